"""Skip policy for CI: every skipped test must be on an allow-list with a reason (issue 18).

``.ci/run`` sets ``SCOPEKB_ALLOWED_SKIPS`` to the allow-list file (``tests/allowed_skips.txt``); the hooks in
``tests/conftest.py`` then collect every skip (at collection, setup or call), print how many there were, and turn
the session's exit status into 1 when a skip matches no entry. Without the variable (a developer's pytest run)
skips are only counted.

Allow-list format, one entry a line; blank lines and lines starting with ``#`` are ignored::

    <pattern> | <reason>

``pattern`` is the pytest node id (``tests/unit/test_x.py::test_y[param]``, or a module's path for a skip at
collection), where ``*`` matches any run of characters (also across ``::`` and ``[...]``); every other character,
brackets included, is literal. ``reason`` is required: why the skip is acceptable in CI. An entry without a
reason is an error, so the list cannot silently grow into a blanket pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ENV = "SCOPEKB_ALLOWED_SKIPS"


@dataclass(frozen=True)
class Allowed:
    """One allow-list entry: node-id pattern and the reason it may be skipped in CI."""

    pattern: str
    reason: str


def load(path: Path) -> list[Allowed]:
    """Parse an allow-list file.

    Raises:
        ValueError: a line has no ``|`` or an empty pattern or reason (message names the line).
    """
    entries = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pattern, sep, reason = (s.strip() for s in line.partition("|"))
        if not sep or not pattern or not reason:
            raise ValueError(f"{path}:{n}: expected '<node id pattern> | <reason>', got {raw!r}")
        entries.append(Allowed(pattern, reason))
    return entries


def unexpected(skipped: list[tuple[str, str]], allowed: list[Allowed]) -> list[tuple[str, str]]:
    """The ``(node id, skip message)`` pairs no entry of ``allowed`` matches."""
    regexes = [re.compile(".*".join(map(re.escape, a.pattern.split("*")))) for a in allowed]
    return [(nid, msg) for nid, msg in skipped if not any(r.fullmatch(nid) for r in regexes)]
