"""Keep the broker from redelivering the tasks a live worker holds, so the visibility timeout can be short.

With ``acks_late`` the Redis transport of kombu keeps every delivered, unacknowledged message in the hash
``unacked`` and its delivery time in the sorted set ``unacked_index`` (score: UNIX seconds). Every
``unacked_restore_interval`` any consumer moves the messages whose score is older than ``visibility_timeout``
back to their queue: that is how a task of a worker that died is redelivered, and why the timeout used to be
longer than the longest task (2 h), so a dead worker's task waited 2 h.

Here the worker's main process (the consumer, which holds the messages of its running and reserved tasks,
including retries waiting for their countdown) re-stamps the score of each message it holds every
``interval_s`` seconds (``ZADD unacked_index XX``: only tags still there; an acknowledged one is not revived).
A live worker's messages therefore never look older than ``interval_s``, while a dead worker's stop being
re-stamped and come back after ``visibility_timeout``: minutes, set by ``worker.visibility_timeout_s``. The
stamps are written by the consumer process, so a pool process stuck in a long task keeps its message as long
as the worker lives (the task time limit ends a stuck task).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import redis

from scopekb.logging import get_logger

log = get_logger("scopekb.worker.heartbeat")

#: kombu's default name of the sorted set of unacknowledged delivery tags (``unacked_index_key`` option).
UNACKED_INDEX = "unacked_index"


class HeldTags:
    """Delivery tags of the messages this worker process received (Celery's ``task_received`` signal, sent in
    the main process for every message, ETA retries included). Tags acknowledged since are dropped at the next
    beat (they are no longer in the unacked index)."""

    def __init__(self) -> None:
        self._tags: set[str] = set()
        self._lock = threading.Lock()

    def add(self, tag: object) -> None:
        if tag:
            with self._lock:
                self._tags.add(str(tag))

    def snapshot(self) -> list[str]:
        with self._lock:
            return sorted(self._tags)

    def forget(self, tags: Iterable[str]) -> None:
        with self._lock:
            self._tags.difference_update(tags)


def stamp(client: redis.Redis, tags: Iterable[str], index_key: str = UNACKED_INDEX,
          now: float | None = None) -> list[str]:
    """Set the delivery time of ``tags`` still in ``index_key`` to ``now`` (``ZADD XX``: an acknowledged tag is
    never re-added); returns the tags that are gone (acknowledged or restored meanwhile)."""
    tags = list(tags)
    if not tags:
        return []
    scores = client.zmscore(index_key, tags)
    present = [t for t, sc in zip(tags, scores, strict=True) if sc is not None]
    if present:
        client.zadd(index_key, dict.fromkeys(present, time.time() if now is None else now), xx=True)
    return [t for t, sc in zip(tags, scores, strict=True) if sc is None]


class Heartbeat(threading.Thread):
    """A daemon thread re-stamping the held messages every ``interval_s`` seconds until :meth:`stop`.

    Args:
        client: the broker's Redis.
        interval_s: seconds between stamps; must be well under the visibility timeout (a third or less).
        held: the tags to stamp (:class:`HeldTags`, fed by the ``task_received`` signal).
        index_key: the transport's ``unacked_index_key``.
    """

    def __init__(self, client: redis.Redis, interval_s: float, held: HeldTags,
                 index_key: str = UNACKED_INDEX) -> None:
        super().__init__(name="scopekb-heartbeat", daemon=True)
        self.client = client
        self.interval_s = interval_s
        self.held = held
        self.index_key = index_key
        self.halt = threading.Event()
        self.beats = 0

    def beat(self) -> int:
        """Stamp once; returns how many messages are still held."""
        tags = self.held.snapshot()
        gone = stamp(self.client, tags, self.index_key)
        self.held.forget(gone)
        self.beats += 1
        return len(tags) - len(gone)

    def run(self) -> None:
        while not self.halt.wait(self.interval_s):
            try:
                held = self.beat()
                if held:
                    log.debug("heartbeat", held=held)
            except Exception as e:  # noqa: BLE001 - the broker may be down; the next beat tries again
                log.warning("heartbeat_failed", error=str(e)[:200])

    def stop(self) -> None:
        self.halt.set()


def index_key(app: Any) -> str:
    """The ``unacked_index_key`` the app's Redis transport uses."""
    return str((app.conf.broker_transport_options or {}).get("unacked_index_key", UNACKED_INDEX))
