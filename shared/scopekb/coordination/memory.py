"""The coordination interface in memory (embedded profile): one process, so a locked dict with expiry serves.

Thread-safe; values are bytes, expiry uses the monotonic clock.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections.abc import Sequence

from scopekb.coordination import Coordination


class MemoryCoordination(Coordination):
    """:class:`Coordination` for the threads of one process (nothing is ever evicted)."""

    kind = "memory"

    def __init__(self) -> None:
        self._data: dict[str, tuple[bytes, float | None]] = {}
        self._mu = threading.RLock()

    def ping(self) -> None:
        """Always answers."""

    def eviction_policy(self) -> tuple[str, int]:
        """Nothing is evicted here."""
        return "noeviction", 0

    def _alive(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        if item[1] is not None and item[1] <= time.monotonic():
            del self._data[key]
            return None
        return item[0]

    def _set(self, key: str, value: str, ttl_s: float | None = None, nx: bool = False) -> bool:
        with self._mu:
            if nx and self._alive(key) is not None:
                return False
            self._data[key] = (value.encode(), time.monotonic() + ttl_s if ttl_s else None)
            return True

    def _get(self, key: str) -> bytes | None:
        with self._mu:
            return self._alive(key)

    def _delete(self, *names: str) -> None:
        with self._mu:
            for k in names:
                self._data.pop(k, None)

    def _exists(self, key: str) -> bool:
        with self._mu:
            return self._alive(key) is not None

    def _any(self, pattern: str) -> bool:
        with self._mu:
            return any(self._alive(k) is not None for k in list(self._data) if fnmatch.fnmatchcase(k, pattern))

    def _values(self, pattern: str) -> list[bytes]:
        with self._mu:
            found = (self._alive(k) for k in list(self._data) if fnmatch.fnmatchcase(k, pattern))
            return [v for v in found if v is not None]

    def _incr(self, key: str, ttl_s: float | None = None, forget: Sequence[str] = ()) -> int:
        with self._mu:
            self._delete(*forget)
            cur = self._alive(key)
            expiry = time.monotonic() + ttl_s if ttl_s else (self._data[key][1] if cur is not None else None)
            n = int(cur or 0) + 1
            self._data[key] = (str(n).encode(), expiry)
            return n

    def _set_nx_with(self, key: str, value: str, ttl_s: float, others: Sequence[tuple[str, str]],
                     others_ttl_s: float, unless: tuple[str, str] | None = None) -> int:
        with self._mu:
            if unless is not None and (self._alive(unless[0]) or b"0") != unless[1].encode():
                return -1
            if not self._set(key, value, ttl_s=ttl_s, nx=True):
                return 0
            for k, v in others:
                self._set(k, v, ttl_s=others_ttl_s)
            return 1

    def _extend_if(self, key: str, token: str, ttl_s: float) -> bool:
        with self._mu:
            if self._alive(key) != token.encode():
                return False
            self._data[key] = (token.encode(), time.monotonic() + ttl_s)
            return True

    def _delete_if(self, key: str, token: str) -> bool:
        with self._mu:
            if self._alive(key) != token.encode():
                return False
            del self._data[key]
            return True


_SHARED = MemoryCoordination()


def shared_memory_coordination() -> MemoryCoordination:
    """The process-wide coordination every embedded component uses."""
    return _SHARED
