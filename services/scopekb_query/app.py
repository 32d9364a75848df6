"""The query service (FastAPI, stateless): search, sources, keys, jobs, status, health, metrics.

Authentication: ``Authorization: Bearer <key>``. Agent keys search within the scope bound to the key; the
admin token (``SCOPEKB_QUERY__ADMIN_TOKEN``) manages sources and keys. OpenAPI at ``/openapi.json``.
"""


import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import TransportError
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, generate_latest
from pydantic import BaseModel, Field, field_validator

from scopekb import queue
from scopekb.auth import ApiKey, AuthError, hash_key, new_key, resolve_scope, tokens_equal
from scopekb.deadletters import list_dead_letters, replay
from scopekb.logging import configure_logging, get_logger
from scopekb.models import Job, Scope, SearchRequest, SearchResponse, Source, SourceCreate, utcnow
from scopekb.runtime import build_runtime, redis_client
from scopekb.search import SearchUnavailable, render_text, run_search
from scopekb.settings import Settings, get_settings
from scopekb.sources import InvalidRepoUrl, validate_repo_url
from scopekb.status import source_status

log = get_logger("scopekb.query")

REQUESTS = Counter("scopekb_query_requests_total", "Requests by route, mode and status",
                   ["route", "mode", "status"])
LATENCY = Histogram("scopekb_query_latency_seconds", "Request latency by route and mode", ["route", "mode"])
JOB_QUEUED_KEY = "scopekb:job:{job_id}"


class _IndexCollector:
    """Gauges read from the stores at scrape time: jobs by state and trigger, sources, chunks, dead letters.

    One per process (Prometheus names must be unique); it reads through the most recent app's runtime.
    """

    def __init__(self) -> None:
        self.rt: Any = None

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        if self.rt is None:
            return
        try:
            jobs = GaugeMetricFamily("scopekb_jobs", "Sync jobs on record by state and trigger",
                                     labels=["state", "trigger"])
            counts: dict[tuple[str, str], int] = {}
            for d in self.rt.records.find("jobs", size=10000):
                k = (str(d.get("state")), str(d.get("trigger")))
                counts[k] = counts.get(k, 0) + 1
            for (state, trigger), n in sorted(counts.items()):
                jobs.add_metric([state, trigger], n)
            yield jobs
            yield GaugeMetricFamily("scopekb_sources", "Registered sources", value=len(self.rt.records.find(
                "sources", size=10000)))
            yield GaugeMetricFamily("scopekb_chunks", "Chunks in the index", value=self.rt.chunks.count())
            yield GaugeMetricFamily("scopekb_dead_letters", "Dead-lettered tasks not yet replayed",
                                    value=sum(1 for d in self.rt.records.find("deadletters", size=10000)
                                              if not d.get("replayed_at")))
        except Exception as e:  # noqa: BLE001 - a scrape must never fail because a store is down
            log.warning("metrics_collect_failed", error=str(e))


INDEX_COLLECTOR = _IndexCollector()
REGISTRY.register(INDEX_COLLECTOR)


class KeyCreate(BaseModel):
    """Create an API key bound to one agent (optionally to some of its contexts)."""

    agent_name: str = Field(min_length=1, max_length=200)
    context_ids: list[str] | None = Field(default=None, max_length=1000)
    label: str | None = Field(default=None, max_length=200)

    @field_validator("agent_name")
    @classmethod
    def _agent(cls, v: str) -> str:
        return Scope(agent_name=v, context_id="x").agent_name

    @field_validator("context_ids")
    @classmethod
    def _contexts(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [Scope(agent_name="x", context_id=c).context_id for c in v]


def backend_reason(exc: TransportError) -> str:
    """The root cause type OpenSearch gave for a refused request (``query_shard_exception``), or its error."""
    info = exc.info if isinstance(exc.info, dict) else {}
    causes = (info.get("error") or {}).get("root_cause") if isinstance(info.get("error"), dict) else None
    return str(causes[0].get("type")) if causes else str(exc.error)


class Caller(BaseModel):
    admin: bool = False
    key: ApiKey | None = None


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the query app. Settings default to :func:`scopekb.settings.get_settings`."""
    settings = settings or get_settings()
    configure_logging("json" if settings.log_format == "auto" else settings.log_format, settings.log_level)
    rt = build_runtime(settings, interactive=True)
    INDEX_COLLECTOR.rt = rt
    celery = queue.make_celery(settings, name="scopekb-query")
    key_cache: dict[str, tuple[float, ApiKey | None]] = {}
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            rt.chunks.ensure_index()
        except Exception as e:  # noqa: BLE001 - readiness reports it; the process still serves health
            log.error("ensure_index_failed", error=str(e))
        async with contextlib.AsyncExitStack() as stack:
            for ctx in app.state.lifespan_contexts:
                await stack.enter_async_context(ctx())
            yield

    app = FastAPI(title="scopekb query", version="0.1.0", lifespan=lifespan,
                  description="Scoped BM25 / kNN / hybrid search over code and documents for AI agents.")
    #: Extra async context managers run for the app's lifetime (e.g. the MCP session manager).
    app.state.lifespan_contexts = []

    @app.middleware("http")
    async def _metrics(request: Request, call_next: Any) -> Any:
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        mode = request.scope.get("scopekb_mode", "-")
        LATENCY.labels(path, mode).observe(time.perf_counter() - t0)
        REQUESTS.labels(path, mode, str(response.status_code)).inc()
        return response

    @app.exception_handler(OSConnectionError)
    async def _os_down(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": "search backend unavailable"}, status_code=503)

    @app.exception_handler(TransportError)
    async def _os_error(request: Request, exc: TransportError) -> JSONResponse:
        reason = backend_reason(exc)
        # A search's own query was refused (over 1024 clauses, too many terms): the caller's error, not a 5xx.
        refused = exc.status_code == 400 or reason in ("too_many_clauses", "too_many_nested_clauses")
        if refused and request.url.path == "/v1/search":
            log.warning("opensearch_refused_query", status=exc.status_code, reason=reason)
            return JSONResponse({"detail": f"the search backend refused the query ({reason}); use "
                                 "fewer query terms, file patterns or languages"}, status_code=400)
        log.error("opensearch_error", status=exc.status_code, error=str(exc.error), reason=reason)
        return JSONResponse({"detail": "search backend error"}, status_code=503)

    def caller(request: Request) -> Caller:
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPException(401, "missing bearer key", headers={"WWW-Authenticate": "Bearer"})
        token = token.strip()
        admin = settings.query.admin_token
        if admin is not None and tokens_equal(token, admin.get_secret_value()):
            return Caller(admin=True)
        h = hash_key(token)
        now = time.monotonic()
        cached = key_cache.get(h)
        if cached is None or now - cached[0] > 30:
            docs = rt.records.find("keys", size=1, key_hash=h)
            k = ApiKey.model_validate(docs[0]) if docs else None
            key_cache[h] = (now, k)
            cached = key_cache[h]
        key = cached[1]
        if key is None or key.revoked_at is not None:
            raise HTTPException(401, "unknown or revoked key", headers={"WWW-Authenticate": "Bearer"})
        return Caller(key=key)

    def admin_only(c: Annotated[Caller, Depends(caller)]) -> Caller:
        if settings.query.admin_token is None:
            raise HTTPException(403, "admin API disabled: set SCOPEKB_QUERY__ADMIN_TOKEN")
        if not c.admin:
            raise HTTPException(403, "admin key required")
        return c

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        """OpenSearch and Redis reachable."""
        checks: dict[str, str] = {}
        try:
            rt.chunks.client.cluster.health(params={"request_timeout": 2})
            checks["opensearch"] = "ok"
        except Exception as e:  # noqa: BLE001 - any failure means not ready; reported as text
            checks["opensearch"] = f"error: {type(e).__name__}"
        try:
            redis_client(settings).ping()
            checks["redis"] = "ok"
        except Exception as e:  # noqa: BLE001
            checks["redis"] = f"error: {type(e).__name__}"
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    # ---- search ------------------------------------------------------------------------------------------

    @app.post("/v1/search", response_model=SearchResponse)
    def search(req: SearchRequest, request: Request, c: Annotated[Caller, Depends(caller)],
               format: str = "json") -> Any:
        """Search within the caller's scope. ``?format=text`` returns the agent text rendering."""
        request.scope["scopekb_mode"] = req.mode.value
        if c.key is None:
            raise HTTPException(403, "searches need an agent key, not the admin token")
        try:
            scope = resolve_scope(c.key, req.context_id, req.cross_context)
            resp = run_search(rt.chunks, req, scope, settings.query,
                              embed=rt.embed_query if rt.embedder is not None else None)
        except AuthError as e:
            raise HTTPException(e.status, str(e)) from None
        except SearchUnavailable as e:
            raise HTTPException(400, str(e)) from None
        if format == "text":
            return PlainTextResponse(render_text(resp))
        return resp

    # ---- sources -----------------------------------------------------------------------------------------

    @app.post("/v1/sources", status_code=201, dependencies=[Depends(admin_only)])
    def add_source(body: SourceCreate) -> dict[str, Any]:
        """Register a git repository + ref, or an object-store prefix, for a scope. Clone URLs are validated
        (https/ssh; no private, loopback or metadata hosts unless allowlisted)."""
        url = body.repo_url
        if body.kind == "git":
            try:
                url = validate_repo_url(body.repo_url, rt.settings.git.allow_local_paths,
                                        settings.git.host_allowlist)
            except InvalidRepoUrl as e:
                raise HTTPException(422, str(e)) from None
        src = Source(**{**body.model_dump(), "repo_url": url, "webhook_secret": body.webhook_secret},
                     id=Source.new_id())
        rt.records.put_source(src)
        queue.bump_sources_version(redis_client(settings))
        log.info("source_added", source_id=src.id, agent_name=src.agent_name, context_id=src.context_id)
        return src.public()

    @app.get("/v1/sources", dependencies=[Depends(admin_only)])
    def list_sources(agent_name: str | None = None) -> list[dict[str, Any]]:
        return [s.public() for s in rt.records.list_sources(agent_name=agent_name)]

    @app.get("/v1/sources/{source_id}", dependencies=[Depends(admin_only)])
    def get_source(source_id: str) -> dict[str, Any]:
        src = rt.records.get_source(source_id)
        if src is None:
            raise HTTPException(404, "source not found")
        return {**src.public(), **_source_status(src)}

    @app.delete("/v1/sources/{source_id}", dependencies=[Depends(admin_only)])
    def delete_source(source_id: str) -> dict[str, Any]:
        """Unregister a source and delete its chunks and sync state."""
        if rt.records.get_source(source_id) is None:
            raise HTTPException(404, "source not found")
        deleted = rt.chunks.delete_source(source_id)
        rt.records.delete("state", source_id)
        rt.records.delete("sources", source_id)
        queue.bump_sources_version(redis_client(settings))
        return {"deleted": True, "chunks_deleted": deleted}

    def _enqueue_sync(src: Source, trigger: str) -> str:
        job_id = f"{trigger}-" + uuid.uuid4().hex[:16]
        redis_client(settings).set(JOB_QUEUED_KEY.format(job_id=job_id), json.dumps(
            {"id": job_id, "state": "queued", "source_ids": [src.id], "ref": src.ref, "trigger": trigger}),
            ex=settings.worker.result_expires_s)
        celery.send_task(queue.TASK_SYNC_SOURCES, task_id=job_id, kwargs={
            "job_id": job_id, "source_ids": [src.id], "trigger": trigger})
        return job_id

    @app.post("/v1/sources/{source_id}/sync", status_code=202, dependencies=[Depends(admin_only)])
    def sync_now(source_id: str) -> dict[str, Any]:
        """Enqueue a sync of the source to its ref's current commit (or its prefix's current listing)."""
        src = rt.records.get_source(source_id)
        if src is None:
            raise HTTPException(404, "source not found")
        return {"status": "queued", "job_id": _enqueue_sync(src, "manual")}

    @app.post("/v1/sources/{source_id}/documents", status_code=202, dependencies=[Depends(admin_only)])
    async def upload_document(source_id: str, name: str, request: Request) -> dict[str, Any]:
        """Store a document (raw request body) under an object-store source's prefix and index it.

        ``name`` is the document's path below the prefix (e.g. ``runbooks/restart.md``).
        """
        from scopekb.documents import ObjectPrefix

        src = rt.records.get_source(source_id)
        if src is None:
            raise HTTPException(404, "source not found")
        if src.kind != "s3":
            raise HTTPException(400, "documents can only be uploaded to an object-store (s3) source")
        rel = name.strip().lstrip("/")
        if not rel or ".." in rel.split("/") or any(ord(c) < 32 for c in rel) or len(rel) > 900:
            raise HTTPException(422, "name must be a relative path without '..' or control characters")
        data = await request.body()
        if len(data) > settings.ingester.max_body_bytes * 10:
            raise HTTPException(413, "document too large")
        store = ObjectPrefix(settings.s3, src.bucket or settings.s3.bucket, src.prefix or "")
        key = store.put(rel, data, request.headers.get("content-type") or "application/octet-stream")
        return {"status": "queued", "key": key, "job_id": _enqueue_sync(src, "upload")}

    def _source_status(src: Source) -> dict[str, Any]:
        return source_status(rt.records, rt.chunks, src)

    # ---- keys --------------------------------------------------------------------------------------------

    @app.post("/v1/keys", status_code=201, dependencies=[Depends(admin_only)])
    def create_key(body: KeyCreate) -> dict[str, Any]:
        """Create an agent key; the key itself is returned once and only its hash is stored."""
        key, h = new_key()
        rec = ApiKey(id="key_" + uuid.uuid4().hex[:12], agent_name=body.agent_name, context_ids=body.context_ids,
                     key_hash=h, label=body.label)
        rt.records.put("keys", rec.id, rec.model_dump(mode="json"))
        return {"id": rec.id, "key": key, "agent_name": rec.agent_name, "context_ids": rec.context_ids}

    @app.get("/v1/keys", dependencies=[Depends(admin_only)])
    def list_keys() -> list[dict[str, Any]]:
        return [ApiKey.model_validate(d).model_dump(mode="json", exclude={"key_hash"})
                for d in rt.records.find("keys", sort="created_at")]

    @app.delete("/v1/keys/{key_id}", dependencies=[Depends(admin_only)])
    def revoke_key(key_id: str) -> dict[str, Any]:
        d = rt.records.get("keys", key_id)
        if d is None:
            raise HTTPException(404, "key not found")
        d["revoked_at"] = utcnow().isoformat()
        rt.records.put("keys", key_id, d)
        key_cache.clear()
        return {"revoked": True}

    # ---- jobs and status ---------------------------------------------------------------------------------

    @app.get("/v1/jobs/{job_id}", dependencies=[Depends(admin_only)])
    def get_job(job_id: str) -> dict[str, Any]:
        """A sync job record; a queued job not yet picked up by a worker is reported from the queue marker."""
        job = rt.records.get_job(job_id)
        if job is not None:
            return job.model_dump(mode="json")
        raw = redis_client(settings).get(JOB_QUEUED_KEY.format(job_id=job_id))
        if raw:
            return Job.model_validate(json.loads(raw)).model_dump(mode="json")
        raise HTTPException(404, "job not found")

    @app.get("/v1/jobs", dependencies=[Depends(admin_only)])
    def list_jobs(source_id: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        return [j.model_dump(mode="json") for j in rt.records.list_jobs(source_id, size=min(max(limit, 1), 200))]

    @app.get("/v1/deadletters", dependencies=[Depends(admin_only)])
    def dead_letters(include_replayed: bool = False) -> list[dict[str, Any]]:
        """Tasks parked after failing ``worker.max_retries`` times."""
        return [d.model_dump(mode="json") for d in list_dead_letters(rt.records, include_replayed)]

    @app.post("/v1/deadletters/{dl_id}/replay", status_code=202, dependencies=[Depends(admin_only)])
    def replay_dead_letter(dl_id: str) -> dict[str, Any]:
        """Enqueue a parked task again; returns the new job id."""
        try:
            return {"status": "queued", "job_id": replay(rt.records, celery, dl_id)}
        except KeyError:
            raise HTTPException(404, "dead letter not found") from None

    @app.post("/v1/deadletters/replay", status_code=202, dependencies=[Depends(admin_only)])
    def replay_all() -> dict[str, Any]:
        """Replay every parked task that was not replayed yet."""
        return {"status": "queued", "job_ids": [replay(rt.records, celery, d.id)
                                                for d in list_dead_letters(rt.records)]}

    @app.get("/v1/status", dependencies=[Depends(admin_only)])
    def status() -> dict[str, Any]:
        """Per-source status (READY / INDEXING / EMPTY / ERROR, documents, chunks, indexed commit)."""
        sources = rt.records.list_sources()
        return {"index": rt.chunks.live_index(), "chunks": rt.chunks.count(),
                "sources": [{**s.public(), **_source_status(s)} for s in sources]}

    # ---- MCP (streamable HTTP at /mcp, same agent keys; shares the key cache so revocation applies at once) --
    from scopekb_query.mcp_server import mount_mcp  # here, not at the top: mcp_server imports this module

    mount_mcp(app, rt, settings, celery, key_cache)
    return app
