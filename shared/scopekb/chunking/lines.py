"""Line-window chunking with overlap: the fallback for any text."""

from __future__ import annotations

from scopekb.models import Chunk


def chunk_lines(text: str, window: int, overlap: int, max_chars: int = 6000) -> list[Chunk]:
    """Cut ``text`` into windows of ``window`` lines that overlap by ``overlap`` lines.

    Windows are trimmed of leading and trailing blank lines and all-blank windows are dropped, so every
    non-blank line is in at least one chunk. A window longer than ``max_chars`` is split further at line
    boundaries, and a single line longer than ``max_chars`` (minified code, base64) into pieces of that size.

    Raises:
        ValueError: ``overlap`` is not smaller than ``window``.
    """
    if window < 1 or not 0 <= overlap < window:
        raise ValueError(f"overlap ({overlap}) must be >= 0 and smaller than window ({window})")
    lines = text.split("\n")
    n = len(lines)
    step = window - overlap
    out: list[Chunk] = []
    start = 0
    while start < n:
        end = min(n, start + window)  # exclusive
        s, e = start, end
        while s < e and not lines[s].strip():
            s += 1
        while e > s and not lines[e - 1].strip():
            e -= 1
        if s < e:
            out.extend(_bounded(lines, s, e, max_chars))
        if end >= n:
            break
        start += step
    return out


def _bounded(lines: list[str], s: int, e: int, max_chars: int) -> list[Chunk]:
    """Chunks for lines[s:e] (0-based, exclusive end) each at most ``max_chars`` characters."""
    out: list[Chunk] = []
    buf: list[str] = []
    buf_start = s
    size = 0
    for i in range(s, e):
        line = lines[i]
        if len(line) > max_chars:
            if buf:
                out.append(Chunk("\n".join(buf), buf_start + 1, i))
                buf, size = [], 0
            for k in range(0, len(line), max_chars):
                out.append(Chunk(line[k:k + max_chars], i + 1, i + 1))
            buf_start = i + 1
            continue
        if buf and size + len(line) + 1 > max_chars:
            out.append(Chunk("\n".join(buf), buf_start + 1, i))
            buf, size, buf_start = [], 0, i
        if not buf:
            buf_start = i
        buf.append(line)
        size += len(line) + 1
    if buf and any(x.strip() for x in buf):
        out.append(Chunk("\n".join(buf), buf_start + 1, e))
    return out
