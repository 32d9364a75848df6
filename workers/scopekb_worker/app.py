"""The Celery app and its thin tasks. Start with ``scopekb worker`` (or ``celery -A scopekb_worker.app worker``).

Tasks are at-least-once (``acks_late``, ``task_reject_on_worker_lost``) and idempotent. A per-repository Redis
lock serialises syncs of one repository; a later push finds the work done or does the remainder, so a newer
push supersedes an older one and a lost delivery heals at the next push.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache
from typing import Any

from celery import Task
from celery.signals import task_postrun, task_prerun, worker_process_init
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import TransportError
from redis.exceptions import RedisError

from scopekb import queue
from scopekb.gitrepo import GitError
from scopekb.indexing import SyncError, run_sync
from scopekb.logging import bind_context, clear_context, configure_logging, get_logger
from scopekb.models import DeadLetter, JobState
from scopekb.reindex import REINDEX_LOCK_KEY
from scopekb.runtime import Runtime, build_runtime, redis_client
from scopekb.settings import get_settings

log = get_logger("scopekb.worker")

app = queue.make_celery(get_settings(), name="scopekb-worker")


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    """Clients of this worker process, built on first use (after fork)."""
    rt = build_runtime(get_settings())
    rt.chunks.ensure_index()
    return rt


@worker_process_init.connect
def _init_logging(**_: Any) -> None:
    s = get_settings()
    configure_logging("json" if s.log_format == "auto" else s.log_format, s.log_level)


@task_prerun.connect
def _bind(task_id: str | None = None, task: Task | None = None, kwargs: dict[str, Any] | None = None,
          **_: Any) -> None:
    clear_context()
    kw = kwargs or {}
    bind_context(task_id=task_id, task=task.name if task else None,
                 delivery_id=kw.get("delivery_id"), job_id=kw.get("job_id"))


@task_postrun.connect
def _unbind(**_: Any) -> None:
    clear_context()


@app.task(name=queue.TASK_PING)
def ping(value: str = "ping") -> dict[str, Any]:
    """Round-trip check: returns the value and the worker's pid."""
    return {"value": value, "pid": os.getpid()}


@app.task(name=queue.TASK_SYNC_SOURCES, bind=True, max_retries=get_settings().worker.max_retries)
def sync_sources(self: Task, job_id: str, source_ids: list[str], after: str | None = None,
                 branch_deleted: bool = False, delivery_id: str | None = None,
                 trigger: str = "webhook") -> dict[str, Any]:
    """Sync sources of one repository and ref to the ref's current commit; returns the job record as JSON.

    Transient failures (git fetch, OpenSearch or Redis unreachable) are retried with exponential backoff up
    to ``worker.max_retries`` times; a :class:`SyncError` is permanent and not retried.
    """
    s = get_settings()
    rt = runtime()
    rds = redis_client(s)
    if rds.exists(REINDEX_LOCK_KEY):  # the index is being rebuilt: wait, without spending a retry attempt
        log.info("sync_deferred_for_reindex")
        raise self.retry(countdown=30, max_retries=None)
    log.info("sync_started", source_ids=source_ids, after=after, branch_deleted=branch_deleted)
    lock_name = queue.LOCK_KEY.format(repo_hash=queue.repo_hash(",".join(sorted(source_ids))))
    try:
        with rds.lock(lock_name, timeout=s.worker.task_time_limit_s, blocking_timeout=s.worker.task_time_limit_s):
            job = run_sync(rt.sync_deps(), job_id, source_ids, trigger=trigger, branch_deleted=branch_deleted)
    except SyncError as e:
        log.error("sync_refused", error=str(e))
        return {"id": job_id, "state": "failed", "errors": [str(e)]}
    except (GitError, OSConnectionError, TransportError, RedisError, OSError) as e:
        if self.request.retries >= s.worker.max_retries:
            _dead_letter(rt, self, job_id, e)
            return {"id": job_id, "state": "failed", "errors": [str(e)], "dead_letter": True}
        delay = min(300, 5 * 2**self.request.retries)
        log.warning("sync_retry", error=str(e), retries=self.request.retries, countdown=delay)
        raise self.retry(exc=e, countdown=delay) from e
    return job.model_dump(mode="json")


def _dead_letter(rt: Runtime, task: Task, job_id: str, exc: Exception) -> None:
    """Park a task that failed ``max_retries`` times: its name, arguments and error, replayable later."""
    rec = DeadLetter(id=task.request.id or job_id, task=task.name, kwargs=dict(task.request.kwargs or {}),
                     error=f"{type(exc).__name__}: {exc}", attempts=task.request.retries + 1)
    try:
        rt.records.put("deadletters", rec.id, rec.model_dump(mode="json"))
        job = rt.records.get_job(job_id)
        if job is not None:
            job.state = JobState.failed
            job.errors.append(f"dead letter after {rec.attempts} attempts: {rec.error}")
            rt.records.put_job(job)
    except Exception as e:  # noqa: BLE001 - the store may be what is down; the log keeps the record
        log.error("dead_letter_not_stored", error=str(e), task_kwargs=rec.kwargs)
    log.error("task_dead_lettered", attempts=rec.attempts, error=rec.error)


@app.task(name=queue.TASK_RECONCILE)
def reconcile() -> dict[str, Any]:
    """Enqueue a sync for every (repository, ref) with registered sources.

    A sync of an up-to-date source is a fetch and nothing else, so this heals refs that moved without a
    webhook (lost deliveries, hosts without webhooks) at the cost of one fetch per repository per period.
    """
    rt = runtime()
    groups: dict[tuple[str, str], list[str]] = {}
    for src in rt.records.list_sources():
        groups.setdefault((src.repo_url, src.ref), []).append(src.id)
    stamp = int(time.time())
    for (url, ref), ids in groups.items():
        job_id = f"reconcile-{queue.repo_hash(url + ref)}-{stamp}"
        app.send_task(queue.TASK_SYNC_SOURCES, task_id=job_id,
                      kwargs={"job_id": job_id, "source_ids": sorted(ids), "trigger": "reconcile"})
    log.info("reconcile_enqueued", groups=len(groups))
    return {"groups": len(groups)}
