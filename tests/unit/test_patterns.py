"""Issue 16, item 3: every user-controlled pattern is compiled to a bounded form or refused with 400 naming the
limit — search ``file_patterns`` on both stores (SQLite here, OpenSearch in tests/integration/test_isolation.py),
a source's include/exclude, and the ``.gitattributes`` patterns of an indexed repository."""

from __future__ import annotations

import fnmatch
import hashlib
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from scopekb import fields as F
from scopekb import filetypes
from scopekb.auth import resolve_scope
from scopekb.models import SearchRequest, SourceCreate
from scopekb.patterns import (
    CEILING,
    DEFAULT_LIMITS,
    PatternLimits,
    PatternRefused,
    compile_glob,
    compile_globs,
)
from scopekb.search import SearchUnavailable, run_search
from scopekb.settings import QuerySettings
from scopekb.stores.base import ScopeFilter, SearchFilter
from scopekb.stores.sqlite import SqliteChunkStore

#: The issue's input: 21 characters, 20 wildcards; Python's backtracking regex took 8 s on one path.
ISSUE_PATTERN = "*?*?*?*?*?*?*?*?*?*?Z"
#: Within every limit (9 wildcards) and still exponential for a backtracking engine on a long path without Z.
NASTY_BUT_ALLOWED = "*?*?*?*?*Z"
LONG_PATH = "a/" * 400 + "b" * 200


def test_the_issue_pattern_is_refused_naming_the_limit() -> None:
    with pytest.raises(PatternRefused, match=r"20 wildcards.*at most 10.*query\.max_pattern_wildcards"):
        compile_glob(ISSUE_PATTERN)


@pytest.mark.parametrize(("glob", "limit"), [
    ("a" * 257, "query.max_pattern_length"),
    ("*" + "?" * 10, "query.max_pattern_wildcards"),
    ("**/a/**/b/**/c/**/d", "query.max_pattern_globstars"),
    ("", "empty"),
    ("a\x00b", "control characters"),
])
def test_sibling_limits_are_named(glob: str, limit: str) -> None:
    with pytest.raises(PatternRefused, match=limit.replace(".", r"\.")):
        compile_glob(glob)


def test_too_many_patterns_names_the_entry_count_and_entry() -> None:
    with pytest.raises(PatternRefused, match=r"21 entries; at most 20 .*query\.max_patterns"):
        compile_globs(["*.py"] * 21)
    with pytest.raises(PatternRefused, match=r"file_patterns\[1\]: .*wildcards"):
        compile_globs(["*.py", ISSUE_PATTERN])


def test_matching_is_linear_time_for_patterns_within_the_limits() -> None:
    g = compile_glob(NASTY_BUT_ALLOWED, CEILING)
    g2 = compile_glob("*?" * 15 + "Z", CEILING)  # 30 wildcards: allowed by the stores' ceiling, still linear
    t0 = time.perf_counter()
    for _ in range(200):
        assert not g.match(LONG_PATH) and not g2.match(LONG_PATH)
    assert time.perf_counter() - t0 < 2.0  # generous: a backtracking engine needs minutes here


@pytest.mark.parametrize(("glob", "values"), [
    ("src/**/*.py", ("src/*.py", "src/*/*.py")),
    ("setup.py", ("setup.py", "*/setup.py")),
    ("**/test_*.py", ("test_*.py", "*/test_*.py")),
    ("a\\b/*", ("a\\\\b/*",)),  # a literal backslash is escaped for OpenSearch's wildcard syntax
    ("a***b/x", ("a*b/x",)),
])
def test_opensearch_wildcard_values(glob: str, values: tuple[str, ...]) -> None:
    assert compile_glob(glob).wildcards == values


def test_opensearch_expansion_is_bounded_by_the_globstar_limit() -> None:
    g = compile_glob("**/" * 4 + "x/*.py", CEILING)
    assert len(g.wildcards) <= 2 ** CEILING.max_globstars
    assert all(w.count("*") + w.count("?") <= 2 * CEILING.max_wildcards for w in g.wildcards)


@pytest.mark.parametrize("glob", ["*.py", "src/*", "src/**/*.py", "*/a?.md", "docs/**", "[ab]*.py", "x[!0-9].txt",
                                  "a[]]b", "[z-a]x"])
def test_include_exclude_dialect_agrees_with_fnmatch(glob: str) -> None:
    paths = ["a.py", "src/a.py", "src/x/y.py", "src/x/a1.md", "docs/a/b", "b.py", "xa.txt", "x1.txt", "a]b",
             "deep/b.py", "src"]
    try:
        g = compile_glob(glob, classes=True)
    except PatternRefused:
        assert glob == "[z-a]x"  # a reversed range: re refuses it too
        return
    for p in paths:
        name = p if "/" in glob else p.rsplit("/", 1)[-1]
        want = fnmatch.fnmatchcase(name, glob) or ("/" in glob and fnmatch.fnmatchcase(p, glob.replace("**/", "")))
        assert g.match(name) == want, (glob, p)
        assert filetypes.path_skip_reason(p, include=[glob]) == (None if want else filetypes.SKIP_EXCLUDED)


def test_source_include_exclude_are_refused_at_registration() -> None:
    with pytest.raises(ValidationError, match=r"include\[0\].*wildcards"):
        SourceCreate(agent_name="a", context_id="c", repo_url="https://example.com/r.git", include=[ISSUE_PATTERN])
    with pytest.raises(ValidationError, match=r"exclude.*101 entries"):
        SourceCreate(agent_name="a", context_id="c", repo_url="https://example.com/r.git", exclude=["*.md"] * 101)
    ok = SourceCreate(agent_name="a", context_id="c", repo_url="https://example.com/r.git", include=["src/**/*.py"])
    assert ok.include == ["src/**/*.py"]


def test_query_settings_limits_are_checked_against_the_ceiling() -> None:
    assert QuerySettings().pattern_limits() == PatternLimits(
        max_length=DEFAULT_LIMITS.max_length, max_wildcards=DEFAULT_LIMITS.max_wildcards,
        max_globstars=DEFAULT_LIMITS.max_globstars, max_patterns=DEFAULT_LIMITS.max_patterns)
    with pytest.raises(ValidationError, match="max_pattern_wildcards must be between 1 and 32"):
        QuerySettings(max_pattern_wildcards=33)


# ---- on the SQLite store, through the search action every route calls ------------------------------------------


@pytest.fixture
def sqlite_store(tmp_path: Path) -> SqliteChunkStore:
    s = SqliteChunkStore(tmp_path / "chunks.sqlite3")
    s.ensure_index()
    docs = []
    for n in range(300):
        path = LONG_PATH + f"/f{n}.py"
        sha = hashlib.sha256(str(n).encode()).hexdigest()
        docs.append({"_id": F.chunk_id("a", "c", "s", path, 1, 1, sha), F.AGENT_NAME: "a", F.CONTEXT_ID: "c",
                     F.SOURCE_ID: "s", F.PATH: path, F.CONTENT: f"def retry_{n}(): pass", F.CHUNK_INDEX: 0,
                     F.START_LINE: 1, F.END_LINE: 1, F.CONTENT_SHA: sha, F.INDEXED_AT: "2026-01-01T00:00:00+00:00"})
    s.bulk_write(docs)
    yield s
    s.close()


def test_sqlite_search_refuses_the_issue_pattern_with_the_limit(sqlite_store: SqliteChunkStore) -> None:
    from scopekb.auth import ApiKey

    key = ApiKey(id="k", agent_name="a", context_ids=["c"], key_hash="x")
    req = SearchRequest(query="pass", file_patterns=[ISSUE_PATTERN])
    with pytest.raises(SearchUnavailable, match=r"file_patterns\[0\].*query\.max_pattern_wildcards"):
        run_search(sqlite_store, req, resolve_scope(key, None, False), QuerySettings())


def test_sqlite_search_with_allowed_nasty_patterns_is_fast_and_correct(sqlite_store: SqliteChunkStore) -> None:
    flt = SearchFilter(scope=ScopeFilter("a", ("c",)), file_patterns=(NASTY_BUT_ALLOWED,) * 20)
    t0 = time.perf_counter()
    assert sqlite_store.keyword_search("pass", flt, 10) == []
    took = time.perf_counter() - t0
    assert took < 2.0  # generous bound (the issue's 19-character pattern took 3 s on one path)
    flt = SearchFilter(scope=ScopeFilter("a", ("c",)), file_patterns=("*?*?*?f7.py",))
    assert [d[F.PATH] for _, _, d in sqlite_store.keyword_search("retry_7", flt, 10)] == [LONG_PATH + "/f7.py"]


def test_sqlite_glob_over_the_ceiling_matches_nothing_and_never_blocks(sqlite_store: SqliteChunkStore) -> None:
    # The store is reached only through run_search (which refuses first); if anything else passed such a pattern,
    # it must match nothing rather than run a backtracking engine.
    flt = SearchFilter(scope=ScopeFilter("a", ("c",)), file_patterns=("*?" * 40 + "Z",))
    done = threading.Event()
    t = threading.Thread(target=lambda: (sqlite_store.keyword_search("pass", flt, 10), done.set()))
    t.start()
    t.join(10)
    assert done.is_set()
