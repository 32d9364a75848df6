"""The Celery app and its thin tasks. Start with ``scopekb worker`` (or ``celery -A scopekb_worker.app worker``).

Tasks are at-least-once (``acks_late``, ``task_reject_on_worker_lost``) and idempotent. A per-repository lock
(:meth:`scopekb.coordination.Coordination.repo_lock`) serialises syncs of one repository; a later push finds the
work done or does the remainder, so a newer push supersedes an older one and a lost delivery heals at the next push.

Faults (DESIGN §11, issue 12): the repository lock has a short expiry that a thread renews while the sync runs, so a
worker that dies frees it within ``LOCK_TTL_S``; transient failures (git, OpenSearch, Redis, the embedding API) are
retried with jittered exponential backoff a bounded number of times, then parked as a dead letter (the sync state
did not move, so the next reconcile re-syncs); a file whose chunking kills the worker process is counted per attempt
in the coordination backend (Redis) and parked on its own after ``FILE_ATTEMPTS_LIMIT`` attempts while the rest of
the sync completes. The worker checks its settings and the broker's eviction policy at start.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NoReturn

import redis
import structlog
from celery import Task
from celery.exceptions import Reject, Retry, SoftTimeLimitExceeded
from celery.signals import (
    task_postrun,
    task_prerun,
    task_received,
    worker_init,
    worker_process_init,
    worker_ready,
)

from scopekb import ops, queue
from scopekb.coordination import Coordination, keys
from scopekb.embedding.limits import backoff_delay
from scopekb.errors import Refused, Transient
from scopekb.indexing import embed_part, run_sync
from scopekb.logging import bind_context, clear_context, configure_logging, get_logger
from scopekb.models import DeadLetter, Job, JobState, utcnow
from scopekb.runtime import Runtime, build_runtime, celery_app, coordination
from scopekb.settings import Settings, get_settings
from scopekb.stores.base import RecordStore, answered_problem, slow_problem
from scopekb_worker.heartbeat import Heartbeat, HeldTags
from scopekb_worker.heartbeat import index_key as heartbeat_index_key

log = get_logger("scopekb.worker")

app = celery_app(get_settings(), name="scopekb-worker")

#: Seconds a repository lock outlives a worker that died holding it; renewed every third of it while a sync runs.
LOCK_TTL_S = 60
#: Attempts at chunking one file (each ended by the worker process dying) before the file is parked.
FILE_ATTEMPTS_LIMIT = 3
FILE_ATTEMPTS_TTL_S = 7 * 24 * 3600
#: Task-level retry backoff after a transient error: ``[d/2, d]`` with ``d = min(max, base * 2**retries)``.
RETRY_BASE_S = 5.0
RETRY_MAX_S = 300.0
#: Seconds between checks while the search cluster cannot serve (red, no cluster manager) before a sync starts.
CLUSTER_WAIT_S = 15
#: Waits per task for a cluster that took the health question's connection but did not answer within its 2 s
#: (:func:`scopekb.stores.base.slow_problem`: heavy load, a long GC pause) after a step failed. Past it such failures
#: spend attempts again, so a cluster that never answers in time ends in a dead letter after bounded attempts
#: instead of waiting forever (20 waits of ``CLUSTER_WAIT_S``: about 5 minutes, chosen, not measured).
SLOW_WAITS_LIMIT = 20
#: Errors that say a dependency is (for now) unavailable: the sync is retried later, never spun on. Adapters
#: translate their libraries' errors into :class:`scopekb.errors.Transient` (git, OpenSearch, Redis, S3 and the
#: embedding API among them); ``OSError`` covers the local disk.
TRANSIENT_ERRORS = (Transient, OSError)
#: Eviction policies that never drop keys without a TTL (broker queues and unacked tasks have none).
SAFE_EVICTION = ("noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    """Clients of this worker process, built on first use (after fork). Sends no request: a cluster that cannot
    serve never fails the build (the chunk index is checked by :func:`ensure_chunk_index`, inside a task's
    error handling)."""
    s = get_settings()
    # With an embedding queue (issue 19) the model is loaded by the first embedding task only: a worker of the
    # sync queue alone never imports torch.
    return build_runtime(s, name="scopekb-worker", lazy_embedder=bool(s.worker.embed_queue))


#: The runtime whose chunk index :func:`ensure_chunk_index` last checked successfully (one check per process).
_index_checked: list[Any] = []  # [runtime, the live index name it checked]


def ensure_chunk_index(rt: Runtime) -> None:
    """Create, check and migrate the chunk index (:meth:`scopekb.stores.base.ChunkStore.ensure_index`) once per
    runtime and live index: the first sync of a worker process does it, every sync after one where it failed, and
    the first sync after the alias moved to another index (each sync asks for the live index's name).

    Raises:
        Transient: the cluster cannot answer (unreachable, no elected cluster manager, a shard without a copy).
        StoreVersionMismatch: the live index has another mapping version or dimension (``scopekb reindex``).
    """
    if _index_checked and _index_checked[0] is rt and rt.chunks.live_index() == _index_checked[1]:
        return  # still the index this process checked: one alias request a sync
    # first sync, or the alias moved (a `scopekb reindex` swapped it to another model or dimension; hostile review:
    # a worker without a provider kept writing chunks without vectors into the new vector index, and one of another
    # model of the same dimension would have mixed two vector spaces): checked again, a mismatch refuses the sync
    _index_checked[:] = [rt, rt.chunks.ensure_index()]


@worker_process_init.connect
def _init_logging(**_: Any) -> None:
    s = get_settings()
    configure_logging("json" if s.log_format == "auto" else s.log_format, s.log_level)
    # ``scopekb worker`` configured WARNING for the CLI's own output before Celery started (and configure_logging
    # keeps the first level): the worker's events log at the configured level.
    level = logging.getLevelName(s.log_level.upper())
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level if isinstance(level, int)
                                                                            else logging.INFO))


def effective_limits(s: Settings, conf: Any) -> dict[str, Any]:
    """The limits this worker runs with (Celery's configuration as built by :func:`scopekb.queue.make_celery`)."""
    transport = conf.broker_transport_options or {}
    return {"queue": s.worker.queue, "embed_queue": s.worker.embed_queue,
            "soft_time_limit_s": conf.task_soft_time_limit, "time_limit_s": conf.task_time_limit,
            "visibility_timeout_s": transport.get("visibility_timeout"),
            "result_expires_s": conf.result_expires, "max_tasks_per_child": conf.worker_max_tasks_per_child,
            "prefetch_multiplier": conf.worker_prefetch_multiplier, "acks_late": conf.task_acks_late,
            "reject_on_worker_lost": conf.task_reject_on_worker_lost, "max_retries": s.worker.max_retries,
            "retry_backoff_s": [RETRY_BASE_S, RETRY_MAX_S], "lock_ttl_s": LOCK_TTL_S,
            "file_attempts_limit": FILE_ATTEMPTS_LIMIT, "reconcile_interval_s": s.worker.reconcile_interval_s,
            "heartbeat_s": s.worker.heartbeat_s if str(conf.broker_url or "").startswith("redis") else 0,
            "broker": str(conf.broker_url or "").partition("://")[0] or "?"}


def startup_problems(limits: dict[str, Any], coord: Coordination) -> list[str]:
    """What is unsafe in the worker's limits or the broker, each as one sentence naming the fix.

    The visibility timeout and the eviction policy are Redis's: a broker of another kind (the embedded profile's
    in-process ``memory`` broker, whose messages live and die with the process) is not asked about them, so
    ``scopekb up`` does not warn about a redelivery that cannot happen (README newcomer run)."""
    out: list[str] = []
    soft, hard, vis = limits["soft_time_limit_s"], limits["time_limit_s"], limits["visibility_timeout_s"]
    redis_broker = limits.get("broker", "redis") in ("redis", "rediss", "unix")
    if not soft or not hard:
        out.append("task soft/hard time limits are not set: a stuck sync would hold its worker forever")
    elif not redis_broker:
        pass
    elif not vis:
        out.append("broker visibility_timeout is not set")
    elif limits["heartbeat_s"] and vis < 3 * limits["heartbeat_s"]:
        out.append(f"broker visibility_timeout ({vis}) must be at least 3 x the heartbeat "
                   f"({limits['heartbeat_s']}s), or Redis redelivers running tasks between two heartbeats")
    elif not limits["heartbeat_s"] and vis <= hard:
        out.append(f"broker visibility_timeout ({vis}) must exceed the hard time limit ({hard}s) without a "
                   "heartbeat, or Redis redelivers running tasks")
    if not limits["result_expires_s"]:
        out.append("result_expires is not set: task results accumulate in Redis")
    if not limits["max_tasks_per_child"]:
        out.append("worker_max_tasks_per_child is not set: a leak in a pool process is never reclaimed")
    if not redis_broker:
        return out
    try:
        policy, maxmemory = coord.eviction_policy()
    except Transient as e:
        out.append(f"cannot read the broker's maxmemory-policy ({e}); make sure it is "
                   "noeviction (or volatile-*): other policies can evict queued and unacknowledged tasks")
        return out
    if policy not in SAFE_EVICTION:
        out.append(f"Redis maxmemory-policy is {policy!r} (maxmemory {maxmemory or 'unlimited'}): under memory "
                   "pressure it can evict queued and unacknowledged tasks, which are then lost; set "
                   "'maxmemory-policy noeviction' (or a volatile-* policy) on the broker")
    return out


@worker_init.connect
def _startup_checks(sender: Any = None, **_: Any) -> None:
    """Log the effective limits once, and warn about settings or a broker that can lose tasks."""
    s = get_settings()
    _init_logging()
    limits = effective_limits(s, app.conf)
    log.info("worker_limits", **limits)
    for problem in startup_problems(limits, coordination(s)):
        log.warning("worker_startup_check", problem=problem)


HELD = HeldTags()


@task_received.connect
def _held(request: Any = None, **_: Any) -> None:
    """Remember the delivery tag of every message this worker receives (ETA retries included)."""
    HELD.add(getattr(getattr(request, "message", None), "delivery_tag", None))


@worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    """Start re-stamping the held messages (Redis broker only), so a live worker's tasks are never redelivered
    while a dead worker's come back after ``worker.visibility_timeout_s`` (:mod:`scopekb_worker.heartbeat`)."""
    s = get_settings()
    broker = str(app.conf.broker_url or "")
    if not s.worker.heartbeat_s or not broker.startswith("redis"):
        return
    beat = Heartbeat(redis.Redis.from_url(broker, socket_timeout=10), s.worker.heartbeat_s, HELD,
                     heartbeat_index_key(app))
    beat.start()
    log.info("heartbeat_started", interval_s=s.worker.heartbeat_s,
             visibility_timeout_s=(app.conf.broker_transport_options or {}).get("visibility_timeout"))


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


#: No Celery retry limit: Celery counts every re-enqueue (waits for the cluster or a reindex too) and would end a
#: sync waiting out a long red state; the task itself bounds its attempts (``worker.max_retries``, waits excluded).
@app.task(name=queue.TASK_SYNC_SOURCES, bind=True, max_retries=None)
def sync_sources(self: Task, job_id: str, source_ids: list[str], after: str | None = None,
                 branch_deleted: bool = False, delivery_id: str | None = None,
                 trigger: str = "webhook", verify: bool = False,
                 reset_attempts: list[str] | None = None, deferrals: int = 0,
                 slow_waits: int = 0) -> dict[str, Any]:
    """Sync sources of one repository and ref to the ref's current commit; returns the job record as JSON.

    Transient failures (git fetch, OpenSearch, Redis or the embedding API unavailable) are retried with jittered
    exponential backoff up to ``worker.max_retries`` times, then parked as a dead letter; a :class:`SyncError`
    is permanent and not retried. While a reindex runs, or the search cluster reports that it cannot serve (red,
    no elected cluster manager) - before the sync starts or when any step fails, from the first request of the
    task (the chunk index check, the job record, the repository lock) to the last write - the task waits instead
    (:func:`_defer`): ``deferrals`` counts those waits, which spend no attempt, however long the cluster is red.
    After a failed step a health question that a node took but nobody answered in time (heavy load) is a wait too,
    ``slow_waits`` of them at most (``SLOW_WAITS_LIMIT``); one every node refused (an outage) is not: those
    failures are retried with bounded attempts.
    Any other failure settles the job record (``failed`` with the reason, :func:`_settle_failed`) before the
    task ends: a job is never left ``running`` by a task that is over (issue 24).
    ``verify`` (the reconcile) also repairs drift between the index and git's tree; ``reset_attempts`` (a
    parked file's replay) forgets those files' crash counts first.
    """
    s = get_settings()
    attempt = self.request.retries - deferrals  # attempts that failed transiently; waits are not attempts
    rt = runtime()  # no request sent: what fails to build (settings) leaves the job to the reconcile to settle
    attempts: FileAttemptsRecorder | None = None
    try:
        if rt.coord.reindex_running():  # the index is being rebuilt: wait, without spending a retry attempt
            _defer(self, deferrals, 30, "sync_deferred_for_reindex")
        # First the index (a failure here is a transient error, handled below like any step's: a wait while the
        # cluster says it cannot serve): asked about a missing index, _cluster/health waits for it to appear and
        # the 2 s question times out ("unreachable"), which must not be taken for a reason to wait.
        ensure_chunk_index(rt)
        problem = answered_problem(rt.chunks.problem())
        if problem is not None:  # the cluster cannot take writes now (red, no cluster manager): wait for it, without
            # spending a retry attempt, rather than block in bulk requests it cannot serve (issue 24). An outage
            # (no node answers) is not waited for here: its failures are retried with bounded attempts.
            _defer(self, deferrals, CLUSTER_WAIT_S, "sync_deferred_for_cluster", problem=problem)
        log.info("sync_started", source_ids=source_ids, after=after, branch_deleted=branch_deleted, verify=verify,
                 retries=attempt, deferrals=deferrals)
        attempts = FileAttemptsRecorder(rt.coord, rt.records, self.name)
        if reset_attempts:
            rt.coord.forget_attempts(reset_attempts)
        with rt.coord.repo_lock(source_ids, wait_s=s.worker.task_time_limit_s, ttl_s=LOCK_TTL_S):
            _carry_marker(rt, job_id)
            if deferrals and not (self.request.delivery_info or {}).get("redelivered"):
                _resume_after_wait(rt, job_id)
            deps = rt.sync_deps()
            deps.attempts = attempts
            job = run_sync(deps, job_id, source_ids, trigger=trigger, branch_deleted=branch_deleted, verify=verify,
                           attempt=attempt, retried=lambda e: isinstance(e, TRANSIENT_ERRORS)
                           and attempt < s.worker.max_retries)  # retried or waited for below: not over
    except (Retry, Reject):  # a wait or a retry enqueued (or not, Reject): the job is not over
        raise
    except Refused as e:  # SyncError, or a request a store refused: permanent, not retried
        log.error("sync_refused", error=str(e))
        _settle_failed(rt, job_id, source_ids, trigger, e)
        return {"id": job_id, "state": "failed", "errors": [str(e)]}
    except TRANSIENT_ERRORS as e:
        problem, asked = _cluster_problem(rt, slow_waits)
        if problem is not None:  # the step failed because the cluster cannot serve: wait for it, like a start
            _defer(self, deferrals, CLUSTER_WAIT_S, "sync_deferred_for_cluster", slow=slow_problem(asked),
                   problem=problem, error=str(e)[:300])
        if attempt >= s.worker.max_retries:
            _dead_letter(rt, self, job_id, e)
            return {"id": job_id, "state": "failed", "errors": [str(e)], "dead_letter": True}
        delay = backoff_delay(attempt, RETRY_BASE_S, RETRY_MAX_S)
        log.warning("sync_retry", error=str(e)[:500], retries=attempt, countdown=round(delay, 1), cluster=asked,
                    slow_waits=slow_waits)
        try:
            raise self.retry(exc=e, countdown=delay) from e
        except Retry:  # published: the job is waiting, not failed
            _mark_retrying(rt, job_id, attempt + 1, delay, e)
            raise
        except Reject:  # the broker is down too: the job fails, the next reconcile re-syncs the source
            log.error("sync_retry_not_enqueued", error=str(e)[:300])
            _settle_failed(rt, job_id, source_ids, trigger, e)
            raise
    except Exception as e:  # anything else ends the task (a bug, the soft time limit): settle the job first
        if isinstance(e, SoftTimeLimitExceeded):  # out of time because the cluster could not serve: wait for it
            problem, asked = _cluster_problem(rt, slow_waits)
            if problem is not None:
                _defer(self, deferrals, CLUSTER_WAIT_S, "sync_deferred_for_cluster", slow=slow_problem(asked),
                       problem=problem, error="soft time limit")
        log.error("sync_crashed", error=f"{type(e).__name__}: {e}"[:500], retries=attempt, deferrals=deferrals)
        _settle_failed(rt, job_id, source_ids, trigger, e)
        raise
    finally:
        if attempts is not None:
            with contextlib.suppress(Transient):
                attempts.flush()
    return job.model_dump(mode="json")


def _defer(task: Task, deferrals: int, countdown: float, event: str, slow: bool = False, **why: Any) -> NoReturn:
    """Re-enqueue the running sync after ``countdown`` seconds without spending an attempt: ``deferrals`` + 1 is
    passed on (the task checks its attempt limit on ``retries - deferrals``; Celery's own limit is off), and with
    ``slow`` (a wait for a cluster that did not answer in time) ``slow_waits`` + 1 too. Raises Celery's ``Retry``."""
    kwargs = {**(task.request.kwargs or {}), "deferrals": deferrals + 1}
    if slow:
        kwargs["slow_waits"] = int(kwargs.get("slow_waits") or 0) + 1
        why["slow_waits"] = kwargs["slow_waits"]
    log.warning(event, deferrals=deferrals + 1, countdown_s=countdown, **why)
    raise task.retry(countdown=countdown, kwargs=kwargs)


def _settle_failed(rt: Runtime, job_id: str, source_ids: Sequence[str], trigger: str,
                   exc: BaseException) -> None:
    """Record the job ``failed`` with ``exc`` as the reason, for a task that ends without a retry: unless
    :func:`scopekb.indexing.run_sync` already did (a record ``failed``) or the job finished. Best effort: when the
    record store is what fails the job keeps its state, and the reconcile settles
    it once the broker holds no message for it (:func:`scopekb.ops.settle_lost_jobs`)."""
    reason = f"{type(exc).__name__}: {exc}"[:500]
    try:
        job = rt.records.get_job(job_id)
        if job is not None and job.state in (JobState.failed, JobState.done, JobState.partial):
            return
        job = job or rt.coord.queued_job(job_id) or Job(id=job_id, source_ids=list(source_ids), trigger=trigger)
        now = utcnow()
        rt.records.put_job(job.model_copy(update={
            "state": JobState.failed, "errors": [*job.errors, f"the task ended: {reason}"], "finished_at": now,
            "started_at": job.started_at or now}))
    except Exception as e:  # noqa: BLE001 - see above; the log keeps the reason
        log.error("job_not_settled", job_id=job_id, reason=reason, error=f"{type(e).__name__}: {e}"[:300])


def _carry_marker(rt: Runtime, job_id: str) -> None:
    """A job the reconcile enqueued again after its message was lost has that on its queued marker
    (``retries["requeued"]``, ``errors``): make the marker its record before the sync starts, so the record keeps
    it. One Redis read per sync otherwise."""
    marker = rt.coord.queued_job(job_id)
    if marker is not None and marker.retries and rt.records.get_job(job_id) is None:
        rt.records.put_job(marker)


def _resume_after_wait(rt: Runtime, job_id: str) -> None:
    """A sync the cluster interrupted (it deferred) left its record ``running``: the cluster could not take the
    update. Mark it queued again, so the resumed run is not counted as redelivered after a worker death."""
    job = rt.records.get_job(job_id)
    if job is not None and job.state == JobState.running:
        rt.records.put_job(job.model_copy(update={"state": JobState.queued}))


def _cluster_problem(rt: Runtime, slow_waits: int) -> tuple[str | None, str | None]:
    """After a step failed: ``(why the task waits, the cluster's answer as asked)``. Asked after a step failed, so a
    recovering cluster is waited for (a deferral) rather than spending the task's attempts (issue 24).

    The task waits when the cluster says it cannot serve (red, no elected cluster manager, shard copies still
    recovering after nodes came back), and when a node took the question but none answered within its 2 s
    (:func:`scopekb.stores.base.slow_problem`) while ``slow_waits`` < ``SLOW_WAITS_LIMIT``: on a machine under
    heavy load the question times out while the cluster recovers, and taking that for "no problem" spent the
    task's attempts on a cluster that could not take the writes (issue 24). It does not wait (None) when every node
    refused (an outage: retried with backoff and bounded attempts, like any transient failure), when the question
    itself fails otherwise, or when the cluster serves. The answer (second item) is None when the cluster serves.
    """
    try:
        asked = rt.chunks.problem(recovering=True)
    except Exception as e:  # noqa: BLE001 - the question is best effort; the task's retry policy applies instead
        return None, f"health check failed: {type(e).__name__}"
    if answered_problem(asked) is not None:
        return asked, asked
    if slow_problem(asked) and slow_waits < SLOW_WAITS_LIMIT:
        return f"{asked}: the cluster took the health question but did not answer in time", asked
    return None, asked


class FileAttemptsRecorder:
    """:class:`scopekb.indexing.FileAttempts` on the coordination backend: one counter per (sources, blob,
    path), kept ``FILE_ATTEMPTS_TTL_S``. ``done`` is deferred and sent with the next ``begin`` (one round trip
    per file) or by ``flush``."""

    limit = FILE_ATTEMPTS_LIMIT

    def __init__(self, coord: Coordination, records: RecordStore, task_name: str) -> None:
        self.coord = coord
        self.records = records
        self.task_name = task_name
        self._pending: list[str] = []

    def begin(self, source_ids: Sequence[str], path: str, sha: str) -> int:
        """Count an attempt about to start; the attempts so far, this one included."""
        n = self.coord.count_attempt(keys.file_attempts(source_ids, path, sha), FILE_ATTEMPTS_TTL_S,
                                     forget=self._pending)
        self._pending = []
        return n

    def done(self, source_ids: Sequence[str], path: str, sha: str) -> None:
        """The attempt survived: forget its count with the next round trip."""
        self._pending.append(keys.file_attempts(source_ids, path, sha))

    def flush(self) -> None:
        """Forget the counts of finished attempts now."""
        if self._pending:
            self.coord.forget_attempts(self._pending)
            self._pending = []

    def park(self, job: Job, path: str, sha: str, attempts: int) -> None:
        """A dead letter per (sources, blob, path), replaced while the file keeps failing; its replay resets the
        count and re-runs the sync of those sources."""
        key = keys.file_attempts(job.source_ids, path, sha)
        dl = DeadLetter(id="file-" + hashlib.sha256(key.encode()).hexdigest()[:20], task=self.task_name,
                        kwargs={"job_id": job.id, "source_ids": job.source_ids, "trigger": "replay",
                                "reset_attempts": [key]},
                        error=f"chunking {path} (blob {sha[:12]}) stopped the worker process {attempts} times",
                        attempts=attempts, path=path)
        self.records.put("deadletters", dl.id, dl.model_dump(mode="json"))
        log.error("file_dead_lettered", path=path, blob_sha=sha, attempts=attempts, dead_letter=dl.id)


def _mark_retrying(rt: Runtime, job_id: str, retry: int, delay: float, exc: Exception) -> None:
    """The job is not over: ``failed`` is kept for jobs that will not run again. Best effort (the record store
    may be what is down; the job then keeps its last recorded state until the retry runs)."""
    try:
        job = rt.records.get_job(job_id)
        if job is not None and job.state in (JobState.failed, JobState.queued, JobState.running):
            job.state = JobState.queued
            job.errors.append(f"retry {retry} in {delay:.0f}s after {type(exc).__name__}")
            rt.records.put_job(job)
    except Exception as e:  # noqa: BLE001 - see above
        log.warning("job_retry_not_recorded", error=str(e)[:300])


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


@app.task(name=queue.TASK_EMBED_CHUNKS, bind=True, max_retries=None)
def embed_chunks(self: Task, job_id: str, run: str, part: int, items: list[list[str]]) -> dict[str, Any]:
    """The embedding stage (issue 19): vectors for one part of a sync's chunks (``items`` = ``[[chunk id,
    text, blob sha], ...]``) through the embedding cache, added to the chunks; the last part finishes the job
    (:func:`scopekb.indexing.embed_part`). Idempotent, so a redelivered part (worker death) neither duplicates
    chunks nor counts twice. Transient failures (provider, OpenSearch, Redis) are retried with backoff up to
    ``worker.max_retries`` times, then parked as a dead letter (its chunks stay without vector and blob id, so
    the next sync of the source indexes them again)."""
    s = get_settings()
    rt = runtime()
    try:
        ensure_chunk_index(rt)  # inside the retry policy: a cluster that cannot answer now is retried later
        return embed_part(rt.sync_deps(), job_id, run, part, items)
    except Refused as e:
        log.error("embed_refused", error=str(e))
        return {"part": part, "errors": [str(e)]}
    except TRANSIENT_ERRORS as e:
        attempt = self.request.retries
        if attempt >= s.worker.max_retries:
            _dead_letter(rt, self, job_id, e)
            return {"part": part, "errors": [str(e)], "dead_letter": True}
        delay = backoff_delay(attempt, RETRY_BASE_S, RETRY_MAX_S)
        log.warning("embed_retry", error=str(e)[:500], retries=attempt, countdown=round(delay, 1))
        raise self.retry(exc=e, countdown=delay) from e


@app.task(name=queue.TASK_RECONCILE)
def reconcile() -> dict[str, Any]:
    """Settle queued jobs whose message the broker lost (enqueued again once, then failed with the reason), then
    enqueue a verifying sync for every (repository, ref) with registered sources, except those being synced
    (:func:`scopekb.ops.reconcile`).

    The sync brings a source whose ref moved without a webhook (lost deliveries, hosts without webhooks, tasks
    lost with the broker) to the ref, and compares the index's documents with git's tree by content id,
    repairing what differs (``job.drift``): a fetch, a tree listing and one aggregation per source when nothing
    drifted.
    """
    return ops.reconcile(runtime())
