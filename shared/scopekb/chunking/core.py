"""Machinery shared by every chunker: the document's lines with token costs, pieces, packing and line windows,
long-line splitting, and the final pass that turns pieces into :class:`scopekb.models.Chunk` objects.

Rows here are 0-based line numbers of ``text.split("\\n")``; chunks carry 1-based inclusive lines.

Size rule: a chunk's token count (special tokens included, by the :class:`~scopekb.chunking.tokens.TokenCounter`)
is at most :attr:`Doc.budget` = ``min(cfg.max_tokens, counter.limit)`` minus ``cfg.context_reserve_tokens`` when
``cfg.embed_context`` is on, and its length at most ``cfg.max_chars`` characters.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from scopekb.chunking.tokens import TokenCounter, count_many
from scopekb.models import Chunk

#: Smallest content budget in tokens whatever the settings say (a line piece must always fit).
MIN_BUDGET = 8
#: Skip reason for a single line longer than ``max_chars`` under ``long_lines="skip"``.
SKIP_LONG_LINE = "line_too_long"
# Lines that only close a block ("}", "};", "end", ")", "]", "</div>") are merged into the piece before them.
_CLOSER = re.compile(r"^\s*(?:[\]\)\}]+[;,]?|end|fi|done|esac|\*/|-->)\s*(?://.*|#.*)?$")
# A soft place to cut a long line: after whitespace or a separator.
_SOFT_CUT = re.compile(r"[\s,;\)\}\]>]")


@dataclass(slots=True)
class Piece:
    """A chunk before numbering: rows ``s..e`` (0-based, inclusive) or, with ``cols``, a sub-slice of row ``s``.

    ``group`` ties the pieces of one split definition/section/cell together; the final pass numbers them
    ``metadata["part"]`` 0.. and sets ``metadata["parts"]``.
    """

    s: int
    e: int
    kind: str = "lines"
    symbol: str | None = None
    signature: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    group: int | None = None
    cols: tuple[int, int] | None = None

    def like(self, s: int, e: int, cols: tuple[int, int] | None = None) -> Piece:
        """A copy with other rows (same kind, symbol, signature, metadata and group)."""
        return Piece(s, e, self.kind, self.symbol, self.signature, dict(self.meta), self.group, cols)


class Doc:
    """One document's lines with per-line token counts and prefix sums for O(1) range costs.

    Args:
        text: the document (LF line ends; other characters are kept as they are).
        cfg: :class:`scopekb.settings.ChunkingSettings`.
        counter: the token counter; its ``limit`` caps ``cfg.max_tokens``.
        count_costs: False skips token counting (for documents whose lines are not chunked directly).
    """

    def __init__(self, text: str, cfg: Any, counter: TokenCounter, count_costs: bool = True) -> None:
        self.text = text
        self.cfg = cfg
        self.counter = counter
        self.lines = text.split("\n")
        self.n = len(self.lines)
        self.max_chars = int(cfg.max_chars)
        self.limit = max(1, min(int(cfg.max_tokens), int(counter.limit)))
        reserve = int(cfg.context_reserve_tokens) if cfg.embed_context else 0
        self.budget = max(self.limit - reserve, min(self.limit, MIN_BUDGET))
        self.additive = bool(getattr(counter, "additive", False))
        self.overhead = counter.count("")
        self.skipped: list[tuple[int, str]] = []
        self._groups = itertools.count()
        self.blank = [not ln.strip() for ln in self.lines]
        self.huge = [len(ln) > self.max_chars for ln in self.lines]
        raw = [0] * self.n
        if count_costs:
            todo = [i for i in range(self.n) if not self.blank[i] and not self.huge[i]]
            for i, c in zip(todo, count_many(counter, [self.lines[i] for i in todo]), strict=True):
                raw[i] = max(0, c - self.overhead)
                if self.overhead + raw[i] > self.budget:
                    self.huge[i] = True  # one line over the token budget: split like an over-long line
        self.raw = raw
        self._cum_tok = list(itertools.accumulate(raw, initial=0))
        self._cum_chr = list(itertools.accumulate((len(ln) + 1 for ln in self.lines), initial=0))
        self._cum_huge = list(itertools.accumulate((1 if h else 0 for h in self.huge), initial=0))

    # -- costs ---------------------------------------------------------------------------------------------
    def new_group(self) -> int:
        """A fresh group id for the pieces of one split unit."""
        return next(self._groups)

    def tokens(self, s: int, e: int) -> int:
        """Token estimate of rows s..e joined (exact for additive counters)."""
        return self.overhead + self._cum_tok[e + 1] - self._cum_tok[s]

    def chars(self, s: int, e: int) -> int:
        """Characters of rows s..e joined with newlines."""
        return self._cum_chr[e + 1] - self._cum_chr[s] - 1

    def fits(self, s: int, e: int) -> bool:
        """Rows s..e make one chunk: no over-long line, within the token budget and ``max_chars``."""
        return (self._cum_huge[e + 1] == self._cum_huge[s] and self.tokens(s, e) <= self.budget
                and self.chars(s, e) <= self.max_chars)

    def trim(self, s: int, e: int) -> tuple[int, int] | None:
        """Rows s..e without leading/trailing blank rows, or None when all are blank."""
        s, e = max(s, 0), min(e, self.n - 1)
        while s <= e and self.blank[s]:
            s += 1
        while e >= s and self.blank[e]:
            e -= 1
        return (s, e) if s <= e else None

    def content(self, p: Piece) -> str:
        """The text of a piece: its rows joined, or its column slice of one row."""
        if p.cols is not None:
            return self.lines[p.s][p.cols[0]:p.cols[1]]
        return "\n".join(self.lines[p.s:p.e + 1])

    # -- packing -------------------------------------------------------------------------------------------
    def blocks(self, s: int, e: int) -> list[tuple[int, int]]:
        """Rows s..e as units separated by blank rows (paragraphs); for :meth:`pack`."""
        out: list[tuple[int, int]] = []
        start: int | None = None
        for r in range(s, e + 1):
            if self.blank[r]:
                if start is not None:
                    out.append((start, r - 1))
                    start = None
            elif start is None:
                start = r
        if start is not None:
            out.append((start, e))
        return out

    def pack(self, units: list[tuple[int, int]], tpl: Piece, max_lines: int | None = None) -> list[Piece]:
        """Greedily join consecutive units (row ranges, ascending, non-overlapping) into pieces that fit.

        A unit that does not fit on its own is cut into rows; a row that does not fit becomes line pieces
        (:meth:`split_line`). Pieces never start or end on a blank row.
        """
        out: list[Piece] = []
        cur: list[int] | None = None  # [s, e]

        def flush() -> None:
            nonlocal cur
            if cur is not None:
                out.append(tpl.like(cur[0], cur[1]))
                cur = None

        stack = list(reversed(units))
        while stack:
            s, e = stack.pop()
            t = self.trim(s, e)
            if t is None:
                continue
            s, e = t
            if not self.fits(s, e):
                if s == e:
                    flush()
                    out.extend(self.split_line(s, tpl))
                else:
                    stack.extend(reversed([(r, r) for r in range(s, e + 1)]))
                continue
            if cur is None:
                cur = [s, e]
            elif self.fits(cur[0], e) and (max_lines is None or e - cur[0] + 1 <= max_lines):
                cur[1] = e
            else:
                flush()
                cur = [s, e]
        flush()
        return out

    def gap(self, s: int, e: int, tpl: Piece, out: list[Piece]) -> None:
        """Append pieces for rows s..e that lie between definitions (code outside any definition).

        Rows that only close a block (``}``, ``end``) are merged into the previous piece when it ends just
        before them and the result still fits; other rows are packed by paragraphs into at most
        ``cfg.window_lines`` rows per piece, without overlap.
        """
        t = self.trim(s, e)
        if t is None:
            return
        s, e = t
        if out and out[-1].cols is None and out[-1].e < s and all(
                self.blank[r] for r in range(out[-1].e + 1, s)) and all(
                self.blank[r] or _CLOSER.match(self.lines[r]) for r in range(s, e + 1)) and self.fits(out[-1].s, e):
            out[-1].e = e
            return
        out.extend(self.pack(self.blocks(s, e), tpl, max_lines=int(self.cfg.window_lines)))

    def windows(self, s: int, e: int, tpl: Piece, overlap: int | None = None) -> list[Piece]:
        """Line windows over rows s..e: up to ``cfg.window_lines`` rows and the token/char budget each,
        consecutive windows sharing up to ``cfg.overlap_lines`` rows (scaled down for windows cut short by
        the budget, so a window always advances). Blank edges are trimmed, over-long rows split.
        """
        window = int(self.cfg.window_lines)
        overlap = int(self.cfg.overlap_lines) if overlap is None else overlap
        out: list[Piece] = []
        i = s
        while i <= e:
            while i <= e and self.blank[i]:
                i += 1
            if i > e:
                break
            if self.huge[i]:
                out.extend(self.split_line(i, tpl))
                i += 1
                continue
            j = i  # exclusive end
            while j <= e and j - i < window and not self.huge[j] and self.fits(i, j):
                j += 1
            t = self.trim(i, j - 1)
            assert t is not None  # row i is not blank
            out.append(tpl.like(*t))
            if j > e:
                break
            if self.huge[j]:
                i = j  # no overlap into a window that would stop at the same over-long row again
                continue
            taken = j - i
            ov = min(overlap, (taken * overlap) // window, taken - 1) if overlap else 0
            i = max(i + 1, j - ov)
        return out

    def split_line(self, r: int, tpl: Piece) -> list[Piece]:
        """Pieces of one over-long row: contiguous column slices ``[a, b)`` of ``lines[r]``, each within
        ``max_chars`` and the token budget, cut after whitespace or a separator where one is near the end.
        Whitespace-only slices are left out. Under ``cfg.long_lines == "skip"`` a row over ``max_chars``
        gives no pieces and is recorded in :attr:`skipped` with reason ``line_too_long``.
        """
        line = self.lines[r]
        if len(line) > self.max_chars and self.cfg.long_lines == "skip":
            self.skipped.append((r + 1, SKIP_LONG_LINE))
            return []
        out: list[Piece] = []
        pos, n = 0, len(line)
        guess = self.max_chars  # the last piece's length: the next one starts from it (one count per piece)
        while pos < n:
            length = min(self.max_chars, n - pos, guess + guess // 4 + 16)
            while True:
                cut = length
                if pos + length < n and length > 8:
                    window = line[pos + (length * 3) // 4:pos + length]
                    last = None
                    for m in _SOFT_CUT.finditer(window):
                        last = m
                    if last is not None:
                        cut = (length * 3) // 4 + last.end()
                piece = line[pos:pos + cut]
                c = self.counter.count(piece)
                if c <= self.budget or cut <= 1:
                    break
                length = max(1, min(cut - 1, int(cut * self.budget / c * 0.9)))
            if piece.strip():
                out.append(tpl.like(r, r, (pos, pos + cut)))
            guess = max(cut, 16)
            pos += cut
        return out

    # -- final pass ----------------------------------------------------------------------------------------
    def enforce(self, pieces: list[Piece]) -> list[Piece]:
        """Re-count each piece with the real counter (only for non-additive counters, whose per-line sums
        are estimates) and cut any piece over the budget in halves until it fits."""
        if self.additive:
            return pieces
        out: list[Piece] = []
        stack = list(reversed(pieces))
        while stack:
            p = stack.pop()
            if self.counter.count(self.content(p)) <= self.budget:
                out.append(p)
            elif p.cols is None and p.e > p.s:
                mid = (p.s + p.e) // 2
                halves = [p.like(*t) for t in (self.trim(p.s, mid), self.trim(mid + 1, p.e)) if t is not None]
                stack.extend(reversed(halves))
            elif p.cols is None:
                stack.extend(reversed(self.split_line(p.s, p)))
            else:
                a, b = p.cols
                if b - a <= 1:
                    out.append(p)  # a single character: nothing smaller exists
                    continue
                m = (a + b) // 2
                stack.extend(reversed([p.like(p.s, p.s, c) for c in ((a, m), (m, b))
                                       if self.lines[p.s][c[0]:c[1]].strip()]))
        if len(out) != len(pieces) and all(p.kind == "lines" and p.cols is None for p in out):
            out = self._in_line_order(out)
        return out

    @staticmethod
    def _in_line_order(pieces: list[Piece]) -> list[Piece]:
        """Overlapping line windows cut in halves interleave (``1-3, 2-4`` become ``1-2, 3, 2-3, 4``): put the
        pieces back in line order and drop a piece whose rows the previous one already holds."""
        out: list[Piece] = []
        for p in sorted(pieces, key=lambda q: (q.s, q.e)):
            if out and out[-1].s <= p.s and p.e <= out[-1].e:
                continue
            out.append(p)
        return out

    def to_chunks(self, pieces: list[Piece], row_map: list[int] | None = None) -> list[Chunk]:
        """Number pieces into chunks: ``chunk_index`` 0.., part numbers per group, column metadata for line
        pieces. ``row_map`` maps rows to other line numbers (0-based; notebooks map cell rows to file rows)."""
        pieces = self.enforce(pieces)
        counts: dict[int, int] = {}
        for p in pieces:
            if p.group is not None:
                counts[p.group] = counts.get(p.group, 0) + 1
        seen: dict[int, int] = {}
        line_part: dict[int, int] = {}
        out: list[Chunk] = []
        for p in pieces:
            meta = dict(p.meta)
            if p.group is not None and counts[p.group] > 1:
                meta["part"] = seen.get(p.group, 0)
                meta["parts"] = counts[p.group]
                seen[p.group] = meta["part"] + 1
            if p.cols is not None:
                meta["col_start"], meta["col_end"] = p.cols
                meta["line_part"] = line_part.get(p.s, 0)
                line_part[p.s] = meta["line_part"] + 1
            s, e = (row_map[p.s], row_map[p.e]) if row_map is not None else (p.s, p.e)
            out.append(Chunk(self.content(p), s + 1, e + 1, len(out), p.kind, p.symbol, p.signature, meta))
        return out
