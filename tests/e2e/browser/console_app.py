"""The query app with the console mounted, for the browser tests (uvicorn factory ``create_app``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from scopekb.runtime import build_runtime
from scopekb.settings import Settings, get_settings
from scopekb_query.app import create_app as query_app
from scopekb_query.console import mount_console


def _celery(settings: Settings) -> Any:
    from scopekb import queue

    return queue.make_celery(settings, name="scopekb-console")


def create_app() -> FastAPI:
    settings = get_settings()
    app = query_app(settings)
    mount_console(app, build_runtime(settings, interactive=True), settings, _celery(settings))
    return app
