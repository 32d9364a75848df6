"""Isolation property (issue 8): a key never sees a chunk outside its allowed scopes, on real OpenSearch.

Several agents x several contexts hold chunks with marker strings. Agent names and context ids that differ only
in case (``alpha``/``Alpha``, ``c1``/``C1``) get markers that are the same token after lowercasing, so only the
scope filter can keep them apart. Random queries run

- through the REST API of the query app (in-process, real OpenSearch and Redis, real keys created by the admin
  API), with and without ``cross_context``, with forged ``agent_name``/``context_id`` fields and path globs
  naming other agents' folders;
- through :func:`scopekb.search.run_search` on a k-NN index for ``vector`` and ``hybrid`` (the query app is
  keyword-only until an embedder is wired in; it must then answer 400, never leak).

Each hit's scope is checked from the stored labels and from the document itself (its path starts with its
true ``agent/context``).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scopekb import fields as F
from scopekb.auth import ApiKey, AuthError, new_key, resolve_scope
from scopekb.models import SearchMode, SearchRequest
from scopekb.search import run_search
from scopekb.settings import QuerySettings, Settings
from scopekb.stores.opensearch import OpenSearchChunkStore
from scopekb.stores.records import OpenSearchRecordStore

RUN = uuid.uuid4().hex[:8]
PREFIX = f"iso-{RUN}"
ADMIN = "iso-admin-" + uuid.uuid4().hex
AGENTS = ("alpha", "Alpha", "beta")
CONTEXTS = ("c1", "c2", "C1")
KEY_AGENTS = (*AGENTS, "gamma")  # gamma has keys but no chunks
KEY_CONTEXTS: dict[str, list[str] | None] = {"one": ["c1"], "two": ["c1", "c2"], "upper": ["C1"], "all": None}
VOCAB = ("retry", "upload", "parser", "token", "config", "widget", "spline", "cache", "handler", "stream")
DIM = 16


def marker(agent: str, ctx: str) -> str:
    """The scope's marker token; equal for scopes that differ only in case (the analyzer lowercases)."""
    return f"mk_{agent.lower()}_{ctx.lower()}"


MARKERS = sorted({marker(a, c) for a in KEY_AGENTS for c in CONTEXTS})


def embed(text: str) -> list[float]:
    """Deterministic bag-of-words vector: each lowercased token adds a hashed direction."""
    v = [0.0] * DIM
    for tok in text.lower().split():
        h = hashlib.sha256(tok.encode()).digest()
        for i in range(DIM):
            v[i] += (h[i] - 127.5) / 127.5
    n = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / n for x in v] if any(v) else [1.0] + [0.0] * (DIM - 1)


def _docs(with_vectors: bool) -> list[dict[str, Any]]:
    rnd = random.Random(7)
    out = []
    for agent, ctx in itertools.product(AGENTS, CONTEXTS):
        for i in range(4):
            words = " ".join(rnd.sample(VOCAB, 3))
            content = f"{marker(agent, ctx)} {words}\nline two of {words}"
            path = f"{agent}/{ctx}/file{i}.py"
            sha = hashlib.sha256(content.encode()).hexdigest()
            d = {"_id": F.chunk_id(agent, ctx, f"src-{agent}-{ctx}", path, 1, 2, sha),
                 F.AGENT_NAME: agent, F.CONTEXT_ID: ctx, F.SOURCE_ID: f"src-{agent}-{ctx}", F.REPO: "iso/repo",
                 F.REF: "main", F.COMMIT: "0" * 40, F.PATH: path, F.LANGUAGE: "python", F.KIND: "lines",
                 F.SYMBOL: None, F.SIGNATURE: None, F.CONTENT: content, F.CHUNK_INDEX: 0, F.START_LINE: 1,
                 F.END_LINE: 2, F.CONTENT_SHA: sha, F.BLOB_SHA: sha[:40], F.METADATA: {},
                 F.INDEXED_AT: "2024-01-01T00:00:00Z"}
            if with_vectors:
                d[F.EMBEDDING] = embed(content)
                d[F.EMBEDDING_MODEL] = "iso-hash"
            out.append(d)
    return out


@pytest.fixture(scope="module")
def iso_settings(opensearch_url: str, redis_url: str) -> Settings:
    return Settings(opensearch={"url": opensearch_url, "alias": f"{PREFIX}-chunks", "system_prefix": f"{PREFIX}-sys"},
                    redis={"url": redis_url}, query={"admin_token": ADMIN}, profile="distributed",
                    embedding={"provider": "none"}, log_format="json", log_level="WARNING")


@pytest.fixture(scope="module")
def world(iso_settings: Settings, opensearch_client: Any) -> Iterator[dict[str, Any]]:
    """The query app (in-process) over a chunk index with every scope's documents, plus one key per
    (agent, context set); and a k-NN store with the same documents for vector/hybrid."""
    from scopekb_query.app import create_app

    app = create_app(iso_settings)
    knn = OpenSearchChunkStore(opensearch_client, alias=f"{PREFIX}-knn", dimension=DIM, model="iso-hash")
    try:
        with TestClient(app) as client:
            kw = OpenSearchChunkStore(opensearch_client, alias=f"{PREFIX}-chunks")
            kw.ensure_index()
            assert not kw.bulk_write(_docs(False), refresh=True).errors
            knn.ensure_index()
            assert not knn.bulk_write(_docs(True), refresh=True).errors
            keys: dict[tuple[str, str], tuple[str, ApiKey]] = {}
            records = OpenSearchRecordStore(opensearch_client, f"{PREFIX}-sys")
            for agent, (kname, ctxs) in itertools.product(KEY_AGENTS, KEY_CONTEXTS.items()):
                if kname == "one" and agent.lower() == "alpha":
                    # Through the admin API (each create waits for a refresh, so only a few go this way).
                    r = client.post("/v1/keys", json={"agent_name": agent, "context_ids": ctxs},
                                    headers={"Authorization": f"Bearer {ADMIN}"})
                    assert r.status_code == 201, r.text
                    secret, key_id = r.json()["key"], r.json()["id"]
                else:  # the same record the admin API writes, without a refresh per key
                    secret, h = new_key()
                    key_id = f"key_{uuid.uuid4().hex[:12]}"
                    records.put("keys", key_id, ApiKey(id=key_id, agent_name=agent, context_ids=ctxs, key_hash=h)
                                .model_dump(mode="json"), wait=False)
                keys[(agent, kname)] = (secret, ApiKey(id=key_id, agent_name=agent, context_ids=ctxs, key_hash=""))
            opensearch_client.indices.refresh(index=records.index_name("keys"))
            yield {"client": client, "keys": keys, "knn": knn}
    finally:
        opensearch_client.indices.delete(index=f"{PREFIX}-*", ignore_unavailable=True)


def expected_scope(key: ApiKey, context_id: str | None, cross: bool) -> tuple[int, set[tuple[str, str]]]:
    """(HTTP status, visible scopes) by the rules of DESIGN §5, computed independently of resolve_scope."""
    allowed = key.context_ids
    if context_id is not None and allowed is not None and context_id not in allowed:
        return 403, set()
    if context_id is None and not cross and not (allowed is not None and len(allowed) == 1):
        return 400, set()
    if cross:
        ctxs = set(CONTEXTS) if allowed is None else set(allowed)
    elif context_id is not None:
        ctxs = {context_id}
    else:
        ctxs = set(allowed or ())
    return 200, {(key.agent_name, c) for c in ctxs}


def populated(visible: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The visible scopes that hold chunks."""
    return {s for s in visible if s[0] in AGENTS and s[1] in CONTEXTS}


def check_hits(hits: Sequence[dict[str, Any]], visible: set[tuple[str, str]]) -> None:
    """Every hit is inside ``visible``, by its labels and by the document's own path and marker."""
    for h in hits:
        label = (h["agent_name"], h["context_id"])
        assert label in visible, f"leak: {label} not in {sorted(visible)} ({h['path']})"
        agent, ctx, _ = h["path"].split("/", 2)
        assert (agent, ctx) == label, f"mislabelled document {h['path']} as {label}"
        assert h["content"].startswith(marker(agent, ctx) + " ")


queries = st.lists(st.one_of(st.sampled_from(MARKERS), st.sampled_from((*VOCAB, "alpha", "Alpha", "c1", "C1", "mk"))),
                   min_size=1, max_size=4).map(" ".join)
context_ids = st.one_of(st.none(), st.sampled_from(CONTEXTS), st.sampled_from(("c3", "")))
rest_modes = st.sampled_from([SearchMode.keyword] * 4 + [SearchMode.vector, SearchMode.hybrid])
forged = st.fixed_dictionaries({}, optional={
    "agent_name": st.sampled_from(KEY_AGENTS), "agent": st.sampled_from(KEY_AGENTS),
    "scope": st.fixed_dictionaries({"agent_name": st.sampled_from(KEY_AGENTS),
                                    "context_id": st.sampled_from(CONTEXTS)}),
    "file_patterns": st.sampled_from([["*.py"], *[[f"{a}/**"] for a in AGENTS], ["*/C1/*"]]),
    "source_id": st.sampled_from([f"src-{a}-{c}" for a in AGENTS for c in CONTEXTS]),
})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key_id=st.sampled_from(sorted(itertools.product(KEY_AGENTS, KEY_CONTEXTS))), query=queries,
       context_id=context_ids, cross=st.booleans(), mode=rest_modes, extra=forged)
def test_rest_search_never_leaks(world: dict[str, Any], key_id: tuple[str, str], query: str,
                                 context_id: str | None, cross: bool, mode: SearchMode, extra: dict[str, Any]
                                 ) -> None:
    secret, key = world["keys"][key_id]
    body = {**extra, "query": query, "mode": mode.value, "cross_context": cross, "max_results": 50}
    if context_id is not None:
        body["context_id"] = context_id
    r = world["client"].post("/v1/search", json=body, headers={"Authorization": f"Bearer {secret}"})
    if forged_scope := sorted(extra.keys() & {"agent_name", "agent", "scope"}):  # no such field (hostile review L3)
        assert r.status_code == 422 and forged_scope[0] in r.text and "hits" not in r.text, (body, r.text)
        event("forged scope field: 422")
        return
    if context_id == "":  # not a context name (the naming rule of every request, hostile review 2 H8): refused
        assert r.status_code == 422 and "context_id" in r.text and "hits" not in r.text, (body, r.text)
        event("empty context_id: 422")
        return
    status, visible = expected_scope(key, context_id, cross)
    if mode != SearchMode.keyword and r.status_code == 400 and status == 200:
        assert "embedding" in r.json()["detail"]  # keyword-only service: refused, nothing returned
        event(f"{mode.value} refused: keyword-only service")
        return
    assert r.status_code == status, (body, r.text)
    event(f"status {status}")
    if status != 200:
        return
    hits = r.json()["hits"]
    event("with hits" if hits else "no hits")
    check_hits(hits, visible)
    # Not vacuous: a visible scope's marker in the query finds that scope's chunks (when no filter narrows).
    if mode == SearchMode.keyword and not ({"file_patterns", "source_id"} & extra.keys()):
        wanted = {s for s in populated(visible) if marker(*s) in query.split()}
        assert wanted <= {(h["agent_name"], h["context_id"]) for h in hits}, (body, hits)


@pytest.mark.parametrize("key_id", sorted(itertools.product(KEY_AGENTS, KEY_CONTEXTS)), ids="-".join)
def test_each_key_sees_exactly_its_scopes(world: dict[str, Any], key_id: tuple[str, str]) -> None:
    secret, key = world["keys"][key_id]
    r = world["client"].post("/v1/search", headers={"Authorization": f"Bearer {secret}"}, json={
        "query": " ".join(MARKERS), "cross_context": True, "max_results": 50, "context_id": None})
    assert r.status_code == 200, r.text
    seen = {(h["agent_name"], h["context_id"]) for h in r.json()["hits"]}
    _, visible = expected_scope(key, None, True)
    assert seen == populated(visible), (key_id, seen)
    assert len(r.json()["hits"]) == 4 * len(seen)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key_id=st.sampled_from(sorted(itertools.product(KEY_AGENTS, KEY_CONTEXTS))), query=queries,
       context_id=context_ids, cross=st.booleans(), mode=st.sampled_from(list(SearchMode)),
       k=st.integers(min_value=1, max_value=50))
def test_store_search_never_leaks_in_every_mode(world: dict[str, Any], key_id: tuple[str, str], query: str,
                                                context_id: str | None, cross: bool, mode: SearchMode, k: int
                                                ) -> None:
    _, key = world["keys"][key_id]
    status, visible = expected_scope(key, context_id or None, cross)
    try:
        scope = resolve_scope(key, context_id or None, cross)
    except AuthError as e:
        assert e.status == status
        return
    assert status == 200
    if mode == SearchMode.symbol:  # symbol search takes one name (a request with spaces is refused: 422)
        query = query.split()[0]
    req = SearchRequest(query=query, mode=mode, max_results=k, context_id=context_id or None, cross_context=cross)
    resp = run_search(world["knn"], req, scope, QuerySettings(), embed)
    check_hits([h.model_dump() for h in resp.hits], visible)
    event(f"{mode.value} {'with' if resp.hits else 'no'} hits")
    assert all(0.0 <= h.score <= 1.0 for h in resp.hits)
    if mode == SearchMode.vector:
        # Filtered kNN returns k hits whenever k matching chunks exist.
        assert len(resp.hits) == min(k, 4 * len(populated(visible)))
