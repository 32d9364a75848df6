"""The CI skip policy (tests/skips.py, hooks in tests/conftest.py): the allow-list format and matching."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import skips

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_allow_list_parses_and_every_entry_has_a_reason() -> None:
    for entry in skips.load(REPO / "tests" / "allowed_skips.txt"):
        assert entry.pattern.startswith("tests/") and entry.reason


def test_entries_without_a_reason_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "allowed.txt"
    f.write_text("# comment\n\ntests/unit/test_a.py::test_b | needs a GPU runner\ntests/unit/test_c.py::*\n")
    with pytest.raises(ValueError, match=r"allowed.txt:4"):
        skips.load(f)


def test_only_listed_skips_are_allowed(tmp_path: Path) -> None:
    f = tmp_path / "allowed.txt"
    f.write_text("tests/e2e/test_x.py::test_gpu[*] | no GPU in CI\ntests/unit/test_y.py | module needs Windows\n")
    allowed = skips.load(f)
    skipped = [("tests/e2e/test_x.py::test_gpu[a]", "no GPU"), ("tests/unit/test_y.py", "not Windows"),
               ("tests/unit/test_chunking_realfiles.py::test_known_definition[go:Index]", "go is not installed")]
    assert skips.unexpected(skipped, allowed) == [skipped[2]]
