"""Ref membership in both chunk stores (issue 23): a chunk is one document whatever number of refs share it; refs
are added and taken away without rewriting it, a chunk left with no ref is deleted, a ``ref`` filter sees members
only, and an OpenSearch index or SQLite file made before the ``refs`` field gets it with ``refs = [ref]``."""

from __future__ import annotations

from typing import Any

from scopekb import fields as F
from scopekb.models import SearchRequest
from scopekb.search import run_search
from scopekb.settings import QuerySettings
from scopekb.stores.base import ChunkStore, ScopeFilter, SearchFilter
from tests.integration.test_store_contract import Backend, backend, mkdoc  # noqa: F401 - the two-store fixture

SC = ScopeFilter("ragent", ("c",))


def _paths(store: ChunkStore, ref: str) -> set[str]:
    return {d[F.PATH] for _, _, d in store.keyword_search("refmarker", SearchFilter(scope=SC, ref=ref), 50)}


def test_membership_is_added_and_taken_away_without_copies(backend: Backend) -> None:  # noqa: F811
    store = backend.make("membership", dimension=None, model=None)
    a = {**mkdoc("ragent", "c", "s1", "a.py", "refmarker alpha", vector=False), F.REFS: ["main"]}
    b = {**mkdoc("ragent", "c", "s1", "b.py", "refmarker beta", vector=False), F.REFS: ["main"]}
    other = {**mkdoc("ragent", "c", "s2", "a.py", "refmarker alpha", vector=False), F.REFS: ["main"]}
    assert not store.bulk_write([a, b, other], refresh=True).errors
    assert store.chunk_refs([a["_id"], "missing"]) == {a["_id"]: ["main"]}
    assert not store.set_refs({a["_id"]: ["main", "dev"]}).errors
    store.refresh()
    assert store.count() == 3 and _paths(store, "dev") == {"a.py"} and _paths(store, "main") == {"a.py", "b.py"}
    hit = run_search(store, SearchRequest(query="refmarker alpha", ref="dev"), SC, QuerySettings()).hits[0]
    assert hit.path == "a.py" and sorted(hit.refs or []) == ["dev", "main"]
    # main leaves s1 except a.py: b.py has no ref left and is deleted; s2 is another source, untouched
    assert store.remove_ref("ragent", "c", "s1", "main", keep_ids=[a["_id"]]) == (1, 1)
    store.refresh()
    assert store.count() == 2 and _paths(store, "main") == {"a.py"}
    assert store.remove_ref("ragent", "c", "s1", "main", paths=["a.py"]) == (1, 0)
    store.refresh()
    assert _paths(store, "dev") == {"a.py"} and store.chunk_refs([a["_id"]]) == {a["_id"]: ["dev"]}
    assert store.remove_ref("ragent", "c", "s1", "dev") == (1, 1)
    assert store.remove_ref("ragent", "c", "s1", "dev") == (0, 0)
    store.refresh()
    assert store.count() == 1 and store.chunk_refs([a["_id"], other["_id"]]) == {other["_id"]: ["main"]}


def test_an_index_from_before_refs_is_given_them(backend: Backend) -> None:  # noqa: F811
    doc: dict[str, Any] = mkdoc("ragent", "c", "s1", "old.py", "refmarker legacy", ref="dev", vector=False)
    if backend.name == "opensearch":
        from scopekb.stores.opensearch import OpenSearchChunkStore

        store = backend.make("legacy", dimension=None, model=None, ensure=False)
        assert isinstance(store, OpenSearchChunkStore)
        mapping = F.chunk_mapping(None)
        del mapping["properties"][F.REFS]
        backend.client.indices.create(index=store.version_name, body={
            "settings": F.chunk_index_settings(1, 0, knn=False), "mappings": mapping,
            "aliases": {store.alias: {}}})
        backend.client.index(index=store.alias, id=doc["_id"], body={k: v for k, v in doc.items() if k != "_id"},
                             refresh=True)
        store.ensure_index()
    else:
        store = backend.make("legacy", dimension=None, model=None)
        assert not store.bulk_write([doc]).errors  # a document without refs is on its one ref
    store.refresh()
    assert store.chunk_refs([doc["_id"]]) == {doc["_id"]: ["dev"]}
    assert _paths(store, "dev") == {"old.py"} and _paths(store, "main") == set()


def test_membership_changes_keep_the_vectors(backend: Backend) -> None:  # noqa: F811
    """A chunk whose refs change (partial update, copy to a new ref, a ref taken away) still answers kNN with its
    own vector: on OpenSearch every membership change re-indexes the document from ``_source``, so a vector kept
    out of ``_source`` was dropped by the first one (mapping version 4)."""
    store = backend.make("membership-vectors")
    a = {**mkdoc("ragent", "c", "s1", "a.py", "refmarker alpha"), F.REFS: ["main"]}
    b = {**mkdoc("ragent", "c", "s1", "b.py", "refmarker beta"), F.REFS: ["main"]}
    assert not store.bulk_write([a, b], refresh=True).errors

    def nearest(doc: dict[str, Any], ref: str) -> str | None:
        hits = store.vector_search(doc[F.EMBEDDING], SearchFilter(scope=SC, ref=ref), 1)
        return hits[0][2][F.PATH] if hits else None

    assert not store.set_refs({a["_id"]: ["main", "dev"]}).errors
    store.copy_ref("ragent", "c", "s1", "main", "release")
    store.remove_ref("ragent", "c", "s1", "main", paths=["b.py"])
    store.refresh()
    assert nearest(a, "dev") == "a.py" and nearest(a, "main") == "a.py" and nearest(a, "release") == "a.py"
    assert nearest(b, "release") == "b.py" and nearest(b, "main") != "b.py"


def test_a_membership_change_over_many_scroll_batches(backend: Backend) -> None:  # noqa: F811
    """A by-query membership change that reads its chunks in more than 100 scroll batches completes: OpenSearch
    2.19 answers a blocking by-query request with one ``TASK_RESOURCE_USAGE`` header per batch and Python's HTTP
    client refused more than 100 of them (django's 130,000-chunk branch copy failed so); the store now waits on
    the task instead. Batches are made small here (2 chunks) so 300 chunks take 150 batches."""
    store = backend.make("membership-batches", dimension=None, model=None)
    if backend.name == "opensearch":
        store.by_query_batch = 2  # type: ignore[attr-defined]
    docs = [{**mkdoc("ragent", "c", "s1", f"f{i}.py", f"refmarker n{i}", vector=False), F.REFS: ["main"]}
            for i in range(300)]
    assert not store.bulk_write(docs, refresh=True).errors
    assert store.copy_ref("ragent", "c", "s1", "main", "dev") == 300
    store.refresh()
    assert store.remove_ref("ragent", "c", "s1", "main") == (300, 0)
    store.refresh()
    assert store.count() == 300 and len(_paths(store, "dev")) == 50 and not _paths(store, "main")
