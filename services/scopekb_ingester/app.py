"""The webhook receiver (FastAPI): the routes of :mod:`scopekb_ingester.webhooks` plus health and metrics.

It runs on the ingester's own runtime (:func:`scopekb.runtime.build_control_runtime`: records, coordination and
the task producer; no chunk store, no S3 client, no embedding model). ``scopekb up`` adds the same webhook
router to the embedded all-in-one app with :func:`attach`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scopekb.http.exposure import fastapi_options, guarded_metrics, harden, route_limits
from scopekb.http.server import apply_worker_threads
from scopekb.http.unicode import install_unicode_safety
from scopekb.logging import configure_logging
from scopekb.runtime import ControlRuntime, build_control_runtime
from scopekb.settings import Settings, get_settings
from scopekb_ingester.state import Ingester
from scopekb_ingester.webhooks import router as webhook_router

health_router = APIRouter(tags=["health"])


@health_router.get("/healthz")
def healthz() -> dict[str, str]:
    """Process is up."""
    return {"status": "ok"}


@health_router.get("/metrics")
def metrics(request: Request) -> Response:
    """Prometheus metrics (``http.expose_metrics``; ``http.metrics_token`` when set)."""
    return guarded_metrics(request, lambda: PlainTextResponse(generate_latest().decode(),
                                                              media_type=CONTENT_TYPE_LATEST))


def attach(app: FastAPI, rt: ControlRuntime) -> FastAPI:
    """Serve the webhook routes on ``app`` over ``rt`` (sets ``app.state.ingester``)."""
    app.state.ingester = Ingester.on(rt)
    app.include_router(webhook_router)
    return app


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ingester app. Settings default to :func:`scopekb.settings.get_settings`."""
    settings = settings or get_settings()
    configure_logging("json" if settings.log_format == "auto" else settings.log_format, settings.log_level)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        apply_worker_threads(settings.http)  # the webhook route's blocking part runs in these threads (issue 20)
        yield

    app = FastAPI(title="scopekb ingester", version="0.1.0", lifespan=lifespan, **fastapi_options(settings.http))
    install_unicode_safety(app)  # before the routers: their default response class
    app.include_router(health_router)
    attach(app, build_control_runtime(settings))
    # Body caps while streaming, JSON depth, body deadline, security headers (issue 16). Webhook bodies are
    # judged by their signatures, which cover the body: no gate before reading.
    harden(app, settings.http, title="scopekb ingester", routes=route_limits(settings))
    return app
