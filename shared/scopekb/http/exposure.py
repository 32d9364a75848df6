"""What an HTTP app exposes besides its API, by setting (issue 16, item 8), and the one call that hardens an app.

- ``/docs``: Swagger UI with its script and stylesheet served by the process itself (the files shipped by the
  ``fastapi-offline`` package), never from a CDN; its page gets a CSP that allows exactly its own inline script
  (by hash). Off with ``http.expose_docs=false`` (and whenever the OpenAPI document is off).
- ``/openapi.json``: ``http.expose_openapi``.
- ``/metrics``: ``http.expose_metrics``, and with ``http.metrics_token`` set only for ``Bearer <token>``.

Apps build FastAPI with :func:`fastapi_options` and then call :func:`harden` once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping, Sequence
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.staticfiles import StaticFiles

from scopekb.http.middleware import (
    API_CSP,
    Gate,
    RequestLimits,
    RequestLimitsMiddleware,
    RouteLimit,
    SecurityHeaders,
    SecurityHeadersMiddleware,
)
from scopekb.settings import HttpSettings, Settings

DOCS_PATH = "/docs"
DOCS_STATIC = "/docs/static"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def fastapi_options(http: HttpSettings) -> dict[str, Any]:
    """``FastAPI(...)`` keyword arguments: FastAPI's own CDN-loading docs pages are never built; the OpenAPI route
    exists only when exposed."""
    return {"docs_url": None, "redoc_url": None, "openapi_url": "/openapi.json" if http.expose_openapi else None}


def docs_exposed(http: HttpSettings) -> bool:
    """``/docs`` is served: asked for, and the OpenAPI document it renders is served too."""
    return http.expose_docs and http.expose_openapi


def _docs_html(title: str) -> tuple[str, str]:
    """The Swagger UI page (assets from :data:`DOCS_STATIC`) and the CSP that allows its inline script by hash."""
    html = get_swagger_ui_html(openapi_url="/openapi.json", title=title,
                               swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
                               swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
                               swagger_favicon_url=f"{DOCS_STATIC}/favicon.png").body.decode()
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
                      for s in _INLINE_SCRIPT.findall(html))
    csp = (f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
           "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
    return html, csp


def metrics_refusal(http: HttpSettings, authorization: str | None) -> tuple[int, str] | None:
    """None when ``/metrics`` may be answered, else ``(status, detail)``: 404 when not exposed, 401 when a metrics
    token is set and ``authorization`` is not ``Bearer <token>`` (constant-time compare)."""
    if not http.expose_metrics:
        return 404, "Not Found"
    if http.metrics_token is not None:
        scheme, _, token = (authorization or "").partition(" ")
        want = http.metrics_token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), want):
            return 401, "metrics need the metrics bearer token"
    return None


def route_limits(settings: Settings) -> list[RouteLimit]:
    """Per-route body caps of every scopekb app (routes an app does not serve never match): webhooks
    ``ingester.max_body_bytes``, document uploads ``http.max_document_bytes`` (raw bytes, not scanned as JSON);
    everything else ``http.max_body_bytes``."""
    return [RouteLimit("/webhooks/", settings.ingester.max_body_bytes),
            RouteLimit("/v1/sources/", settings.http.max_document_bytes, json=False, methods=("POST",),
                       suffix="/documents")]


def guarded_metrics(request: Request, render: Callable[[], Response]) -> Response:
    """The ``/metrics`` answer: ``render()`` when exposed to this caller (:func:`metrics_refusal` with the settings
    :func:`harden` stored on the app), else 404 or 401."""
    refusal = metrics_refusal(request.app.state.http_settings, request.headers.get("authorization"))
    if refusal is None:
        return render()
    headers = {"WWW-Authenticate": "Bearer"} if refusal[0] == 401 else None
    return JSONResponse({"detail": refusal[1]}, status_code=refusal[0], headers=headers)


def harden(app: FastAPI, http: HttpSettings, *, title: str, routes: Sequence[RouteLimit] = (),
           gate: Gate | None = None, csp_by_prefix: Mapping[str, str] | None = None) -> None:
    """Apply the HTTP hardening of ``http`` to ``app``: body caps (``http.max_body_bytes`` unless a route says
    otherwise), JSON depth, body deadline and the optional auth ``gate`` (:class:`RequestLimitsMiddleware`),
    security headers on every response (:class:`SecurityHeadersMiddleware`), and the local ``/docs`` page when
    exposed. Call once, after the routes are added (middleware order: headers outermost)."""
    app.state.http_settings = http
    extra_csp: dict[str, str] = dict(csp_by_prefix or {})
    if docs_exposed(http):
        html, docs_csp = _docs_html(title)
        static = StaticFiles(directory=str(files("fastapi_offline") / "static"))
        app.mount(DOCS_STATIC, static, name="docs-static")

        @app.get(DOCS_PATH, include_in_schema=False)
        def docs() -> HTMLResponse:
            """Swagger UI, every asset from this process."""
            return HTMLResponse(html)

        extra_csp[DOCS_PATH] = docs_csp
    limits = RequestLimits(default_max_bytes=http.max_body_bytes, routes=tuple(routes),
                           json_max_depth=http.json_max_depth, body_timeout_s=http.body_timeout_s)
    app.add_middleware(RequestLimitsMiddleware, limits=limits, gate=gate)
    app.add_middleware(SecurityHeadersMiddleware, headers=SecurityHeaders(csp=API_CSP, csp_by_prefix=extra_csp))
