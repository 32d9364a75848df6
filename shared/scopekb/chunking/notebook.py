"""Jupyter notebooks (``.ipynb`` JSON) by cell; outputs and attachments are dropped, never read into chunks.

Line mapping: a notebook chunk's ``content`` is cell source text, and its ``start_line``/``end_line`` are the
lines *of the .ipynb file* that hold the chunk's first and last source line. nbformat writes every source line
as its own JSON string on its own line, so in the usual layout the range points exactly at the code in the raw
file; when a cell's source is a single JSON string, all its lines map to that string's line. Chunk metadata:
``cell`` (0-based index among all cells), ``cell_type`` (``code``/``markdown``/``raw``), and for parts of a
split cell ``part``/``parts``. Kind is ``cell`` for a whole cell.

A cell within the size budget is one chunk. A larger cell is chunked as a document of its own (code cells by
the notebook's kernel language, python by default, through the syntax chunker; markdown cells by headings) and
its chunks are mapped back to file lines. Blank cells give no chunk. A file that is not a notebook's JSON raises
:class:`NotebookError` (the caller falls back to line windows).
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from scopekb.chunking.core import Doc, Piece
from scopekb.models import Chunk

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class NotebookError(ValueError):
    """The text is not a notebook's JSON (reason for the fallback)."""


@dataclass(slots=True)
class Cell:
    """One cell: its source text and, per source line, the 0-based row of the .ipynb file holding it."""

    index: int
    cell_type: str
    text: str
    rows: list[int]


class _Scanner:
    """Walks JSON text keeping character offsets (the stdlib parser does not report positions)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.newlines = [m.start() for m in re.finditer("\n", text)]

    def row(self, offset: int) -> int:
        return bisect.bisect_left(self.newlines, offset)

    def ws(self, i: int) -> int:
        return _WS.match(self.text, i).end()  # type: ignore[union-attr]

    def skip(self, i: int) -> int:
        """End offset of the JSON value starting at ``i``."""
        return _DECODER.raw_decode(self.text, i)[1]

    def members(self, i: int) -> list[tuple[str, int, int]]:
        """(key, value start, value end) of the object at ``i``."""
        t = self.text
        if t[i] != "{":
            raise NotebookError("expected an object")
        out = []
        i = self.ws(i + 1)
        if t[i] == "}":
            return out
        while True:
            if t[i] != '"':
                raise NotebookError("expected a key")
            key, i = scanstring(t, i + 1)
            i = self.ws(i)
            if t[i] != ":":
                raise NotebookError("expected ':'")
            start = self.ws(i + 1)
            end = self.skip(start)
            out.append((key, start, end))
            i = self.ws(end)
            if t[i] == "}":
                return out
            if t[i] != ",":
                raise NotebookError("expected ',' or '}'")
            i = self.ws(i + 1)

    def elements(self, i: int) -> list[tuple[int, int]]:
        """(start, end) of each element of the array at ``i``."""
        t = self.text
        if t[i] != "[":
            raise NotebookError("expected an array")
        out = []
        i = self.ws(i + 1)
        if t[i] == "]":
            return out
        while True:
            end = self.skip(i)
            out.append((i, end))
            i = self.ws(end)
            if t[i] == "]":
                return out
            if t[i] != ",":
                raise NotebookError("expected ',' or ']'")
            i = self.ws(i + 1)


def parse_cells(text: str) -> tuple[list[Cell], str]:
    """Cells of a notebook with their file rows, and the kernel language (``python`` when not stated).

    Raises:
        NotebookError: not a notebook (invalid JSON, no ``cells`` list, wrong types).
    """
    sc = _Scanner(text)
    try:
        start = sc.ws(0)
        top = sc.members(start)
        cells_at = next(((s, e) for k, s, e in top if k == "cells"), None)
        if cells_at is None:
            raise NotebookError("no cells")
        language = "python"
        meta_at = next(((s, e) for k, s, e in top if k == "metadata"), None)
        if meta_at is not None:
            meta = json.loads(text[meta_at[0]:meta_at[1]])
            lang = (meta.get("kernelspec") or {}).get("language") or (meta.get("language_info") or {}).get("name")
            if isinstance(lang, str) and lang:
                language = lang.lower()
        cells: list[Cell] = []
        for idx, (cs, _ce) in enumerate(sc.elements(cells_at[0])):
            fields = {k: (s, e) for k, s, e in sc.members(cs)}
            ctype = json.loads(text[slice(*fields["cell_type"])]) if "cell_type" in fields else "code"
            if "source" not in fields:
                cells.append(Cell(idx, str(ctype), "", []))
                continue
            s0, e0 = fields["source"]
            if text[s0] == "[":
                parts = [(json.loads(text[a:b]), sc.row(a)) for a, b in sc.elements(s0)]
            else:
                parts = [(json.loads(text[s0:e0]), sc.row(s0))]
            if not all(isinstance(p, str) for p, _ in parts):
                raise NotebookError("cell source is not text")
            cells.append(_cell(idx, str(ctype), parts))
    except (IndexError, KeyError, ValueError, TypeError, AttributeError) as e:
        if isinstance(e, NotebookError):
            raise
        raise NotebookError(f"not a notebook: {type(e).__name__}") from e
    return cells, language


def _cell(index: int, ctype: str, parts: list[tuple[str, int]]) -> Cell:
    joined = "".join(p for p, _ in parts)
    starts = []
    pos = 0
    for p, _ in parts:
        starts.append(pos)
        pos += len(p)
    part_rows = [r for _, r in parts]
    rows = []
    line_start = 0
    for line in joined.split("\n"):
        k = max(0, bisect.bisect_right(starts, line_start) - 1)
        rows.append(part_rows[k] if part_rows else 0)
        line_start += len(line) + 1
    if joined.endswith("\n"):
        joined = joined[:-1]
        rows.pop()
    return Cell(index, ctype, joined, rows)


SubChunker = Callable[[str, str], tuple[list[Chunk], Any]]


def chunk_notebook(text: str, cfg: Any, counter: Any, sub: SubChunker) -> list[Chunk]:
    """Chunks of a notebook (see the module docstring); ``chunk_index`` is numbered by the caller.

    Args:
        sub: ``sub(cell_text, language) -> (chunks, report)``: chunks a large cell as its own document.

    Raises:
        NotebookError: the text is not a notebook.
    """
    cells, language = parse_cells(text)
    out: list[Chunk] = []
    for cell in cells:
        if not cell.text.strip():
            continue
        meta = {"cell": cell.index, "cell_type": cell.cell_type}
        doc = Doc(cell.text, cfg, counter)
        t = doc.trim(0, doc.n - 1)
        if t is None:
            continue
        if doc.fits(*t):
            out.extend(doc.to_chunks([Piece(t[0], t[1], "cell", None, None, meta)], row_map=cell.rows))
            continue
        lang = "markdown" if cell.cell_type == "markdown" else (language if cell.cell_type == "code" else "text")
        chunks, _report = sub(cell.text, lang)
        n = len(chunks)
        for i, c in enumerate(chunks):
            c.metadata = {**c.metadata, **meta}
            if n > 1:
                c.metadata.setdefault("cell_part", i)
            c.start_line = cell.rows[c.start_line - 1] + 1
            c.end_line = cell.rows[c.end_line - 1] + 1
            out.append(c)
    return out
