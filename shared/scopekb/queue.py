"""Queue and task names and the Celery app configuration shared by producers (ingester, query service, CLI) and
workers (consumer).

Producers enqueue by task *name* (``send_task``) so they never import worker code. Task and queue names live
here; coordination key names live in :mod:`scopekb.coordination.keys` (the onyx layout, DESIGN §12). Which
broker a process uses is decided by :func:`scopekb.runtime.celery_app`.
"""

from __future__ import annotations

from celery import Celery

from scopekb.settings import Settings

TASK_SYNC_SOURCES = "scopekb.sync_sources"
TASK_PING = "scopekb.ping"
TASK_RECONCILE = "scopekb.reconcile"


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
                     TASK_RECONCILE: {"queue": w.queue}},
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
