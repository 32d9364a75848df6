"""Filtered kNN on real OpenSearch (issue 7): a scope of 20 chunks inside an index of 10,000 chunks of another
agent still gets k hits in vector and hybrid mode, all from the right scope."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from scopekb import fields as F
from scopekb.models import SearchMode, SearchRequest
from scopekb.search import run_search
from scopekb.settings import OpenSearchSettings, QuerySettings
from scopekb.stores.base import ScopeFilter
from scopekb.stores.opensearch import OpenSearchChunkStore, make_client

DIM = 16


def _doc(agent: str, n: int, vec: np.ndarray, word: str) -> dict:
    content = f"{word} chunk number {n}"
    return {"_id": f"{agent}-{n}", F.AGENT_NAME: agent, F.CONTEXT_ID: "c", F.SOURCE_ID: f"src-{agent}",
            F.PATH: f"{agent}/f{n}.txt", F.CONTENT: content, F.CHUNK_INDEX: 0, F.START_LINE: 1, F.END_LINE: 1,
            F.CONTENT_SHA: str(n), F.BLOB_SHA: str(n), F.LANGUAGE: "text", F.KIND: "lines",
            F.EMBEDDING: vec.tolist()}


@pytest.mark.parametrize("mode", [SearchMode.vector, SearchMode.hybrid])
def test_small_scope_in_a_large_index_gets_k_hits(opensearch_url: str, big_index, mode: SearchMode) -> None:
    store, query_vec = big_index
    req = SearchRequest(query="widget", mode=mode, max_results=10, context_id="c")
    resp = run_search(store, req, ScopeFilter("small", ("c",)), QuerySettings(), embed=lambda _: query_vec)
    assert len(resp.hits) == 10 and {h.agent_name for h in resp.hits} == {"small"}
    assert all(0.0 <= h.score <= 1.0 for h in resp.hits)
    print(f"checked: {mode.value} with max_results=10 in a 10,020-chunk index -> 10 hits, all agent 'small'")


@pytest.fixture(scope="module")
def big_index(opensearch_url: str):
    client = make_client(OpenSearchSettings(url=opensearch_url))
    alias = f"it-knn-{uuid.uuid4().hex[:8]}"
    store = OpenSearchChunkStore(client, alias=alias, dimension=DIM, model="random-16")
    store.ensure_index()
    rng = np.random.default_rng(7)
    centre = rng.normal(size=DIM)
    # The big agent's vectors all sit near the query; the small agent's are random: an unfiltered top-k (or a
    # post-filter) would return no chunk of the small agent.
    big = centre + 0.05 * rng.normal(size=(10_000, DIM))
    docs = [_doc("big", i, v / np.linalg.norm(v), "widget") for i, v in enumerate(big)]
    small = rng.normal(size=(20, DIM))
    docs += [_doc("small", i, v / np.linalg.norm(v), "widget") for i, v in enumerate(small)]
    report = store.bulk_write(docs, refresh=True)
    assert report.written == 10_020 and not report.errors
    yield store, (centre / np.linalg.norm(centre)).tolist()
    client.indices.delete(index=f"{alias}*", params={"expand_wildcards": "open"})
