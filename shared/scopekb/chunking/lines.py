"""Line-window chunking with overlap: the fallback for any text (the windows live in
:meth:`scopekb.chunking.core.Doc.windows`; this module keeps the small stand-alone helper)."""

from __future__ import annotations

from scopekb.chunking.core import Doc, Piece
from scopekb.chunking.tokens import EstimateCounter, TokenCounter
from scopekb.models import Chunk
from scopekb.settings import ChunkingSettings


def chunk_lines(text: str, window: int, overlap: int, max_chars: int = 6000,
                counter: TokenCounter | None = None, max_tokens: int = 1 << 30) -> list[Chunk]:
    """Cut ``text`` into windows of up to ``window`` lines that overlap by up to ``overlap`` lines.

    Windows are trimmed of leading and trailing blank lines and all-blank windows are dropped, so every
    non-blank line is in at least one chunk. A window is also cut short at ``max_chars`` characters and at
    ``max_tokens`` tokens of ``counter`` (default: no token bound); a single line longer than that is split into
    pieces (``metadata["col_start"]``/``["col_end"]``). Chunks are numbered 0.. in order.

    Raises:
        ValueError: ``overlap`` is not smaller than ``window``, or ``window`` < 1.
    """
    if window < 1 or not 0 <= overlap < window:
        raise ValueError(f"overlap ({overlap}) must be >= 0 and smaller than window ({window})")
    limit = max(16, max_tokens)
    cfg = ChunkingSettings(window_lines=window, overlap_lines=overlap, max_chars=max(16, max_chars),
                           max_tokens=limit, embed_context=False)
    doc = Doc(text, cfg, counter if counter is not None else EstimateCounter(limit))
    return doc.to_chunks(doc.windows(0, doc.n - 1, Piece(0, 0)))
