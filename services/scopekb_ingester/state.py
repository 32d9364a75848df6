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


class SourceCache:
    """Registered sources kept in memory so most webhook requests do no record-store I/O.

    Reloaded when the sources version changes (registration bumps it), when older than ``ttl_s``, or on a
    miss at most once a second.
    """

    def __init__(self, loader: Callable[[], list[Source]], version: Callable[[], int],
                 ttl_s: float = SOURCE_CACHE_TTL_S) -> None:
        self._loader = loader
        self._version = version
        self._ttl = ttl_s
        self._sources: list[Source] = []
        self._loaded_at = float("-inf")
        self._loaded_version: int | None = None
        self._lock = threading.Lock()

    def get(self, force: bool = False) -> list[Source]:
        """The cached sources, reloaded as described above. Record-store errors propagate."""
        try:
            v: int | None = self._version()
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


def ingester(request: Request) -> Ingester:
    """The app's ingester state (``app.state.ingester``)."""
    return request.app.state.ingester  # type: ignore[no-any-return]
