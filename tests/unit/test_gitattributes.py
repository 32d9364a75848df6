"""``.gitattributes`` read by git's rules in bounded time (hostile review, stop 42: only the root file was read,
``-attr``/``attr=false``/``!attr`` and later lines were ignored, ``lib/*`` matched ``lib/sub/b.py``).

The expected answers come from git itself: ``git check-attr`` on a real repository holding the same files (git is
trusted with these small, well-formed patterns; the product does not hand patterns to git, whose matcher took
minutes on hostile ones)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from scopekb.gitattributes import attributes_set, pattern_regex
from scopekb.patterns import PatternRefused

NAMES = ("linguist-vendored", "linguist-generated")
PATHS = ["main.py", "lib/a.py", "lib/sub/b.py", "lib/x.py", "gen/out.py", "gen/keep.py", "docs/api.md",
         "deep/er/gen/out.py", "vendor/j/q.js", "a.min.js", "src/a.min.js", "keep.py", "src/lib/c.py",
         "weird name.py", "k[1].py", "q?.py", "a\u00a0b.py", "x.js"]
CASES = {
    "overrides": {"": "* linguist-generated\n*.py -linguist-generated\n"},
    "value_false_and_unspecified": {"": "*.py linguist-vendored\nkeep.py linguist-vendored=false\n"
                                        "main.py !linguist-vendored\n"},
    "anchored_and_unanchored": {"": "lib/* linguist-vendored\n*.min.js linguist-generated\n/gen/out.py "
                                    "linguist-generated\n"},
    "globstar": {"": "**/gen/** linguist-generated\nvendor/** linguist-vendored\n"},
    "nested_files": {"": "*.py linguist-generated\n", "lib": "*.py -linguist-generated\nx.py linguist-generated\n",
                     "deep/er": "gen/* linguist-vendored=true\n"},
    "folder_pattern_matches_no_file": {"": "lib/ linguist-vendored\ngen linguist-vendored\n"},
    # git separates fields by space, tab and CR only: VT, FF and NBSP belong to the pattern or the name (hostile
    # review: str.split() made "\v*.py linguist-generated" mark every .py file)
    "blank_characters": {"": "\x0b*.py linguist-generated\n*.js linguist-generated\x0clinguist-vendored\n"
                             "a\u00a0b.py linguist-generated\n\tx.js\t\tlinguist-vendored \r\n"},
    # git's wildmatch compares bytes: "?" is one byte, so U+00A0 (two bytes in UTF-8) needs "??"
    "byte_wildcards": {"": "a?b.py linguist-generated\na??b.py linguist-vendored\n*\u00a0*.py linguist-generated\n"},
    "classes_and_escapes": {"": "k[0-9].py linguist-generated\nq\\?.py linguist-generated\nweird\\ name.py "
                                "linguist-vendored\n[!m]ain.py linguist-vendored\n"},
}


def _git_answer(tmp: Path, files: dict[str, str]) -> frozenset[str]:
    repo = tmp / "repo"
    for p in PATHS:
        (repo / p).parent.mkdir(parents=True, exist_ok=True)
        (repo / p).write_text("x\n")
    for folder, text in files.items():
        (repo / folder / ".gitattributes").write_text(text)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    out = subprocess.run(["git", "-C", str(repo), "-c", "core.attributesFile=/dev/null", "check-attr", "-z",
                          "--stdin", *NAMES], input="\0".join(PATHS).encode(), capture_output=True, check=True,
                         env={"GIT_ATTR_NOSYSTEM": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp)}).stdout
    f = out.split(b"\0")
    return frozenset(f[i].decode() for i in range(0, len(f) - 2, 3) if f[i + 2] in (b"set", b"true"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_paths_git_marks_are_the_paths_marked(tmp_path: Path, case: str) -> None:
    files = CASES[case]
    got, refused = attributes_set(sorted(files.items()), PATHS, NAMES)
    assert all("control characters" in r for r in refused), refused  # "\v*.py": no path has one, in git either
    assert got == _git_answer(tmp_path, files), case


def test_hostile_patterns_are_refused_in_bounded_time() -> None:
    """The patterns that kept ``git add`` busy for minutes (40 stars each, thousands of lines) are over the
    wildcard limit and skipped; what is within the limits matches in linear time."""
    text = "".join(f"{'*a' * 40}b{i} linguist-generated\n" for i in range(3000)) + "*.py linguist-vendored\n"
    paths = ["d/" + "a" * 60 + str(i) for i in range(300)] + ["x.py"]
    from scopekb.gitattributes import REFUSED_SHOWN, AttributeMatcher

    t0 = time.monotonic()
    m = AttributeMatcher([("", text)], NAMES)
    got = {p for p in paths if p in m}
    assert time.monotonic() - t0 < 30
    assert got == {"x.py"} and m.refused_count == 3000 and "wildcards" in m.refused[0]
    assert len(m.refused) == REFUSED_SHOWN  # every skipped line counted, the first ones described


def test_unsupported_constructs_are_refused_not_guessed() -> None:
    for pattern in ("[[:alpha:]]*.py",):
        with pytest.raises(PatternRefused):
            pattern_regex(pattern, "")
    _, refused = attributes_set([("", '"quoted name.py" linguist-vendored\n[attr]gen linguist-generated\n')],
                                ["quoted name.py"], NAMES)
    assert len(refused) == 2


def test_a_huge_file_is_read_only_up_to_the_rule_limit_and_paths_are_matched_when_asked() -> None:
    """Hostile review (stop 43): every line of a 500,000-line ``.gitattributes`` was compiled before the rule cap
    applied (1.15 GB in a worker, 108 s a sync), and every push matched every rule against every path of the tree
    (39 s for a one-line push under 2,000 rules). Now reading stops at the cap, and a path is matched only when a
    sync asks about it."""
    from scopekb.gitattributes import AttributeMatcher
    from scopekb.patterns import GITATTRIBUTES_LIMITS

    cap = GITATTRIBUTES_LIMITS.max_patterns
    text = "".join(f"f{i}.x linguist-generated\n" for i in range(500_000))
    t0 = time.monotonic()
    m = AttributeMatcher([("", text), ("sub", "*.py linguist-generated\n")], NAMES)
    assert time.monotonic() - t0 < 10
    assert len(m.rules) == cap and "f0.x" in m and f"f{cap - 1}.x" in m and f"f{cap}.x" not in m
    assert "sub/a.py" not in m  # the deeper file's rule is past the cap, as the refusals say
    assert any("are not read" in r and "'.gitattributes'" in r for r in m.refused), m.refused
    hostile = "".join(f"{'*a' * 15}{i}x linguist-generated\n" for i in range(cap))
    m = AttributeMatcher([("", hostile)], NAMES)
    t0 = time.monotonic()
    assert ("d/" + "a" * 40 + "7x") in m and "d/plain.py" not in m  # two paths asked: two paths matched
    assert time.monotonic() - t0 < 2 and len(m._seen) == 2
