"""Queue and task names and the Celery app configuration shared by producers (ingester, query service, CLI) and
workers (consumer).

Producers enqueue by task *name* (``send_task``) so they never import worker code. Task and queue names live
here; coordination key names live in :mod:`scopekb.coordination.keys` (the onyx layout, DESIGN §12). Which
broker a process uses is decided by :func:`scopekb.runtime.celery_app`.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from typing import Any

from celery import Celery

from scopekb.settings import Settings

TASK_SYNC_SOURCES = "scopekb.sync_sources"
TASK_PING = "scopekb.ping"
TASK_RECONCILE = "scopekb.reconcile"
#: The embedding stage's task (issue 19): vectors for one part of a sync's chunks, on ``worker.embed_queue``.
TASK_EMBED_CHUNKS = "scopekb.embed_chunks"


def embed_task_id(job_id: str, run: str, part: int) -> str:
    """Task id of part ``part`` of sync run ``run``'s embedding stage: ``embed-<job>-<run>-<part>`` (the sink sends
    it, the reconcile looks for it in the broker)."""
    return f"embed-{job_id}-{run}-{part}"


def make_celery(settings: Settings, name: str, broker: str, backend: str) -> Celery:
    """A Celery app on ``broker`` with at-least-once delivery (DESIGN §11).

    ``acks_late`` + ``task_reject_on_worker_lost`` redeliver a task whose worker died; tasks are idempotent by
    deterministic chunk ids. The broker ``visibility_timeout`` is longer than the hard task time limit
    (checked in :class:`scopekb.settings.Settings`).
    """
    w = settings.worker
    app = Celery(name, broker=broker, backend=backend)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=w.queue,
        task_routes={TASK_SYNC_SOURCES: {"queue": w.queue}, TASK_PING: {"queue": w.queue},
                     TASK_RECONCILE: {"queue": w.queue}, TASK_EMBED_CHUNKS: {"queue": w.embed_queue or w.queue}},
        beat_schedule={"reconcile": {"task": TASK_RECONCILE, "schedule": float(w.reconcile_interval_s)}}
        if w.reconcile_interval_s > 0 else {},
        task_soft_time_limit=w.task_soft_time_limit_s,
        task_time_limit=w.task_time_limit_s,
        broker_transport_options={"visibility_timeout": w.visibility_timeout_s},
        result_backend_transport_options={"visibility_timeout": w.visibility_timeout_s},
        result_expires=w.result_expires_s,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_max_tasks_per_child=200,
    )
    return app


#: Strings :func:`plain_kwargs_repr` answers for: printable ASCII without quotes and backslashes (where Python's
#: ``repr`` and Celery's ``saferepr`` write the same text).
_PLAIN_STR = re.compile(r"[ !#-&(-\[\]-~]*")


def _plain(v: Any) -> bool:
    return _PLAIN_STR.fullmatch(v) is not None if type(v) is str else (v is None or type(v) in (bool, int))


def plain_kwargs_repr(kwargs: dict[str, Any], limit: int) -> str | None:
    """``repr(kwargs)`` when it is exactly what Celery's ``saferepr(kwargs, limit, maxlevels=3)`` writes into a
    task message's ``kwargsrepr`` header, else None (then Celery computes it). That holds for a flat dict of
    plain strings (printable ASCII, no quote or backslash), ints, bools and None, with lists of plain strings, no
    longer than ``limit`` characters - the sync tasks' arguments (ids, commit hashes, triggers). ``saferepr`` walks
    the arguments in Python (~0.05 ms a webhook; issue 20); ``repr`` is one C call. Equality:
    ``tests/unit/test_task_reprs.py``."""
    for k, v in kwargs.items():
        if type(k) is not str or not _plain(k):
            return None
        if not (_plain(v) or (type(v) is list and all(type(x) is str and _plain(x) for x in v))):
            return None
    text = repr(kwargs)
    return text if len(text) <= limit else None


# ---- what the Redis broker holds -------------------------------------------------------------------------------

#: kombu's Redis transport keeps a queue's messages in lists ``<queue>`` and ``<queue>\x06\x16<step>`` for the
#: priority steps 3, 6 and 9 (``kombu.transport.redis.PRIORITY_STEPS``, ``Channel.sep``), and every delivered,
#: unacknowledged message (running, reserved, or waiting for its ETA in a worker) in the hash ``unacked``.
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"
UNACKED_KEY = "unacked"


def queue_names(app: Celery) -> set[str]:
    """Every queue the app's tasks are routed to (``task_default_queue`` and the queues of ``task_routes``)."""
    routes = app.conf.task_routes or {}
    names = {str(app.conf.task_default_queue)}
    if isinstance(routes, dict):
        names |= {str(r["queue"]) for r in routes.values() if isinstance(r, dict) and r.get("queue")}
    return names


def _task_id(raw: bytes | str) -> str | None:
    """The task id (``headers.id``, Celery's message protocol 2) of a stored kombu message, or None."""
    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError, IndexError):
        msg = json.loads(raw)
        msg = msg[0] if isinstance(msg, list) else msg  # unacked entries are [message, exchange, routing key]
        return str(msg["headers"]["id"])
    return None


def task_ids_in_redis(client: Any, queues: Iterable[str], wanted: Iterable[str], unacked_key: str = UNACKED_KEY,
                      page: int = 1000) -> set[str]:
    """Which of the task ids ``wanted`` have a message in a Redis broker: waiting in one of ``queues`` (every
    priority list) or delivered to a worker and not acknowledged yet (``unacked_key``). Reads lists in pages of
    ``page`` and stops once every wanted id is found. Redis errors propagate.

    The lists are read before the hash, so a message a worker takes meanwhile (list -> hash) is still seen;
    one moving the other way (a dead worker's message restored) can be missed: callers look twice.
    """
    want = set(wanted)
    found: set[str] = set()
    for q in sorted(queues):
        for step in PRIORITY_STEPS:
            name = f"{q}{PRIORITY_SEP}{step}" if step else q
            start = 0
            while want - found:
                items = client.lrange(name, start, start + page - 1)
                if not items:
                    break
                found |= {t for t in map(_task_id, items) if t in want}
                start += page
    if want - found:
        found |= {t for _, raw in client.hscan_iter(unacked_key, count=page) if (t := _task_id(raw)) in want}
    return found
