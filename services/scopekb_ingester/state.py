"""What the ingester's routes share: its runtime and the in-memory cache of registered sources."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request

from scopekb.models import Source
from scopekb.runtime import ControlRuntime

#: Seconds the source cache is trusted without a sources-version change.
SOURCE_CACHE_TTL_S = 30.0
#: Seconds between two reads of the sources version. 0: read on every webhook (one Redis GET, ~0.2 ms). A longer
#: interval (1 s before) let a push for a repository that other sources already track miss a source registered
#: a moment before it: the cached list still matched the repository, so nothing forced a reload, and the new
#: source's scope never got that push (seen as a flaky e2e test, test_same_delivery_five_times_concurrently).
SOURCE_VERSION_CHECK_S = 0.0


class SourceCache:
    """Registered sources kept in memory so most webhook requests do no record-store or coordination I/O.

    Reloaded when the sources version changes (registration and removal bump it before they answer; read on every
    ``get`` with the default ``check_s`` of 0), when older than ``ttl_s``, or on a miss (a push for a repository not
    in the cache) at most once a second. So a source registered before a push is matched by that push, also when
    other sources of the same repository were cached already; a removed source is not matched once its removal
    has answered.
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
        return self.load(force)[0]

    def load(self, force: bool = False, check: bool = True) -> tuple[list[Source], int | None]:
        """The cached sources and the sources version they were loaded at (None: it could not be read).

        ``check=False`` skips the version read (reloading only when older than ``ttl_s`` or never loaded): the
        caller must confirm the returned version where it acts on the list, as the webhook route does inside its
        delivery claim (:meth:`scopekb.coordination.Coordination.claim_delivery` with ``sources_version``), so an
        accepted push costs no separate version read (issue 20). Record-store errors propagate."""
        v: int | None = self._loaded_version
        # A list loaded while the version could not be read has no version a delivery claim could confirm: read it
        # (hostile pass: a first load during a Redis outage otherwise went unchecked until ttl_s ran out).
        check = check or v is None
        if check and (force or time.monotonic() - self._version_read_at >= self._check_s):
            try:
                v = self._version()
                self._version_read_at = time.monotonic()
            except Exception:  # noqa: BLE001 - coordination hiccup: fall back to the TTL
                v = self._loaded_version
        with self._lock:
            age = time.monotonic() - self._loaded_at
            if age > self._ttl or v != self._loaded_version or (force and age > 1.0):
                if not check:  # a (re)load reads the version it loads at
                    with contextlib.suppress(Exception):
                        v = self._version()
                self._sources = list(self._loader())
                self._loaded_at = time.monotonic()
                self._loaded_version = v
            return self._sources, self._loaded_version

    def current_version(self) -> int | None:
        """The sources version now (one read), None when it cannot be read."""
        try:
            return self._version()
        except Exception:  # noqa: BLE001 - as in load(): the caller falls back to its copy
            return None


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
