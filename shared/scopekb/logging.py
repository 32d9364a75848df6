"""structlog configuration shared by every process.

Event names are fixed snake_case strings with key/value pairs (``log.info("sync_started", source_id=...)``),
never f-strings. Services log JSON lines; terminals get a readable console renderer. Context such as the webhook
``delivery_id`` is bound with :func:`bind_context` (structlog contextvars) so every line of one push carries it,
in the ingester and in the worker that runs the task.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_configured: str | None = None


#: Events not written in this process (:func:`drop_events`).
_DROPPED: frozenset[str] = frozenset()


def drop_events(names: frozenset[str]) -> None:
    """Write no log line for these event names in this process: the CLI reports a failed in-process sync in one
    line of its own, so the sync's ``sync_failed`` line would say it twice (hostile review)."""
    global _DROPPED
    _DROPPED = frozenset(names)


def _drop(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    if event.get("event") in _DROPPED:
        raise structlog.DropEvent
    return event


def configure_logging(fmt: str = "auto", level: str = "INFO") -> None:
    """Configure structlog and the stdlib root logger once per process.

    Args:
        fmt: ``json`` (one JSON object a line), ``console`` (coloured, human) or ``auto`` (console on a TTY).
        level: a stdlib level name such as ``INFO``.
    """
    global _configured
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    if _configured == fmt:
        return
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    shared: list[Any] = [
        _drop,
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=lvl, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    # Third-party clients are chatty at INFO (every HTTP request); keep them at WARNING.
    for name in ("opensearch", "urllib3", "httpx", "git"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # opensearch-py logs every answer of status 4xx at WARNING, the expected ones included ("index exists" when
    # the system indices are ensured, 404 for a record not there yet), which read as failures on every start
    # (README newcomer run); a failed request still reaches scopekb's own handling and its log lines.
    logging.getLogger("opensearch").setLevel(logging.ERROR)
    _configured = fmt


def get_logger(name: str | None = None) -> Any:
    """Return a lazy structlog logger; ``name`` is added as ``module`` when given."""
    # Initial values keep the proxy lazy: binding here would freeze the configuration in force at import time.
    return structlog.get_logger(module=name) if name else structlog.get_logger()


def bind_context(**values: Any) -> None:
    """Bind key/values (e.g. ``delivery_id``) to every later log line of this thread or task."""
    structlog.contextvars.bind_contextvars(**values)


def clear_context() -> None:
    """Drop all bound context (call at the end of a task or request)."""
    structlog.contextvars.clear_contextvars()
