"""Issue #7 acceptance, embedding half: the OpenSearch embedding cache on the real OpenSearch, and cached
embedding through the openai provider over a real socket (a second pass over the same texts computes zero).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from scopekb.embedding import (
    OpenSearchEmbeddingCache,
    cache_doc_id,
    embcache_index_name,
    embed_with_cache,
    make_embedding_cache,
    text_sha,
)
from scopekb.embedding.local import LocalEmbedder
from scopekb.embedding.openai_provider import OpenAIEmbedder
from scopekb.settings import EmbeddingSettings, OpenSearchSettings, Settings
from tests.openai_stub import OpenAIStub


@pytest.fixture
def prefix(opensearch_client) -> Iterator[str]:
    """A system prefix of its own; its cache index is deleted afterwards."""
    p = f"scopekb-test-{uuid.uuid4().hex[:8]}"
    yield p
    opensearch_client.indices.delete(index=embcache_index_name(p), ignore_unavailable=True)


@pytest.fixture
def os_cache(opensearch_client, prefix: str) -> OpenSearchEmbeddingCache:
    return OpenSearchEmbeddingCache(opensearch_client, embcache_index_name(prefix), batch=2)


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return LocalEmbedder()


def test_cache_index_is_a_plain_strict_index(opensearch_client, os_cache: OpenSearchEmbeddingCache) -> None:
    index = os_cache.index
    mapping = opensearch_client.indices.get_mapping(index=index)[index]["mappings"]
    assert mapping["dynamic"] == "strict"
    assert mapping["properties"]["vector"]["type"] == "binary"
    settings = opensearch_client.indices.get_settings(index=index)[index]["settings"]["index"]
    assert settings.get("knn") in (None, "false")
    os_cache.ensure_index()  # idempotent


def test_round_trip_model_isolation_and_batched_mget(opensearch_client, os_cache: OpenSearchEmbeddingCache) -> None:
    rng = np.random.default_rng(1)
    vecs = {text_sha(f"text {i}"): rng.standard_normal(384).astype(np.float32).tolist() for i in range(5)}
    os_cache.put_many("model-a", vecs)
    got = os_cache.get_many("model-a", [*vecs, text_sha("absent")])
    assert got == vecs  # bit-exact float32, across 3 mget batches of 2
    assert os_cache.get_many("model-b", list(vecs)) == {}
    os_cache.put_many("model-b", {text_sha("text 0"): [1.0, 2.0]})
    assert os_cache.get_many("model-b", [text_sha("text 0")]) == {text_sha("text 0"): [1.0, 2.0]}
    assert os_cache.get_many("model-a", [text_sha("text 0")])[text_sha("text 0")] == vecs[text_sha("text 0")]
    doc = opensearch_client.get(index=os_cache.index, id=cache_doc_id("model-a", text_sha("text 1")))
    assert doc["_source"]["model"] == "model-a" and doc["_source"]["dim"] == 384
    opensearch_client.indices.refresh(index=os_cache.index)
    assert os_cache.delete_model("model-b") == 1
    assert os_cache.get_many("model-b", [text_sha("text 0")]) == {}


def test_factory_builds_the_opensearch_cache(opensearch_client, prefix: str) -> None:
    s = Settings(opensearch=OpenSearchSettings(system_prefix=prefix), embedding=EmbeddingSettings(cache="opensearch"))
    cache = make_embedding_cache(s, opensearch_client)
    assert isinstance(cache, OpenSearchEmbeddingCache) and cache.index == f"{prefix}-embcache"
    assert opensearch_client.indices.exists(index=cache.index)


def test_second_pass_computes_zero(local: LocalEmbedder, os_cache: OpenSearchEmbeddingCache) -> None:
    texts = [f"def handler_{i}(event):\n    return process(event, retries={i})" for i in range(40)]
    texts += texts[:5] + ["", "   "]
    with OpenAIStub(local.encode, local.count_tokens) as stub:
        emb = OpenAIEmbedder(model="all-MiniLM-L6-v2", base_url=stub.base_url, api_key="none",
                             max_batch_inputs=16)
        first = embed_with_cache(emb, os_cache, texts)
        assert (first.stats.computed, first.stats.cached, first.stats.duplicates, first.stats.blank) == (40, 0, 5, 2)
        served = len(stub.requests)
        assert served == 3  # 40 distinct texts in batches of 16

        again = embed_with_cache(emb, os_cache, texts)
        assert (again.stats.computed, again.stats.cached, again.stats.failed) == (0, 40, 0)
        assert len(stub.requests) == served  # nothing sent
        assert again.vectors == first.vectors

        # a second scope/branch with a few changed chunks embeds only those
        changed = texts[:38] + ["def handler_new(event): ...", "def other(): ..."]
        third = embed_with_cache(emb, os_cache, changed)
        assert (third.stats.computed, third.stats.cached) == (2, 38)
        assert [q.inputs for q in stub.served()][-1] == ["def handler_new(event): ...", "def other(): ..."]

    # the local provider has its own model id: no cross-model reuse
    local_pass = embed_with_cache(local, os_cache, texts[:3])
    assert local_pass.stats.computed == 3
    assert np.allclose(local_pass.vectors[0], first.vectors[0], atol=1e-5)
