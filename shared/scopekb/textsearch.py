"""Line matching for the ``exact`` and ``regex`` search modes, and the literal filters the stores narrow them by.

A search in these modes runs in two steps (the Google Code Search method: an index narrows, a matcher decides):

1. The store returns *candidate* chunks: those whose content holds every literal of one of the groups of a
   :class:`LiteralQuery` (OpenSearch: ``term`` queries for the 3-grams of each literal on the ``content.tri`` field,
   :func:`scopekb.fields.trigram_clauses`; SQLite: a ``trigram`` FTS5 table). Candidates are a superset of the answer.
2. :meth:`LinePattern.lines` verifies each candidate line by line and returns the matching line numbers. Only
   chunks with at least one matching line are hits, so the answer is exactly what ``git grep -n -F`` / ``-E``
   gives on the same text, line for line.

Regexes are RE2 syntax (google-re2: linear time in the text, no backtracking, no backreferences or lookaround)
with limits on pattern length and compiled size; a pattern over a limit, or one RE2 does not support, raises
:class:`PatternRefused` (HTTP 400 naming the limit). Literals are extracted from the parsed pattern (alternation,
groups, repetition with a minimum of one); a pattern with no literal of :data:`MIN_LITERAL` characters gives no
filter and the search scans the scope's chunks up to ``query.text_scan_max``.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2

from scopekb.patterns import PatternRefused

#: Shortest literal worth a candidate filter (trigram indexes cannot use shorter ones).
MIN_LITERAL = 3
#: At most this many OR-groups and literals per group in a filter (a larger product is narrowed by dropping).
_MAX_GROUPS, _MAX_PER_GROUP = 16, 8
#: Syntax whose meaning differs between RE2 and Python's parser (used only to find literals): no filter then.
_OPAQUE = ("[:", "\\p", "\\P", "\\Q", "\\C", "\\z")


#: Anchors that RE2 reads against the text searched (each line here): ``^`` and ``\A`` at the line start, ``$`` and
#: ``\z`` at the line end, like ``git grep -E`` per line. Patterns with one skip the whole-chunk shortcut.
_ANCHORED = re2.compile(r"[$^]|\\[Az]")
#: An inline flag group that sets ``i`` (``(?i)``, ``(?si)``, ``(?i:...)``); matched on the raw text, so an escaped
#: look-alike only makes the filter case-insensitive (wider, never wrong).
_IGNORECASE_FLAG = re2.compile(r"\(\?[A-Za-z]*i")


def ignores_case(pattern: str) -> bool:
    """Whether any part of the RE2 ``pattern`` matches ignoring case (an inline ``i`` flag, global or scoped)."""
    return _IGNORECASE_FLAG.search(pattern) is not None


@dataclass(frozen=True)
class LiteralQuery:
    """Candidate filter: content holding every literal of at least one group (OR of ANDs).

    ``groups == ()`` means no filter (every chunk of the scope is a candidate). With ``case_sensitive`` false the
    literals are ASCII and compared ignoring ASCII case (what OpenSearch's ``case_insensitive`` wildcard and
    SQLite's trigram tokenizer both do).
    """

    groups: tuple[tuple[str, ...], ...]
    case_sensitive: bool


@dataclass(frozen=True)
class RegexLimits:
    """Bounds on a regex (defaults: :class:`scopekb.settings.QuerySettings`). ``max_length`` characters;
    ``max_mem`` bytes of RE2 program memory (a pattern such as ``(a{999}){999}`` exceeds it)."""

    max_length: int = 512
    max_mem: int = 1 << 20


class LinePattern:
    """A compiled ``exact`` or ``regex`` query: :meth:`lines` gives the matching lines of a chunk."""

    def __init__(self, mode: str, query: str, case_sensitive: bool, limits: RegexLimits = RegexLimits()) -> None:
        self.mode = mode
        self.query = query
        self.case_sensitive = case_sensitive
        self._regex: Any = None
        if mode == "exact":
            if not case_sensitive:
                self._regex = _compile(re2.escape(query), False, limits.max_mem)
            self.literals = LiteralQuery(_needle_groups([query], case_sensitive), case_sensitive)
        elif mode == "regex":
            if len(query) > limits.max_length:
                raise PatternRefused(f"regex of {len(query)} characters; at most {limits.max_length} are allowed "
                                     "(query.regex_max_length)")
            self._regex = _compile(query, case_sensitive, limits.max_mem)
            # the candidate filter is never stricter than RE2: any (?i) / (?i:...) part makes it case-insensitive
            sensitive = case_sensitive and not ignores_case(query)
            self.literals = LiteralQuery(regex_literals(query, sensitive), sensitive)
        else:
            raise ValueError(f"not a line mode: {mode!r}")

    def lines(self, content: str, start_line: int) -> list[int]:
        """Absolute line numbers (``start_line`` is the chunk's first line) of the lines of ``content`` that
        match, ascending; empty when none does."""
        if self._regex is None:  # exact, case-sensitive: find every occurrence, map offsets to lines
            q = self.query
            i = content.find(q)
            if i < 0:
                return []
            breaks = _breaks(content)
            out: list[int] = []
            while i >= 0:
                n = bisect.bisect_right(breaks, i)
                out.append(start_line + n)
                nxt = breaks[n] + 1 if n < len(breaks) else len(content)
                i = content.find(q, max(nxt, i + 1))
            return out
        rx = self._regex
        if rx.search(content) is None and "\n" not in self.query and not _ANCHORED.search(self.query):
            # no match in the whole text: none in any line either, except for patterns with a text-boundary
            # anchor (^ $ \A \z), which hold at each line's start/end but only once in the whole text
            return []
        return [start_line + n for n, line in enumerate(content.split("\n")) if rx.search(line) is not None]


def _breaks(content: str) -> list[int]:
    out = []
    i = content.find("\n")
    while i >= 0:
        out.append(i)
        i = content.find("\n", i + 1)
    return out


#: RE2 parse errors that name a construct RE2 does not have (Perl's backreferences and lookarounds), as opposed
#: to a malformed pattern.
_UNSUPPORTED = re.compile(r"invalid escape sequence: \\[1-9]|invalid perl operator|invalid named capture")
#: The numbers of a ``{m,n}`` quoted in RE2's "invalid repetition size" error.
_REPEAT_BOUNDS = re.compile(r"(\d+)")


@lru_cache(maxsize=512)
def _compile(pattern: str, case_sensitive: bool, max_mem: int) -> Any:
    opts = re2.Options()
    opts.max_mem = max_mem
    opts.case_sensitive = case_sensitive
    opts.log_errors = False
    try:
        return re2.compile(pattern, opts)
    except re2.error as e:
        arg = e.args[0] if e.args else ""
        msg = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
        bounds = [int(n) for n in _REPEAT_BOUNDS.findall(msg)]
        if "repetition size" in msg and not (len(bounds) == 2 and bounds[0] > bounds[1]):
            raise PatternRefused("regex repeats more than 1000 times in total (RE2's repetition limit); use "
                                 "fewer or smaller {m,n} repetitions") from None
        if "too large" in msg or "memory" in msg.lower():
            raise PatternRefused(f"regex compiles to more than {max_mem} bytes of RE2 program memory "
                                 "(query.regex_max_mem); use fewer or smaller repetitions") from None
        if _UNSUPPORTED.search(msg):  # a backreference, a lookaround, a named-group reference
            raise PatternRefused(f"regex not supported (RE2 syntax: no backreferences or lookaround): {msg[:200]}"
                                 ) from None
        # README newcomer: "(" was answered "not supported ... missing )"; it is a typo, not a feature
        raise PatternRefused(f"regex is not valid: {msg[:200]}") from None


def _ascii_runs(lit: str) -> str:
    """The longest ASCII run of a literal (case-insensitive filters compare ASCII case only)."""
    best = cur = ""
    for ch in lit:
        if ch.isascii():
            cur += ch
            best = cur if len(cur) > len(best) else best
        else:
            cur = ""
    return best


def _needle_groups(lits: list[str], case_sensitive: bool) -> tuple[tuple[str, ...], ...]:
    kept = tuple(x for x in (lits if case_sensitive else [_ascii_runs(x) for x in lits]) if len(x) >= MIN_LITERAL)
    return (kept,) if kept else ()


def regex_literals(pattern: str, case_sensitive: bool = True) -> tuple[tuple[str, ...], ...]:
    """Literals a line matching ``pattern`` must contain, as OR-groups of ANDs; ``()`` when none is certain.

    ``"foo(bar|bazz)"`` → ``(("foo", "bar"), ("foo", "bazz"))`` (runs shorter than :data:`MIN_LITERAL` are
    dropped: ``"a(bc|de)"`` → ``()``). Conservative: any construct it does not understand gives no literal, never
    a wrong one.
    """
    if any(x in pattern for x in _OPAQUE):
        return ()
    try:
        import re._parser as sre_parse  # the standard library's regex parser (read-only use)
    except ImportError:  # pragma: no cover - Python < 3.11
        import sre_parse  # type: ignore[import-not-found,no-redef]
    try:
        parsed = sre_parse.parse(pattern)
    except Exception:  # noqa: BLE001 - syntax Python does not know: no filter, RE2 still decides
        return ()
    if parsed.state.flags & 2 or ignores_case(pattern):  # (?i) anywhere, also scoped (?i:...)
        case_sensitive = False
    dnf = _seq(list(parsed), sre_parse)
    out = []
    for group in dnf:
        kept = [x for x in (group if case_sensitive else [_ascii_runs(g) for g in group]) if len(x) >= MIN_LITERAL]
        if not kept:
            return ()  # one branch needs no literal: no filter is certain
        out.append(tuple(sorted(set(kept), key=lambda x: (-len(x), x))[:_MAX_PER_GROUP]))
    return tuple(dict.fromkeys(out))


_Dnf = list[list[str]]


def _and(a: _Dnf, b: _Dnf) -> _Dnf:
    if len(a) * len(b) > _MAX_GROUPS:  # keep the side with the longest literals rather than explode
        return a if max((len(x) for g in a for x in g), default=0) >= max((len(x) for g in b for x in g),
                                                                         default=0) else b
    return [x + y for x in a for y in b]


def _seq(items: list[Any], sp: Any) -> _Dnf:
    """DNF of a sequence of parsed items: consecutive literals join into runs; required sub-parts AND in."""
    dnf: _Dnf = [[]]
    run: list[str] = []

    def flush() -> None:
        nonlocal dnf
        if run:
            dnf = _and(dnf, [["".join(run)]])
            run.clear()

    for op, av in items:
        if op is sp.LITERAL:
            run.append(chr(av))
            continue
        flush()
        sub: _Dnf | None = None
        if op is sp.SUBPATTERN:
            sub = _seq(list(av[-1]), sp)
        elif op in (sp.MAX_REPEAT, sp.MIN_REPEAT, getattr(sp, "POSSESSIVE_REPEAT", None)) and av[0] >= 1:
            sub = _seq(list(av[2]), sp)
        elif op is sp.BRANCH:
            sub = []
            for alt in av[1]:
                sub.extend(_seq(list(alt), sp))
            if len(sub) > _MAX_GROUPS:
                sub = None
        if sub:
            dnf = _and(dnf, sub)
    flush()
    return dnf
