"""Queue names, task names and the Celery app factory shared by the ingester (producer) and workers (consumer).

The ingester enqueues by task *name* (``send_task``) so it never imports worker code. Task names, queue names and
Redis key prefixes live here, in one place (the onyx layout, DESIGN §12).
"""

from __future__ import annotations

import hashlib

import redis
from celery import Celery

from scopekb.settings import Settings, is_embedded

TASK_SYNC_SOURCES = "scopekb.sync_sources"
TASK_PING = "scopekb.ping"
TASK_RECONCILE = "scopekb.reconcile"

DEDUPE_KEY = "scopekb:delivery:{provider}:{delivery_id}"
LOCK_KEY = "scopekb:lock:repo:{repo_hash}"
#: Bumped on every source registration change so ingesters reload their in-memory source cache at once.
SOURCES_VERSION_KEY = "scopekb:sources:version"


def make_celery(settings: Settings, name: str = "scopekb") -> Celery:
    """A Celery app on the Redis broker with at-least-once delivery (DESIGN §11).

    ``acks_late`` + ``task_reject_on_worker_lost`` redeliver a task whose worker died; tasks are idempotent by
    deterministic chunk ids. The broker ``visibility_timeout`` is longer than the hard task time limit
    (checked in :class:`scopekb.settings.Settings`).
    """
    w = settings.worker
    if is_embedded(settings):  # one process: an in-memory broker shared by the ingester and the worker thread
        app = Celery(name, broker="memory://", backend="cache+memory://")
    else:
        app = Celery(name, broker=settings.redis.url, backend=settings.redis.url)
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


def repo_hash(repo_url: str) -> str:
    """Short stable hash of a repository URL, for lock and cache keys."""
    return hashlib.sha256(repo_url.encode()).hexdigest()[:16]


def claim_delivery(client: redis.Redis, provider: str, delivery_id: str, ttl_s: int) -> bool:
    """Atomically claim a webhook delivery id (``SET NX EX``). True the first time, False for a repeat."""
    key = DEDUPE_KEY.format(provider=provider, delivery_id=delivery_id)
    return bool(client.set(key, "1", nx=True, ex=ttl_s))


def release_delivery(client: redis.Redis, provider: str, delivery_id: str) -> None:
    """Forget a claimed delivery id (used when enqueueing failed, so the host's retry is not dropped)."""
    client.delete(DEDUPE_KEY.format(provider=provider, delivery_id=delivery_id))


def bump_sources_version(client: redis.Redis) -> None:
    """Tell every ingester that the registered sources changed (best effort: their TTL reload also heals)."""
    try:
        client.incr(SOURCES_VERSION_KEY)
    except redis.RedisError:
        pass


def sources_version(client: redis.Redis) -> int:
    """The current sources version (0 when never bumped)."""
    return int(client.get(SOURCES_VERSION_KEY) or 0)
