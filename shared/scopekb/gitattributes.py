"""Which paths of a git tree carry an attribute, by gitattributes(5)'s rules, in bounded time.

A repository's ``.gitattributes`` files are untrusted content: their patterns are checked against
:data:`scopekb.patterns.GITATTRIBUTES_LIMITS` and matched with RE2 (linear time), not handed to git (whose
wildmatch took minutes for ``git add`` of 300 paths under 4,000 patterns of 40 stars each, hostile review). The
rules are git's, which the earlier reader of the root file only did not follow (hostile review, M1):

- every ``.gitattributes`` of the tree applies to the paths under its folder; a deeper file overrides a shallower
  one and, within one file, a later line an earlier one;
- ``attr`` sets, ``-attr`` unsets, ``attr=value`` gives a value, ``!attr`` makes it unspecified again;
- a pattern without ``/`` matches the file name at any depth under the file's folder; one with a ``/`` (a leading
  one included) is anchored there; ``*`` and ``?`` do not match ``/``; ``**/`` matches any folders (none
  included), ``/**`` everything inside; a pattern ending in ``/`` names folders and so no file.

Not followed (rare; the pattern or line is skipped and counted in ``refused``): quoted patterns, character classes
such as ``[[:alpha:]]``, macro definitions (``[attr]name ...``) and attributes set through a macro.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import re2

from scopekb.patterns import GITATTRIBUTES_LIMITS, PatternRefused, bounded_regex, check_glob

#: The states an attribute takes that mean "true" (``attr`` alone, or ``attr=true``).
TRUE_STATES = frozenset({"set", "true"})


@dataclass(frozen=True)
class Rule:
    """One line of a ``.gitattributes``: the paths it matches (``regex``, full match on tree paths) and the states
    it gives the attributes asked about (``{"linguist-generated": "set" | "unset" | "unspecified" | value}``)."""

    regex: re2._Regexp  # type: ignore[name-defined]
    states: dict[str, str]


def _class(pattern: str, i: int) -> tuple[str, int]:
    """The RE2 class for the ``[...]`` starting at ``pattern[i]`` and the index after it; ``("", i)`` when the
    ``[`` opens no class (then it is literal)."""
    j = i + 1
    neg = j < len(pattern) and pattern[j] in "!^"
    if neg:
        j += 1
    start = j
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    end = pattern.find("]", j)
    if end < 0:
        return "", i
    body = pattern[start:end]
    if "[:" in body:
        raise PatternRefused("character class names such as [:alpha:] are not supported")
    out = "".join("-" if c == "-" and 0 < k < len(body) - 1 else _esc(c) for k, c in enumerate(body))
    return "[" + ("^/" if neg else "") + out + "]", end + 1


def _segment_regex(pattern: str) -> str:
    """RE2 text for a wildmatch pattern under WM_PATHNAME (``*``/``?`` stop at ``/``; ``**`` next to slashes
    crosses them)."""
    out: list[str] = []
    i = 0
    if pattern.startswith("**/"):
        out.append("(?:.*/)?")
        i = 3
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(_esc(pattern[i + 1]))
            i += 2
        elif pattern.startswith("/**/", i):
            out.append("/(?:.*/)?")
            i += 4
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif c == "*":
            while i < len(pattern) and pattern[i] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            cls, after = _class(pattern, i)
            if cls:
                out.append(cls)
                i = after
            else:
                out.append(_esc(c))
                i += 1
        else:
            out.append(_esc(c))
            i += 1
    return "".join(out)


def as_bytes_text(text: str) -> str:
    """``text``'s UTF-8 bytes, one character (U+0000-U+00FF) each: git's wildmatch compares bytes, so ``?`` is
    one byte and a two-byte character needs ``??`` (hostile review: ``a?b.py`` matched ``a\u00a0b.py`` here, not
    in git). Names that are not valid UTF-8 (held as surrogate escapes) keep their bytes."""
    return text.encode("utf-8", "surrogateescape").decode("latin-1")


def _esc(c: str) -> str:
    """One character of :func:`as_bytes_text` as a literal of an RE2 pattern compiled as Latin-1."""
    return re2.escape(c) if ord(c) < 0x80 else f"\\x{{{ord(c):02x}}}"


def pattern_regex(pattern: str, folder: str) -> str | None:
    """RE2 text matching the tree paths ``pattern`` matches in the ``.gitattributes`` of ``folder`` (``""`` for
    the root), or None when it can match no file (a folder pattern ending in ``/``). The text is over bytes
    (:func:`as_bytes_text`; compile it with ``latin1=True``, match ``as_bytes_text(path)``).

    Raises:
        PatternRefused: over :data:`~scopekb.patterns.GITATTRIBUTES_LIMITS` or using a construct not supported.
    """
    if pattern.endswith("/"):
        return None
    check_glob(pattern, GITATTRIBUTES_LIMITS, classes=True)
    pattern, folder = as_bytes_text(pattern), as_bytes_text(folder)
    prefix = "".join(_esc(c) for c in folder + "/") if folder else ""
    if "/" not in pattern:
        return prefix + "(?:.*/)?" + _segment_regex(pattern)
    return prefix + _segment_regex(pattern.lstrip("/") if pattern.startswith("/") else pattern)


def _states(tokens: Iterable[str], names: frozenset[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for t in tokens:
        if t.startswith("-") and t[1:] in names:
            out[t[1:]] = "unset"
        elif t.startswith("!") and t[1:] in names:
            out[t[1:]] = "unspecified"
        else:
            name, eq, value = t.partition("=")
            if name in names:
                out[name] = value if eq else "set"
    return out


#: The characters git separates a ``.gitattributes`` line's fields with (attr.c: ``blank``); other Unicode
#: whitespace (VT, FF, NBSP) is part of a pattern or name there, and so here (hostile review: ``\x0b*.py
#: linguist-generated`` marks nothing in git, and marked every .py file when ``str.split`` was used).
_BLANK = re.compile("[ \t\r]+")


def _lines(text: str) -> Iterator[str]:
    """``text``'s lines split at ``\n`` only (as git reads them), one at a time: a large file is never held as a
    list of lines."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        yield text[start:end]
        start = end + 1


#: Skipped lines described (with why) per ``.gitattributes``; the others are only counted, so a file of many
#: refused patterns holds no message per line in memory.
REFUSED_SHOWN = 20


def parse(text: str, folder: str, names: Sequence[str], room: int | None = None
          ) -> tuple[list[Rule], list[str], int]:
    """The rules of one ``.gitattributes`` (in ``folder``) that mention any of ``names``, in file order; the first
    :data:`REFUSED_SHOWN` lines skipped with why (``refused``, then the note that reading stopped at the cap, if
    it did); and how many lines were skipped in all. At most ``room`` rules are made (default: ``max_patterns``);
    reading stops there, so a file of a million rules costs no more than one of ``room`` (hostile review)."""
    wanted = frozenset(names)
    room = GITATTRIBUTES_LIMITS.max_patterns if room is None else room
    rules: list[Rule] = []
    refused: list[str] = []
    skipped = 0
    where = (folder + "/" if folder else "") + ".gitattributes"
    for line in _lines(text):
        parts = [t for t in _BLANK.split(line) if t]
        if len(parts) < 2 or parts[0].startswith("#"):
            continue
        states = _states(parts[1:], wanted)
        if not states:
            continue
        if len(rules) >= max(room, 0):
            refused.append(f"{where[:200]!r}: rules after the first {GITATTRIBUTES_LIMITS.max_patterns} of the "
                           "tree are not read (gitattributes.max_patterns)")
            skipped += 1
            break
        pattern = parts[0]
        try:
            if pattern.startswith(('"', "[attr]", "!")):  # quoted, a macro, a negative pattern (git refuses it)
                raise PatternRefused("quoted, macro and negative patterns are not supported")
            regex = pattern_regex(pattern, folder)
            if regex is None:
                continue
            rules.append(Rule(bounded_regex(regex, pattern, latin1=True), states))
        except PatternRefused as e:  # the file's path and the pattern are repository content: quoted for logs
            skipped += 1
            if len(refused) < REFUSED_SHOWN:
                refused.append(f"{where[:200]!r}: {pattern[:80]!r}: {str(e)[:200]!r}")
    return rules, refused, skipped


class AttributeMatcher:
    """Whether a path ends up with any attribute of ``names`` set or ``true``, by the tree's ``.gitattributes``
    files given as ``(folder, text)`` (``""`` for the root). ``path in matcher`` answers one path, remembered;
    nothing is matched until a path is asked, so a sync that reads a few files asks about those only, not about
    the whole tree (hostile review: every push matched every rule against every path of the tree).

    At most ``GITATTRIBUTES_LIMITS.max_patterns`` rules are read over all files, shallow files first; ``refused``
    says which lines or rules were skipped and why (at most :data:`REFUSED_SHOWN` a file), ``refused_count`` how
    many lines were skipped in all."""

    def __init__(self, files: Sequence[tuple[str, str]], names: Sequence[str]) -> None:
        ordered = sorted(files, key=lambda f: (f[0].count("/") + (1 if f[0] else 0), f[0]))  # shallow before deep
        self.rules: list[Rule] = []
        self.refused: list[str] = []
        self.refused_count = 0
        for folder, text in ordered:
            got, bad, n = parse(text, folder, names, GITATTRIBUTES_LIMITS.max_patterns - len(self.rules))
            self.rules += got
            self.refused += bad
            self.refused_count += n
        self._seen: dict[str, bool] = {}

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str) or not self.rules:
            return False
        hit = self._seen.get(path)
        if hit is None:
            state: dict[str, str] = {}
            raw = path.encode("utf-8", "surrogateescape")  # matched as bytes, as git does (pattern_regex)
            for rule in self.rules:  # later (and deeper) rules override earlier ones
                if rule.regex.fullmatch(raw) is not None:
                    state.update(rule.states)
            hit = self._seen[path] = any(v in TRUE_STATES for v in state.values())
        return hit


def attributes_set(files: Sequence[tuple[str, str]], paths: Iterable[str], names: Sequence[str]
                   ) -> tuple[frozenset[str], list[str]]:
    """The ``paths`` for which any attribute of ``names`` ends up set or ``true`` (:class:`AttributeMatcher`),
    and the skipped lines it describes."""
    m = AttributeMatcher(files, names)
    return frozenset(p for p in paths if p in m), m.refused
