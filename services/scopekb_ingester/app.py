"""The webhook receiver (FastAPI).

``POST /webhooks/github``: read the raw body (size-capped), find the registered sources of the repository,
verify ``X-Hub-Signature-256`` against their secrets, answer ``ping``, drop a repeated ``X-GitHub-Delivery``
(Redis ``SET NX EX``), enqueue ``scopekb.sync_sources`` by name with the delivery id as task and job id, and
answer 202. Bad input gets 400/401/404/413, never 5xx, and enqueues nothing.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from scopekb import queue
from scopekb.logging import bind_context, clear_context, configure_logging, get_logger
from scopekb.models import Source
from scopekb.runtime import build_runtime, redis_client
from scopekb.settings import Settings, get_settings
from scopekb.sources import matching_sources

from scopekb_ingester.providers import (
    BadRequest,
    github_repository,
    parse_github_body,
    parse_github_push,
    verify_github,
)

log = get_logger("scopekb.ingester")

WEBHOOKS = Counter("scopekb_webhooks_total", "Webhook deliveries by provider and outcome",
                   ["provider", "outcome"])
JOB_QUEUED_KEY = "scopekb:job:{job_id}"


class SourceCache:
    """Registered sources kept in memory, refreshed at most every ``ttl_s`` seconds (and on a miss, at most
    once a second), so most webhook requests do no OpenSearch I/O."""

    def __init__(self, loader: Any, ttl_s: float = 5.0) -> None:
        self._loader = loader
        self._ttl = ttl_s
        self._sources: list[Source] = []
        self._loaded_at = float("-inf")
        self._lock = threading.Lock()

    def get(self, force: bool = False) -> list[Source]:
        """The cached sources; reloaded when older than the TTL, or when ``force`` and older than 1 s."""
        with self._lock:
            age = time.monotonic() - self._loaded_at
            if age > self._ttl or (force and age > 1.0):
                self._sources = list(self._loader())
                self._loaded_at = time.monotonic()
        return self._sources


def _err(status: int, detail: str, provider: str, outcome: str) -> JSONResponse:
    WEBHOOKS.labels(provider, outcome).inc()
    return JSONResponse({"detail": detail}, status_code=status)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ingester app. Settings default to :func:`scopekb.settings.get_settings`."""
    settings = settings or get_settings()
    configure_logging("json" if settings.log_format == "auto" else settings.log_format, settings.log_level)
    rt = build_runtime(settings)
    rds = redis_client(settings)
    celery = queue.make_celery(settings, name="scopekb-ingester")
    cache = SourceCache(lambda: rt.records.list_sources(), ttl_s=5.0)
    app = FastAPI(title="scopekb ingester", version="0.1.0")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Process is up."""
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/webhooks/github", status_code=202)
    async def github(request: Request) -> JSONResponse:
        """GitHub push and ping webhooks (JSON or form-encoded bodies)."""
        provider = "github"
        clear_context()
        cap = settings.ingester.max_body_bytes
        clen = request.headers.get("content-length")
        if clen and clen.isdigit() and int(clen) > cap:
            return _err(413, f"body larger than {cap} bytes", provider, "too_large")
        body = bytearray()
        async for part in request.stream():
            body.extend(part)
            if len(body) > cap:
                return _err(413, f"body larger than {cap} bytes", provider, "too_large")
        raw = bytes(body)
        event = request.headers.get("x-github-event")
        delivery = request.headers.get("x-github-delivery")
        if not event or not delivery or len(delivery) > 200:
            return _err(400, "missing X-GitHub-Event or X-GitHub-Delivery header", provider, "bad_request")
        bind_context(delivery_id=delivery, provider=provider, event=event)
        if event not in ("push", "ping"):
            return _err(400, f"unsupported event {event!r}", provider, "bad_event")
        try:
            data = parse_github_body(raw, request.headers.get("content-type"))
            urls, full_name = github_repository(data)
        except BadRequest as e:
            return _err(400, str(e), provider, "bad_request")
        try:
            found = matching_sources(cache.get(), urls, [full_name])
            if not found:
                found = matching_sources(cache.get(force=True), urls, [full_name])
        except Exception as e:  # the source registry is unreachable: the host retries later
            log.error("webhook_sources_unavailable", error=str(e))
            return _err(503, "source registry unavailable, retry later", provider, "unavailable")
        if not found:
            log.info("webhook_unknown_repository", repository=full_name)
            return _err(404, "not found", provider, "unknown_repo")
        sig = request.headers.get("x-hub-signature-256")
        # Only sources whose own secret signed this body (or that have no secret) take part.
        eligible = [s for s in found if s.webhook_secret is None
                    or verify_github([s.webhook_secret.get_secret_value()], raw, sig)]
        if not eligible:
            log.warning("webhook_bad_signature", repository=full_name)
            return _err(401, "invalid signature", provider, "bad_signature")
        if event == "ping":
            WEBHOOKS.labels(provider, "ping").inc()
            return JSONResponse({"status": "pong"}, status_code=200)
        try:
            push = parse_github_push(data)
        except BadRequest as e:
            return _err(400, str(e), provider, "bad_request")
        branch = push.branch
        targets = [s for s in eligible if branch is not None and s.ref == branch]
        if not targets:
            WEBHOOKS.labels(provider, "ignored").inc()
            log.info("webhook_ignored", ref=push.ref, reason="no source tracks this ref")
            return JSONResponse({"status": "ignored", "reason": "no source tracks this ref"}, status_code=202)
        try:
            if not queue.claim_delivery(rds, provider, delivery, settings.ingester.dedupe_ttl_s):
                WEBHOOKS.labels(provider, "duplicate").inc()
                log.info("webhook_duplicate")
                return JSONResponse({"status": "duplicate", "job_id": delivery}, status_code=200)
            rds.set(JOB_QUEUED_KEY.format(job_id=delivery),
                    json.dumps({"id": delivery, "state": "queued", "source_ids": [s.id for s in targets],
                                "ref": branch, "to_commit": push.after}),
                    ex=settings.worker.result_expires_s)
            celery.send_task(queue.TASK_SYNC_SOURCES, task_id=delivery, kwargs={
                "job_id": delivery, "source_ids": [s.id for s in targets], "after": push.after,
                "branch_deleted": push.deleted, "delivery_id": delivery})
        except Exception as e:  # broker down: let the host retry, do not remember the delivery
            try:
                queue.release_delivery(rds, provider, delivery)
            except Exception:  # noqa: BLE001 - Redis itself may be the failure; the 503 below says so
                pass
            log.error("webhook_enqueue_failed", error=str(e))
            return _err(503, "queue unavailable, retry later", provider, "enqueue_failed")
        WEBHOOKS.labels(provider, "queued").inc()
        log.info("webhook_queued", ref=push.ref, after=push.after, sources=len(targets))
        return JSONResponse({"status": "queued", "job_id": delivery, "sources": [s.id for s in targets]},
                            status_code=202)

    return app
