"""Rendering indexed data for agents and terminals without letting it shape the output (DESIGN §5, §13
"Untrusted content").

Everything indexed (file contents, paths, symbols, repository names) is untrusted. Rules applied here and by
every caller that prints such data (REST ``format=text``, the MCP tools, the CLI):

- structure lines (headers, summaries) are built from validated fields only, and every data value placed on
  them goes through :func:`one_line`, so no control character (C0, DEL, C1), line or paragraph separator,
  bidirectional override or other format character from the data reaches them: each is shown as a visible
  escape (``\\n``, ``\\x1b``, ``\\u202e``);
- chunk content is returned only as data inside a fence it cannot close: the fence carries a per-answer random
  nonce that is checked to occur in none of the answer's content (:func:`fence_nonce`);
- text meant for a terminal (:func:`terminal_text`) also keeps control characters other than tab and newline
  out of the content, so indexed bytes cannot move the cursor, recolour or retitle the terminal.
"""

from __future__ import annotations

import secrets
import unicodedata
from collections.abc import Iterable

from scopekb.models import SearchHit, SearchResponse

#: Unicode general categories never written raw on a structure line: controls, format characters (bidi
#: overrides, zero-width characters), line/paragraph separators, surrogates, private use and unassigned.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Bytes of randomness in a fence nonce (12 hex digits; re-drawn when it occurs in the content).
NONCE_BYTES = 6
FENCE_OPEN = "<<<chunk-{nonce}"
FENCE_CLOSE = "chunk-{nonce}>>>"


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    cp = ord(ch)
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def is_unsafe(ch: str) -> bool:
    """True for a character that must not be written raw on a structure line (see the module docstring)."""
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def one_line(value: object, max_chars: int = 500) -> str:
    """``value`` as text safe for a structure line: unsafe characters escaped (``\\n``, ``\\x1b``,
    ``\\u2028``), at most ``max_chars`` characters of the original kept (then ``…``).

    Printable text, including non-ASCII letters and backslashes, is kept as it is (it is display text, not an
    encoding: the JSON API returns the exact values).
    """
    s = str(value)
    cut = len(s) > max_chars
    s = s[:max_chars]
    if not any(is_unsafe(c) for c in s):
        return s + ("…" if cut else "")
    return "".join(_escape(c) if is_unsafe(c) else c for c in s) + ("…" if cut else "")


def terminal_text(content: str) -> str:
    """Content for a terminal: tab and newline kept, every other unsafe character escaped visibly, so indexed
    text cannot send terminal control sequences (ESC ... cursor moves, colours, titles, hyperlinks)."""
    if not any(is_unsafe(c) and c not in "\t\n" for c in content):
        return content
    return "".join(_escape(c) if is_unsafe(c) and c not in "\t\n" else c for c in content)


def fence_nonce(contents: Iterable[str]) -> str:
    """A random hex nonce (:data:`NONCE_BYTES` bytes) occurring in none of ``contents`` (compared without
    case), so no content can contain the fence line made from it. Drawn again until it does not occur."""
    texts = [c.lower() for c in contents]
    while True:
        nonce = secrets.token_hex(NONCE_BYTES)
        if not any(nonce in t for t in texts):
            return nonce


#: Matching line numbers listed in a hit's header at most.
_MAX_LINES_SHOWN = 50


def hit_header(n: int, h: SearchHit) -> str:
    """The structure line naming hit ``n``: ``[n] path:start-end (score 0.92) symbol blob <blob_sha>``, data
    parts escaped."""
    head = f"[{int(n)}] {one_line(h.path)}:{int(h.start_line)}-{int(h.end_line)} (score {float(h.score):.2f})"
    if h.symbol:
        head += f" {one_line(h.symbol, 200)}"
    if h.blob_sha:  # what the ``read`` tool needs to open this file at this version
        head += f" blob {one_line(h.blob_sha, 64)}"
    if h.match_lines:  # exact/regex/symbol: the matching lines (integers only)
        shown = h.match_lines[:_MAX_LINES_SHOWN]
        head += " lines " + ",".join(str(int(x)) for x in shown) + ("…" if len(h.match_lines) > len(shown) else "")
    return head


def render_text(resp: SearchResponse) -> str:
    """Text for agents (REST ``format=text``, the MCP ``search`` tool).

    Each hit is a header line (:func:`hit_header`) followed by its content between a ``<<<chunk-NONCE`` and a
    ``chunk-NONCE>>>`` line; the nonce (12 hex digits) is random per answer and absent from all of the answer's
    content and headers, so content cannot close its fence and forge a hit or an instruction outside it. A
    degraded answer ends with a ``Note:`` line. An empty result says so plainly, in one line.
    """
    if not resp.hits:
        return f"No results for '{one_line(resp.query, 200)}'."
    heads = [hit_header(n, h) for n, h in enumerate(resp.hits, 1)]
    nonce = fence_nonce([*heads, *(h.content for h in resp.hits)])
    opening, closing = FENCE_OPEN.format(nonce=nonce), FENCE_CLOSE.format(nonce=nonce)
    parts = [f"{head}\n{opening}\n{h.content}\n{closing}" for head, h in zip(heads, resp.hits, strict=True)]
    if resp.notice:
        parts.append(f"Note: {one_line(resp.notice)}")
    return "\n\n".join(parts)
