"""Prometheus metrics of the query service: request counts and latency by route and mode, and gauges read from
the stores at scrape time (jobs by state and trigger, sources, chunks, dead letters)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
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

    @app.middleware("http")
    async def _metrics(request: Request, call_next: Any) -> Any:
        t0 = time.perf_counter()
        response = await call_next(request)
        path = getattr(request.scope.get("route"), "path", "unmatched")
        mode = request.scope.get("scopekb_mode", "-")
        LATENCY.labels(path, mode).observe(time.perf_counter() - t0)
        REQUESTS.labels(path, mode, str(response.status_code)).inc()
        return response


def metrics_response() -> PlainTextResponse:
    """The Prometheus text exposition of this process's registry."""
    return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)
