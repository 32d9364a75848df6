"""Chunking: documents in, :class:`scopekb.models.Chunk` lists out.

:func:`chunk_document` is the single entry point used by the indexers; it picks a chunker by language and
falls back to line windows.
"""

from __future__ import annotations

from scopekb.chunking.lines import chunk_lines
from scopekb.models import Chunk
from scopekb.settings import ChunkingSettings


def chunk_document(path: str, text: str, language: str, cfg: ChunkingSettings) -> list[Chunk]:
    """Cut one decoded document into chunks, numbered 0.. in order.

    Args:
        path: repository-relative path (used for context and language-specific rules).
        text: decoded text with LF line ends.
        language: from :func:`scopekb.filetypes.language_for`.
        cfg: window sizes and limits.
    """
    chunks = chunk_lines(text, cfg.window_lines, cfg.overlap_lines, cfg.max_chars)
    for i, c in enumerate(chunks):
        c.chunk_index = i
    return chunks
