"""Query overhead: the query service's latency and requests/s per mode ÷ the raw OpenSearch queries it issues.

The raw queries are captured, not rewritten: :func:`scopekb.search.run_search` runs here against an
:class:`~scopekb.stores.opensearch.OpenSearchChunkStore` whose client records every ``search`` call, with the same
scope, settings and query vector the service uses. The baseline replays those request bodies with a plain HTTP
client straight to OpenSearch (``hybrid``: its one ``_msearch`` of both queries, as the service sends it).
The service's figure therefore also includes what the raw queries cannot: HTTP + JSON, key lookup, embedding
the query (``vector``, ``hybrid``), fusion and result shaping. The bare query-embedding time is reported too.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from opensearchpy import OpenSearch

from scopekb.models import SearchMode, SearchRequest
from scopekb.search import run_search
from scopekb.settings import QuerySettings
from scopekb.stores.base import ScopeFilter
from scopekb.stores.opensearch import OpenSearchChunkStore

MODES = ("keyword", "vector", "hybrid")
#: The index name a recorded ``_msearch`` call is kept under (its body is the list of header/body pairs).
MSEARCH = "_msearch"


def raw_request(index: str, body: Any) -> tuple[str, dict[str, Any]]:
    """The HTTP path and httpx keyword arguments that replay one recorded call straight to OpenSearch."""
    if index == MSEARCH:
        nd = "".join(json.dumps(x) + "\n" for x in body)
        return "/_msearch", {"content": nd.encode(), "headers": {"Content-Type": "application/x-ndjson"}}
    return f"/{index}/_search", {"json": body}


class _Recorder:
    """Wraps an OpenSearch client; records ``search`` calls as ``(index, body)`` and forwards everything."""

    def __init__(self, client: OpenSearch) -> None:
        self._client = client
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def search(self, index: str | None = None, body: dict[str, Any] | None = None, **kw: Any) -> Any:
        self.calls.append((str(index), body or {}))
        return self._client.search(index=index, body=body, **kw)

    def msearch(self, body: Any = None, index: str | None = None, **kw: Any) -> Any:
        self.calls.append((MSEARCH, body))
        return self._client.msearch(body=body, index=index, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def capture(client: OpenSearch, alias: str, dimension: int, model: str, scope: ScopeFilter,
            queries: Sequence[str], embed: Callable[[str], list[float]], max_results: int = 10
            ) -> tuple[dict[str, dict[str, list[tuple[str, dict[str, Any]]]]], list[float]]:
    """The raw OpenSearch requests ``run_search`` issues per mode and query, and the query-embedding times (s)."""
    cache: dict[str, list[float]] = {}
    embed_times: list[float] = []

    def cached_embed(q: str) -> list[float]:
        if q not in cache:
            t0 = time.perf_counter()
            cache[q] = embed(q)
            embed_times.append(time.perf_counter() - t0)
        return cache[q]

    out: dict[str, dict[str, list[tuple[str, dict[str, Any]]]]] = {m: {} for m in MODES}
    cfg = QuerySettings()
    for q in queries:
        for mode in MODES:
            rec = _Recorder(client)
            store = OpenSearchChunkStore(rec, alias=alias, dimension=dimension, model=model)  # type: ignore[arg-type]
            run_search(store, SearchRequest(query=q, mode=SearchMode(mode), max_results=max_results), scope, cfg,
                       embed=cached_embed)
            out[mode][q] = rec.calls
    return out, embed_times


def latency(query_url: str, key: str, context: str, os_url: str, queries: Sequence[str],
            captured: dict[str, dict[str, list[tuple[str, dict[str, Any]]]]], n: int,
            max_results: int = 10) -> dict[str, dict[str, list[float]]]:
    """Sequential requests (one at a time), service and raw interleaved per query: seconds per request."""
    out = {m: {"service": [], "raw": []} for m in MODES}
    with httpx.Client(base_url=query_url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as svc, \
            httpx.Client(base_url=os_url, timeout=60) as raw:
        def one_service(q: str, mode: str) -> None:
            r = svc.post("/v1/search", json={"query": q, "mode": mode, "max_results": max_results,
                                             "context_id": context})
            r.raise_for_status()

        def one_raw(q: str, mode: str) -> None:
            for index, body in captured[mode][q]:
                path, kw = raw_request(index, body)
                r = raw.post(path, **kw)
                r.raise_for_status()

        for i in range(min(5, len(queries))):  # warm-up: connections, caches
            for mode in MODES:
                one_service(queries[i], mode)
                one_raw(queries[i], mode)
        for i in range(n):
            q = queries[i % len(queries)]
            for mode in MODES:
                t0 = time.perf_counter()
                one_service(q, mode)
                t1 = time.perf_counter()
                one_raw(q, mode)
                t2 = time.perf_counter()
                out[mode]["service"].append(t1 - t0)
                out[mode]["raw"].append(t2 - t1)
    return out


async def _throughput(query_url: str, key: str, context: str, os_url: str, queries: Sequence[str],
                      captured: dict[str, dict[str, list[tuple[str, dict[str, Any]]]]], mode: str, n: int,
                      concurrency: int, max_results: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    out: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=query_url, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                                 limits=limits) as svc, \
            httpx.AsyncClient(base_url=os_url, timeout=120, limits=limits) as raw:
        async def service_one(q: str) -> None:
            r = await svc.post("/v1/search", json={"query": q, "mode": mode, "max_results": max_results,
                                                   "context_id": context})
            r.raise_for_status()

        async def raw_one(q: str) -> None:
            for index, body in captured[mode][q]:
                path, kw = raw_request(index, body)
                r = await raw.post(path, **kw)
                r.raise_for_status()

        for name, fn in (("service", service_one), ("raw", raw_one)):
            next_i = 0

            async def worker(fn: Callable[[str], Any] = fn) -> None:
                nonlocal next_i
                while next_i < n:
                    i = next_i
                    next_i += 1
                    await fn(queries[i % len(queries)])

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            out[name] = n / (time.perf_counter() - t0)
    return out


def throughput(query_url: str, key: str, context: str, os_url: str, queries: Sequence[str],
               captured: dict[str, dict[str, list[tuple[str, dict[str, Any]]]]], n: int, concurrency: int = 8,
               max_results: int = 10) -> dict[str, dict[str, float]]:
    """Requests/s per mode with ``concurrency`` requests in flight, for the service and for the raw queries."""
    return {m: asyncio.run(_throughput(query_url, key, context, os_url, queries, captured, m, n, concurrency,
                                       max_results)) for m in MODES}
