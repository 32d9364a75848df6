"""How the query service answers errors: scopekb's error family (:mod:`scopekb.errors`), nothing library-specific.

Adapters translate their libraries' errors (opensearch-py, redis, S3, git, the embedding API) into
:class:`~scopekb.errors.Refused` - answered with its 4xx status and one-line message (e.g. a search OpenSearch
refuses as too large: 400 naming what to reduce) - or :class:`~scopekb.errors.Transient` - answered 503 with its
message (``search backend unavailable``). Never a stack trace or a 500 for a dependency that is down.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from scopekb.errors import Refused, Transient
from scopekb.http.unicode import SafeJSONResponse
from scopekb.logging import get_logger

log = get_logger("scopekb.query")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers described in the module docstring on ``app``."""

    @app.exception_handler(Refused)
    async def _refused(_: Request, exc: Refused) -> JSONResponse:
        return SafeJSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(Transient)
    async def _transient(request: Request, exc: Transient) -> JSONResponse:
        log.error("dependency_unavailable", path=request.url.path, error=str(exc),
                  cause=type(exc.__cause__).__name__ if exc.__cause__ else None)
        return SafeJSONResponse({"detail": str(exc)}, status_code=503)
