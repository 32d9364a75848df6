"""User-controlled path globs compiled to a bounded form (issue 16; DESIGN §13: "any user-controlled pattern is
compiled to a bounded form or refused with 400").

Every glob that reaches a store or a path filter goes through :func:`compile_glob`: search ``file_patterns`` (SQLite
and OpenSearch), a source's ``include``/``exclude`` and the ``.gitattributes`` patterns of an indexed repository.
A compiled :class:`PathGlob` matches with RE2 (google-re2: linear time in the path length, no backtracking; Python's
``re`` took 8 s for ``*?*?*?*?*?*?*?*?*?*?Z`` against one path), and expands into a bounded number of OpenSearch
``wildcard`` values. Patterns over a limit raise :class:`PatternRefused`, whose message names the limit and the
setting that holds it.

Glob syntax (one dialect for both stores): ``*`` and ``**`` match any characters including ``/``; ``**/`` also
matches no folder at all (``src/**/*.py`` matches ``src/a.py``); ``?`` matches one character; with
``classes=True`` (source include/exclude, ``.gitattributes``: the fnmatch dialect they always had) ``[abc]``,
``[a-z]`` and ``[!abc]`` match one character of a class, otherwise ``[`` is literal (OpenSearch's wildcard query has
no classes). A pattern without ``/`` matches the file name in any folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import re2

#: RE2 memory budget per compiled glob in bytes (RE2's own default is 8 MiB; a 256-character glob needs far less).
_RE2_MAX_MEM = 1 << 20


class PatternRefused(ValueError):
    """A pattern over a limit or not compilable (HTTP 400); the message names the limit and its setting."""


@dataclass(frozen=True)
class PatternLimits:
    """Bounds on one request's patterns. Defaults are those of :class:`scopekb.settings.QuerySettings`.

    Attributes:
        max_length: characters per pattern.
        max_wildcards: ``*``/``**``/``?``/``[...]`` per pattern. Bounds the OpenSearch wildcard automaton (Lucene
            refuses above 10,000 determinized states; ``*a`` followed by n ``?`` needs 2**n of them).
        max_globstars: ``**/`` per pattern; each doubles the OpenSearch wildcard alternatives of the pattern.
        max_patterns: patterns per request.
    """

    max_length: int = 256
    max_wildcards: int = 10
    max_globstars: int = 3
    max_patterns: int = 20
    #: Names of the settings holding the limits, quoted in refusals.
    setting_prefix: str = "query"


#: Limits for patterns no request chose (a source's include/exclude, ``.gitattributes``) and the ceiling stores
#: apply to whatever reaches them.
DEFAULT_LIMITS = PatternLimits()
CEILING = PatternLimits(max_length=1024, max_wildcards=32, max_globstars=4, max_patterns=64)
#: A source's ``include``/``exclude`` (fixed limits, checked at registration; fnmatch classes allowed).
SOURCE_LIMITS = PatternLimits(max_length=256, max_wildcards=16, max_globstars=3, max_patterns=100,
                              setting_prefix="source")
#: Patterns of an indexed repository's ``.gitattributes`` (each is tried on every path a sync reads or compares:
#: about 3.5 µs a rule and path here for hostile patterns, so at most 500 rules keep the worst case near 1.8 ms a
#: file, about what chunking it costs; 2,000 rules cost a 3,000-file tree 30 s, hostile review).
GITATTRIBUTES_LIMITS = PatternLimits(max_length=1024, max_wildcards=32, max_globstars=4, max_patterns=500,
                                     setting_prefix="gitattributes")


@dataclass(frozen=True)
class PathGlob:
    """A compiled path glob: RE2 full-match on repository paths and the equivalent OpenSearch wildcard values."""

    text: str
    regex: re2._Regexp  # type: ignore[name-defined]  # google-re2's compiled pattern type
    #: OpenSearch ``wildcard`` values (``*``/``?`` with ``\\`` escaping) that together match what :meth:`match`
    #: matches; empty when the pattern uses character classes (those are matched in Python only).
    wildcards: tuple[str, ...]

    def match(self, path: str) -> bool:
        """True when the whole ``path`` matches (linear time in ``len(path)``)."""
        return self.regex.fullmatch(path) is not None


def _count(glob: str, classes: bool) -> tuple[int, int]:
    """``(wildcards, globstars)`` of a glob: runs of ``*`` count once, ``**/`` counts as a globstar too."""
    wild = stars = i = 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            j = i
            while j < len(glob) and glob[j] == "*":
                j += 1
            wild += 1
            if j - i >= 2 and glob.startswith("/", j):
                stars += 1
            i = j
            continue
        if c == "?" or (classes and c == "[" and _class_end(glob, i) > 0):
            wild += 1
            i = _class_end(glob, i) + 1 if c == "[" else i + 1
            continue
        i += 1
    return wild, stars


def _class_end(glob: str, i: int) -> int:
    """Index of the ``]`` closing the class opened at ``glob[i] == "["`` (fnmatch rules), or -1 when unclosed."""
    j = i + 1
    if j < len(glob) and glob[j] == "!":
        j += 1
    if j < len(glob) and glob[j] == "]":
        j += 1
    end = glob.find("]", j)
    return end


def _class_regex(body: str) -> str:
    neg = body.startswith("!")
    if neg:
        body = body[1:]
    out = []
    for k, c in enumerate(body):
        if c == "-" and 0 < k < len(body) - 1:
            out.append("-")
        else:
            out.append(re2.escape(c))
    return "[" + ("^" if neg else "") + "".join(out) + "]"


def check_glob(glob: str, limits: PatternLimits = DEFAULT_LIMITS, classes: bool = False) -> None:
    """Refuse ``glob`` when over a limit.

    Raises:
        PatternRefused: too long, too many wildcards or ``**/`` segments, empty, or containing NUL/control
            characters; the message names the limit and its setting (e.g. ``query.max_pattern_wildcards``).
    """
    p = limits.setting_prefix
    if not glob:
        raise PatternRefused("a path pattern must not be empty")
    if len(glob) > limits.max_length:
        raise PatternRefused(f"path pattern of {len(glob)} characters; at most {limits.max_length} are allowed "
                             f"({p}.max_pattern_length)")
    if any(ord(c) < 32 or ord(c) == 127 for c in glob):
        raise PatternRefused("path pattern contains control characters")
    wild, stars = _count(glob, classes)
    if wild > limits.max_wildcards:
        raise PatternRefused(f"path pattern has {wild} wildcards (*, **, ?{', [...]' if classes else ''}); at most "
                             f"{limits.max_wildcards} are allowed ({p}.max_pattern_wildcards)")
    if stars > limits.max_globstars:
        raise PatternRefused(f"path pattern has {stars} '**/' segments; at most {limits.max_globstars} are allowed "
                             f"({p}.max_pattern_globstars)")


@lru_cache(maxsize=4096)
def _compile(glob: str, classes: bool) -> PathGlob:
    out: list[str] = []
    wild: list[str] = []  # the pattern as one OpenSearch wildcard value, "**/" kept as a marker \0
    has_class = False
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            wild.append("\0")
            i += 3
        elif c == "*":
            while i < len(glob) and glob[i] == "*" and not glob.startswith("**/", i):
                i += 1
            out.append(".*")
            wild.append("*")
        elif c == "?":
            out.append(".")
            wild.append("?")
            i += 1
        elif classes and c == "[" and _class_end(glob, i) > 0:
            end = _class_end(glob, i)
            out.append(_class_regex(glob[i + 1:end]))
            has_class = True
            i = end + 1
        else:
            out.append(re2.escape(c))
            wild.append("\\" + c if c in "*?\\" else c)
            i += 1
    body = "".join(out)
    if "/" not in glob:
        body = "(?:.*/)?" + body
    return PathGlob(text=glob, regex=bounded_regex(body, glob), wildcards=() if has_class else _wildcards(
        "".join(wild), glob))


def bounded_regex(body: str, glob: str, latin1: bool = False) -> re2._Regexp:  # type: ignore[name-defined]
    """``body`` (RE2 syntax, translated from the path pattern ``glob``) compiled within the memory budget every
    path pattern gets (:data:`_RE2_MAX_MEM`); ``.`` matches any character of a path. ``latin1``: ``body`` holds
    only U+0000-U+00FF and is compiled over bytes (match ``bytes``; one character = one byte).

    Raises:
        PatternRefused: RE2 cannot compile it within the budget (the message names ``glob``, cut to 80 characters).
    """
    opts = re2.Options()
    opts.max_mem = _RE2_MAX_MEM
    opts.dot_nl = True
    if latin1:
        opts.encoding = re2.Options.Encoding.LATIN1
    try:
        return re2.compile(body.encode("latin-1") if latin1 else body, opts)
    except re2.error as e:
        raise PatternRefused(f"path pattern {glob[:80]!r} cannot be compiled: {e}") from None


def _wildcards(marked: str, glob: str) -> tuple[str, ...]:
    """Expand the ``\\0`` markers (``**/``) into "no folder" or "any folders" (``*/``): at most 2**globstars values,
    plus the any-folder variant of a pattern without ``/``."""
    parts = marked.split("\0")
    alts = [parts[0]]
    for part in parts[1:]:
        alts = [a + sep + part for a in alts for sep in ("", "*/")]
    out = []
    for a in alts:
        while "**" in a:  # a run of * matches what one * matches, and costs less
            a = a.replace("**", "*")
        out.append(a)
    if "/" not in glob:
        out = [w for a in out for w in (a, "*/" + a)]
    return tuple(dict.fromkeys(out))


def compile_glob(glob: str, limits: PatternLimits = DEFAULT_LIMITS, classes: bool = False) -> PathGlob:
    """Check ``glob`` against ``limits`` and compile it (cached).

    Raises:
        PatternRefused: over a limit (see :func:`check_glob`) or not compilable (e.g. a reversed class range).
    """
    check_glob(glob, limits, classes)
    return _compile(glob, classes)


def compile_globs(globs: Sequence[str], limits: PatternLimits = DEFAULT_LIMITS, classes: bool = False,
                  what: str = "file_patterns") -> tuple[PathGlob, ...]:
    """Compile a request's patterns; refuse the request when there are too many or one is over a limit.

    Raises:
        PatternRefused: the message names the offending entry (``file_patterns[3]: ...``) and the limit.
    """
    if len(globs) > limits.max_patterns:
        raise PatternRefused(f"{what} has {len(globs)} entries; at most {limits.max_patterns} are allowed "
                             f"({limits.setting_prefix}.max_patterns)")
    out = []
    for n, g in enumerate(globs):
        try:
            out.append(compile_glob(g, limits, classes))
        except PatternRefused as e:
            raise PatternRefused(f"{what}[{n}]: {e}") from None
    return tuple(out)
