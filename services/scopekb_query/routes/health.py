"""Liveness, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from scopekb.http.exposure import guarded_metrics
from scopekb.runtime import READINESS_REPORTED_ONLY
from scopekb_query.deps import Rt
from scopekb_query.metrics import metrics_response

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(rt: Rt) -> JSONResponse:
    """The chunk store and the coordination backend answer (``opensearch`` and ``redis``, or ``sqlite`` and
    ``memory`` in the embedded profile): 200, else 503 with each check's error type. ``s3`` (distributed) is
    reported in ``checks`` but does not make the service unready (:data:`scopekb.runtime.READINESS_REPORTED_ONLY`)."""
    checks = rt.readiness()
    ok = all(v == "ok" for k, v in checks.items() if k not in READINESS_REPORTED_ONLY)
    return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """Prometheus metrics (``http.expose_metrics``; ``http.metrics_token`` when set)."""
    return guarded_metrics(request, metrics_response)
