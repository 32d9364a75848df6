"""An in-process key-value store with the subset of the Redis client API scopekb uses, for embedded mode.

In the distributed profile the ingester, workers and query service share Redis for delivery dedupe, job
markers, locks and the sources version. In the embedded profile all of them live in one process, so a
thread-safe dictionary with expiry serves the same purpose. Methods mirror ``redis.Redis``: ``set`` (with
``nx``/``ex``), ``get``, ``delete``, ``exists``, ``incr``, ``expire``, ``scan_iter``, ``ping`` and ``lock``.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections.abc import Iterator
from typing import Any


class LockNotAcquired(TimeoutError):
    """``lock(..., blocking_timeout=...)`` gave up waiting."""


class MemoryKV:
    """Thread-safe keys with optional expiry (seconds). Values are stored as bytes, like Redis returns them."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[bytes, float | None]] = {}
        self._mu = threading.RLock()

    def _alive(self, key: str) -> bool:
        item = self._data.get(key)
        if item is None:
            return False
        if item[1] is not None and item[1] <= time.monotonic():
            del self._data[key]
            return False
        return True

    @staticmethod
    def _b(value: Any) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()

    def set(self, key: str, value: Any, ex: int | None = None, nx: bool = False) -> bool:
        """Set ``key``; with ``nx`` only when absent. Returns True when the value was written."""
        with self._mu:
            if nx and self._alive(key):
                return False
            self._data[key] = (self._b(value), time.monotonic() + ex if ex else None)
            return True

    def get(self, key: str) -> bytes | None:
        with self._mu:
            return self._data[key][0] if self._alive(key) else None

    def delete(self, *keys: str) -> int:
        with self._mu:
            n = 0
            for k in keys:
                if self._alive(k):
                    del self._data[k]
                    n += 1
            return n

    def exists(self, *keys: str) -> int:
        with self._mu:
            return sum(1 for k in keys if self._alive(k))

    def incr(self, key: str, amount: int = 1) -> int:
        with self._mu:
            cur = int(self._data[key][0]) if self._alive(key) else 0
            exp = self._data[key][1] if key in self._data else None
            self._data[key] = (str(cur + amount).encode(), exp)
            return cur + amount

    def expire(self, key: str, seconds: int) -> bool:
        with self._mu:
            if not self._alive(key):
                return False
            self._data[key] = (self._data[key][0], time.monotonic() + seconds)
            return True

    def scan_iter(self, match: str = "*", count: int | None = None) -> Iterator[bytes]:
        with self._mu:
            keys = [k for k in list(self._data) if self._alive(k) and fnmatch.fnmatchcase(k, match)]
        return iter(k.encode() for k in keys)

    def ping(self) -> bool:
        return True

    def config_get(self, pattern: str = "*") -> dict[str, str]:
        """Server settings: nothing is ever evicted from this store."""
        return {"maxmemory-policy": "noeviction", "maxmemory": "0"}

    def pipeline(self, transaction: bool = False) -> _Pipeline:
        """Commands queued and run in order by ``execute()`` (atomic here: one lock)."""
        return _Pipeline(self)

    def lock(self, name: str, timeout: float | None = None, blocking_timeout: float | None = None,
             thread_local: bool = True) -> _Lock:
        """A lock on ``name`` (expiring after ``timeout`` s) like ``redis.lock.Lock``: ``acquire``/``release``
        or a ``with`` block, waiting up to ``blocking_timeout`` s. Tokens are never thread-local here, so
        ``thread_local`` is accepted and ignored."""
        return _Lock(self, name, timeout, blocking_timeout)


class _Pipeline:
    def __init__(self, kv: MemoryKV) -> None:
        self.kv = kv
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def queue(*args: Any, **kwargs: Any) -> _Pipeline:
            self.calls.append((name, args, kwargs))
            return self
        return queue

    def execute(self) -> list[Any]:
        with self.kv._mu:
            out = [getattr(self.kv, n)(*a, **k) for n, a, k in self.calls]
        self.calls = []
        return out


class _Lock:
    def __init__(self, kv: MemoryKV, name: str, timeout: float | None, blocking_timeout: float | None) -> None:
        self.kv, self.name, self.timeout, self.blocking_timeout = kv, name, timeout, blocking_timeout
        self.token = f"{threading.get_ident()}-{time.monotonic_ns()}".encode()

    def acquire(self, blocking: bool = True, blocking_timeout: float | None = None, token: str | None = None
                ) -> bool:
        if token is not None:
            self.token = token.encode()
        wait = blocking_timeout if blocking_timeout is not None else self.blocking_timeout
        deadline = None if wait is None else time.monotonic() + wait
        ex = int(self.timeout) if self.timeout else None
        while not self.kv.set(self.name, self.token, ex=ex, nx=True):
            if not blocking or (deadline is not None and time.monotonic() > deadline):
                return False
            time.sleep(0.05)
        return True

    def release(self) -> None:
        with self.kv._mu:
            if self.kv.get(self.name) == self.token:
                self.kv.delete(self.name)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        with self.kv._mu:
            if self.kv.get(self.name) != self.token:
                return False
            return self.kv.expire(self.name, int(additional_time))

    def locked(self) -> bool:
        return bool(self.kv.exists(self.name))

    def __enter__(self) -> _Lock:
        if not self.acquire():
            raise LockNotAcquired(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_SHARED = MemoryKV()


def shared_memory_kv() -> MemoryKV:
    """The process-wide store every embedded component uses."""
    return _SHARED
