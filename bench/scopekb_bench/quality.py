"""Retrieval quality on the docstring→function set (the CodeSearchNet method), through the real query service.

Each pair's query (first paragraph of a docstring) is sent three times: ``keyword`` and ``vector`` with
``max_results=40`` (the candidate depth ``hybrid`` uses for 10 results: ``candidate_factor`` 4) and ``hybrid`` with
``max_results=10``. ``keyword@10`` and ``vector@10`` are the first ten of their lists; ``rrf`` is Reciprocal Rank
Fusion (k = 60, :func:`scopekb.scoring.rrf_fusion`) of the two 40-deep lists, computed here because the search
API has no RRF mode. A hit is relevant when it is in the function's file and its lines overlap the function's
lines in the docstring-free code; only the best-ranked relevant hit counts (one relevant document per query).

Also ANN fidelity: recall@10 of the k-NN (HNSW) search scopekb issues against exact cosine search over the same
stored vectors.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import httpx
import numpy as np
from opensearchpy import OpenSearch

from scopekb import fields as F
from scopekb.scoring import rrf_fusion
from scopekb.stores.base import ScopeFilter, SearchFilter
from scopekb.stores.opensearch import OpenSearchChunkStore

MODES = ("keyword", "vector", "hybrid", "rrf")
DEPTH = 40


async def _fetch_all(query_url: str, key: str, context: str, pairs: list[dict[str, Any]],
                     concurrency: int) -> list[dict[str, list[dict[str, Any]]]]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=query_url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=120) as client:
        async def one(mode: str, q: str, n: int) -> list[dict[str, Any]]:
            async with sem:
                r = await client.post("/v1/search", json={"query": q, "mode": mode, "max_results": n,
                                                          "context_id": context})
                r.raise_for_status()
                return r.json()["hits"]

        async def pair(p: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
            kw, vec, hyb = await asyncio.gather(one("keyword", p["query"], DEPTH), one("vector", p["query"], DEPTH),
                                                one("hybrid", p["query"], 10))
            return {"keyword": kw, "vector": vec, "hybrid": hyb}

        return await asyncio.gather(*(pair(p) for p in pairs))


def _hid(h: dict[str, Any]) -> str:
    return f"{h['path']}#{h['chunk_index']}"


def rank_of(hits: list[dict[str, Any]], pair: dict[str, Any], k: int = 10) -> int | None:
    """1-based rank of the first relevant hit within the top ``k``, or None."""
    for i, h in enumerate(hits[:k], 1):
        if h["path"] == pair["path"] and h["start_line"] <= pair["end_line"] and h["end_line"] >= pair["start_line"]:
            return i
    return None


def rankings(res: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The four top-10 lists of one query: keyword, vector, hybrid (service) and rrf (fused here)."""
    by_id = {_hid(h): h for h in res["keyword"] + res["vector"]}
    fused = rrf_fusion([(_hid(h), h["score"]) for h in res["keyword"]], [(_hid(h), h["score"]) for h in res["vector"]])
    return {"keyword": res["keyword"][:10], "vector": res["vector"][:10], "hybrid": res["hybrid"][:10],
            "rrf": [by_id[i] for i, _ in fused[:10]]}


def scores(rank: int | None) -> dict[str, float]:
    """NDCG@10, reciprocal rank (MRR@10), recall@1 and recall@10 of one query with one relevant document."""
    if rank is None:
        return {"ndcg10": 0.0, "mrr10": 0.0, "recall1": 0.0, "recall10": 0.0}
    return {"ndcg10": 1.0 / math.log2(rank + 1), "mrr10": 1.0 / rank, "recall1": float(rank == 1), "recall10": 1.0}


def paired_bootstrap(a: list[float], b: list[float], n: int = 2000, seed: int = 7) -> tuple[float, float, float]:
    """Mean of ``a - b`` with a 95% bootstrap interval (paired, resampling queries)."""
    d = np.asarray(a) - np.asarray(b)
    if len(d) == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n, len(d)))].mean(axis=1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def evaluate(query_url: str, key: str, context: str, pairs: list[dict[str, Any]],
             concurrency: int = 4) -> dict[str, Any]:
    """Run every pair through the service; per-mode means, per-project means and per-query scores."""
    raw = asyncio.run(_fetch_all(query_url, key, context, pairs, concurrency))
    per_query: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for p, res in zip(pairs, raw, strict=True):
        lists = rankings(res)
        for m in MODES:
            per_query[m].append(scores(rank_of(lists[m], p)))
    out: dict[str, Any] = {"n": len(pairs), "modes": {}, "projects": {}}
    for m in MODES:
        out["modes"][m] = {k: float(np.mean([s[k] for s in per_query[m]])) for k in per_query[m][0]}
    for proj in sorted({p["project"] for p in pairs}):
        idx = [i for i, p in enumerate(pairs) if p["project"] == proj]
        out["projects"][proj] = {"n": len(idx), **{m: {k: float(np.mean([per_query[m][i][k] for i in idx]))
                                                        for k in ("ndcg10", "mrr10")} for m in MODES}}
    kw = [s["ndcg10"] for s in per_query["keyword"]]
    for m in ("vector", "hybrid", "rrf"):
        mine = [s["ndcg10"] for s in per_query[m]]
        mean, lo, hi = paired_bootstrap(mine, kw)
        out["modes"][m]["ndcg10_minus_keyword"] = {"mean": mean, "ci95": [lo, hi],
                                                  "wins": sum(a > b for a, b in zip(mine, kw, strict=True)),
                                                  "losses": sum(a < b for a, b in zip(mine, kw, strict=True))}
    out["per_query_ndcg10"] = {m: [s["ndcg10"] for s in per_query[m]] for m in MODES}
    return out


def ann_fidelity(client: OpenSearch, alias: str, dimension: int, model: str, scope: ScopeFilter,
                 query_vectors: list[list[float]], k: int = 10) -> dict[str, Any]:
    """recall@k of scopekb's k-NN search (the store's query: lucene HNSW, ``ef_search`` as configured there)
    against exact cosine search over the same stored vectors of the scope."""
    ids: list[str] = []
    vecs: list[list[float]] = []
    flt = [{"term": {F.AGENT_NAME: scope.agent_name}}]
    if scope.context_ids is not None:
        flt.append({"terms": {F.CONTEXT_ID: list(scope.context_ids)}})
    res = client.search(index=alias, body={"size": 2000, "query": {"bool": {"filter": flt}},
                                           "_source": [F.EMBEDDING], "sort": ["_doc"]}, params={"scroll": "2m"})
    sid = res.get("_scroll_id")
    while res["hits"]["hits"]:
        for h in res["hits"]["hits"]:
            v = h["_source"].get(F.EMBEDDING)
            if v:
                ids.append(h["_id"])
                vecs.append(v)
        res = client.scroll(body={"scroll_id": sid, "scroll": "2m"})
        sid = res.get("_scroll_id", sid)
    if sid:
        client.clear_scroll(body={"scroll_id": [sid]})
    m = np.asarray(vecs, dtype=np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True) + 1e-12
    store = OpenSearchChunkStore(client, alias=alias, dimension=dimension, model=model)
    recalls = []
    for qv in query_vectors:
        q = np.asarray(qv, dtype=np.float32)
        q /= np.linalg.norm(q) + 1e-12
        exact = {ids[i] for i in np.argsort(-(m @ q))[:k]}
        ann = {h[0] for h in store.vector_search(qv, SearchFilter(scope=scope), k)}
        recalls.append(len(exact & ann) / k)
    return {"queries": len(recalls), "vectors": len(ids), "recall_at_k": float(np.mean(recalls)) if recalls else
            math.nan, "k": k}


def sample(pairs: list[dict[str, Any]], n: int | None, seed: int = 11) -> list[dict[str, Any]]:
    """A deterministic sample of at most ``n`` pairs spread over the projects (all of them when ``n`` is None)."""
    if n is None or n >= len(pairs):
        return list(pairs)
    by: dict[str, list[dict[str, Any]]] = {}
    for p in pairs:
        by.setdefault(p["project"], []).append(p)
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    share = max(1, n // len(by))
    for proj in sorted(by):
        items = by[proj][:]
        rng.shuffle(items)
        out.extend(items[:share])
    return out
