"""Store contract (issue 9): one suite run against both chunk stores and both record stores.

Every test takes the module-scoped ``backend`` fixture, parametrised over ``opensearch`` (the real node from
``scripts/services``; indices under a unique per-run prefix, deleted afterwards) and ``sqlite`` (files in a temporary
folder). Rankings may differ between the engines; the contract may not: scope isolation, every filter, the three
search modes through :func:`scopekb.search.run_search` with scores in [0, 1], edge cases, deletes, per-item
rejection, filtered kNN inside a larger index, identifier search, index version checks and the record stores.

A fake query embedder maps query texts to fixed vectors (pure logic); every stored vector is a seeded random
8-d vector derived from the document id.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scopekb import fields as F
from scopekb.models import Job, SearchMode, SearchRequest, SearchResponse, Source
from scopekb.search import SearchUnavailable, run_search
from scopekb.settings import QuerySettings
from scopekb.stores.base import ChunkStore, ScopeFilter, SearchFilter, StoreVersionMismatch
from scopekb.stores.records import RecordStore

DIM = 8
MODEL = "fake-8d"
PREFIX = f"contract-{uuid.uuid4().hex[:8]}"
BACKENDS = ("opensearch", "sqlite")

#: The OpenSearch store's glob translation over-matches (see _OS_GLOB_BUG); the contract follows SearchFilter's doc.
_OS_GLOB_BUG = ("OpenSearch store: _glob_to_wildcard over-matches - a bare name 'setup.py' becomes '*setup.py' "
                "(matches 'tools/mysetup.py') and 'src/**/a.py' becomes 'src/*a.py' (matches 'src/pkg/data.py'); "
                "see the store-contract report")


# ---------------------------------------------------------------------------------------------- backends


@dataclass
class Backend:
    """Makes stores of one kind; ``make(name)`` with the same name opens the same index (alias or file)."""

    name: str
    make_chunks: Callable[[str, int | None, str | None], ChunkStore]
    make_records: Callable[[], RecordStore]
    client: Any = None
    made: list[Any] = field(default_factory=list)

    def make(self, name: str, dimension: int | None = DIM, model: str | None = MODEL,
             ensure: bool = True) -> ChunkStore:
        store = self.make_chunks(name, dimension, model)
        self.made.append(store)
        if ensure:
            store.ensure_index()
        return store


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    if request.param == "opensearch":
        from scopekb.stores.opensearch import OpenSearchChunkStore
        from scopekb.stores.records import OpenSearchRecordStore

        client = request.getfixturevalue("opensearch_client")
        b = Backend("opensearch",
                    lambda n, d, m: OpenSearchChunkStore(client, alias=f"{PREFIX}-{n.lower()}", dimension=d, model=m),
                    lambda: OpenSearchRecordStore(client, prefix=f"{PREFIX}-sys"), client=client)
        yield b
        client.indices.delete(index=f"{PREFIX}-*", ignore_unavailable=True, allow_no_indices=True)
    else:
        from scopekb.stores.sqlite import SqliteChunkStore, SqliteRecordStore

        folder = tmp_path_factory.mktemp("sqlite-contract")
        b = Backend("sqlite", lambda n, d, m: SqliteChunkStore(folder / f"{n}.sqlite3", dimension=d, model=m),
                    lambda: SqliteRecordStore(folder / "records.sqlite3"))
        yield b
        for s in b.made:
            s.close()


# ---------------------------------------------------------------------------------------------- documents


def vec_for(key: str) -> list[float]:
    """A deterministic 8-d vector for a key (a document id or any label)."""
    seed = int(hashlib.sha256(key.encode()).hexdigest()[:12], 16)
    return [float(x) for x in np.random.default_rng(seed).standard_normal(DIM)]


_LANG = {".py": "python", ".go": "go", ".md": "markdown", ".rs": "rust"}


def mkdoc(agent: str, ctx: str, source: str, path: str, content: str, *, chunk_index: int = 0,
          symbol: str | None = None, signature: str | None = None, repo: str = "org/repo", ref: str = "main",
          vector: Sequence[float] | None | bool = True) -> dict[str, Any]:
    """A chunk document as the indexer builds it (``vector=True``: the id's deterministic vector)."""
    sha = hashlib.sha256(content.encode()).hexdigest()
    doc_id = F.chunk_id(agent, ctx, source, path, 1 + 10 * chunk_index, 10 + 10 * chunk_index, sha)
    d: dict[str, Any] = {
        "_id": doc_id, F.AGENT_NAME: agent, F.CONTEXT_ID: ctx, F.SOURCE_ID: source, F.REPO: repo, F.REF: ref,
        F.COMMIT: "c" * 40, F.PATH: path, F.LANGUAGE: _LANG.get(Path(path).suffix, "text"),
        F.KIND: "function" if symbol else "lines", F.SYMBOL: symbol, F.SIGNATURE: signature, F.CONTENT: content,
        F.CHUNK_INDEX: chunk_index, F.START_LINE: 1 + 10 * chunk_index, F.END_LINE: 10 + 10 * chunk_index,
        F.CONTENT_SHA: sha, F.BLOB_SHA: "b" * 40, F.METADATA: {"note": "x"},
        F.INDEXED_AT: "2026-01-02T03:04:05+00:00",
    }
    if vector is True:
        d[F.EMBEDDING], d[F.EMBEDDING_MODEL] = vec_for(doc_id), MODEL
    elif vector:
        d[F.EMBEDDING], d[F.EMBEDDING_MODEL] = list(vector), MODEL
    return d


#: Scopes of the shared corpus; "Alpha" differs from "alpha" only in case; the last context has a space, a slash
#: and a non-ASCII letter. Marker n is unique to scope n.
SCOPES = [("alpha", "c1"), ("alpha", "c2"), ("Alpha", "c1"), ("beta", "c1"), ("gamma", "ctx ü/2")]
COMMON = "zebracorn"


def marker(n: int) -> str:
    return f"zqx{n}marker"


def scope_docs(n: int) -> list[dict[str, Any]]:
    """The same file set for every scope: a main source and a ``-dev`` source on another repo and ref."""
    agent, ctx = SCOPES[n]
    m, src, dev = marker(n), f"src-{n}", f"src-{n}-dev"
    main = [
        ("src/pkg/timeutil.py", f'def parse_rfc3339(value: str) -> datetime:\n    """{COMMON} {m}"""\n'
         "    return parse(value)", "parse_rfc3339", "def parse_rfc3339(value: str) -> datetime"),
        ("src/pkg/a.py", f"parse the value then parse it again {COMMON} {m}", None, None),
        ("src/pkg/data.py", f"parse data rows {COMMON} {m}", None, None),
        ("src/upload/retry.go", f"func retryUpload() error {{ // {COMMON} {m} }}", "retryUpload",
         "func retryUpload() error"),
        ("setup.py", f"setup(name='x') {COMMON} {m}", None, None),
        ("tools/setup.py", f"setup tools {COMMON} {m}", None, None),
        ("tools/mysetup.py", f"my setup {COMMON} {m}", None, None),
        ("docs/guide.md", f"# Guide\nparse things {COMMON} {m}", None, None),
        ("README.md", f"readme {COMMON} {m}", None, None),
        ("docs/Über uns.md", f"about us {COMMON} {m}", None, None),
    ]
    docs = [mkdoc(agent, ctx, src, p, c, symbol=s, signature=sig) for p, c, s, sig in main]
    docs.append(mkdoc(agent, ctx, dev, "src/pkg/timeutil.py", f"legacy parse helpers {COMMON} {m}",
                      repo="org/other", ref="dev"))
    docs.append(mkdoc(agent, ctx, dev, "lib/other.rs", f"fn other() {{}} {COMMON} {m}", repo="org/other", ref="dev"))
    return docs


CORPUS = [d for n in range(len(SCOPES)) for d in scope_docs(n)]
BY_KEY = {(d[F.AGENT_NAME], d[F.CONTEXT_ID], d[F.SOURCE_ID], d[F.PATH]): d for d in CORPUS}


def doc_of(n: int, path: str, dev: bool = False) -> dict[str, Any]:
    agent, ctx = SCOPES[n]
    return BY_KEY[(agent, ctx, f"src-{n}" + ("-dev" if dev else ""), path)]


@pytest.fixture(scope="module")
def corpus(backend: Backend) -> ChunkStore:
    store = backend.make("corpus")
    report = store.bulk_write(CORPUS, refresh=True)
    assert report.errors == [] and report.written == len(CORPUS)
    return store


def scope(n: int | None = None, agent: str | None = None, contexts: tuple[str, ...] | None = ()) -> ScopeFilter:
    """Scope n of SCOPES, or ``agent`` with ``contexts`` (None = cross_context)."""
    if n is not None:
        return ScopeFilter(SCOPES[n][0], (SCOPES[n][1],))
    assert agent is not None
    return ScopeFilter(agent, contexts)


def flt(sc: ScopeFilter, **kw: Any) -> SearchFilter:
    return SearchFilter(scope=sc, **kw)


def search(store: ChunkStore, query: str, sc: ScopeFilter, mode: str = "keyword",
           embed: Callable[[str], Sequence[float]] | None = None, cfg: QuerySettings | None = None,
           **kw: Any) -> SearchResponse:
    req = SearchRequest(query=query, mode=SearchMode(mode), **kw)
    return run_search(store, req, sc, cfg or QuerySettings(), embed)


def embedder(table: dict[str, Sequence[float]]) -> Callable[[str], Sequence[float]]:
    """A fake QueryEmbedder: fixed vectors for known texts, a constant vector for anything else."""
    return lambda text: table.get(text, vec_for("query:" + text))


def assert_scores(resp: SearchResponse) -> None:
    scores = [h.score for h in resp.hits]
    assert all(0.0 <= s <= 1.0 and not math.isnan(s) for s in scores), scores
    assert scores == sorted(scores, reverse=True), scores


def keys(hits: Sequence[tuple[str, float, dict[str, Any]]]) -> set[tuple[str, str]]:
    return {(h[2][F.SOURCE_ID], h[2][F.PATH]) for h in hits}


# ---------------------------------------------------------------------------------------------- index lifecycle


def test_ensure_index_is_idempotent_and_refuses_another_dimension(backend: Backend) -> None:
    store = backend.make("lifecycle")
    assert store.ensure_index() == store.ensure_index()
    with pytest.raises(StoreVersionMismatch):
        backend.make("lifecycle", dimension=DIM + 1)
    with pytest.raises(StoreVersionMismatch):
        backend.make("lifecycle", dimension=None, model=None)
    kw_only = backend.make("lifecycle-kw", dimension=None, model=None)
    with pytest.raises(StoreVersionMismatch):
        backend.make("lifecycle-kw", dimension=DIM)
    assert kw_only.dimension is None


def test_an_index_of_the_other_local_backend_names_both_fixes(backend: Backend) -> None:
    """A changed ``embedding.local_backend`` (issue 19): an index of fp32 vectors of the same model opened for int8
    is refused with a message naming the reindex and the setting that keeps the index; the other way round names
    onnx-int8; another model names the reindex only."""
    fp32, int8 = "local:all-MiniLM-L6-v2@gt-0.1.0", "local:all-MiniLM-L6-v2@gt-0.1.0+int8-0123abcd"
    backend.make("backend-fp32", model=fp32)
    with pytest.raises(StoreVersionMismatch, match=r"scopekb reindex.*SCOPEKB_EMBEDDING__LOCAL_BACKEND=onnx to keep"):
        backend.make("backend-fp32", model=int8)
    backend.make("backend-int8", model=int8)
    with pytest.raises(StoreVersionMismatch, match=r"LOCAL_BACKEND=onnx-int8 to keep"):
        backend.make("backend-int8", model=fp32)
    with pytest.raises(StoreVersionMismatch) as other:
        backend.make("backend-int8", model="local:other-model@0123456789ab")
    assert "scopekb reindex" in str(other.value) and "LOCAL_BACKEND" not in str(other.value)


def test_a_search_with_another_model_than_the_index_is_refused_and_answered_by_keyword(backend: Backend) -> None:
    """A process whose query embedder is of another model (same dimension) than the index's vectors: the kNN is
    refused (the cosine between two vector spaces ranks nothing), and ``run_search`` answers by keyword with a
    notice naming the fix, in both modes; the index is untouched (hostile review of issue 19: OpenSearch checked the
    model only when a writer or the service started, so a CLI search or a query service left running across a
    `scopekb reindex` that switched the backend answered silently)."""
    fp32, int8 = "local:all-MiniLM-L6-v2@gt-0.1.0", "local:all-MiniLM-L6-v2@gt-0.1.0+int8-0123abcd"
    built = backend.make("search-model", model=fp32)
    docs = scope_docs(0)
    assert built.bulk_write(docs, refresh=True).errors == []
    probe = docs[0][F.EMBEDDING]
    assert built.vector_search(probe, flt(scope(0)), 3)[0][0] == docs[0]["_id"]
    other = backend.make("search-model", model=int8, ensure=False)  # a reader: it never calls ensure_index
    with pytest.raises(StoreVersionMismatch, match=r"int8.*LOCAL_BACKEND=onnx to keep"):
        other.vector_search(probe, flt(scope(0)), 3)
    for mode in ("vector", "hybrid"):
        resp = search(other, COMMON, scope(0), mode, embed=embedder({}), max_results=50)
        assert resp.notice and "answered by keyword" in resp.notice and "scopekb reindex" in resp.notice, resp.notice
        assert {(h.path, h.start_line) for h in resp.hits} == {(d[F.PATH], d[F.START_LINE]) for d in docs}
    assert built.vector_search(probe, flt(scope(0)), 3)[0][0] == docs[0]["_id"]  # the index still answers


def test_a_query_embedder_that_cannot_work_or_a_query_with_nothing_to_embed_answers_by_keyword(
        corpus: ChunkStore) -> None:
    """Vector and hybrid modes answer by keyword with a notice when the query embedder cannot be built (a settings
    problem such as an export folder that cannot be written: it was a failed CLI search and a 500 over REST), or
    when the query has no visible character (zero-width spaces embedded as ``[CLS] [SEP]`` ranked arbitrary
    chunks); hostile review of issue 19."""
    from scopekb.embedding.base import EmbeddingConfigError

    def broken(_text: str) -> Sequence[float]:
        raise EmbeddingConfigError("cannot write the ONNX export directory /x: set SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR")

    calls: list[str] = []

    def counting(text: str) -> Sequence[float]:
        calls.append(text)
        return vec_for("query:" + text)

    want = {d["_id"] for d in CORPUS if (d[F.AGENT_NAME], d[F.CONTEXT_ID]) == SCOPES[0]}
    for mode in ("vector", "hybrid"):
        resp = search(corpus, COMMON, scope(0), mode, embed=broken, max_results=50)
        assert resp.notice and "LOCAL_EXPORT_DIR" in resp.notice and "answered by keyword" in resp.notice
        assert len(resp.hits) == len(want) and all(h.path for h in resp.hits)
        # zero-width and BOM; combining marks and a variation selector; private use; tag characters; U+FFFD
        for query in ("\u200b\u200d\ufeff", "\u0301\u0301\ufe0f", "\ue000", "\U000e0041\U000e0042", "\ufffd"):
            blank = search(corpus, query, scope(0), mode, embed=counting)
            assert blank.notice and "no visible characters" in blank.notice and blank.hits == [], (query, blank)
    assert calls == []


def test_stored_fields_round_trip_without_the_vector(corpus: ChunkStore) -> None:
    want = doc_of(0, "src/upload/retry.go")
    hits = corpus.keyword_search("retryUpload", flt(scope(0)), 5)
    got = next(h for h in hits if h[0] == want["_id"])
    assert F.EMBEDDING not in got[2]
    assert got[2] == {k: v for k, v in want.items() if k not in ("_id", F.EMBEDDING)}
    vhits = corpus.vector_search(want[F.EMBEDDING], flt(scope(0)), 1)
    assert vhits[0][0] == want["_id"] and F.EMBEDDING not in vhits[0][2]


# ---------------------------------------------------------------------------------------------- scopes


@pytest.mark.parametrize("n", range(len(SCOPES)))
def test_scope_isolation_keyword_and_vector(corpus: ChunkStore, n: int) -> None:
    mine = [d for d in CORPUS if (d[F.AGENT_NAME], d[F.CONTEXT_ID]) == SCOPES[n]]
    hits = corpus.keyword_search(COMMON, flt(scope(n)), 100)
    assert {h[0] for h in hits} == {d["_id"] for d in mine}
    for other in range(len(SCOPES)):
        found = corpus.keyword_search(marker(other), flt(scope(n)), 100)
        assert (len(found) > 0) == (other == n), (other, found)
    # the nearest vector overall belongs to another scope: it must not leak
    foreign = doc_of((n + 1) % len(SCOPES), "setup.py")
    vhits = corpus.vector_search(foreign[F.EMBEDDING], flt(scope(n)), 100)
    assert {h[0] for h in vhits} == {d["_id"] for d in mine}
    assert all((h[2][F.AGENT_NAME], h[2][F.CONTEXT_ID]) == SCOPES[n] for h in vhits)


def test_cross_context_stays_within_the_agent(corpus: ChunkStore) -> None:
    for agent in ("alpha", "Alpha", "beta", "gamma"):
        want = {d["_id"] for d in CORPUS if d[F.AGENT_NAME] == agent}
        assert {h[0] for h in corpus.keyword_search(COMMON, flt(scope(agent=agent, contexts=None)), 100)} == want
        vec = doc_of(3 if agent != "beta" else 0, "README.md")[F.EMBEDDING]
        assert {h[0] for h in corpus.vector_search(vec, flt(scope(agent=agent, contexts=None)), 100)} == want
    # naming both contexts is the same as cross_context for "alpha"
    both = corpus.keyword_search(COMMON, flt(scope(agent="alpha", contexts=("c1", "c2"))), 100)
    assert {h[2][F.CONTEXT_ID] for h in both} == {"c1", "c2"}
    assert {h[2][F.AGENT_NAME] for h in both} == {"alpha"}


def test_agent_names_and_contexts_are_exact_and_case_sensitive(corpus: ChunkStore) -> None:
    vec = doc_of(0, "README.md")[F.EMBEDDING]
    for sc in (scope(agent="ALPHA", contexts=None), scope(agent="alph", contexts=None),
               scope(agent="alpha", contexts=("C1",)), scope(agent="alpha", contexts=())):
        assert corpus.keyword_search(COMMON, flt(sc), 100) == []
        assert corpus.vector_search(vec, flt(sc), 100) == []
    upper = corpus.keyword_search(COMMON, flt(scope(agent="Alpha", contexts=None)), 100)
    assert upper and {h[2][F.AGENT_NAME] for h in upper} == {"Alpha"}


def test_run_search_respects_scope_in_every_mode(corpus: ChunkStore) -> None:
    emb = embedder({})
    for mode in ("keyword", "vector", "hybrid"):
        resp = search(corpus, COMMON, scope(agent="beta", contexts=None), mode, emb, max_results=50)
        assert resp.hits and {(h.agent_name, h.context_id) for h in resp.hits} == {("beta", "c1")}, mode


# ---------------------------------------------------------------------------------------------- filters

_MAIN = {"src/pkg/timeutil.py", "src/pkg/a.py", "src/pkg/data.py", "src/upload/retry.go", "setup.py",
         "tools/setup.py", "tools/mysetup.py", "docs/guide.md", "README.md", "docs/Über uns.md"}
_DEV = {"src/pkg/timeutil.py", "lib/other.rs"}


def _k(*paths: str, dev: Sequence[str] = ()) -> set[tuple[str, str]]:
    return {("src-0", p) for p in paths} | {("src-0-dev", p) for p in dev}


FILTER_CASES: list[tuple[str, dict[str, Any], set[tuple[str, str]], str | None]] = [
    ("source_id", {"source_id": "src-0-dev"}, _k(dev=_DEV), None),
    ("repo", {"repo": "org/other"}, _k(dev=_DEV), None),
    ("ref", {"ref": "dev"}, _k(dev=_DEV), None),
    ("ref-prefixed", {"ref": "refs/heads/main"}, _k(*_MAIN), None),
    ("language", {"languages": ("go",)}, _k("src/upload/retry.go"), None),
    ("languages", {"languages": ("markdown", "rust")},
     _k("docs/guide.md", "README.md", "docs/Über uns.md", dev=["lib/other.rs"]), None),
    ("ext-glob", {"file_patterns": ("*.py",)},
     _k(*(p for p in _MAIN if p.endswith(".py")), dev=["src/pkg/timeutil.py"]), None),
    ("deep-glob", {"file_patterns": ("src/**/*.py",)},
     _k("src/pkg/timeutil.py", "src/pkg/a.py", "src/pkg/data.py", dev=["src/pkg/timeutil.py"]), None),
    ("folder-glob", {"file_patterns": ("docs/*",)}, _k("docs/guide.md", "docs/Über uns.md"), None),
    ("any-folder-glob", {"file_patterns": ("**/*.md",)}, _k("docs/guide.md", "README.md", "docs/Über uns.md"), None),
    ("unicode-name", {"file_patterns": ("Über uns.md",)}, _k("docs/Über uns.md"), None),
    ("question-mark", {"file_patterns": ("docs/?ber uns.md",)}, _k("docs/Über uns.md"), None),
    ("two-globs", {"file_patterns": ("*.go", "*.rs")}, _k("src/upload/retry.go", dev=["lib/other.rs"]), None),
    ("exact-path", {"file_patterns": ("src/upload/retry.go",)}, _k("src/upload/retry.go"), None),
    ("glob-case", {"file_patterns": ("README.MD",)}, set(), None),
    ("bare-name", {"file_patterns": ("setup.py",)}, _k("setup.py", "tools/setup.py"), _OS_GLOB_BUG),
    ("double-star-folder", {"file_patterns": ("src/**/a.py",)}, _k("src/pkg/a.py"), _OS_GLOB_BUG),
    ("combined", {"source_id": "src-0", "languages": ("python",), "file_patterns": ("src/**",)},
     _k("src/pkg/timeutil.py", "src/pkg/a.py", "src/pkg/data.py"), None),
    ("no-match", {"languages": ("cobol",)}, set(), None),
]


@pytest.mark.parametrize(("case", "kw", "want", "os_bug"), FILTER_CASES, ids=[c[0] for c in FILTER_CASES])
def test_filters(request: pytest.FixtureRequest, backend: Backend, corpus: ChunkStore, case: str,
                 kw: dict[str, Any], want: set[tuple[str, str]], os_bug: str | None) -> None:
    del os_bug  # fixed: globs now translate to several OpenSearch wildcards
    f = flt(scope(0), **kw)
    assert keys(corpus.keyword_search(COMMON, f, 100)) == want
    assert keys(corpus.vector_search(vec_for("probe"), f, 100)) == want
    # cross_context keeps the filter and adds alpha/c2's copies of the same files
    wide = corpus.keyword_search(COMMON, SearchFilter(scope=scope(agent="alpha", contexts=None), **kw), 100)
    assert {(h[2][F.SOURCE_ID].replace("src-1", "src-0"), h[2][F.PATH]) for h in wide} == want
    assert len(wide) == (1 if "source_id" in kw else 2) * len(want)


def test_filters_pass_through_run_search(corpus: ChunkStore) -> None:
    emb = embedder({})
    for mode in ("keyword", "vector", "hybrid"):
        resp = search(corpus, COMMON, scope(0), mode, emb, max_results=50, languages=["python"],
                      file_patterns=["src/**"], source_id="src-0", repo="org/repo", ref="main")
        assert {h.path for h in resp.hits} == {"src/pkg/timeutil.py", "src/pkg/a.py", "src/pkg/data.py"}, mode


#: Issue 16, item 3: the issue's pattern (20 wildcards; 8 s per path on SQLite before) and its siblings.
PATHOLOGICAL = ["*?*?*?*?*?*?*?*?*?*?Z", "*a" + "?" * 12, "**/" * 4 + "*.py", "x" * 300]


@pytest.mark.parametrize("pattern", PATHOLOGICAL)
def test_pathological_file_patterns_are_refused_naming_the_limit(corpus: ChunkStore, pattern: str) -> None:
    with pytest.raises(SearchUnavailable, match=r"file_patterns\[0\].*query\.max_pattern"):
        search(corpus, COMMON, scope(0), file_patterns=[pattern])
    with pytest.raises(SearchUnavailable, match=r"query\.max_patterns"):
        search(corpus, COMMON, scope(0), file_patterns=["*.py"] * 21)


def test_the_worst_allowed_file_patterns_answer_quickly_and_correctly(corpus: ChunkStore) -> None:
    """Twenty patterns at every limit (10 wildcards, ``*a`` then nine ``?``: 512 automaton states in Lucene, a
    backtracking trap for Python's re) over both stores: an answer, and the right one, well within a bound."""
    worst = ["*?*?*?*?*Z", "*a?????????", "**/**/**/*?*?*?*.go", "src/**/??????*?a.py"] * 5
    emb = embedder({})
    for mode in ("keyword", "vector"):
        t0 = time.perf_counter()
        search(corpus, COMMON, scope(0), mode, emb, max_results=50, file_patterns=["src/**"])
        baseline = time.perf_counter() - t0
        t0 = time.perf_counter()
        resp = search(corpus, COMMON, scope(0), mode, emb, max_results=50, file_patterns=worst)
        took = time.perf_counter() - t0
        # A bound, not a speed target: exponential matching (the issue's 21 characters took 8 s on SQLite, and
        # these patterns are far longer) overshoots it by orders of magnitude; a loaded 2-core machine does not.
        assert took < max(6.0, 30 * baseline), (mode, took, baseline)
        assert {h.path for h in resp.hits} == {"src/upload/retry.go", "src/pkg/data.py"}, mode


# ---------------------------------------------------------------------------------------------- modes and scores


def test_keyword_mode_scores_min_score_and_caps(corpus: ChunkStore) -> None:
    resp = search(corpus, "parse setup", scope(0), max_results=50)
    assert_scores(resp)
    assert resp.hits[0].score == 1.0 and len(resp.hits) >= 5
    assert min(h.score for h in resp.hits) < 1.0
    # a min_score between two shown scores keeps exactly the hits above it
    i = next(i for i in range(1, len(resp.hits)) if resp.hits[i].score < resp.hits[i - 1].score)
    cut = (resp.hits[i].score + resp.hits[i - 1].score) / 2
    high = search(corpus, "parse setup", scope(0), max_results=50, min_score=cut)
    assert [h.score for h in high.hits] == [h.score for h in resp.hits[:i]]
    assert len(search(corpus, COMMON, scope(0), max_results=3).hits) == 3
    capped = search(corpus, COMMON, scope(0), cfg=QuerySettings(max_results_cap=4), max_results=100)
    assert len(capped.hits) == 4
    for q in ("nothingmatchesthis", "!!! ???", "zqx2marker"):  # unknown word, no identifier, another scope's marker
        empty = search(corpus, q, scope(0))
        assert empty.hits == [] and empty.query == q


class _FixedStore:
    """A ChunkStore stub with fixed raw BM25 scores, to pin run_search's score rounding."""

    dimension = None

    def __init__(self, raw: list[float]) -> None:
        self.hits = [(f"id{n}", r, mkdoc("s", "c", "s", f"f{n}.py", f"text {n}", vector=None))
                     for n, r in enumerate(raw)]

    def keyword_search(self, query: str, flt: SearchFilter, size: int, offset: int = 0) -> list[Any]:
        return self.hits[offset:offset + size]


def test_min_score_equal_to_a_shown_score_keeps_that_hit() -> None:
    store = _FixedStore([1.0, 0.6737238])
    shown = run_search(store, SearchRequest(query="text", max_results=5), scope(agent="s", contexts=None),
                       QuerySettings())
    assert [h.score for h in shown.hits] == [1.0, 0.673724]
    again = run_search(store, SearchRequest(query="text", max_results=5, min_score=0.673724),
                       scope(agent="s", contexts=None), QuerySettings())
    assert [h.score for h in again.hits] == [1.0, 0.673724]


def test_vector_mode_scores_and_exact_match(corpus: ChunkStore) -> None:
    target = doc_of(0, "docs/guide.md")
    emb = embedder({"how is the guide written": target[F.EMBEDDING]})
    resp = search(corpus, "how is the guide written", scope(0), "vector", emb, max_results=5)
    assert_scores(resp)
    assert len(resp.hits) == 5
    assert resp.hits[0].path == "docs/guide.md" and resp.hits[0].score == pytest.approx(1.0, abs=1e-5)
    # an opposite vector scores (1 + cos) / 2 = 0
    opposite = search(corpus, "anti", scope(0), "vector", embedder({"anti": [-x for x in target[F.EMBEDDING]]}),
                      max_results=50)
    assert opposite.hits[-1].path == "docs/guide.md" and opposite.hits[-1].score == pytest.approx(0.0, abs=1e-5)
    high = search(corpus, "how is the guide written", scope(0), "vector", emb, max_results=50, min_score=0.9)
    assert [h.path for h in high.hits][:1] == ["docs/guide.md"] and all(h.score >= 0.9 for h in high.hits)


def test_hybrid_search_is_both_lists_in_one_call(corpus: ChunkStore) -> None:
    """OpenSearch answers hybrid with one ``_msearch`` (issue 20): the same two lists as the separate calls."""
    both = getattr(corpus, "hybrid_search", None)
    if both is None:  # SQLite: the two lists come from the two calls, nothing to compare
        return
    vec = doc_of(0, "src/pkg/timeutil.py")[F.EMBEDDING]
    flt = SearchFilter(scope=scope(0))
    kw, vh = both("parse_rfc3339 guide", vec, flt, 7, 5)
    assert [h[0] for h in kw] == [h[0] for h in corpus.keyword_search("parse_rfc3339 guide", flt, 7)] and kw
    assert [h[0] for h in vh] == [h[0] for h in corpus.vector_search(vec, flt, 5)] and len(vh) == 5
    assert [s for _, s, _ in kw] == pytest.approx([s for _, s, _ in corpus.keyword_search("parse_rfc3339 guide",
                                                                                          flt, 7)])
    assert all(F.EMBEDDING not in d for _, _, d in kw + vh)


def test_a_one_word_query_is_fused_as_a_name_lookup(corpus: ChunkStore) -> None:
    """README newcomer (stop 43): ``resultcallback`` put a chunk without the word first (vector #1, 0.7 of the
    score). A query of one word and no space is a name: hybrid fuses it ``query.name_keyword_weight`` (0.7) ×
    keyword, so the chunk that has the name beats the one the vector list prefers; a query of several words
    keeps the 0.3/0.7 weights; the rule can be turned off."""
    away = [-x for x in doc_of(0, "src/pkg/timeutil.py")[F.EMBEDDING]]  # the vector list ranks the name's chunk last
    emb = embedder({"parse_rfc3339": away, "parse_rfc3339 please": away})
    resp = search(corpus, "parse_rfc3339", scope(0), "hybrid", emb, max_results=5)
    assert resp.hits[0].symbol == "parse_rfc3339", [h.path for h in resp.hits]
    assert resp.hits[0].why is not None and resp.hits[0].why.fusion == (
        "weighted 0.7×keyword + 0.3×vector (a one-word query: a name)")
    off = search(corpus, "parse_rfc3339", scope(0), "hybrid", emb, QuerySettings(name_keyword_weight=0),
                 max_results=5)
    assert off.hits[0].symbol != "parse_rfc3339" and off.hits[0].why.fusion == "weighted 0.3×keyword + 0.7×vector"
    words = search(corpus, "parse_rfc3339 please", scope(0), "hybrid", emb, max_results=5)
    assert words.hits[0].why.fusion == "weighted 0.3×keyword + 0.7×vector"


def test_hybrid_mode_scores_and_edge_cases(corpus: ChunkStore) -> None:
    target = doc_of(0, "src/pkg/timeutil.py")
    emb = embedder({"parse_rfc3339": target[F.EMBEDDING]})
    resp = search(corpus, "parse_rfc3339", scope(0), "hybrid", emb, max_results=10)
    assert_scores(resp)
    assert resp.hits[0].symbol == "parse_rfc3339" and resp.hits[0].score == 1.0
    assert len(resp.hits) == 10
    # keyword list empty: the vector list alone decides, still in [0, 1] with a 1.0 on top
    alone = search(corpus, "nothingmatchesthis", scope(0), "hybrid", embedder({}), max_results=10)
    assert_scores(alone)
    assert alone.hits and alone.hits[0].score == 1.0
    # both lists empty (a scope with no chunks): an empty, successful answer
    none = search(corpus, "parse", scope(agent="nobody", contexts=None), "hybrid", embedder({}))
    assert none.hits == []
    cut = search(corpus, "parse_rfc3339", scope(0), "hybrid", emb, max_results=10, min_score=0.5)
    assert cut.hits and all(h.score >= 0.5 for h in cut.hits)
    # Reciprocal Rank Fusion: the same guarantees
    rrf = search(corpus, "parse_rfc3339", scope(0), "hybrid", emb, max_results=10, fusion="rrf")
    assert_scores(rrf)
    assert rrf.hits[0].symbol == "parse_rfc3339" and rrf.hits[0].score == 1.0 and len(rrf.hits) == 10
    rrf_alone = search(corpus, "nothingmatchesthis", scope(0), "hybrid", embedder({}), max_results=10, fusion="rrf")
    assert_scores(rrf_alone)
    assert rrf_alone.hits and rrf_alone.hits[0].score == 1.0


def test_keyword_only_index_refuses_vector_modes(backend: Backend) -> None:
    store = backend.make("keyword-only", dimension=None, model=None)
    docs = [mkdoc("kw", "c", "s", "a.py", f"plain text {COMMON}", vector=None)]
    assert store.bulk_write(docs, refresh=True).errors == []
    assert store.vector_search(vec_for("x"), flt(scope(agent="kw", contexts=None)), 5) == []
    assert [h.path for h in search(store, COMMON, scope(agent="kw", contexts=None)).hits] == ["a.py"]
    for mode in ("vector", "hybrid"):
        with pytest.raises(SearchUnavailable):
            search(store, COMMON, scope(agent="kw", contexts=None), mode, embedder({}))
    # a vector sent to a keyword-only index is refused per item
    bad = mkdoc("kw", "c", "s", "b.py", "with a vector")
    report = store.bulk_write([bad], refresh=True)
    assert report.written == 0 and [e[0] for e in report.errors] == [bad["_id"]]


def test_single_hit_scores_one_in_every_mode(corpus: ChunkStore) -> None:
    only = doc_of(1, "README.md")
    emb = embedder({"readme": only[F.EMBEDDING]})
    sc = scope(1)
    for mode in ("keyword", "vector", "hybrid"):
        resp = search(corpus, "readme", sc, mode, emb, max_results=1)
        assert len(resp.hits) == 1 and resp.hits[0].path == "README.md", mode
        assert resp.hits[0].score == pytest.approx(1.0, abs=1e-5), mode
    kw = search(corpus, "readme", sc, max_results=10)
    assert [h.path for h in kw.hits] == ["README.md"] and kw.hits[0].score == 1.0


def test_ties_are_stable_and_pages_do_not_overlap(backend: Backend) -> None:
    store = backend.make("ties")
    vec = vec_for("tie")
    docs = [mkdoc("tie", "c", "s", f"copy{i}/LICENSE.md", f"same licence text {COMMON}", vector=vec)
            for i in range(7)]
    assert store.bulk_write(docs, refresh=True).errors == []
    sc = scope(agent="tie", contexts=None)
    full = store.keyword_search(COMMON, flt(sc), 100)
    assert len(full) == 7 and len({round(h[1], 9) for h in full}) == 1 and full[0][1] > 0
    assert store.keyword_search(COMMON, flt(sc), 100) == full
    pages = [h[0] for off in range(0, 8, 2) for h in store.keyword_search(COMMON, flt(sc), 2, off)]
    assert pages == [h[0] for h in full]
    v1 = store.vector_search(vec, flt(sc), 7)
    assert [h[0] for h in v1] == [h[0] for h in store.vector_search(vec, flt(sc), 7)]
    assert {h[0] for h in store.vector_search(vec, flt(sc), 3)} <= {h[0] for h in v1}
    for mode in ("keyword", "vector", "hybrid"):
        resp = search(store, COMMON, sc, mode, embedder({COMMON: vec}), max_results=7)
        assert [h.score for h in resp.hits] == [1.0] * 7, mode


# ---------------------------------------------------------------------------------------------- identifiers


def test_identifier_search_finds_the_whole_identifier_first(corpus: ChunkStore) -> None:
    hits = corpus.keyword_search("parse_rfc3339", flt(scope(0)), 20)
    assert hits[0][2][F.SYMBOL] == "parse_rfc3339" and hits[0][2][F.PATH] == "src/pkg/timeutil.py"
    # chunks that only mention "parse" never rank above it (with the search analyzer they do not match at all)
    assert all("parse_rfc3339" in h[2][F.CONTENT] for h in hits)
    mentions = corpus.keyword_search("parse", flt(scope(0)), 20)
    assert {h[2][F.PATH] for h in mentions} >= {"src/pkg/a.py", "src/pkg/data.py", "docs/guide.md"}
    # parts split at index time still match: rfc and 3339 (digits), retry + upload (camelCase), timeutil (path)
    assert corpus.keyword_search("rfc", flt(scope(0)), 5)[0][2][F.PATH] == "src/pkg/timeutil.py"
    assert corpus.keyword_search("3339", flt(scope(0)), 5)[0][2][F.PATH] == "src/pkg/timeutil.py"
    # ... but not a middle piece that is neither whole nor a single part: both analyzers agree on that
    assert corpus.keyword_search("rfc3339", flt(scope(0)), 5) == []
    assert corpus.keyword_search("retry upload", flt(scope(0)), 5)[0][2][F.SYMBOL] == "retryUpload"
    assert corpus.keyword_search("RetryUpload", flt(scope(0)), 5)[0][2][F.SYMBOL] == "retryUpload"
    assert {h[2][F.PATH] for h in corpus.keyword_search("timeutil", flt(scope(0)), 5)} == {"src/pkg/timeutil.py"}


def test_keyword_field_boosts_change_the_order_on_both_stores(backend: Backend) -> None:
    """Per-context keyword boosts (issue 21, ``scopekb eval --tune``): the same query ranks a symbol match first
    with the default boosts and a content match first when the symbol field is left out."""
    store = backend.make("boosts", dimension=None, model=None)
    store.bulk_write([
        mkdoc("b", "c", "s", "src/one.py", "return 1", symbol="frobnicate", vector=None),
        mkdoc("b", "c", "s", "src/two.py", "frobnicate frobnicate the widget frobnicate", chunk_index=1,
              vector=None)], refresh=True)
    f = flt(scope(agent="b", contexts=("c",)))
    assert store.keyword_search("frobnicate", f, 5)[0][2][F.PATH] == "src/one.py"
    assert [h[2][F.PATH] for h in store.keyword_search("frobnicate", f, 5, boosts=(0.0, 1.0, 1.0, 1.0))] \
        == ["src/two.py"]
    with pytest.raises(ValueError):
        store.keyword_search("frobnicate", f, 5, boosts=(0.0, 0.0, 0.0, 0.0))


def test_keyword_search_leaves_out_stop_words_and_adds_identifier_parts(backend: Backend) -> None:
    """Issue 21 (``keyword_terms``): a comment full of English stop words does not outrank the function a
    natural-language query names; a query of stop words only still finds them; a camelCase query identifier also
    matches its parts in a query of three terms or more."""
    store = backend.make("stopwords", dimension=None, model=None)
    store.bulk_write([
        mkdoc("b", "c", "s", "src/notes.py", "# it is the one that is in the list of the things to do", vector=None),
        mkdoc("b", "c", "s", "src/parse.py", "def parse_header(raw):\n    return raw.split()", chunk_index=1,
              symbol="parse_header", vector=None)], refresh=True)
    f = flt(scope(agent="b", contexts=("c",)))
    assert [h[2][F.PATH] for h in store.keyword_search("parse the header of the request", f, 5)] == ["src/parse.py"]
    assert [h[2][F.PATH] for h in store.keyword_search("the", f, 5)] == ["src/notes.py"]
    assert [h[2][F.PATH] for h in store.keyword_search("parseHeader of raw input", f, 5)] == ["src/parse.py"]
    assert store.keyword_search("parseHeader", f, 5) == []  # a name lookup (under 3 terms) stays exact


def test_tokenisation_matches_the_opensearch_analyzers(opensearch_client: Any) -> None:
    """The SQLite store's Python tokeniser produces the same terms as the analyzers of scopekb.fields."""
    from collections import Counter

    from scopekb.stores.sqlite import index_tokens, query_tokens

    samples = ["parse_rfc3339", "parseRFC3339_date", "HTTPServer fooBar", "_foo foo_ ___", "ABcD x2y a1b2c3",
               "SomeClass.method_name() -> dict[str, Any]", "getHTTPResponseCode2xx", "__init__ self.assertEqual",
               "naïve façade ünïcödeÄrger", "日本語テキスト", "ΑβΓδ", "İstanbul", "O'Reilly's foo-bar.baz/qux",
               "x\u0301y 𝐀𝐁c", "retryUpload(ctx, maxAttempts=3)"]
    name = f"{PREFIX}-analyzers"
    opensearch_client.indices.create(index=name, body={"settings": F.chunk_index_settings(1, 0, knn=False)})
    try:
        for s in samples:
            got = opensearch_client.indices.analyze(index=name, body={"analyzer": F.CODE_ANALYZER, "text": s})
            assert Counter(t["token"] for t in got["tokens"]) == Counter(index_tokens(s)), s
            got = opensearch_client.indices.analyze(index=name, body={"analyzer": F.CODE_SEARCH_ANALYZER, "text": s})
            assert [t["token"] for t in got["tokens"]] == query_tokens(s), s
    finally:
        opensearch_client.indices.delete(index=name)


# ---------------------------------------------------------------------------------------------- writes and deletes


def test_bulk_write_rejects_bad_items_and_keeps_the_rest(backend: Backend) -> None:
    store = backend.make("rejects")
    good = [mkdoc("w", "c", "s", f"f{i}.py", f"good chunk {i} {COMMON}") for i in range(5)]
    short = mkdoc("w", "c", "s", "short.py", f"short vector {COMMON}", vector=vec_for("s")[:DIM - 1])
    unknown = {**mkdoc("w", "c", "s", "unknown.py", f"unknown field {COMMON}"), "not_a_field": 1}
    report = store.bulk_write([*good[:2], short, *good[2:], unknown], refresh=True)
    assert report.written == 5
    assert sorted((e[0], e[1]) for e in report.errors) == sorted([(short["_id"], "short.py"),
                                                                   (unknown["_id"], "unknown.py")])
    assert all(e[2] for e in report.errors)
    sc = flt(scope(agent="w", contexts=None))
    assert {h[2][F.PATH] for h in store.keyword_search(COMMON, sc, 100)} == {f"f{i}.py" for i in range(5)}
    assert len(store.vector_search(vec_for("q"), sc, 100)) == 5


def test_bulk_write_upserts_by_id(backend: Backend) -> None:
    store = backend.make("upserts")
    d = mkdoc("u", "c", "s", "a.py", f"first version {COMMON}")
    assert store.bulk_write([d, d], refresh=True).errors == []
    assert store.bulk_write([d], refresh=True).written == 1  # an unchanged re-write is fine
    changed = {**d, F.CONTENT: f"second edition {COMMON}", F.EMBEDDING: vec_for("second"), F.COMMIT: "d" * 40}
    assert store.bulk_write([changed], refresh=True).written == 1
    sc = flt(scope(agent="u", contexts=None))
    hits = store.keyword_search(COMMON, sc, 10)
    assert [(h[0], h[2][F.COMMIT]) for h in hits] == [(d["_id"], "d" * 40)]
    assert store.keyword_search("second", sc, 10) and store.keyword_search("first", sc, 10) == []
    top = store.vector_search(vec_for("second"), sc, 10)
    assert len(top) == 1 and top[0][1] == pytest.approx(1.0, abs=1e-5)
    assert store.source_stats("s") == {"documents": 1, "chunks": 1}


def test_deletes(backend: Backend) -> None:
    store = backend.make("deletes")
    docs = []
    for agent, ctx in (("A", "c"), ("B", "c"), ("A", "d")):
        for path, n in (("x.py", 3), ("y.py", 2), ("z.md", 1)):
            docs += [mkdoc(agent, ctx, "S", path, f"{path} part {i} {COMMON}", chunk_index=i) for i in range(n)]
    docs += [mkdoc("A", "c", "T", "x.py", f"other source {COMMON}")]
    assert store.bulk_write(docs, refresh=True).errors == []
    assert store.source_stats("S") == {"documents": 3, "chunks": 18}
    assert store.indexed_paths("S") == {"x.py", "y.py", "z.md"}
    assert store.indexed_paths("S", "A", "c") == {"x.py", "y.py", "z.md"}
    assert store.indexed_paths("S", "B") == {"x.py", "y.py", "z.md"}
    assert store.indexed_paths("S", "C") == set() and store.indexed_paths("nope") == set()

    ax = [d for d in docs if (d[F.AGENT_NAME], d[F.CONTEXT_ID], d[F.SOURCE_ID], d[F.PATH]) == ("A", "c", "S", "x.py")]
    assert store.delete_path("A", "c", "S", "x.py", keep_ids=[ax[0]["_id"]]) == 2
    store.refresh()
    sc_ac = flt(scope(agent="A", contexts=("c",)), source_id="S", file_patterns=("x.py",))
    assert [h[0] for h in store.keyword_search(COMMON, sc_ac, 10)] == [ax[0]["_id"]]
    assert [h[0] for h in store.vector_search(vec_for("q"), sc_ac, 10)] == [ax[0]["_id"]]
    # the same path of another scope, and of another source of the same scope, is untouched
    assert len(store.keyword_search(COMMON, flt(scope(agent="B", contexts=None), file_patterns=("x.py",)), 10)) == 3
    assert len(store.keyword_search(COMMON, flt(scope(agent="A", contexts=("c",)), source_id="T"), 10)) == 1
    assert store.delete_path("A", "c", "S", "x.py") == 1
    assert store.delete_path("A", "c", "S", "x.py") == 0
    store.refresh()
    assert store.indexed_paths("S", "A", "c") == {"y.py", "z.md"}
    assert store.indexed_paths("S", "A") == {"x.py", "y.py", "z.md"}  # context d still has x.py

    assert store.delete_source("S", ["y.py", "missing.py"]) == 6
    store.refresh()
    assert store.indexed_paths("S") == {"x.py", "z.md"}
    assert store.source_stats("S") == {"documents": 2, "chunks": 9}
    assert store.delete_source("S") == 9
    store.refresh()
    assert store.source_stats("S") == {"documents": 0, "chunks": 0} and store.indexed_paths("S") == set()
    assert store.keyword_search(COMMON, flt(scope(agent="B", contexts=None)), 10) == []
    assert store.vector_search(vec_for("q"), flt(scope(agent="B", contexts=None)), 10) == []
    assert store.source_stats("T") == {"documents": 1, "chunks": 1}
    assert store.delete_source("S") == 0


# ---------------------------------------------------------------------------------------------- filtered kNN at scale

N_CROWD, N_LONELY = 2000, 20


@pytest.fixture(scope="module")
def crowded(backend: Backend) -> ChunkStore:
    """20 chunks of agent "lonely" inside 2,000 chunks of agent "crowd" whose vectors sit near the probe."""
    store = backend.make("crowded")
    rng = np.random.default_rng(7)
    probe = np.asarray(vec_for("probe"))
    crowd = probe + 0.05 * rng.standard_normal((N_CROWD, DIM))
    lonely = rng.standard_normal((N_LONELY, DIM))
    docs = [mkdoc("crowd", "c", "s", f"crowd/f{i}.py", f"crowd chunk {i} parse {COMMON}", vector=crowd[i].tolist())
            for i in range(N_CROWD)]
    docs += [mkdoc("lonely", "c", "s", f"lonely/f{i}.py", f"lonely chunk {i} parse {COMMON}",
                   vector=lonely[i].tolist()) for i in range(N_LONELY)]
    t0 = time.perf_counter()
    report = store.bulk_write(docs, refresh=True)
    assert report.errors == [] and report.written == len(docs), time.perf_counter() - t0
    return store


def test_filtered_knn_returns_k_hits_for_a_small_scope(crowded: ChunkStore) -> None:
    probe = vec_for("probe")
    sc = scope(agent="lonely", contexts=("c",))
    hits = crowded.vector_search(probe, flt(sc), 10)
    assert len(hits) == 10 and {h[2][F.AGENT_NAME] for h in hits} == {"lonely"}
    assert len(crowded.vector_search(probe, flt(sc), 50)) == N_LONELY  # all of them, no more
    emb = embedder({"parse": probe})
    for mode in ("vector", "hybrid"):
        resp = search(crowded, "parse", sc, mode, emb, max_results=10)
        assert len(resp.hits) == 10 and {h.agent_name for h in resp.hits} == {"lonely"}, mode
        assert_scores(resp)


# ---------------------------------------------------------------------------------------------- record stores


@pytest.fixture(scope="module")
def records(backend: Backend) -> RecordStore:
    return backend.make_records()


def test_record_store_put_get_delete(records: RecordStore) -> None:
    rid = f"k-{uuid.uuid4().hex[:6]}"
    assert records.get("keys", rid) is None
    records.put("keys", rid, {"id": rid, "agent_name": "a", "role": "reader", "context_ids": ["c1", "c2"]})
    assert records.get("keys", rid) == {"id": rid, "agent_name": "a", "role": "reader", "context_ids": ["c1", "c2"]}
    records.put("keys", rid, {"id": rid, "agent_name": "a", "role": "admin"})
    assert records.get("keys", rid) == {"id": rid, "agent_name": "a", "role": "admin"}
    assert records.delete("keys", rid) is True
    assert records.get("keys", rid) is None
    assert records.delete("keys", rid) is False


def test_record_store_find_sort_and_size(records: RecordStore) -> None:
    base = datetime(2026, 3, 1, tzinfo=UTC)
    jobs = [Job(id=f"job-{i}", source_ids=["sA", "sB"] if i % 2 else ["sA"], repo="o/r", ref="main",
                created_at=base + timedelta(hours=i)) for i in range(4)]
    jobs.append(Job(id="job-x", source_ids=["sC"], created_at=base + timedelta(days=3)))
    for job in jobs:  # put_job does not wait for a refresh (reads by id are real-time); find needs the wait
        records.put("jobs", job.id, job.model_dump(mode="json"), wait=True)
    assert records.get_job("job-2") == jobs[2]
    assert [j.id for j in records.list_jobs("sA")] == ["job-3", "job-2", "job-1", "job-0"]
    assert [j.id for j in records.list_jobs("sB")] == ["job-3", "job-1"]
    assert [j.id for j in records.list_jobs("sA", size=2)] == ["job-3", "job-2"]
    assert [j.id for j in records.list_jobs(None)][:2] == ["job-x", "job-3"]
    assert {d["id"] for d in records.find("jobs", repo="o/r", source_ids="sB")} == {"job-1", "job-3"}
    assert records.find("jobs", repo="o/R") == []  # keyword values are exact
    assert records.find("jobs", source_ids="sZ") == []


def test_record_store_typed_helpers(records: RecordStore) -> None:
    src = Source(id=Source.new_id(), agent_name="agent-t", context_id="ctx", repo_url="https://example.invalid/r.git",
                 ref="main", repo_name="o/r")
    records.put_source(src)
    got = records.get_source(src.id)
    assert got is not None and got.id == src.id and got.repo_name == "o/r"
    assert [s.id for s in records.list_sources(agent_name="agent-t")] == [src.id]
    assert records.list_sources(agent_name="AGENT-T") == []
    assert records.indexed_commit(src.id) is None
    records.set_indexed_commit(src.id, "a" * 40)
    assert records.indexed_commit(src.id) == "a" * 40


# ---------------------------------------------------------------------------------------------- metadata filters


def test_metadata_filters_in_vector_and_hybrid_modes(backend: Backend) -> None:
    """``metadata`` narrows kNN (inside the filter, so k hits still come back) and hybrid like keyword (issue 22):
    nested keys by dots, lists match any element, values compare as text."""
    store = backend.make("meta")
    docs = [mkdoc("m", "c", "s", f"doc{i}.md", f"shared words {i}") for i in range(6)]
    metas = [{"team": "a"}, {"team": "b", "tags": ["x", "y"]}, {"nested": {"k": 1}}, {"team": "a", "flag": True},
             {"team": "c"}, {}]
    for d, m in zip(docs, metas, strict=True):
        d[F.METADATA] = m
    assert not store.bulk_write(docs, refresh=True).errors
    sc = scope(agent="m", contexts=("c",))
    probe = vec_for("probe")

    def paths(**meta: Any) -> set[str]:
        filters = tuple((k, tuple(v if isinstance(v, list) else [v])) for k, v in meta.items())
        return {h[2][F.PATH] for h in store.vector_search(probe, flt(sc, metadata=filters), 10)}

    assert paths(team="a") == {"doc0.md", "doc3.md"}
    assert paths(team=["b", "c"]) == {"doc1.md", "doc4.md"}
    assert paths(tags="y") == {"doc1.md"} and paths(**{"nested.k": "1"}) == {"doc2.md"}
    assert paths(team="a", flag="true") == {"doc3.md"} and paths(team="zz") == set()
    emb = embedder({"shared": probe})
    for mode in ("keyword", "vector", "hybrid"):
        resp = search(store, "shared", sc, mode, emb, max_results=10, metadata={"team": "a"})
        assert {h.path for h in resp.hits} == {"doc0.md", "doc3.md"}, mode
        assert_scores(resp)
