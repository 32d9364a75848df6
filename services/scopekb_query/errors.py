"""How the query service answers errors: scopekb's error family (:mod:`scopekb.errors`) and the search backend's.

``Refused`` -> its 4xx status and message; ``Transient`` -> 503; an OpenSearch refusal of a search's own query
(too many clauses) -> 400 naming the reason; any other backend failure -> 503. Never a stack trace or a 500
for a dependency that is down.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import TransportError

from scopekb.errors import Refused, Transient
from scopekb.logging import get_logger

log = get_logger("scopekb.query")

#: OpenSearch root causes that mean "the query is too large", the caller's to fix.
QUERY_TOO_LARGE = ("too_many_clauses", "too_many_nested_clauses")


def backend_reason(exc: TransportError) -> str:
    """The root cause type OpenSearch gave for a refused request (``query_shard_exception``), or its error."""
    info = exc.info if isinstance(exc.info, dict) else {}
    causes = (info.get("error") or {}).get("root_cause") if isinstance(info.get("error"), dict) else None
    return str(causes[0].get("type")) if causes else str(exc.error)


def refused_query(exc: TransportError) -> str | None:
    """The caller-facing message when OpenSearch refused a search's own query (400 or too many clauses), else
    None (the backend failed: 503)."""
    reason = backend_reason(exc)
    if exc.status_code == 400 or reason in QUERY_TOO_LARGE:
        return (f"the search backend refused the query ({reason}); use fewer query terms, file patterns or "
                "languages")
    return None


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers described in the module docstring on ``app``."""

    @app.exception_handler(Refused)
    async def _refused(_: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(Transient)
    async def _transient(_: Request, exc: Transient) -> JSONResponse:
        log.error("dependency_unavailable", error=str(exc))
        return JSONResponse({"detail": "a backing service is unavailable, retry later"}, status_code=503)

    @app.exception_handler(OSConnectionError)
    async def _os_down(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": "search backend unavailable"}, status_code=503)

    @app.exception_handler(TransportError)
    async def _os_error(request: Request, exc: TransportError) -> JSONResponse:
        message = refused_query(exc)
        if message is not None and request.url.path == "/v1/search":
            log.warning("opensearch_refused_query", status=exc.status_code, reason=backend_reason(exc))
            return JSONResponse({"detail": message}, status_code=400)
        log.error("opensearch_error", status=exc.status_code, error=str(exc.error), reason=backend_reason(exc))
        return JSONResponse({"detail": "search backend error"}, status_code=503)
