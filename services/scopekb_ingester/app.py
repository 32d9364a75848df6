"""The webhook receiver (FastAPI).

``POST /webhooks/{github,gitlab,gitea,forgejo,bitbucket}``: read the raw body (size-capped), find the
registered sources of the repository, verify the provider's signature or token against their secrets, answer
pings, drop a repeated delivery id (Redis ``SET NX EX``), enqueue ``scopekb.sync_sources`` by name with the
delivery id as task and job id, and answer 202. Bad input gets 400/401/404/413, never 5xx, and enqueues nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from typing import Any
from urllib.parse import unquote_plus

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.concurrency import run_in_threadpool

from scopekb import queue
from scopekb.logging import bind_context, clear_context, configure_logging, get_logger
from scopekb.models import Source
from scopekb.runtime import build_runtime, redis_client
from scopekb.settings import Settings, get_settings
from scopekb.sources import matching_sources
from scopekb_ingester.providers import PROVIDERS, BadRequest, Provider, decode_body

log = get_logger("scopekb.ingester")

WEBHOOKS = Counter("scopekb_webhooks_total", "Webhook deliveries by provider and outcome",
                   ["provider", "outcome"])
JOB_QUEUED_KEY = "scopekb:job:{job_id}"


class SourceCache:
    """Registered sources kept in memory so most webhook requests do no OpenSearch I/O.

    Reloaded when the Redis sources version changes (registration bumps it), when older than ``ttl_s``, or on a
    miss at most once a second.
    """

    def __init__(self, loader: Any, version: Any, ttl_s: float = 30.0) -> None:
        self._loader = loader
        self._version = version
        self._ttl = ttl_s
        self._sources: list[Source] = []
        self._loaded_at = float("-inf")
        self._loaded_version: int | None = None
        self._lock = threading.Lock()

    def get(self, force: bool = False) -> list[Source]:
        """The cached sources, reloaded as described above."""
        try:
            v: int | None = self._version()
        except Exception:  # noqa: BLE001 - Redis hiccup: fall back to the TTL
            v = self._loaded_version
        with self._lock:
            age = time.monotonic() - self._loaded_at
            if age > self._ttl or v != self._loaded_version or (force and age > 1.0):
                self._sources = list(self._loader())
                self._loaded_at = time.monotonic()
                self._loaded_version = v
        return self._sources


def _err(status: int, detail: str, provider: str, outcome: str) -> JSONResponse:
    WEBHOOKS.labels(provider, outcome).inc()
    return JSONResponse({"detail": detail}, status_code=status)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ingester app. Settings default to :func:`scopekb.settings.get_settings`."""
    settings = settings or get_settings()
    configure_logging("json" if settings.log_format == "auto" else settings.log_format, settings.log_level)
    rt = build_runtime(settings, with_embedder=False)  # the ingester never embeds: no model in memory
    rds = redis_client(settings)
    celery = queue.make_celery(settings, name="scopekb-ingester")
    cache = SourceCache(lambda: rt.records.list_sources(), lambda: queue.sources_version(rds), ttl_s=30.0)
    app = FastAPI(title="scopekb ingester", version="0.1.0")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Process is up."""
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/webhooks/s3", status_code=202)
    async def s3_events(request: Request) -> JSONResponse:
        """S3 event notifications (``{"Records": [{"s3": {"bucket": {"name"}, "object": {"key"}}}]}``, keys
        URL-encoded as AWS sends them): every object-store source whose bucket and prefix cover a changed key is
        synced. Protected by ``X-Scopekb-Token`` (``ingester.s3_event_token``)."""
        clear_context()
        token = settings.ingester.s3_event_token
        if token is None:
            return _err(404, "object-store events are not enabled", "s3", "disabled")
        raw = await request.body()
        if len(raw) > settings.ingester.max_body_bytes:
            return _err(413, "body too large", "s3", "too_large")
        return await run_in_threadpool(_process_s3, raw, request.headers.get("x-scopekb-token") or "")

    def _process_s3(raw: bytes, given: str) -> JSONResponse:
        """Verify, find the covering sources, dedupe and enqueue (blocking clients, off the event loop)."""
        token = settings.ingester.s3_event_token
        assert token is not None
        if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
            return _err(401, "invalid token", "s3", "bad_signature")
        try:
            records = json.loads(raw).get("Records")
            changed = {(r["s3"]["bucket"]["name"], unquote_plus(r["s3"]["object"]["key"])) for r in records}
        except (ValueError, AttributeError, TypeError, KeyError):
            return _err(400, "body must be an S3 event with Records[].s3.bucket.name and .object.key", "s3",
                        "bad_request")
        try:
            sources = [x for x in cache.get() if x.kind == "s3"]
        except Exception as e:  # the source registry is unreachable: the sender retries later
            log.error("webhook_sources_unavailable", error=str(e))
            return _err(503, "source registry unavailable, retry later", "s3", "unavailable")
        targets = [x for x in sources
                   if any(b == (x.bucket or settings.s3.bucket) and k.startswith((x.prefix or "") + "/")
                          for b, k in changed)]
        if not targets:
            return JSONResponse({"status": "ignored", "reason": "no source covers these keys"}, status_code=202)
        delivery = "s3-" + hashlib.sha256(raw).hexdigest()[:32]
        bind_context(delivery_id=delivery, provider="s3")
        if not queue.claim_delivery(rds, "s3", delivery, settings.ingester.dedupe_ttl_s):
            return JSONResponse({"status": "duplicate", "job_id": delivery}, status_code=200)
        job_ids = []
        for n, src in enumerate(targets):
            job_id = f"{delivery}:{n}"
            celery.send_task(queue.TASK_SYNC_SOURCES, task_id=job_id, kwargs={
                "job_id": job_id, "source_ids": [src.id], "trigger": "s3-event", "delivery_id": delivery})
            job_ids.append(job_id)
        WEBHOOKS.labels("s3", "queued").inc()
        return JSONResponse({"status": "queued", "job_ids": job_ids}, status_code=202)

    @app.post("/webhooks/{provider}", status_code=202)
    async def webhook(provider: str, request: Request) -> JSONResponse:
        """Push webhooks from GitHub, GitLab, Gitea/Forgejo and Bitbucket Cloud (``provider`` in the path)."""
        clear_context()
        prov = PROVIDERS.get(provider)
        if prov is None:
            return _err(404, "unknown provider", "unknown", "unknown_provider")
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
        # Redis, the source cache and the broker are blocking clients: run them off the event loop.
        return await run_in_threadpool(_process, provider, prov, raw, dict(request.headers))

    def _process(provider: str, prov: Provider, raw: bytes, headers: dict[str, str]) -> JSONResponse:
        """Everything after the body is read: parse, find sources, verify, dedupe, enqueue."""
        event = prov.header(headers, prov.event_headers)
        delivery = prov.header(headers, prov.delivery_headers)
        if not event or not delivery or len(delivery) > 200 or len(event) > 100:
            return _err(400, "missing event or delivery header", provider, "bad_request")
        bind_context(delivery_id=delivery, provider=provider, event=event)
        try:
            parsed = prov.parse(event, decode_body(raw, headers.get("content-type")))
        except BadRequest as e:
            return _err(400, str(e), provider, "bad_request")
        repo = parsed.repository
        try:
            found = matching_sources(cache.get(), repo.urls, [repo.full_name])
            if not found:
                found = matching_sources(cache.get(force=True), repo.urls, [repo.full_name])
        except Exception as e:  # the source registry is unreachable: the host retries later
            log.error("webhook_sources_unavailable", error=str(e))
            return _err(503, "source registry unavailable, retry later", provider, "unavailable")
        if not found:
            log.info("webhook_unknown_repository", repository=repo.full_name)
            return _err(404, "not found", provider, "unknown_repo")
        sig = prov.header(headers, prov.signature_headers)
        # Only sources whose own secret (current or previous, during rotation) signed this body take part.
        eligible = [s for s in found if not s.secrets() or prov.verify(s.secrets(), raw, sig)]
        if not eligible:
            log.warning("webhook_bad_signature", repository=repo.full_name)
            return _err(401, "invalid signature", provider, "bad_signature")
        if parsed.kind == "ping":
            WEBHOOKS.labels(provider, "ping").inc()
            return JSONResponse({"status": "pong"}, status_code=200)
        work = [(push, [s for s in eligible if push.branch is not None and s.ref == push.branch])
                for push in parsed.pushes]
        work = [(push, targets) for push, targets in work if targets]
        if parsed.kind == "ignored" or not work:
            WEBHOOKS.labels(provider, "ignored").inc()
            log.info("webhook_ignored", refs=[p.ref for p in parsed.pushes], reason="no source tracks this ref")
            return JSONResponse({"status": "ignored", "reason": "no source tracks this ref"}, status_code=202)
        job_ids = [delivery if len(work) == 1 else f"{delivery}:{n}" for n in range(len(work))]
        try:
            if not queue.claim_delivery(rds, provider, delivery, settings.ingester.dedupe_ttl_s):
                WEBHOOKS.labels(provider, "duplicate").inc()
                log.info("webhook_duplicate")
                return JSONResponse({"status": "duplicate", "job_id": job_ids[0]}, status_code=200)
            for job_id, (push, targets) in zip(job_ids, work, strict=True):
                ids = [s.id for s in targets]
                rds.set(JOB_QUEUED_KEY.format(job_id=job_id),
                        json.dumps({"id": job_id, "state": "queued", "source_ids": ids, "ref": push.branch,
                                    "to_commit": None if push.deleted else push.after}),
                        ex=settings.worker.result_expires_s)
                celery.send_task(queue.TASK_SYNC_SOURCES, task_id=job_id, kwargs={
                    "job_id": job_id, "source_ids": ids, "after": push.after, "branch_deleted": push.deleted,
                    "delivery_id": delivery})
        except Exception as e:  # broker down: let the host retry, do not remember the delivery
            try:
                queue.release_delivery(rds, provider, delivery)
            except Exception:  # noqa: BLE001 - Redis itself may be the failure; the 503 below says so
                pass
            log.error("webhook_enqueue_failed", error=str(e))
            return _err(503, "queue unavailable, retry later", provider, "enqueue_failed")
        WEBHOOKS.labels(provider, "queued").inc()
        log.info("webhook_queued", refs=[p.ref for p, _ in work], jobs=len(job_ids))
        return JSONResponse({"status": "queued", "job_id": job_ids[0], "job_ids": job_ids,
                             "sources": sorted({s.id for _, t in work for s in t})}, status_code=202)

    return app
