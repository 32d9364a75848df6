"""Hit content as numbered lines with the query's terms marked, HTML-escaped piece by piece.

Indexed text is untrusted (DESIGN §13): every piece of it goes through :func:`markupsafe.escape`, after its
control, format (bidi overrides, U+202E ...) and separator characters are written as visible escapes
(:func:`scopekb.render.terminal_text`: a right-to-left override reversed what followed it on the page); only the
``<mark>`` elements added here are markup. The pattern is a literal alternation of at most
:data:`MAX_TERMS` escaped terms of the operator's own query, so matching is linear in the content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from scopekb.render import terminal_text

MAX_TERMS = 20
MAX_TERM_CHARS = 100
_WORD = re.compile(r"[A-Za-z0-9_]{2,}")


@dataclass(frozen=True)
class Line:
    """One line of a hit: its number in the file, its HTML (escaped, terms marked) and whether a term matched."""

    number: int
    html: Markup
    matched: bool


def query_terms(query: str) -> list[str]:
    """Identifier-like words of ``query`` (2+ characters), longest first, at most :data:`MAX_TERMS`."""
    seen: dict[str, None] = {}
    for w in _WORD.findall(query):
        seen.setdefault(w[:MAX_TERM_CHARS].lower(), None)
    return sorted(seen, key=len, reverse=True)[:MAX_TERMS]


def highlight(content: str, start_line: int, query: str, match_lines: Sequence[int] | None = None) -> list[Line]:
    """``content`` split into lines numbered from ``start_line``, each escaped with the query's terms marked.
    ``match_lines`` (exact/regex/symbol hits): the lines flagged as matching are these, not those with a term."""
    terms = query_terms(query)
    pattern = re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE) if terms else None
    out = []
    for i, raw in enumerate(content.split("\n")):
        text = terminal_text(raw)
        if pattern is None:
            out.append(Line(start_line + i, Markup(escape(text)), False))
            continue
        parts: list[str] = []
        pos = 0
        for m in pattern.finditer(text):
            parts.append(str(escape(text[pos:m.start()])))
            parts.append(f"<mark>{escape(m.group(0))}</mark>")
            pos = m.end()
        parts.append(str(escape(text[pos:])))
        out.append(Line(start_line + i, Markup("".join(parts)), pos > 0))
    if match_lines is not None:
        wanted = set(match_lines)
        out = [Line(ln.number, ln.html, ln.number in wanted) for ln in out]
    return out
