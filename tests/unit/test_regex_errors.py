"""A regex the search refuses says why in words that fit the mistake (README newcomer, stop 43: a missing ``)``
was answered "regex not supported (RE2 syntax: no backreferences or lookaround)")."""

from __future__ import annotations

import pytest

from scopekb.patterns import PatternRefused
from scopekb.textsearch import _compile


@pytest.mark.parametrize(("pattern", "reason"), [
    ("(", "regex is not valid: missing ): ("),
    ("[z-a]", "regex is not valid: invalid character class range"),
    ("a{2,1}", "regex is not valid: invalid repetition size: {2,1}"),
    ("(a)\\1", "regex not supported (RE2 syntax: no backreferences or lookaround)"),
    ("(?=x)y", "regex not supported (RE2 syntax: no backreferences or lookaround)"),
    ("(?<!x)y", "regex not supported (RE2 syntax: no backreferences or lookaround)"),
    ("a{1001}", "RE2's repetition limit"),
])
def test_refused_regexes_say_why(pattern: str, reason: str) -> None:
    with pytest.raises(PatternRefused) as e:
        _compile(pattern, True, 8 << 20)
    assert reason in str(e.value) and "\n" not in str(e.value)
