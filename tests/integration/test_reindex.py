"""Model switch with reindex: a new index is built and swapped in atomically while searches keep answering."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from scopekb.blobs import S3BlobStore
from scopekb.chunking import counter_for_model
from scopekb.embedding import OpenSearchEmbeddingCache
from scopekb.embedding.local import LocalEmbedder
from scopekb.embedding.openai_provider import OpenAIEmbedder
from scopekb.indexing import SyncDeps, run_sync
from scopekb.models import SearchMode, SearchRequest, Source
from scopekb.reindex import reindex
from scopekb.search import run_search
from scopekb.settings import QuerySettings, Settings
from scopekb.stores.base import ScopeFilter
from scopekb.stores.opensearch import IndexVersionMismatch, OpenSearchChunkStore, make_client
from scopekb.stores.records import OpenSearchRecordStore
from tests.openai_stub import OpenAIStub

from .test_git_sync import Repo
from .test_vector_pipeline import FILES


@pytest.fixture(scope="module")
def stubs() -> Iterator[tuple[OpenAIStub, OpenAIStub]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    local = LocalEmbedder()

    def small(texts):  # a different model: 128 dimensions
        v = np.asarray(local.encode(texts), dtype=np.float32)[:, :128]
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-9)

    with OpenAIStub(local.encode, local.count_tokens) as a, OpenAIStub(small, local.count_tokens) as b:
        yield a, b


def test_model_switch_reindex_with_zero_failed_searches(opensearch_url: str, s3_config: dict, stubs,
                                                       tmp_path_factory) -> None:
    old_stub, new_stub = stubs
    run = uuid.uuid4().hex[:8]
    s = Settings(opensearch={"url": opensearch_url, "alias": f"it-rx-{run}", "system_prefix": f"it-rx-{run}-sys"},
                 s3={**s3_config, "bucket": f"it-rx-{run}"},
                 git={"cache_dir": tmp_path_factory.mktemp("git"), "allow_local_paths": True})
    client = make_client(s.opensearch)
    try:
        old_emb = OpenAIEmbedder(model="minilm", base_url=old_stub.base_url, api_key="x")
        new_emb = OpenAIEmbedder(model="minilm-128", base_url=new_stub.base_url, api_key="x")
        cache = OpenSearchEmbeddingCache(client, f"it-rx-{run}-sys-embcache")
        old_store = OpenSearchChunkStore(client, alias=s.opensearch.alias, dimension=old_emb.dimension,
                                         model=old_emb.model_id)
        old_store.ensure_index()
        deps = SyncDeps(settings=s, records=OpenSearchRecordStore(client, s.opensearch.system_prefix),
                        chunks=old_store, blobs=S3BlobStore(s.s3), embedder=old_emb, embed_cache=cache,
                        counter=counter_for_model(None, s.chunking))
        repo = Repo(tmp_path_factory.mktemp("rx") / "r")
        for path, text in FILES.items():
            repo.write(path, text)
        repo.commit()
        src = Source(id=Source.new_id(), agent_name="a", context_id="c", repo_url=str(repo.path), ref="main")
        deps.records.put_source(src)
        assert run_sync(deps, "j1", [src.id]).state.value == "done"
        before = old_store.count()

        new_store = OpenSearchChunkStore(client, alias=s.opensearch.alias, dimension=new_emb.dimension,
                                         model=new_emb.model_id)
        with pytest.raises(IndexVersionMismatch, match="reindex"):
            new_store.ensure_index()  # starting with another dimension is refused

        failures: list[str] = []
        answered = [0]
        stop = threading.Event()

        def searcher() -> None:  # a query replica still running with the old model
            req = SearchRequest(query="retry failed uploads", mode=SearchMode.hybrid, context_id="c")
            while not stop.is_set():
                try:
                    resp = run_search(old_store, req, ScopeFilter("a", ("c",)), QuerySettings(),
                                      embed=old_emb.embed_query)
                    if not resp.hits or resp.hits[0].path != "storage/upload.py":
                        failures.append(f"bad answer: {[h.path for h in resp.hits]}")
                    answered[0] += 1
                except Exception as e:  # noqa: BLE001 - any exception is a failed search
                    failures.append(repr(e))

        t = threading.Thread(target=searcher)
        t.start()
        try:
            rep = reindex(new_store, new_emb, cache, s.chunking, deps.counter, batch=2)
            stop.wait(1.0)
        finally:
            stop.set()
            t.join()
        assert failures == [] and answered[0] > 5
        assert rep.chunks == before and rep.embeddings_computed == before and rep.old_index is not None
        assert new_store.live_index() == rep.new_index and not client.indices.exists(index=rep.old_index)
        new_store.ensure_index()  # now accepted
        resp = run_search(new_store, SearchRequest(query="retry failed uploads", mode=SearchMode.vector,
                                                   context_id="c"), ScopeFilter("a", ("c",)), QuerySettings(),
                          embed=new_emb.embed_query)
        assert resp.hits[0].path == "storage/upload.py" and resp.notice is None
        docs = client.search(index=s.opensearch.alias, body={"size": 100, "query": {"match_all": {}}})["hits"]["hits"]
        assert len(docs) == before and all(d["_source"]["embedding_model"] == new_emb.model_id for d in docs)
        # Reindexing again takes vectors from the embedding cache: the same model re-embeds nothing.
        rep2 = reindex(new_store, new_emb, cache, s.chunking, deps.counter)
        assert rep2.embeddings_computed == 0 and rep2.embeddings_cached == before
    finally:
        client.indices.delete(index=f"it-rx-{run}*", params={"expand_wildcards": "open"})


def test_same_dimension_other_vectors_are_refused_and_sq_reindex_keeps_search(opensearch_url: str, s3_config: dict,
                                                                              stubs, tmp_path_factory) -> None:
    """A backend whose vectors differ at the same dimension (torch -> onnx-int8: another model id) is refused like
    a dimension change; the reindex to it can switch on scalar quantization, and search still finds the file."""
    old_stub, _ = stubs
    run = uuid.uuid4().hex[:8]
    s = Settings(opensearch={"url": opensearch_url, "alias": f"it-rq-{run}", "system_prefix": f"it-rq-{run}-sys"},
                 s3={**s3_config, "bucket": f"it-rq-{run}"},
                 git={"cache_dir": tmp_path_factory.mktemp("git"), "allow_local_paths": True})
    client = make_client(s.opensearch)
    try:
        emb = OpenAIEmbedder(model="minilm", base_url=old_stub.base_url, api_key="x")
        other = OpenAIEmbedder(model="minilm", base_url=old_stub.base_url, api_key="x", model_id="minilm+int8")
        cache = OpenSearchEmbeddingCache(client, f"it-rq-{run}-sys-embcache")
        store = OpenSearchChunkStore(client, alias=s.opensearch.alias, dimension=emb.dimension, model=emb.model_id)
        store.ensure_index()
        deps = SyncDeps(settings=s, records=OpenSearchRecordStore(client, s.opensearch.system_prefix),
                        chunks=store, blobs=S3BlobStore(s.s3), embedder=emb, embed_cache=cache,
                        counter=counter_for_model(None, s.chunking))
        repo = Repo(tmp_path_factory.mktemp("rq") / "r")
        for path, text in FILES.items():
            repo.write(path, text)
        repo.commit()
        src = Source(id=Source.new_id(), agent_name="a", context_id="c", repo_url=str(repo.path), ref="main")
        deps.records.put_source(src)
        assert run_sync(deps, "j1", [src.id]).state.value == "done"

        sq_store = OpenSearchChunkStore(client, alias=s.opensearch.alias, dimension=emb.dimension,
                                        model=other.model_id, encoder="sq")
        with pytest.raises(IndexVersionMismatch, match="model.*reindex"):
            sq_store.ensure_index()
        rep = reindex(sq_store, other, cache, s.chunking, deps.counter)
        assert rep.chunks == store.count() and rep.embeddings_computed > 0  # other model id: its own cache entries
        method = client.indices.get_mapping(index=rep.new_index)[rep.new_index]["mappings"]["properties"][
            "embedding"]["method"]
        assert method["parameters"]["encoder"]["name"] == "sq"
        sq_store.ensure_index()
        resp = run_search(sq_store, SearchRequest(query="retry failed uploads", mode=SearchMode.vector,
                                                  context_id="c"), ScopeFilter("a", ("c",)), QuerySettings(),
                          embed=other.embed_query)
        assert resp.hits[0].path == "storage/upload.py"
    finally:
        client.indices.delete(index=f"it-rq-{run}*", params={"expand_wildcards": "open"})
