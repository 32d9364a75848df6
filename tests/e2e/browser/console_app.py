"""The query app with the console mounted, for the browser tests (uvicorn factory ``create_app``)."""

from __future__ import annotations

from fastapi import FastAPI

from scopekb.settings import get_settings
from scopekb_query.app import create_app as query_app
from scopekb_query.console import mount_console


def create_app() -> FastAPI:
    settings = get_settings()
    app = query_app(settings)
    rt = app.state.runtime  # the query app's runtime: one key cache, one Celery producer
    mount_console(app, rt, settings, rt.tasks.app)
    return app
