"""Rendering indexed data for agents and terminals without letting it shape the output (DESIGN §5, §13
"Untrusted content").

Everything indexed (file contents, paths, symbols, repository names) is untrusted. Rules applied here and by
every caller that prints such data (REST ``format=text``, the MCP tools, the CLI):

- structure lines (headers, summaries) are built from validated fields only, and every data value placed on
  them goes through :func:`one_line`, so no control character (C0, DEL, C1), line or paragraph separator,
  bidirectional override or other format character from the data reaches them: each is shown as a visible
  escape (``\\n``, ``\\x1b``, ``\\u202e``);
- a data value that marks a field of a structure line (a path, symbol, blob id, ref, context) goes through
  :func:`field`: written bare only when it is made of letters, digits and ``._/-+@~``, else as a JSON string
  (``"forge/z.md:1-1, [7] x.py"``), so no value can imitate a line's own punctuation (``:a-b``, ``(score``,
  ``, [n]``; hostile review 2, H3);
- chunk content is returned only as data inside a fence it cannot close: the fence carries a per-answer random
  nonce that is checked to occur in none of the answer's content (:func:`fence_nonce`);
- text meant for a terminal (:func:`terminal_text`) also keeps control characters other than tab and newline
  out of the content, so indexed bytes cannot move the cursor, recolour or retitle the terminal.
"""

from __future__ import annotations

import json
import secrets
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from scopekb.models import HitReason, SearchHit, SearchResponse

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


def _plain(s: str) -> bool:
    return bool(s) and all(c.isalnum() or c in _PLAIN_PUNCT for c in s) and not any(is_unsafe(c) for c in s)


#: Characters of a line's structure (``path:a-b``, ``[n]``) escaped inside a quoted :func:`field` value as well.
_QUOTED_ESCAPES = {":": "\\u003a", "[": "\\u005b", "]": "\\u005d"}
#: Punctuation a bare :func:`field` value may hold besides letters and digits (none of it is a structure line's).
_PLAIN_PUNCT = frozenset("._/-+@~")


def field(value: object, max_chars: int = 500) -> str:
    """``value`` as one token of a structure line that cannot be read as the line's structure: bare when it is
    letters, digits and ``._/-+@~`` only (``src/app.py``, ``Trusted.method``), else a JSON string literal (RFC 8259
    §7: ``"`` and ``\\`` escaped, every unsafe character - controls, separators, bidi and other format characters,
    see :func:`is_unsafe` - as a ``\\uXXXX`` escape, and ``:``, ``[``, ``]`` too, so that even a reader that
    ignores the quotes finds no ``path:a-b`` or ``[n]`` inside one), so spaces, ``(``, ``,`` and quotes in data
    stay inside the quotes. At most ``max_chars`` characters of the value are kept (then ``…`` after the token).
    """
    s = str(value)
    cut = len(s) > max_chars
    s = s[:max_chars]
    if _plain(s):
        return s + ("…" if cut else "")
    text = json.dumps(s, ensure_ascii=False)
    if any(is_unsafe(c) or c in _QUOTED_ESCAPES for c in text):
        text = "".join(json.dumps(c)[1:-1] if is_unsafe(c) else _QUOTED_ESCAPES.get(c, c) for c in text)
    return text + ("…" if cut else "")


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
_HEX = frozenset("0123456789abcdef")


def short_commit(commit: str | None) -> str | None:
    """A commit id shortened to 12 hex digits (unambiguous in any repository of a realistic size); any other value
    escaped and bounded; None when unknown."""
    if not commit:
        return None
    if set(commit) <= _HEX:
        return commit[:12]
    return field(commit, 64)


def origin(h: SearchHit) -> str:
    """Where a hit comes from, for its header: ``context 'c1', repo 'pallets/click', ref 'main', commit
    1a2b3c4d5e6f`` (the source id when the hit names no repository; parts unknown are left out); a name that is
    not plain is a JSON string instead of ``'...'`` (:func:`field`).
    Two hits with the same path and lines from two contexts, repositories or refs differ here."""
    parts = [f"context {_name(h.context_id, 100)}"]
    if h.repo:
        parts.append(f"repo {_name(h.repo, 200)}")
    elif h.source_id:
        parts.append(f"source {_name(h.source_id, 100)}")
    if h.ref:
        parts.append(f"ref {_name(h.ref, 200)}")
    commit = short_commit(h.commit)
    if commit:
        parts.append(f"commit {commit}")
    return ", ".join(parts)


def hit_header(n: int, h: SearchHit) -> str:
    """The structure line naming hit ``n``: ``[n] path:start-end (score 0.92) symbol; context 'c1', repo 'r',
    ref 'main', commit 1a2b3c4d5e6f; blob <blob_sha>; lines 3,7`` (:func:`origin`; blob and lines when known),
    data parts as :func:`field` tokens (a path with a space, ``:`` or brackets is a quoted JSON string)."""
    head = f"[{int(n)}] {field(h.path)}:{int(h.start_line)}-{int(h.end_line)} (score {float(h.score):.2f})"
    if h.symbol:
        head += f" {field(h.symbol, 200)}"
    head += f"; {origin(h)}"
    if h.blob_sha:  # what the ``read`` tool needs to open this file at this version
        head += f"; blob {field(h.blob_sha, 64)}"
    if h.match_lines:  # exact/regex/symbol: the matching lines (integers only)
        shown = h.match_lines[:_MAX_LINES_SHOWN]
        head += "; lines " + ",".join(str(int(x)) for x in shown) + ("…" if len(h.match_lines) > len(shown) else "")
    return head


def matching_lines(h: SearchHit, max_lines: int = 20) -> tuple[list[tuple[int, str]], int]:
    """The hit's matching lines (``match_lines``: exact/regex matches, symbol definition headers) as ``(line
    number, line text)`` taken from its content, at most ``max_lines``, and how many more there are. The text is
    raw content: print it as content (:func:`terminal_text`), never on a structure line."""
    lines = h.content.split("\n")
    out = []
    for n in h.match_lines or []:
        i = int(n) - int(h.start_line)
        if 0 <= i < len(lines):
            out.append((int(n), lines[i]))
    return out[:max_lines], max(0, len(out) - max_lines)


class Counter(Protocol):
    """What the budget needs from a tokenizer (:class:`scopekb.chunking.TokenCounter` satisfies it)."""

    name: str

    def count(self, text: str) -> int:
        """Tokens of ``text``."""
        ...


#: Most ranges and omitted hits named on one structure line (then "+N more").
MAX_LISTED = 10
#: Most matched terms named per field on a ``why:`` line.
MAX_TERMS = 8


def _fallback_counter() -> Counter:
    """The tokenizer-free estimate of :mod:`scopekb.chunking.tokens` (over-counts word pieces on code/prose)."""
    from scopekb.chunking.tokens import EstimateCounter

    return EstimateCounter()


def scope_line(resp: SearchResponse) -> str:
    """``agent 'a', contexts 'c1', 'c2'`` or ``agent 'a', every context the key may see``, data escaped."""
    if resp.scope is None:
        return ""
    ctx = resp.scope.context_ids
    if ctx is None:
        where = "every context the key may see"
    else:
        shown = ", ".join(_name(c) for c in ctx[:MAX_LISTED])
        where = f"context{'s' if len(ctx) != 1 else ''} {shown}" + (
            f" +{len(ctx) - MAX_LISTED} more" if len(ctx) > MAX_LISTED else "")
    return f"agent {_name(resp.scope.agent_name)}, {where}"


def _name(value: str, max_chars: int = 100) -> str:
    """A name (agent, context, repository, ref, source) on a structure line, after its path: ``'c1'``,
    ``'https://host/o/r'`` when it holds no quote, backslash or unsafe character, else a JSON string
    (:func:`field`), so a quote or ``', ref '`` in it cannot imitate the next part."""
    quotable = not any(c in "'\"\\" or is_unsafe(c) for c in value)
    return f"'{value}'" if value and quotable and len(value) <= max_chars else field(value, max_chars)


def summary_line(resp: SearchResponse, query_chars: int = 200) -> str:
    """The answer's first line: how many results, for what query, in which mode, scope and grouping."""
    unit = "file" if resp.group_by == "file" else "result"
    n = len(resp.hits)
    head = f"{n} {unit}{'s' if n != 1 else ''}" if n else "No results"
    return (f"{head} for '{one_line(resp.query, query_chars)}' (mode {resp.mode.value}; {scope_line(resp)}"
            + ("; one result per file" if resp.group_by == "file" else "") + ").")


def why_line(why: HitReason) -> str:
    """``why: keyword #1 (0.82), vector #3 (0.91); fusion weighted ...; matched symbol: retry; content: retry,
    upload`` (ranked modes) or ``why: exact: every listed line matches; matched content: <query>``.

    Terms are the query's own identifiers (``\\w+`` runs), escaped anyway; field names come from a fixed set.
    """
    parts = []
    if why.keyword_rank is not None:
        parts.append(f"keyword #{int(why.keyword_rank)}"
                     + (f" ({float(why.keyword_score):.2f})" if why.keyword_score is not None else ""))
    if why.vector_rank is not None:
        parts.append(f"vector #{int(why.vector_rank)}"
                     + (f" ({float(why.vector_score):.2f})" if why.vector_score is not None else ""))
    if parts:  # ranked modes: the lists' ranks and how they were fused
        text = "why: " + ", ".join(parts) + f"; fusion {one_line(why.fusion, 80)}"
    else:  # exact / regex / symbol: the kind of match
        text = f"why: {one_line(why.fusion, 80)}"
    if why.matched:
        text += "; matched " + "; ".join(
            f"{m.field}: " + ", ".join(one_line(t, 60) for t in m.terms[:MAX_TERMS])
            + (f" +{len(m.terms) - MAX_TERMS}" if len(m.terms) > MAX_TERMS else "") for m in why.matched)
    else:
        text += "; no query term in symbol, signature, path or content"
    return text


def also_line(h: SearchHit) -> str | None:
    """``also: lines 80-95 (0.41), 120-130 (0.33)``: the file's other matching ranges (group_by=file)."""
    if not h.other_ranges:
        return None
    shown = ", ".join(f"{int(r.start_line)}-{int(r.end_line)} ({float(r.score):.2f})"
                      for r in h.other_ranges[:MAX_LISTED])
    more = len(h.other_ranges) - MAX_LISTED
    return f"also matched in this file: lines {shown}" + (f" +{more} more" if more > 0 else "")


@dataclass
class _Block:
    n: int
    head: list[str]  # structure lines before the fence
    lines: list[str]  # content lines
    hit: SearchHit


def _blocks(resp: SearchResponse) -> list[_Block]:
    out = []
    for n, h in enumerate(resp.hits, 1):
        head = [hit_header(n, h)]
        if h.why is not None:
            head.append(why_line(h.why))
        also = also_line(h)
        if also:
            head.append(also)
        out.append(_Block(n, head, h.content.split("\n"), h))
    return out


def _assemble(summary: str | None, blocks: list[tuple[_Block, int]], nonce: str, tail: list[str]) -> str:
    opening, closing = FENCE_OPEN.format(nonce=nonce), FENCE_CLOSE.format(nonce=nonce)
    parts = [summary] if summary else []
    for b, keep in blocks:
        body = "\n".join(b.lines[:keep])
        part = "\n".join([*b.head, opening, body, closing])
        if keep < len(b.lines):
            first = int(b.hit.start_line) + keep
            part += (f"\n[{b.n}] cut at the token budget: lines {first}-{int(b.hit.end_line)} not shown "
                     f"({len(b.lines) - keep} of {len(b.lines)} lines)")
        parts.append(part)
    parts.extend(tail)
    return "\n\n".join(parts)


def render_text(resp: SearchResponse, max_tokens: int | None = None, counter: Counter | None = None) -> str:
    """Text for agents (REST ``format=text``, the MCP ``search`` tool).

    The first line (when the response names its scope) says how many results, the query, the mode, the scope and
    the grouping. Each hit is a header line (:func:`hit_header`), a ``why:`` line (its keyword and vector ranks,
    the fusion, the matched terms per field), for a file hit the file's other matching line ranges, then its content
    between a ``<<<chunk-NONCE`` and a ``chunk-NONCE>>>`` line; the nonce (12 hex digits) is random per answer and
    absent from all of the answer's content and structure lines, so content cannot close its fence and forge a hit
    or an instruction outside it. A degraded answer ends with a ``Note:`` line. An empty result says so plainly,
    in one line.

    Args:
        resp: the search response.
        max_tokens: a budget in tokens of ``counter``: hits are kept best first; the first that does not fit is
            cut at a line boundary (a ``[n] cut at the token budget: lines a-b not shown`` line follows its fence)
            and the ones after it are omitted (named on a last ``Budget:`` line). The whole text's count is checked
            and is never over the budget (:data:`scopekb.models.MIN_ANSWER_TOKENS` and up). A budget too small for
            that still shows the first result's header and first lines (:func:`_first_only`), or names the budget
            that would.
        counter: the tokenizer the budget is counted with: the embedding model's (the runtime's ``counter``); None:
            the tokenizer-free estimate of :class:`scopekb.chunking.tokens.EstimateCounter`.
    """
    if not resp.hits:
        if resp.scope is None:
            return f"No results for '{one_line(resp.query, 200)}'."
        note = f"\nNote: {one_line(resp.notice, 1000)}" if resp.notice else ""  # e.g. a context with no sources
        return _fit(lambda q: summary_line(resp, q) + note, max_tokens, counter)
    blocks = _blocks(resp)
    nonce = fence_nonce([resp.query, *(ln for b in blocks for ln in b.head), *(h.content for h in resp.hits)])

    def tail(shown: int) -> list[str]:  # the Note line; a more-match note counts the results the text shows
        if resp._more_match_cap is not None:
            note = more_match_note(len(resp.hits), shown, resp._more_match_cap, resp._more_match_files,
                                   resp._more_match_at_cap)
            return [f"Note: {note}"]
        return [f"Note: {one_line(resp.notice)}"] if resp.notice else []

    summary = summary_line(resp) if resp.scope is not None else None
    whole = _assemble(summary, [(b, len(b.lines)) for b in blocks], nonce, tail(len(blocks)))
    if max_tokens is None or (counter := counter or _fallback_counter()).count(whole) <= max_tokens:
        return whole
    return _pack(resp, blocks, nonce, tail, max_tokens, counter)


def more_match_note(found: int, shown: int, cap: int, files: bool = False, at_cap: bool = False) -> str:
    """The notice of an exact/regex search that stopped at ``max_results`` (hostile review L5): ``found`` results
    returned (``files``: files, grouped by file), ``shown`` of them in a text answer within its token budget,
    ``cap`` the largest ``max_results`` (``query.max_results_cap``); ``at_cap``: ``max_results`` is already that,
    so only narrowing helps (hostile review: the note said to raise it at 50 of 50)."""
    if files:  # the chunks read before grouping ran out: later files, and later matches of these, are not listed
        text = (f"more chunks match than were read for the {found} file{'s' if found != 1 else ''} found (in path "
                "order; later files and later matching lines of these are not listed)")
    else:
        text = f"more chunks match than the {found} result{'s' if found != 1 else ''} found (in path order)"
    if shown < found:
        text += f", {shown} of them shown within the token budget"
    if at_cap:
        return text + "; narrow with file_patterns, languages or source_id"
    return text + f"; raise max_results (at most {cap}) or narrow with file_patterns"


def _fit(make: Callable[[int], str], max_tokens: int | None, counter: Counter | None) -> str:
    """``make(query_chars)`` with the query echo shortened until the line fits ``max_tokens``."""
    text = make(200)
    if max_tokens is None:
        return text
    counter = counter or _fallback_counter()
    for q in (200, 80, 30, 10, 0):
        text = make(q)
        if counter.count(text) <= max_tokens:
            return text
    return _hard_cut(text, max_tokens, counter)


def _hard_cut(text: str, max_tokens: int, counter: Counter) -> str:
    """The longest prefix of ``text`` (by characters) within ``max_tokens``: the last resort of the budget."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter.count(text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def _budget_line(max_tokens: int, counter: Counter, omitted: list[_Block]) -> str:
    text = f"Budget: {int(max_tokens)} tokens ({one_line(getattr(counter, 'name', 'tokens'), 60)})"
    if omitted:
        text += (f"; {len(omitted)} result{'s' if len(omitted) != 1 else ''} omitted: "
                 + ", ".join(f"[{b.n}] {field(b.hit.path, 120)}:{int(b.hit.start_line)}-{int(b.hit.end_line)}"
                             for b in omitted[:MAX_LISTED])
                 + (f" +{len(omitted) - MAX_LISTED} more" if len(omitted) > MAX_LISTED else ""))
    return text + "."


def _pack(resp: SearchResponse, blocks: list[_Block], nonce: str, tail: Callable[[int], list[str]], max_tokens: int,
          counter: Counter) -> str:
    """Greedy packing, best first, verified against the whole text's count (see :func:`render_text`).

    Per-block counts are summed (a tokenizer's count of joined text can differ slightly from the sum), so the whole
    text is counted at the end; when it is over, the packing target shrinks by the excess and packing runs again.
    The last resort is the summary and the ``Budget:`` line naming every result as omitted.
    """
    target = max_tokens
    query_chars = 200
    reserve = 60  # room for the Budget line and a cut line, checked below on the whole text
    fence = ["<<<chunk-" + nonce, "chunk-" + nonce + ">>>"]
    for _ in range(6):
        summary = summary_line(resp, query_chars) if resp.scope is not None else None
        used = counter.count(summary) if summary else 0
        kept: list[tuple[_Block, int]] = []
        stop = False
        for b in blocks:
            whole = counter.count("\n".join([*b.head, fence[0], *b.lines, fence[1]]))
            if used + whole + reserve <= target:
                kept.append((b, len(b.lines)))
                used += whole
                continue
            fixed = counter.count("\n".join([*b.head, *fence]))
            lo, hi = 0, len(b.lines)  # the largest line prefix that fits
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if used + fixed + counter.count("\n".join(b.lines[:mid])) + reserve <= target:
                    lo = mid
                else:
                    hi = mid - 1
            if lo > 0:
                kept.append((b, lo))
            stop = True
            break
        done = {b.n for b, _ in kept}
        omitted = [b for b in blocks if b.n not in done]
        budget = [_budget_line(max_tokens, counter, omitted)] if stop else []
        text = _assemble(summary, kept, nonce, [*tail(len(kept)), *budget])
        total = counter.count(text)
        if total <= max_tokens and kept:
            return text
        if total <= max_tokens:
            break  # it fits, but shows no result: the compact form below
        target -= (total - max_tokens) + 10
        query_chars = max(0, query_chars // 2)
    return _first_only(resp, blocks[0], len(blocks) - 1, nonce, tail, max_tokens, counter)


def _first_only(resp: SearchResponse, first: _Block, rest: int, nonce: str, tail: Callable[[int], list[str]],
                max_tokens: int, counter: Counter) -> str:
    """The answer of a budget too small for the full packing (hostile review 2, H8: at ``max_tokens`` 100 no
    result was shown): the first result alone with its header line only (no ``why:``/``also`` lines) and as many
    of its lines as fit, the other results counted on a short ``Budget:`` line; the summary's query echo, the
    ``Note:`` line and then the summary are given up first. When no line fits, the header alone with a line
    naming the lines not shown (a ``read`` of path and blob gives them); when not even that fits, one line names
    the smallest budget that shows the first line, after the summary line when both fit (the count and scope tell
    an agent how much there is and where it was searched)."""
    head = _Block(first.n, first.head[:1], first.lines, first.hit)
    budget = f"Budget: {int(max_tokens)} tokens" + (
        f"; {rest} more result{'s' if rest != 1 else ''} omitted" if rest else "") + "."
    h = first.hit
    unshown = (f"[{first.n}] lines {int(h.start_line)}-{int(h.end_line)} not shown: over the token budget "
               "(read them by path and blob)")

    def text(query_chars: int | None, note: bool, keep: int) -> str:
        summary = summary_line(resp, query_chars) if resp.scope is not None and query_chars is not None else None
        notes = tail(1 if keep else 0) if note else []
        if keep:
            return _assemble(summary, [(head, keep)], nonce, [*notes, budget])
        return "\n\n".join([*([summary] if summary else []), "\n".join([*head.head, unshown]), *notes, budget])

    tries: list[tuple[int | None, bool]] = [(200, True), (30, True), (0, True), (0, False), (None, False)]
    for q, notes in tries:
        if counter.count(text(q, notes, 1)) > max_tokens:
            continue
        lo, hi = 1, len(head.lines)  # the largest line prefix that fits, counted on the whole text
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if counter.count(text(q, notes, mid)) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        return text(q, notes, lo)
    for q, notes in tries:
        if counter.count(text(q, notes, 0)) <= max_tokens:
            return text(q, notes, 0)
    # The count of this answer's fence lines depends on its nonce (an all-digit one counts 5 estimated tokens, a
    # mixed one 12; a word-piece tokenizer splits hex in many ways), and the next answer draws another nonce and
    # names another budget: the budget named here holds with any nonce (each of its characters one token at most,
    # both fences) and any number of that many digits.
    worst = 2 * max(0, 2 * NONCE_BYTES - (counter.count(nonce) - counter.count("")))
    need = counter.count(text(None, False, 1)) + worst
    need += len(str(need)) + 1
    small = (f"Budget: {int(max_tokens)} tokens is too small to show a result: the first one's header and first "
             f"line need {need}; ask again with max_tokens of at least {need}.")
    short = (f"Budget: {int(max_tokens)} tokens is too small to show a result; ask again with max_tokens of at "
             f"least {need}.")
    for query_chars in ((200, 30, 0) if resp.scope is not None else ()):
        summary = summary_line(resp, query_chars)
        for line in (small, short):
            if counter.count(summary + "\n\n" + line) <= max_tokens:
                return summary + "\n\n" + line
    return _fit(lambda q: small, max_tokens, counter)


def validation_message(errors: Iterable[Mapping[str, Any]], max_errors: int = 3) -> str:
    """One line for pydantic validation errors (``ValidationError.errors()``): ``loc: msg`` joined by ``; ``.

    A model-level check (empty ``loc``) gives just its message; pydantic's ``Value error, `` prefix and its
    documentation URLs are left out; at most ``max_errors`` errors are named (then ``(+N more)``). Used by REST,
    MCP and the CLI alike, so the same bad input reads the same everywhere.
    """
    parts = []
    errs = list(errors)
    for err in errs[:max_errors]:
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(one_line(f"{loc}: {msg}" if loc else msg, 600))
    more = f" (+{len(errs) - max_errors} more)" if len(errs) > max_errors else ""
    return "; ".join(parts) + more
