"""The operators' web console (issue 25), served by the query service under ``/console``.

Server-rendered HTML (Jinja2 templates, autoescaped), one local stylesheet and one small script for live job
progress; nothing is loaded from elsewhere (strict Content-Security-Policy). Sign in with the admin token, or
with an agent key for a read-only view of that agent's scope. See :mod:`.routes` for the pages and
:mod:`.session` for cookies and CSRF.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from scopekb.runtime import Runtime

from .actions import ActionRefused, ConsoleActions, OpsActions
from .routes import Console, SignInRequired

__all__ = ["Console", "mount_console"]


def mount_console(app: FastAPI, rt: Runtime, actions: ConsoleActions | None = None) -> Console:
    """Add the console's routes under ``/console`` to ``app`` and its error pages.

    ``actions`` defaults to :class:`OpsActions` over ``rt`` (:mod:`scopekb.ops`, what the ``/v1`` routes call).
    """
    console = Console(rt, actions or OpsActions(rt))
    app.include_router(console.router(), prefix="/console")

    async def _error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ActionRefused)
        try:
            viewer = console.viewer(request)
        except SignInRequired:
            viewer = None
        return console.page(request, viewer, "error.html", status=exc.status, message=exc.message,
                            code=exc.status)

    async def _sign_in(request: Request, exc: Exception) -> Response:
        return RedirectResponse("/console/login", status_code=303)

    app.add_exception_handler(ActionRefused, _error)
    app.add_exception_handler(SignInRequired, _sign_in)
    return console
