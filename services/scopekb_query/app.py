"""The query service (FastAPI, stateless): search, sources, keys, jobs, status, health, metrics, MCP.

Authentication: ``Authorization: Bearer <key>``. Agent keys search within the scope bound to the key; the
admin token (``SCOPEKB_QUERY__ADMIN_TOKEN``) manages sources and keys. OpenAPI at ``/openapi.json``.

The routes live in :mod:`scopekb_query.routes` (one router per resource), their dependencies in
:mod:`scopekb_query.deps`, error answers in :mod:`scopekb_query.errors`, metrics in :mod:`scopekb_query.metrics`
and the MCP endpoint in :mod:`scopekb_query.mcp_server`; the actions themselves in :mod:`scopekb.ops`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from scopekb.http.exposure import fastapi_options, harden, route_limits
from scopekb.http.server import apply_worker_threads
from scopekb.http.unicode import install_unicode_safety
from scopekb.logging import configure_logging, get_logger
from scopekb.runtime import Runtime, build_runtime
from scopekb.settings import Settings, get_settings
from scopekb_query.console import mount_console
from scopekb_query.deps import bearer_gate
from scopekb_query.errors import install_error_handlers
from scopekb_query.mcp_server import mount_mcp
from scopekb_query.metrics import install_metrics
from scopekb_query.routes import ROUTERS

log = get_logger("scopekb.query")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the query app on a runtime for ``settings`` (default :func:`scopekb.settings.get_settings`).

    The operators' console is served under ``/console`` (:mod:`scopekb_query.console`).
    ``app.state.lifespan_contexts`` holds further async context managers run for the app's lifetime (the MCP
    session manager; ``scopekb up`` adds none).
    """
    settings = settings or get_settings()
    configure_logging("json" if settings.log_format == "auto" else settings.log_format, settings.log_level)
    rt = build_runtime(settings, interactive=True, name="scopekb-query")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        apply_worker_threads(settings.http)  # the OpenSearch client keeps a connection for each (issue 20)
        _ensure_index(rt)
        async with contextlib.AsyncExitStack() as stack:
            for ctx in app.state.lifespan_contexts:
                await stack.enter_async_context(ctx())
            yield

    app = FastAPI(title="scopekb query", version="0.1.0", lifespan=lifespan,
                  description="Scoped BM25 / kNN / hybrid search over code and documents for AI agents.",
                  **fastapi_options(settings.http))
    install_unicode_safety(app)  # before the routers: their default response class
    app.state.runtime = rt
    app.state.lifespan_contexts = []
    install_metrics(app, rt)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    mount_mcp(app, rt)
    mount_console(app, rt)
    # Issue 16: bodies judged before and while they are read (bearer gate, per-route caps, JSON depth, deadline),
    # security headers on every answer, /docs from local assets. ``scopekb up`` adds the webhook routes later:
    # their cap is among route_limits.
    harden(app, settings.http, title="scopekb query", routes=route_limits(settings), gate=bearer_gate(rt))
    return app


def _ensure_index(rt: Runtime) -> None:
    try:
        rt.chunks.ensure_index()
    except Exception as e:  # noqa: BLE001 - readiness reports it; the process still serves health
        log.error("ensure_index_failed", error=str(e))
