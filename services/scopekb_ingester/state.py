"""What the ingester's routes share: its runtime and the in-memory cache of registered sources."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request

from scopekb.models import Source
from scopekb.runtime import ControlRuntime

#: Seconds the source cache is trusted without a sources-version change.
SOURCE_CACHE_TTL_S = 30.0
#: Seconds between two reads of the sources version (issue 20: not one coordination round trip per webhook).
SOURCE_VERSION_CHECK_S = 1.0


class SourceCache:
    """Registered sources kept in memory so most webhook requests do no record-store or coordination I/O.

    Reloaded when the sources version changes (registration bumps it; read at most every ``check_s`` seconds),
    when older than ``ttl_s``, or on a miss (a push for a repository not in the cache) at most once a second, so a
    source registered a moment ago is found on its first push. A removed source may still be matched for up to
    ``check_s`` seconds; its sync then finds no source and does nothing.
    """

    def __init__(self, loader: Callable[[], list[Source]], version: Callable[[], int],
                 ttl_s: float = SOURCE_CACHE_TTL_S, check_s: float = SOURCE_VERSION_CHECK_S) -> None:
        self._loader = loader
        self._version = version
        self._ttl = ttl_s
        self._check_s = check_s
        self._sources: list[Source] = []
        self._loaded_at = float("-inf")
        self._loaded_version: int | None = None
        self._version_read_at = float("-inf")
        self._lock = threading.Lock()

    def get(self, force: bool = False) -> list[Source]:
        """The cached sources, reloaded as described above. Record-store errors propagate."""
        v: int | None = self._loaded_version
        if force or time.monotonic() - self._version_read_at >= self._check_s:
            try:
                v = self._version()
                self._version_read_at = time.monotonic()
            except Exception:  # noqa: BLE001 - coordination hiccup: fall back to the TTL
                v = self._loaded_version
        with self._lock:
            age = time.monotonic() - self._loaded_at
            if age > self._ttl or v != self._loaded_version or (force and age > 1.0):
                self._sources = list(self._loader())
                self._loaded_at = time.monotonic()
                self._loaded_version = v
        return self._sources


@dataclass
class Ingester:
    """The ingester's runtime (records, coordination, task producer) and its source cache."""

    rt: ControlRuntime
    sources: SourceCache

    @classmethod
    def on(cls, rt: ControlRuntime) -> Ingester:
        """An ingester over ``rt`` with a fresh source cache."""
        return cls(rt, SourceCache(lambda: rt.records.list_sources(), rt.coord.sources_version))


async def ingester(request: Request) -> Ingester:
    """The app's ingester state (``app.state.ingester``). Async: FastAPI runs a plain ``def`` dependency in a
    worker thread (a thread hand-off each way per webhook; issue 20)."""
    return request.app.state.ingester  # type: ignore[no-any-return]
