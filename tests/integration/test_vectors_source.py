"""Issue #19: vectors are kept out of the stored ``_source`` of the chunk index (k-NN derived source, mapping
version 6) and out of doc values (version 7), and still survive every way chunks are changed after they are
written, on a real OpenSearch: partial updates of ``refs`` (``set_refs``), ``update_by_query`` membership changes
(``copy_ref``/``remove_ref``), the embedding stage's ``set_vectors``, and a ``scopekb reindex`` (which takes
vectors from the embedding cache, never from ``_source``). A chunk whose vector had been dropped would no longer
come back from kNN, and its ``_source`` would have no vector to give back."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence

import numpy as np
from opensearchpy import helpers

from scopekb import fields as F
from scopekb.embedding import OpenSearchEmbeddingCache
from scopekb.embedding.base import EmbedResult
from scopekb.reindex import reindex
from scopekb.settings import ChunkingSettings, OpenSearchSettings
from scopekb.stores.base import ScopeFilter, SearchFilter
from scopekb.stores.opensearch import OpenSearchChunkStore, make_client

DIM = 384
N = 60


class HashEmbedder:
    """Deterministic unit vectors from the sha256 of each text (a stand-in model; counts texts embedded)."""

    model_id = "hash:384"
    dimension = DIM
    max_input_tokens = 10_000

    def __init__(self) -> None:
        self.embedded = 0

    def _vec(self, text: str) -> list[float]:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).normal(size=DIM)
        return (v / np.linalg.norm(v)).astype(np.float32).tolist()

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        self.embedded += len(texts)
        return EmbedResult(vectors=[self._vec(t) for t in texts], token_counts=[len(t) for t in texts],
                           errors={}, total_tokens=sum(len(t) for t in texts), requests=1)

    def embed_query(self, text: str) -> list[float]:
        return self._vec(text)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]

    def close(self) -> None:
        pass


def _doc(i: int, vec: list[float] | None) -> dict:
    d = {"_id": f"c{i}", F.AGENT_NAME: "a", F.CONTEXT_ID: "c", F.SOURCE_ID: "s", F.REPO: "r", F.REF: "main",
         F.REFS: ["main"], F.PATH: f"pkg/m{i}.py", F.LANGUAGE: "python", F.KIND: "lines",
         F.CONTENT: f"def f{i}():\n    return {i} * {i}\n", F.CHUNK_INDEX: 0, F.START_LINE: 1, F.END_LINE: 2,
         F.CONTENT_SHA: f"sha{i}", F.BLOB_SHA: f"blob{i}"}
    if vec is not None:
        d[F.EMBEDDING], d[F.EMBEDDING_MODEL] = vec, HashEmbedder.model_id
    return d


def _stored_vectors(client, alias: str) -> dict[str, list[float]]:
    """``id -> vector`` as the source reads give it back (derived from the vector values)."""
    client.indices.refresh(index=alias)
    return {h["_id"]: h["_source"][F.EMBEDDING] for h in helpers.scan(
        client, index=alias, query={"query": {"exists": {"field": F.EMBEDDING}}, "_source": [F.EMBEDDING]})}


def _assert_knn_finds_each(store: OpenSearchChunkStore, vectors: dict[str, list[float]], ref: str) -> None:
    for cid, vec in vectors.items():
        hits = store.vector_search(vec, SearchFilter(scope=ScopeFilter("a", ("c",)), ref=ref), 3)
        assert hits and hits[0][0] == cid, (cid, [h[0] for h in hits[:3]])


def _membership_changes(store: OpenSearchChunkStore) -> None:
    """Every kind of membership write: update_by_query (copy_ref, remove_ref) and partial updates (set_refs)."""
    assert store.copy_ref("a", "c", "s", "main", "dev") == N
    unlinked, deleted = store.remove_ref("a", "c", "s", "main", paths=[f"pkg/m{i}.py" for i in range(0, N, 2)])
    assert (unlinked, deleted) == (N // 2, 0)
    assert store.set_refs({f"c{i}": ["dev", "v1"] for i in range(1, N, 3)}).written == len(range(1, N, 3))
    store.refresh()


def test_vectors_out_of_stored_source_survive_updates_and_reindex(opensearch_url: str) -> None:
    client = make_client(OpenSearchSettings(url=opensearch_url))
    run = uuid.uuid4().hex[:8]
    alias, twin = f"it-vsrc-{run}", f"it-vsrc-{run}-twin"
    emb = HashEmbedder()
    cache = OpenSearchEmbeddingCache(client, f"it-vsrc-{run}-embcache")
    store = OpenSearchChunkStore(client, alias=alias, dimension=DIM, model=emb.model_id)
    try:
        index = store.ensure_index()
        settings = client.indices.get_settings(index=index)[index]["settings"]["index"]
        assert settings["knn.derived_source"]["enabled"] == "true"
        # no second float32 copy of each vector in doc values (mapping version 7)
        assert client.indices.get_mapping(index=index)[index]["mappings"]["properties"][F.EMBEDDING][
            "doc_values"] is False
        # two thirds written with vectors, one third without (the embedding stage adds theirs later)
        first = {f"c{i}": emb._vec(f"text {i}") for i in range(N)}
        docs = [_doc(i, first[f"c{i}"] if i % 3 else None) for i in range(N)]
        assert not store.bulk_write(docs, refresh=True).errors
        assert not store.set_vectors({f"c{i}": (first[f"c{i}"], f"blob{i}") for i in range(0, N, 3)},
                                     emb.model_id).errors
        _membership_changes(store)
        after = _stored_vectors(client, alias)
        assert set(after) == set(first)  # no chunk lost its vector
        assert all(np.allclose(after[k], first[k], atol=1e-6) for k in first)
        _assert_knn_finds_each(store, after, "dev")

        # the stored bytes: the same documents, written once, take far less room than in an index keeping the
        # vectors in _source (the mapping's settings with only derived source turned off)
        sizes = []
        for derived in (True, False):
            body = {"settings": F.chunk_index_settings(1, 0, knn=True),
                    "mappings": F.chunk_mapping(DIM, emb.model_id)}
            body["settings"]["index"]["knn.derived_source.enabled"] = derived
            name = f"{twin}-{derived}".lower()
            client.indices.create(index=name, body=body)
            helpers.bulk(client, ({"_index": name, "_id": d.pop("_id"), "_source": d}
                                  for d in (_doc(i, first[f"c{i}"]) for i in range(N))), refresh=True)
            client.indices.forcemerge(index=name, params={"max_num_segments": 1, "request_timeout": 120})
            client.indices.refresh(index=name)
            sizes.append(client.indices.stats(index=name, metric="store")["indices"][name]["primaries"]["store"][
                "size_in_bytes"])
        assert sizes[0] < 0.6 * sizes[1], sizes  # measured: 0.36 (210,746 vs 580,923 bytes)

        # a reindex (here to scalar quantization) takes the vectors from the embedding cache, never from _source
        stats = reindex(store, emb, cache, ChunkingSettings())  # first: fills the cache from the model
        assert stats.chunks == N and stats.embeddings_computed == N
        sq = OpenSearchChunkStore(client, alias=alias, dimension=DIM, model=emb.model_id, encoder="sq")
        before_embedded = emb.embedded
        stats = reindex(sq, emb, cache, ChunkingSettings())
        assert stats.chunks == N and stats.embeddings_cached == N and emb.embedded == before_embedded
        new = sq.live_index()
        assert client.indices.get_settings(index=new)[new]["settings"]["index"]["knn.derived_source"][
            "enabled"] == "true"
        reindexed = _stored_vectors(client, alias)
        assert set(reindexed) == set(first)
        assert sq.set_refs({f"c{i}": ["dev", "v2"] for i in range(N)}).written == N
        sq.remove_ref("a", "c", "s", "v1")
        sq.refresh()
        assert _stored_vectors(client, alias) == reindexed
        _assert_knn_finds_each(sq, reindexed, "v2")
    finally:
        client.indices.delete(index=f"it-vsrc-{run}*", params={"expand_wildcards": "open"})


def test_int8_vectors_survive_updates_and_reindex(opensearch_url: str) -> None:
    """The ``int8`` encoder (mapping version 8): vectors stored as bytes (``data_type: byte``) by
    :func:`scopekb.fields.int8_vector`, in ``_source`` as integers (k-NN 2.19.1's derived source reads float
    vectors only), through writes, the embedding stage, membership changes and a reindex from a float32 index
    (vectors from the embedding cache); the float query vector finds each chunk first."""
    client = make_client(OpenSearchSettings(url=opensearch_url))
    run = uuid.uuid4().hex[:8]
    alias = f"it-vsrc8-{run}"
    emb = HashEmbedder()
    cache = OpenSearchEmbeddingCache(client, f"it-vsrc8-{run}-embcache")
    store = OpenSearchChunkStore(client, alias=alias, dimension=DIM, model=emb.model_id, encoder="int8")
    try:
        index = store.ensure_index()
        settings = client.indices.get_settings(index=index)[index]["settings"]["index"]
        assert settings["knn.derived_source"]["enabled"] == "false"
        prop = client.indices.get_mapping(index=index)[index]["mappings"]["properties"][F.EMBEDDING]
        assert str(prop["data_type"]).lower() == "byte" and settings["codec"] == "best_compression"
        first = {f"c{i}": emb._vec(f"text {i}") for i in range(N)}
        want = {k: F.int8_vector(v) for k, v in first.items()}
        docs = [_doc(i, first[f"c{i}"] if i % 3 else None) for i in range(N)]
        assert not store.bulk_write(docs, refresh=True).errors
        assert not store.set_vectors({f"c{i}": (first[f"c{i}"], f"blob{i}") for i in range(0, N, 3)},
                                     emb.model_id).errors
        _membership_changes(store)
        assert _stored_vectors(client, alias) == want  # every chunk keeps its vector, as int8 values
        for cid, vec in first.items():
            hits = store.vector_search(vec, SearchFilter(scope=ScopeFilter("a", ("c",)), ref="dev"), 3)
            assert hits and hits[0][0] == cid and hits[0][1] > 0.99, (cid, hits[:1])

        # a float32 index reindexed to int8 takes the vectors from the embedding cache, never from _source
        plain = OpenSearchChunkStore(client, alias=f"{alias}-b", dimension=DIM, model=emb.model_id)
        plain.ensure_index()
        assert not plain.bulk_write([_doc(i, first[f"c{i}"]) for i in range(N)], refresh=True).errors
        assert reindex(plain, emb, cache, ChunkingSettings()).embeddings_computed == N  # fills the cache
        cached = {k: F.int8_vector(v) for k, v in _stored_vectors(client, f"{alias}-b").items()}
        before = emb.embedded
        to8 = OpenSearchChunkStore(client, alias=f"{alias}-b", dimension=DIM, model=emb.model_id, encoder="int8")
        stats = reindex(to8, emb, cache, ChunkingSettings())
        assert stats.chunks == N and stats.embeddings_cached == N and emb.embedded == before
        assert _stored_vectors(client, f"{alias}-b") == cached and len(cached) == N
    finally:
        client.indices.delete(index=f"it-vsrc8-{run}*", params={"expand_wildcards": "open"})
