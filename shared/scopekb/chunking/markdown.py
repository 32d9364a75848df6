"""Markdown by heading hierarchy.

A section runs from one heading to the next heading of any level. Each chunk carries the path of headings
above it and its own: ``metadata["headings"] = ["Install", "From source"]``, ``metadata["level"]`` (1-6),
``symbol`` = its heading text, ``signature`` = the heading line, kind ``section``. Text before the first
heading is a section with an empty path.

Headings are ATX (``#`` .. ``######`` followed by a space or the line end, up to 3 spaces of indent) and setext
(one paragraph line underlined by ``===`` or ``---``). Lines inside fenced code blocks (opened by 3+ backticks or
tildes, up to 3 spaces of indent; closed by the same character at least as long) and inside a leading YAML
front-matter block are never headings. A heading with no text below it before a deeper heading is merged into
that sub-section. A section over the size budget is cut at blank lines outside fences (a fence stays whole when
it fits), then at lines; its parts keep the headings and get ``metadata["part"]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from scopekb.chunking.core import Doc, Piece

_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_NOT_PARAGRAPH = re.compile(r"^(?: {4,}|\t| {0,3}(?:[-*+>|]|\d{1,9}[.)])(?:\s|$)| {0,3}<)")


@dataclass(slots=True)
class Section:
    """Rows ``s..e`` (0-based, inclusive) under one heading (``level`` 0 = text before any heading)."""

    s: int
    e: int
    level: int
    title: str | None
    headings: list[str]
    heading_line: str | None
    hrow: int = -1  #: row of the heading line (-1 for text before any heading)


def scan(lines: list[str]) -> tuple[list[Section], list[bool]]:
    """Sections of a markdown document and, per row, whether it is inside a fenced block (fence lines
    included), for :func:`chunk_markdown`."""
    n = len(lines)
    in_fence = [False] * n
    heads: list[tuple[int, int, str, int]] = []  # (first row, level, title, heading row)
    fence: tuple[str, int] | None = None
    start = 0
    if n and lines[0].strip() == "---":  # YAML front matter
        for r in range(1, min(n, 500)):
            if lines[r].strip() in ("---", "..."):
                for k in range(r + 1):
                    in_fence[k] = True
                start = r + 1
                break
    prev_para = False  # the previous row is a one-line paragraph that can be a setext heading
    for r in range(start, n):
        line = lines[r]
        if fence is not None:
            in_fence[r] = True
            stripped = line.strip()
            ch, length = fence
            if len(line) - len(line.lstrip(" ")) <= 3 and stripped and set(stripped) == {ch} \
                    and len(stripped) >= length:
                fence = None
            prev_para = False
            continue
        m = _FENCE_OPEN.match(line)
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = (m.group(1)[0], len(m.group(1)))
            in_fence[r] = True
            prev_para = False
            continue
        m = _ATX.match(line)
        if m:
            heads.append((r, len(m.group(1)), (m.group(2) or "").strip(), r))
            prev_para = False
            continue
        m = _SETEXT.match(line)
        if m and prev_para:
            level = 1 if m.group(1)[0] == "=" else 2
            heads.append((r - 1, level, lines[r - 1].strip(), r - 1))
            prev_para = False
            continue
        prev_para = bool(line.strip()) and not _NOT_PARAGRAPH.match(line) and (r == start or not lines[r - 1].strip()
                                                                               or _is_heading_row(heads, r - 1))
    sections: list[Section] = []
    first = heads[0][0] if heads else n
    if first > 0:
        sections.append(Section(0, first - 1, 0, None, [], None))
    stack: list[tuple[int, str]] = []
    for i, (s, level, title, hrow) in enumerate(heads):
        e = heads[i + 1][0] - 1 if i + 1 < len(heads) else n - 1
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        sections.append(Section(s, e, level, title, [t for _, t in stack], lines[hrow].strip(), hrow))
    return sections, in_fence


def _is_heading_row(heads: list[tuple[int, int, str, int]], r: int) -> bool:
    return bool(heads) and heads[-1][3] == r


def chunk_markdown(doc: Doc, cfg: Any) -> list[Piece]:
    """Section pieces for a markdown document (see the module docstring)."""
    sections, in_fence = scan(doc.lines)
    # a heading with nothing under it before a deeper heading joins that sub-section
    merged: list[Section] = []
    for sec in sections:
        if merged:
            prev = merged[-1]
            body_blank = all(doc.blank[r] for r in range(prev.hrow + 1, prev.e + 1))
            if prev.level and body_blank and sec.level > prev.level:
                merged.pop()
                sec = Section(prev.s, sec.e, sec.level, sec.title, sec.headings, sec.heading_line, sec.hrow)
        merged.append(sec)
    out: list[Piece] = []
    for sec in merged:
        t = doc.trim(sec.s, sec.e)
        if t is None:
            continue
        tpl = Piece(t[0], t[1], "section", sec.title or None, sec.heading_line,
                    {"headings": list(sec.headings), "level": sec.level})
        if doc.fits(*t):
            out.append(tpl)
            continue
        tpl.group = doc.new_group()
        out.extend(doc.pack(_units(doc, in_fence, *t), tpl))
    return out


def _units(doc: Doc, in_fence: list[bool], s: int, e: int) -> list[tuple[int, int]]:
    """Paragraphs (blank-separated) outside fences and whole fenced blocks inside them."""
    out: list[tuple[int, int]] = []
    r = s
    while r <= e:
        if in_fence[r]:
            k = r
            while k + 1 <= e and in_fence[k + 1]:
                k += 1
            out.append((r, k))
            r = k + 1
        elif doc.blank[r]:
            r += 1
        else:
            k = r
            while k + 1 <= e and not doc.blank[k + 1] and not in_fence[k + 1]:
                k += 1
            out.append((r, k))
            r = k + 1
    return out
