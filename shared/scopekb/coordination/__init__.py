"""Coordination between scopekb processes: scopekb's own small interface, not a key-value client's surface.

What the processes coordinate on (DESIGN §11, §13):

- **delivery claim**: a webhook delivery id is acted on once (:meth:`Coordination.claim_delivery`);
- **queued marker**: a job is visible to ``GET /v1/jobs/{id}`` from the moment it is enqueued until a worker
  records it (:meth:`Coordination.mark_queued`, :meth:`Coordination.queued_job`);
- **repository lock** with renewal: one sync of a group of sources at a time; a holder that dies frees it
  within its TTL, at once when it was a process of this host (:meth:`Coordination.repo_lock`);
- **file attempts**: chunking attempts per file that survive a worker death (:meth:`Coordination.count_attempt`);
- **sources version**: ingesters reload their source cache when it moves (:meth:`Coordination.sources_version`);
- **reindex lock**: syncs wait while ``scopekb reindex`` runs.

Two implementations share this logic and differ only in a handful of primitives:
:class:`scopekb.coordination.rediscoord.RedisCoordination` (distributed profile) and
:class:`scopekb.coordination.memory.MemoryCoordination` (embedded profile, one process). The profile is chosen in
:mod:`scopekb.runtime` only. Every key name is in :mod:`scopekb.coordination.keys`. Failures of the backend are
raised as :class:`scopekb.errors.Transient`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from scopekb.coordination import keys
from scopekb.errors import Transient
from scopekb.logging import get_logger
from scopekb.models import Job

log = get_logger("scopekb.coordination")

#: The queued marker's field holding its task's arguments (ignored when the marker is read as a :class:`Job`).
QUEUED_TASK_FIELD = "task_kwargs"


def _marker(job: Job, task_kwargs: dict[str, Any] | None) -> str:
    """The JSON of a queued marker: the job (state queued) plus its task's arguments."""
    return json.dumps({**job.model_dump(mode="json"), QUEUED_TASK_FIELD: task_kwargs or {}})


class LockHeld(Transient):
    """The repository lock stayed held by another sync for the whole wait (transient: retry later)."""


class SourcesChanged(Exception):  # noqa: N818 - a signal to the caller, not a failure
    """The registered sources changed since the caller's copy was loaded (:meth:`Coordination.claim_delivery`
    with ``sources_version``): nothing was written; judge the delivery again against the current sources."""


class Coordination(ABC):
    """The coordination interface (see the module docstring). Subclasses implement the ``_`` primitives.

    Attributes:
        kind: the backend's name as readiness reports it (``redis``, ``memory``).
    """

    kind: str = "?"

    # ---- primitives (per backend) ----------------------------------------------------------------------------

    @abstractmethod
    def ping(self) -> None:
        """Raise :class:`Transient` when the backend does not answer."""

    @abstractmethod
    def eviction_policy(self) -> tuple[str, int]:
        """``(maxmemory-policy, maxmemory bytes)`` of the backend (0: unlimited). Raises :class:`Transient`."""

    @abstractmethod
    def _set(self, key: str, value: str, ttl_s: float | None = None, nx: bool = False) -> bool: ...

    @abstractmethod
    def _get(self, key: str) -> bytes | None: ...

    @abstractmethod
    def _delete(self, *names: str) -> None: ...

    @abstractmethod
    def _exists(self, key: str) -> bool: ...

    @abstractmethod
    def _any(self, pattern: str) -> bool: ...

    @abstractmethod
    def _values(self, pattern: str) -> list[bytes]:
        """The values of every live key matching ``pattern`` (glob), in no particular order."""

    @abstractmethod
    def _incr(self, key: str, ttl_s: float | None = None, forget: Sequence[str] = ()) -> int:
        """Delete ``forget``, add one to ``key`` (setting its TTL when given) in one round trip; the new value."""

    @abstractmethod
    def _set_nx_with(self, key: str, value: str, ttl_s: float, others: Sequence[tuple[str, str]],
                     others_ttl_s: float, unless: tuple[str, str] | None = None) -> int:
        """Set ``key`` only when absent (kept ``ttl_s``) and, when it was set, every ``(key, value)`` of ``others``
        (kept ``others_ttl_s``, overwriting), as one atomic step (one round trip): 1 when ``key`` was set, 0 when
        it existed. ``unless`` ``(key, value)``: first compare that key's value (a missing key reads ``0``) and
        write nothing, answering -1, when it differs."""

    @abstractmethod
    def _extend_if(self, key: str, token: str, ttl_s: float) -> bool: ...

    @abstractmethod
    def _delete_if(self, key: str, token: str) -> bool: ...

    # ---- delivery claim --------------------------------------------------------------------------------------

    def claim_delivery(self, provider: str, delivery_id: str, ttl_s: int,
                       queued: Sequence[tuple[Job, dict[str, Any]]] = (), queued_ttl_s: int = 0,
                       sources_version: int | None = None) -> bool:
        """Atomically claim a webhook delivery id. True the first time within ``ttl_s``, False for a repeat.

        With ``queued`` (``(job, task kwargs)`` pairs), the claim also writes those jobs' queued markers
        (:meth:`mark_queued`, kept ``queued_ttl_s``) in the same atomic step - one round trip on Redis instead of
        one per key (issue 20); a repeat writes nothing. With ``sources_version``, the step first checks that the
        sources version (:meth:`sources_version`) still is that one.

        Raises:
            SourcesChanged: the sources version moved (nothing was written): judge the delivery again against the
                sources as registered now.
        """
        key = keys.delivery(provider, delivery_id)
        if not queued and sources_version is None:
            return self._set(key, "1", ttl_s=ttl_s, nx=True)
        done = self._set_nx_with(key, "1", ttl_s,
                                 [(keys.job_queued(job.id), _marker(job, kw)) for job, kw in queued], queued_ttl_s,
                                 None if sources_version is None else (keys.SOURCES_VERSION, str(sources_version)))
        if done < 0:
            raise SourcesChanged(f"sources version is no longer {sources_version}")
        return done == 1

    def release_delivery(self, provider: str, delivery_id: str, queued: Sequence[str] = ()) -> None:
        """Forget a claimed delivery and the queued markers of the job ids ``queued`` (enqueueing failed, so the
        host's retry must not be dropped, and no job it was told failed shows as queued)."""
        self._delete(keys.delivery(provider, delivery_id), *(keys.job_queued(j) for j in queued))

    # ---- queued marker ---------------------------------------------------------------------------------------

    def mark_queued(self, job: Job, ttl_s: int, task_kwargs: dict[str, Any] | None = None) -> None:
        """Record ``job`` (state queued) until a worker writes its record or ``ttl_s`` passes, with the arguments
        of its task (``task_kwargs``), so a job whose message the broker lost can be enqueued again."""
        self._set(keys.job_queued(job.id), _marker(job, task_kwargs), ttl_s=ttl_s)

    def queued_job(self, job_id: str) -> Job | None:
        """The queued marker of ``job_id``, or None."""
        raw = self._get(keys.job_queued(job_id))
        return Job.model_validate(json.loads(raw)) if raw else None

    def queued_markers(self) -> list[tuple[Job, dict[str, Any]]]:
        """Every live queued marker: ``(job, task kwargs)`` (kwargs ``{}`` for a marker written without them).
        Markers outlive the job's start (they expire after ``worker.result_expires_s``): compare with the job
        records. One scan of the backend's keys (Redis ``SCAN``)."""
        out = []
        for raw in self._values(keys.JOB_QUEUED_PATTERN):
            with contextlib.suppress(ValueError):
                doc = json.loads(raw)
                out.append((Job.model_validate(doc), dict(doc.get(QUEUED_TASK_FIELD) or {})))
        return out

    # ---- embedding stage (issue 19) ---------------------------------------------------------------------------

    def embed_part_done(self, job_id: str, run: str, part: int, result: dict[str, Any], ttl_s: int) -> None:
        """Record that part ``part`` of run ``run`` of the job's embedding stage finished, with its counts
        (``result``, JSON). Idempotent: a redelivered part overwrites its own entry, so nothing is counted twice."""
        self._set(keys.embed_part(job_id, run, part), json.dumps(result), ttl_s=ttl_s)

    def embed_parts_done(self, job_id: str, run: str) -> list[dict[str, Any]]:
        """The results of every finished part of run ``run`` of the job's embedding stage (one key scan)."""
        out = []
        for raw in self._values(keys.embed_part(job_id, run, "*")):
            with contextlib.suppress(ValueError):
                out.append(json.loads(raw))
        return out

    # ---- sources version -------------------------------------------------------------------------------------

    def bump_sources_version(self) -> None:
        """Tell every ingester that the registered sources changed (best effort: their TTL reload also heals)."""
        with contextlib.suppress(Transient):
            self._incr(keys.SOURCES_VERSION)

    def sources_version(self) -> int:
        """The current sources version (0 when never bumped)."""
        return int(self._get(keys.SOURCES_VERSION) or 0)

    def bump_keys_version(self) -> None:
        """Tell every query replica that a key was revoked (their key caches empty on their next request)."""
        with contextlib.suppress(Transient):
            self._incr(keys.KEYS_VERSION)

    def keys_version(self) -> int:
        """The current keys version (0 when never bumped). Raises :class:`Transient` when the backend is down."""
        return int(self._get(keys.KEYS_VERSION) or 0)

    # ---- file attempts ---------------------------------------------------------------------------------------

    def count_attempt(self, key: str, ttl_s: float, forget: Sequence[str] = ()) -> int:
        """Count an attempt under ``key`` (kept ``ttl_s``), forgetting the finished ``forget`` keys in the same
        round trip. Returns the attempts so far, this one included."""
        return self._incr(key, ttl_s=ttl_s, forget=forget)

    def forget_attempts(self, attempt_keys: Sequence[str]) -> None:
        """Forget attempt counts (only keys under :data:`keys.FILE_ATTEMPTS_PREFIX` are touched)."""
        mine = [k for k in attempt_keys if k.startswith(keys.FILE_ATTEMPTS_PREFIX)]
        if mine:
            self._delete(*mine)

    # ---- reindex lock ----------------------------------------------------------------------------------------

    def begin_reindex(self, ttl_s: int) -> bool:
        """Take the reindex lock; False when a reindex already runs."""
        return self._set(keys.REINDEX_LOCK, "1", ttl_s=ttl_s, nx=True)

    def end_reindex(self) -> None:
        """Release the reindex lock."""
        self._delete(keys.REINDEX_LOCK)

    def reindex_running(self) -> bool:
        """True while ``scopekb reindex`` holds its lock."""
        return self._exists(keys.REINDEX_LOCK)

    # ---- repository lock -------------------------------------------------------------------------------------

    def repo_locked(self, source_ids: Sequence[str]) -> bool:
        """True while a sync of this group of sources holds its lock."""
        return self._exists(keys.repo_lock(source_ids))

    def any_repo_locked(self) -> bool:
        """True while any sync holds a repository lock."""
        return self._any(keys.REPO_LOCK_PATTERN)

    @contextlib.contextmanager
    def repo_lock(self, source_ids: Sequence[str], wait_s: float, ttl_s: float) -> Iterator[None]:
        """Hold the repository lock of ``source_ids`` (waiting up to ``wait_s``); a thread renews it every
        ``ttl_s / 3`` while the block runs.

        It expires ``ttl_s`` after the holder stops renewing it, so a worker that died blocks the repository for
        at most that long - and not at all for a worker on the same host: the lock names its holder (host and
        pid), and a holder process that no longer exists there is not waited for.

        Raises:
            LockHeld: not acquired within ``wait_s`` (transient: the task retries later).
        """
        name = keys.repo_lock(source_ids)
        token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        if not self._set(name, token, ttl_s=ttl_s, nx=True):
            if self._break_if_holder_dead(name):
                log.warning("repo_lock_of_dead_process_broken", lock=name)
            if not self._wait_for(name, token, ttl_s, wait_s):
                raise LockHeld(f"repository lock {name} is held by another sync")
        stop = threading.Event()
        keeper = threading.Thread(target=self._renew, args=(name, token, ttl_s, stop), name="repo-lock-keeper",
                                  daemon=True)
        keeper.start()
        try:
            yield
        finally:
            stop.set()
            keeper.join(timeout=5)
            try:
                if not self._delete_if(name, token):
                    log.warning("repo_lock_release_failed", lock=name, error="expired or taken meanwhile")
            except Transient as e:  # the backend restarted: nothing left to free
                log.warning("repo_lock_release_failed", lock=name, error=str(e))

    def _wait_for(self, name: str, token: str, ttl_s: float, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while not self._set(name, token, ttl_s=ttl_s, nx=True):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def _renew(self, name: str, token: str, ttl_s: float, stop: threading.Event) -> None:
        while not stop.wait(ttl_s / 3):
            try:
                if not self._extend_if(name, token, ttl_s):  # expired or taken: the sync goes on, idempotent
                    log.warning("repo_lock_lost", lock=name)
                    return
            except Transient as e:
                log.warning("repo_lock_renewal_failed", lock=name, error=str(e))

    def _break_if_holder_dead(self, name: str) -> bool:
        """Delete the lock ``name`` if its holder is a process of this host that no longer exists."""
        raw = self._get(name)
        try:
            host, pid_s, _ = (raw or b"").decode().split(":", 2)
            pid = int(pid_s)
        except ValueError:  # free, or a lock of an older worker (a bare token): wait for its expiry
            return False
        if host != socket.gethostname() or pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
            return False  # alive (or reused by another process: then the expiry is waited for)
        except ProcessLookupError:
            pass
        except PermissionError:
            return False
        return self._delete_if(name, (raw or b"").decode())
