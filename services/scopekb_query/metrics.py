"""Prometheus metrics of the query service: request counts and latency by route and mode, and gauges read from
the stores at scrape time (jobs by state and trigger, sources, chunks, dead letters)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from scopekb.logging import get_logger

log = get_logger("scopekb.query")

REQUESTS = Counter("scopekb_query_requests_total", "Requests by route, mode and status",
                   ["route", "mode", "status"])
LATENCY = Histogram("scopekb_query_latency_seconds", "Request latency by route and mode", ["route", "mode"])
#: Records read per kind at scrape time.
SCRAPE_SIZE = 10000


class IndexCollector:
    """Gauges read from the stores at scrape time. One per process (Prometheus names must be unique); it reads
    through the most recent app's runtime."""

    def __init__(self) -> None:
        self.rt: Any = None

    def describe(self) -> list[Any]:
        """Nothing up front: the gauges exist only while a runtime is attached."""
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauges; a store that is down logs a warning and yields nothing (a scrape never fails)."""
        if self.rt is None:
            return
        try:
            yield from self._gauges(self.rt)
        except Exception as e:  # noqa: BLE001 - a scrape must never fail because a store is down
            log.warning("metrics_collect_failed", error=str(e))

    @staticmethod
    def _gauges(rt: Any) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("scopekb_jobs", "Sync jobs on record by state and trigger",
                                 labels=["state", "trigger"])
        counts: dict[tuple[str, str], int] = {}
        for d in rt.records.find("jobs", size=SCRAPE_SIZE):
            k = (str(d.get("state")), str(d.get("trigger")))
            counts[k] = counts.get(k, 0) + 1
        for (state, trigger), n in sorted(counts.items()):
            jobs.add_metric([state, trigger], n)
        yield jobs
        yield GaugeMetricFamily("scopekb_sources", "Registered sources",
                                value=len(rt.records.find("sources", size=SCRAPE_SIZE)))
        yield GaugeMetricFamily("scopekb_chunks", "Chunks in the index", value=rt.chunks.count())
        yield GaugeMetricFamily("scopekb_dead_letters", "Dead-lettered tasks not yet replayed",
                                value=sum(1 for d in rt.records.find("deadletters", size=SCRAPE_SIZE)
                                          if not d.get("replayed_at")))


INDEX_COLLECTOR = IndexCollector()
REGISTRY.register(INDEX_COLLECTOR)


def install_metrics(app: FastAPI, rt: Any) -> None:
    """Count and time every request of ``app`` by route template and search mode; attach ``rt`` to the gauges."""
    INDEX_COLLECTOR.rt = rt
    app.add_middleware(_MetricsMiddleware)


class _MetricsMiddleware:
    """Pure ASGI (issue 20: Starlette's ``BaseHTTPMiddleware`` ran each request through an extra task and memory
    streams): time from the request to the last body piece sent, status from the response start."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            mode = scope.get("scopekb_mode", "-")
            LATENCY.labels(path, mode).observe(time.perf_counter() - t0)
            REQUESTS.labels(path, mode, str(status[0])).inc()


def metrics_response() -> PlainTextResponse:
    """The Prometheus text exposition of this process's registry."""
    return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)
