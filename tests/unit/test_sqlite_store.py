"""SQLite store specifics not covered by the store contract (tests/integration/test_store_contract.py):
tokenisation, glob translation, persistence and version checks, cheap re-writes, the vector cache, odd queries,
threads, and the record store's find/sort rules. No services needed."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scopekb import fields as F
from scopekb.patterns import compile_glob
from scopekb.stores import sqlite as S
from scopekb.stores.base import ScopeFilter, SearchFilter, StoreVersionMismatch
from scopekb.stores.sqlite import SqliteChunkStore, SqliteRecordStore, index_tokens, query_tokens
from scopekb.stores.sqlite.text import keyword_terms

DIM = 4


def doc(agent: str, path: str, content: str, i: int = 0, vec: Any = None, **extra: Any) -> dict[str, Any]:
    sha = hashlib.sha256(content.encode()).hexdigest()
    d: dict[str, Any] = {"_id": F.chunk_id(agent, "c", "s", path, 1 + i, 2 + i, sha), F.AGENT_NAME: agent,
                         F.CONTEXT_ID: "c",
                         F.SOURCE_ID: "s", F.PATH: path, F.CONTENT: content, F.CHUNK_INDEX: i, F.START_LINE: 1,
                         F.END_LINE: 2, F.CONTENT_SHA: sha, F.INDEXED_AT: "2026-01-01T00:00:00+00:00"}
    if vec is not None:
        d[F.EMBEDDING] = list(vec)
    d.update(extra)
    return d


def everything(agent: str = "a") -> SearchFilter:
    return SearchFilter(scope=ScopeFilter(agent, None))


@pytest.fixture
def store(tmp_path: Path) -> SqliteChunkStore:
    s = SqliteChunkStore(tmp_path / "db" / "chunks.sqlite3", dimension=DIM, model="m")
    s.ensure_index()
    yield s
    s.close()


# ---------------------------------------------------------------------------------------------- tokenisation


@pytest.mark.parametrize(("text", "tokens"), [
    ("parse_rfc3339", ["parse_rfc3339", "parse", "rfc", "3339"]),
    ("parseRFC3339_date", ["parserfc3339_date", "parse", "rfc", "3339", "date"]),
    ("HTTPServer fooBar", ["httpserver", "foobar", "foo", "bar"]),
    ("_private __init__ ___", ["_private", "private", "__init__", "init", "___"]),
    ("a.b-c/d", ["a", "b", "c", "d"]),
    ("ÄrgerÜber naïve", ["ärgerüber", "ärger", "über", "naïve"]),
    ("İstanbul", ["istanbul"]),
    ("", []),
])
def test_index_tokens(text: str, tokens: list[str]) -> None:
    assert index_tokens(text) == tokens


def test_query_tokens_keep_identifiers_whole() -> None:
    assert query_tokens("Parse_RFC3339 retryUpload(x)") == ["parse_rfc3339", "retryupload", "x"]
    assert query_tokens("!!! ---") == []


def test_keyword_terms_drop_stop_words_and_add_identifier_parts() -> None:
    """Issue 21: keyword queries leave out English stop words and add identifier parts (both stores)."""
    assert keyword_terms("Return the parsed HTTPHeader_map") == ["return", "parsed", "httpheader_map", "httpheader",
                                                                 "map"]
    assert keyword_terms("is_valid for x y") == ["is_valid", "x", "y", "valid"]  # "is": a stop word, also as a part
    assert keyword_terms("the parseHeader") == ["parseheader"]  # under 3 terms: a name lookup, no parts
    assert keyword_terms("if not") == ["if", "not"]  # only stop words: searched as they are
    assert keyword_terms("!!! ---") == []


@pytest.mark.parametrize(("glob", "yes", "no"), [
    ("*.py", ["a.py", "x/y/a.py"], ["a.pyc", "a.PY"]),
    ("setup.py", ["setup.py", "pkg/setup.py"], ["mysetup.py", "setup.pyc"]),
    ("src/**/*.py", ["src/a.py", "src/x/y/a.py"], ["lib/src/a.py", "src.py"]),
    ("src/**/a.py", ["src/a.py", "src/x/a.py"], ["src/data.py", "src/xa.py"]),
    ("**/test_*.py", ["test_a.py", "t/test_a.py"], ["t/mytest_a.py"]),
    ("docs/*", ["docs/a.md", "docs/x/a.md"], ["a/docs/a.md"]),
    ("file?.txt", ["file1.txt", "d/fileA.txt"], ["file10.txt"]),
    ("a[1].py", ["a[1].py"], ["a1.py"]),  # brackets are literal, as in an OpenSearch wildcard
    ("**", ["anything/at/all"], []),
])
def test_glob_matching(glob: str, yes: list[str], no: list[str]) -> None:
    g = compile_glob(glob)
    assert all(g.match(p) for p in yes), glob
    assert not any(g.match(p) for p in no), glob


# ---------------------------------------------------------------------------------------------- lifecycle


def test_reopen_keeps_data_and_refuses_other_dimension_or_model(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    s = SqliteChunkStore(path, dimension=DIM, model="m")
    assert s.bulk_write([doc("a", "x.py", "hello world", vec=[1, 0, 0, 0])]).written == 1  # ensures on first write
    s.close()
    again = SqliteChunkStore(path, dimension=DIM, model="m")
    assert again.ensure_index() == s.ensure_index()
    assert again.count() == 1 and again.keyword_search("hello", everything(), 5)
    assert SqliteChunkStore(path, dimension=DIM).ensure_index()  # model None: no model check
    for dim, model in ((DIM + 1, "m"), (None, None), (DIM, "other")):
        with pytest.raises(StoreVersionMismatch):
            SqliteChunkStore(path, dimension=dim, model=model).ensure_index()
    with pytest.raises(StoreVersionMismatch):
        SqliteChunkStore(path, dimension=DIM + 1, model="m").bulk_write([doc("a", "y.py", "x")])
    again.drop()
    bigger = SqliteChunkStore(path, dimension=DIM + 1, model="m2")
    bigger.ensure_index()
    assert bigger.count() == 0
    for st in (again, bigger):
        st.close()


def test_reads_on_a_missing_database_are_empty(tmp_path: Path) -> None:
    s = SqliteChunkStore(tmp_path / "none.sqlite3", dimension=DIM)
    assert s.keyword_search("x", everything(), 5) == [] and s.vector_search([1, 0, 0, 0], everything(), 5) == []
    assert s.indexed_paths("s") == set() and s.source_stats("s") == {"documents": 0, "chunks": 0}
    assert s.delete_source("s") == 0 and s.count() == 0
    with pytest.raises(ValueError):
        SqliteChunkStore(":memory:")


# ---------------------------------------------------------------------------------------------- writes


def test_rejections_name_the_reason(store: SqliteChunkStore) -> None:
    bad = {
        "dim": doc("a", "1.py", "x1", vec=[1, 0, 0]),
        "zero": doc("a", "2.py", "x2", vec=[0, 0, 0, 0]),
        "nan": doc("a", "3.py", "x3", vec=[float("nan"), 0, 0, 1]),
        "unknown": doc("a", "4.py", "x4", bogus=1),
        "int": doc("a", "5.py", "x5", start_line="first"),
        "meta": doc("a", "6.py", "x6", metadata="flat"),
        "date": doc("a", "7.py", "x7", indexed_at="yesterday"),
        "list": doc("a", "8.py", "x8", language=["a", "b"]),
    }
    report = store.bulk_write([*bad.values(), doc("a", "ok.py", "fine", vec=[0, 1, 0, 0])])
    assert report.written == 1
    reasons = {path: reason for _, path, reason in report.errors}
    assert set(reasons) == {f"{i}.py" for i in range(1, 9)}
    assert "Expected: 4, Given: 3" in reasons["1.py"] and "zero vector" in reasons["2.py"]
    assert "bogus" in reasons["4.py"] and "start_line" in reasons["5.py"]
    assert store.count() == 1


def test_unchanged_rewrite_skips_tokenising(store: SqliteChunkStore, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = [doc("a", f"f{i}.py", f"someFunction_{i} body text", vec=[1, i, 0, 0]) for i in range(300)]
    assert store.bulk_write(docs).written == 300
    calls = []
    real = S.fts_text
    monkeypatch.setattr(S.chunks, "fts_text", lambda t: calls.append(t) or real(t))  # where bulk_write looks
    assert store.bulk_write(docs).written == 300  # identical: skipped
    newer = [{**d, F.INDEXED_AT: "2026-02-01T00:00:00+00:00", F.COMMIT: "f" * 40} for d in docs]
    assert store.bulk_write(newer).written == 300  # stored fields change, searchable text does not
    assert calls == []
    hits = store.keyword_search("somefunction_7", everything(), 5)
    assert [h[2][F.COMMIT] for h in hits] == ["f" * 40]
    renamed = {**docs[0], F.SYMBOL: "renamedSymbol"}
    assert store.bulk_write([renamed]).written == 1 and calls  # text changed: re-tokenised
    assert store.keyword_search("renamed", everything(), 5)[0][0] == docs[0]["_id"]
    assert store.count() == 300


def test_removing_a_vector_on_rewrite(store: SqliteChunkStore) -> None:
    d = doc("a", "x.py", "with vector", vec=[1, 0, 0, 0])
    store.bulk_write([d])
    assert len(store.vector_search([1, 0, 0, 0], everything(), 5)) == 1
    store.bulk_write([{k: v for k, v in d.items() if k != F.EMBEDDING}])
    assert store.vector_search([1, 0, 0, 0], everything(), 5) == []
    assert len(store.keyword_search("vector", everything(), 5)) == 1


# ---------------------------------------------------------------------------------------------- reads


@pytest.mark.parametrize("query", ['NEAR("x")', '"', "AND OR NOT", "*", "col:abc", "a^2", "(", "'", "-x +y"])
def test_odd_queries_do_not_break_fts(store: SqliteChunkStore, query: str) -> None:
    store.bulk_write([doc("a", "x.py", "and or not near col abc x y a")])
    hits = store.keyword_search(query, everything(), 5)
    assert all(h[1] > 0 for h in hits)


def test_vector_cache_matches_direct_reads_and_follows_writes(store: SqliteChunkStore,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((200, DIM))
    store.bulk_write([doc("a" if i % 2 else "b", f"f{i}.py", f"chunk {i}", vec=vecs[i]) for i in range(200)])
    q = rng.standard_normal(DIM)
    monkeypatch.setattr(S.chunks, "_SMALL_INDEX_MAX", 0)  # not small: filtered reads go to the vectors directly
    direct = store.vector_search(q, everything(), 10)
    assert store._vec_cache is None
    monkeypatch.setattr(S.chunks, "_DIRECT_READ_MAX", 0)
    cached = store.vector_search(q, everything(), 10)
    assert store._vec_cache is not None
    assert [h[0] for h in cached] == [h[0] for h in direct]
    assert [h[1] for h in cached] == pytest.approx([h[1] for h in direct])
    # exact: the same order as a brute-force numpy ranking over agent "a"
    mine = [i for i in range(200) if i % 2]
    sims = {i: float(vecs[i] @ q / np.linalg.norm(vecs[i]) / np.linalg.norm(q)) for i in mine}
    want = sorted(mine, key=lambda i: -sims[i])[:10]
    assert [h[2][F.PATH] for h in cached] == [f"f{i}.py" for i in want]
    assert cached[0][1] == pytest.approx((1 + sims[want[0]]) / 2, abs=1e-6)
    # writes and deletes invalidate the cache
    store.bulk_write([doc("a", "best.py", "best", vec=q)])
    assert store.vector_search(q, everything(), 1)[0][2][F.PATH] == "best.py"
    store.delete_source("s", ["best.py"])
    assert store.vector_search(q, everything(), 1)[0][2][F.PATH] == f"f{want[0]}.py"


def test_a_small_index_is_searched_from_the_cache_with_the_same_answers(store: SqliteChunkStore,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20: an index of at most ``_SMALL_INDEX_MAX`` vectors is held in the cache on its first kNN, whatever
    the filter (each search read and unpacked every vector of the scope from SQLite); the hits and scores are the
    direct reads' exactly, for the whole scope and a filtered part, and a write still invalidates it."""
    rng = np.random.default_rng(5)
    vecs = rng.standard_normal((300, DIM))
    store.bulk_write([doc("a", f"{'src' if i % 3 else 'doc'}/f{i}.py", f"chunk {i}", vec=vecs[i]) for i in range(300)])
    queries = [rng.standard_normal(DIM) for _ in range(5)]
    filters = [everything(), SearchFilter(scope=ScopeFilter("a", None), file_patterns=["doc/*.py"])]

    def answers() -> list[list[tuple[str, float]]]:
        return [[(h[0], h[1]) for h in store.vector_search(q, f, 10)] for q in queries for f in filters]

    monkeypatch.setattr(S.chunks, "_SMALL_INDEX_MAX", 0)
    direct = answers()
    assert store._vec_cache is None
    monkeypatch.undo()
    assert S.chunks._SMALL_INDEX_MAX >= 300
    cached = answers()
    assert store._vec_cache is not None and store._vec_cache[1].size == 300
    assert cached == direct  # same ids, same scores, same order (not approximately)
    store.bulk_write([doc("a", "doc/best.py", "best", vec=queries[0])])
    assert store.vector_search(queries[0], filters[1], 1)[0][2][F.PATH] == "doc/best.py"
    assert store._vec_cache[1].size == 301


def test_query_vector_errors(store: SqliteChunkStore) -> None:
    for bad in ([1, 0, 0], [0, 0, 0, 0], [float("inf"), 0, 0, 0]):
        with pytest.raises(ValueError):
            store.vector_search(bad, everything(), 3)
    assert store.vector_search([1, 0, 0, 0], everything(), 0) == []


def test_threads_write_and_read_concurrently(store: SqliteChunkStore) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        try:
            for b in range(10):
                store.bulk_write([doc("a", f"w{w}/f{b}-{i}.py", f"writer {w} batch {b} item {i} common",
                                      vec=[w + 1, b, i, 1]) for i in range(20)])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader() -> None:
        try:
            while not stop.is_set():
                store.keyword_search("common", everything(), 10)
                store.vector_search([1, 1, 1, 1], everything(), 5)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    assert store.count() == 4 * 10 * 20
    assert store.source_stats("s") == {"documents": 800, "chunks": 800}


def test_two_store_objects_on_one_file_see_each_other(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    one, two = SqliteChunkStore(path, DIM, "m"), SqliteChunkStore(path, DIM, "m")
    one.bulk_write([doc("a", "x.py", "first", vec=[1, 0, 0, 0])])
    assert two.vector_search([1, 0, 0, 0], everything(), 5)[0][2][F.PATH] == "x.py"
    two.bulk_write([doc("a", "y.py", "second", vec=[0.9, 0.1, 0, 0])])
    assert [h[2][F.PATH] for h in one.vector_search([0, 1, 0, 0], everything(), 5)] == ["y.py", "x.py"]
    one.close()
    two.close()


# ---------------------------------------------------------------------------------------------- records


def test_record_store_find_rules(tmp_path: Path) -> None:
    r = SqliteRecordStore(tmp_path / "chunks.sqlite3")  # may share the chunk store's file
    SqliteChunkStore(tmp_path / "chunks.sqlite3", DIM).ensure_index()
    r.put("keys", "k1", {"id": "k1", "role": "admin", "active": True, "n": 3, "created_at": "2026-01-01T10:00:00Z"})
    r.put("keys", "k2", {"id": "k2", "role": "reader", "context_ids": ["x", "y"], "created_at":
                         "2026-01-01T12:00:00+02:00"})
    r.put("keys", "k3", {"id": "k3", "role": "reader"})
    r.put("other-kind", "k1", {"id": "elsewhere"})
    assert r.get("keys", "k1")["role"] == "admin" and r.get("other-kind", "k1") == {"id": "elsewhere"}
    assert [d["id"] for d in r.find("keys", role="reader")] == ["k2", "k3"]
    assert [d["id"] for d in r.find("keys", context_ids="y")] == ["k2"]
    assert [d["id"] for d in r.find("keys", active=True, n=3)] == ["k1"]
    assert [d["id"] for d in r.find("keys", role=None)] == ["k1", "k2", "k3"]
    # 12:00+02:00 is 10:00Z, earlier than... equal instant to k1: ties broken by id (descending); missing last
    assert [d["id"] for d in r.find("keys", sort="created_at")] == ["k2", "k1", "k3"]
    assert [d["id"] for d in r.find("keys", sort="created_at", size=1)] == ["k2"]
    assert r.find("keys", **{"bad name": "x"}) == [] and r.find("nothing-here") == []
    assert r.delete("keys", "k3") and not r.delete("keys", "k3")
    r.close()
    assert r.get("keys", "k1")["role"] == "admin"  # reopens after close


def test_a_forked_child_opens_its_own_connection(store: SqliteChunkStore) -> None:
    import multiprocessing

    store.bulk_write([doc("a", "parent.py", "written by the parent")])
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=lambda: store.bulk_write([doc("a", "child.py", "written by the child")]))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert store.indexed_paths("s") == {"parent.py", "child.py"}


def test_search_degrades_to_keyword_when_the_index_is_rebuilt_for_another_model(tmp_path: Path) -> None:
    from scopekb.models import SearchMode, SearchRequest
    from scopekb.search import run_search
    from scopekb.settings import QuerySettings

    path = tmp_path / "c.sqlite3"
    old = SqliteChunkStore(path, DIM, "m")
    old.bulk_write([doc("a", "x.py", "hello there", vec=[1, 0, 0, 0])])
    old.drop()  # what an embedded reindex for a bigger model does, from another store object
    new = SqliteChunkStore(path, DIM + 2, "m2")
    new.bulk_write([doc("a", "x.py", "hello there", vec=[1, 0, 0, 0, 0, 0])])
    with pytest.raises(S.SqliteVersionMismatch):
        old.vector_search([1, 0, 0, 0], everything(), 3)
    resp = run_search(old, SearchRequest(query="hello", mode=SearchMode.hybrid), ScopeFilter("a", None),
                      QuerySettings(), lambda _: [1, 0, 0, 0])
    assert [h.path for h in resp.hits] == ["x.py"] and resp.notice
    for st in (old, new):
        st.close()


def test_reindex_upgrades_a_schema_1_index_keeping_chunks_vectors_and_refs(tmp_path: Path) -> None:
    """An index built before schema 2 (no trigram, definition or metadata tables) is refused with 'Run scopekb
    reindex'; the reindex rebuilds it in place: same chunks, vectors and refs, and exact/symbol/metadata search
    work, a chunk's top-level symbol standing for its definitions."""
    from scopekb.models import SearchMode, SearchRequest
    from scopekb.reindex import reindex
    from scopekb.search import run_search
    from scopekb.settings import ChunkingSettings, QuerySettings

    path = tmp_path / "old.sqlite3"
    s = SqliteChunkStore(path, dimension=DIM, model="m")
    s.bulk_write([doc("a", "x.py", "def parse_rfc(a):\n    return a", vec=[1, 0, 0, 0], symbol="parse_rfc",
                      kind="function", signature="def parse_rfc(a):", metadata={"owner": "ann"}),
                  doc("a", "y.md", "# Title\ntext", 1, vec=[0, 1, 0, 0], refs=["main", "v1"])])
    s.close()
    import sqlite3

    with sqlite3.connect(path) as conn:  # what schema 1 had: none of the new tables, version "1"
        for t in ("chunks_tri", "chunk_defs", "chunk_meta"):
            conn.execute(f"DROP TABLE {t}")
        conn.execute("UPDATE scopekb_meta SET value = '1' WHERE key = 'schema_version'")
    s = SqliteChunkStore(path, dimension=DIM, model="m")
    with pytest.raises(StoreVersionMismatch, match="scopekb reindex"):
        s.ensure_index()
    rep = reindex(s, None, None, ChunkingSettings())
    assert rep.chunks == 2 and not path.with_name(path.name + ".pre-reindex").exists()
    assert s.ensure_index() == s.version_name
    assert s.count() == 2 and s.chunk_refs([d["_id"] for d in s.stored_documents()]) != {}
    assert sorted(r for refs in s.chunk_refs([d["_id"] for d in s.stored_documents()]).values() for r in refs) \
        == ["main", "v1"]
    scope = ScopeFilter("a", None)
    hit = run_search(s, SearchRequest(query="parse_rfc", mode=SearchMode.symbol), scope, QuerySettings()).hits
    assert [(h.path, h.definitions[0]["kind"], h.match_lines) for h in hit] == [("x.py", "function", [1])]
    ex = run_search(s, SearchRequest(query="return a", mode=SearchMode.exact, metadata={"owner": "ann"}), scope,
                    QuerySettings()).hits
    assert [(h.path, h.match_lines) for h in ex] == [("x.py", [2])]
    assert s.vector_search([0, 1, 0, 0], everything(), 1)[0][2][F.PATH] == "y.md"
    s.close()


def test_a_cached_small_index_rebuilt_by_another_store_object_answers_from_the_new_vectors(tmp_path: Path) -> None:
    """Hostile pass (issue 20's small-index cache): another process drops and rebuilds the index file (a reindex)
    and writes as many vector batches as this process had seen, so the rebuilt index's vector generation equals
    the one this process cached. The search must score the rebuilt vectors, not the cached ones of old rowids."""
    path = tmp_path / "shared.sqlite3"
    one, two = SqliteChunkStore(path, DIM, "m"), SqliteChunkStore(path, DIM, "m")
    one.ensure_index()
    one.bulk_write([doc("a", "old-x.py", "old x", vec=[1, 0, 0, 0]), doc("a", "old-y.py", "old y", vec=[0, 1, 0, 0])])
    assert [h[2][F.PATH] for h in one.vector_search([1, 0, 0, 0], everything(), 2)] == ["old-x.py", "old-y.py"]
    assert one._vec_cache is not None  # cached at generation 1
    two.drop()
    two.ensure_index()  # generation 0 again, rowids from 1 again
    two.bulk_write([doc("a", "new-p.py", "new p", vec=[0, 1, 0, 0]), doc("a", "new-q.py", "new q", vec=[1, 0, 0, 0])])
    got = [h[2][F.PATH] for h in one.vector_search([1, 0, 0, 0], everything(), 2)]
    assert got == ["new-q.py", "new-p.py"], got
    one.close()
    two.close()


def test_a_search_with_the_other_local_backend_names_the_setting_that_keeps_the_index(tmp_path: Path) -> None:
    """Hostile pass: ``scopekb search`` with SCOPEKB_EMBEDDING__LOCAL_BACKEND=onnx-int8 on an index of fp32 vectors
    degraded to keyword with "was rebuilt for ... model ...; restart this process with the new model settings":
    nothing was rebuilt and no restart helps. The notice is one line and names model_mismatch_fix's fix."""
    path = tmp_path / "c.sqlite3"
    fp32 = SqliteChunkStore(path, DIM, "local:m@1")
    fp32.bulk_write([doc("a", "x.py", "hello there", vec=[1, 0, 0, 0])])
    int8 = SqliteChunkStore(path, DIM, "local:m@1+int8-abc")
    with pytest.raises(S.SqliteVersionMismatch) as e:
        int8.vector_search([1, 0, 0, 0], everything(), 3)
    msg = str(e.value)
    assert "\n" not in msg and "rebuilt" not in msg
    assert "SCOPEKB_EMBEDDING__LOCAL_BACKEND=onnx " in msg and "scopekb reindex" in msg
    fp32.close()
    int8.close()


def test_an_embedded_reindex_embeds_while_the_old_index_still_answers(tmp_path: Path) -> None:
    """README newcomer: an embedded reindex dropped the tables first and embedded batch by batch, so searches found
    nothing, then part of the index, for minutes. Every vector is now computed (into the cache) while the old index
    still holds every chunk; the rebuild after the drop reads them from the cache and computes nothing."""
    from scopekb.embedding.base import EmbedResult
    from scopekb.embedding.cache import MemoryEmbeddingCache
    from scopekb.reindex import reindex
    from scopekb.settings import ChunkingSettings

    path = tmp_path / "idx.sqlite3"
    old = SqliteChunkStore(path, dimension=DIM, model="old")
    old.bulk_write([doc("a", f"f{i}.py", f"def f{i}():\n    return {i}", i, vec=[1, 0, 0, 0]) for i in range(7)])
    old.close()
    new = SqliteChunkStore(path, dimension=DIM, model="new")
    seen: list[int] = []

    class Counting:
        model_id, dimension, max_input_tokens = "new", DIM, 256

        def embed(self, texts: list[str]) -> EmbedResult:
            probe = SqliteChunkStore(path, dimension=DIM, model="old")  # what a searching process sees now
            seen.append(probe.count())
            probe.close()
            return EmbedResult(vectors=[[0.0, 1.0, 0.0, 0.0] for _ in texts], token_counts=[1] * len(texts),
                               total_tokens=len(texts))

        def count_tokens(self, texts: list[str]) -> list[int]:
            return [len(t.split()) for t in texts]

    progress: list[int] = []
    rep = reindex(new, Counting(), MemoryEmbeddingCache(), ChunkingSettings(), batch=3, progress=progress.append)
    assert seen == [7, 7, 7], seen  # three batches, each embedded while the old index held all 7 chunks
    assert (rep.chunks, rep.embeddings_computed, rep.embeddings_cached, rep.embedding_failures) == (7, 7, 0, 0)
    assert progress == [3, 6, 7, 3, 6, 7]  # embedded, then written
    assert (rep.old_index, rep.new_index) == (old.version_name, new.version_name) != (new.version_name,) * 2
    assert new.count() == 7 and all(d[F.EMBEDDING_MODEL] == "new" for d in new.stored_documents())
    new.close()


def test_syncs_and_a_rebuild_exclude_each_other_across_open_files(tmp_path: Path) -> None:
    """Hostile review: in the embedded profile ``scopekb index`` beside ``scopekb reindex`` (two processes) wrote into
    tables the rebuild then dropped, and recorded its commit as indexed. A rebuild now takes an exclusive ``flock``
    once no sync holds the shared one, and syncs wait while it is held (each guard opens the lock file itself, as
    another process does)."""
    from scopekb.stores.base import StoreBusy

    store = SqliteChunkStore(tmp_path / "idx.sqlite3", dimension=DIM, model="m")
    events: list[str] = []
    with store.sync_guard(), store.sync_guard():  # any number of syncs at once
        with pytest.raises(StoreBusy, match="syncs still running after 0.3s"):
            with store.rebuild_guard(0.3):
                events.append("rebuilt while a sync ran")
    entered = threading.Event()

    def sync() -> None:
        with store.sync_guard():
            events.append("sync")
            entered.set()

    with store.rebuild_guard(1.0):
        t = threading.Thread(target=sync)
        t.start()
        assert not entered.wait(0.5), "a sync ran inside the rebuild"
        events.append("rebuild done")
    assert entered.wait(5)
    t.join()
    assert events == ["rebuild done", "sync"], events
    store.close()
