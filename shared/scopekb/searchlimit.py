"""How many searches of one process run in threads at once (issue 20): :func:`search_threads` and
:class:`SearchLimiter`, used by the query app's REST and MCP search (``Runtime.search_limiter``)."""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from scopekb.settings import Settings

#: Search threads per CPU in the embedded profile (:func:`search_threads`). Measured (docs/benchmarks.md, issue 20
#: ninth pass, 2 CPUs): ``scopekb up`` with 40 threads spent 5.5-6.7 ms of CPU per keyword search at 8 in flight and
#: 7.6-10.9 ms at 32; with 8 threads 5.9-6.0 and 6.0-6.8 ms.
EMBEDDED_SEARCH_THREADS_PER_CPU = 4

T = TypeVar("T")


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def search_threads(settings: Settings, embedded: bool) -> int:
    """How many searches of one process run in threads at once: ``query.search_threads`` when > 0; else, in the
    embedded profile (``embedded``, as :mod:`scopekb.runtime` decides it), :data:`EMBEDDED_SEARCH_THREADS_PER_CPU`
    × the CPUs this process may run on (at most ``http.worker_threads``), in the distributed one
    ``http.worker_threads``.

    Why embedded differs: its search is CPU work in this process (SQLite, the local model, Python under the GIL);
    past a few threads per core, more only add GIL hand-offs and context switches (CPU per search grew 15-60% from
    8 to 32 threads, issue 20). A distributed search mostly waits for OpenSearch, so it keeps a thread per request.
    """
    if settings.query.search_threads > 0:
        return settings.query.search_threads
    if embedded:
        return min(settings.http.worker_threads, EMBEDDED_SEARCH_THREADS_PER_CPU * _cpus())
    return settings.http.worker_threads


class Abandoned(Exception):
    """A search whose caller went away while it waited for a thread (:meth:`SearchLimiter.run` with ``gone``): it
    was not run. Services answer it with status 499 (the client closed the request), which nobody receives."""


class SearchLimiter:
    """Runs blocking search bodies in worker threads, at most ``total`` at once per event loop (an anyio
    ``CapacityLimiter`` made on first use on each loop); callers past that wait on the event loop, holding no
    thread and no lock. The threads come from anyio's worker-thread pool; a search takes a token of this limiter
    instead of anyio's default one (``http.worker_threads``, which the app's other blocking routes use).

    Args:
        total: searches in threads at once (>= 1), e.g. :func:`search_threads`.
    """

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"a search limiter needs at least 1 thread, got {total}")
        self.total = total
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._threads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    def limiter(self) -> Any:
        """This event loop's ``anyio.CapacityLimiter`` (made on first call on the loop)."""
        return self._on_loop(self._by_loop)

    def _thread_limiter(self) -> Any:
        # the threads of searches that took their token of limiter() themselves: as many, so never a wait
        return self._on_loop(self._threads)

    def _on_loop(self, table: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]) -> Any:
        import anyio

        loop = asyncio.get_running_loop()
        got = table.get(loop)
        if got is None:
            got = table[loop] = anyio.CapacityLimiter(self.total)
        return got

    async def run(self, fn: Callable[..., T], *args: Any, gone: Callable[[], Awaitable[bool]] | None = None) -> T:
        """``fn(*args)`` in a worker thread once one of the ``total`` places is free; its result or exception.

        ``gone``: asked once, after a wait for a place, whether the caller went away meanwhile (e.g. Starlette's
        ``Request.is_disconnected``); if so ``fn`` is not run and :class:`Abandoned` is raised, so searches
        abandoned in the queue do not take the threads of those still waited for (hostile review: a burst of
        disconnected searches all ran). A search that got its place at once is not asked."""
        import anyio.to_thread

        lim = self.limiter()
        if gone is None or lim.available_tokens >= 1:
            return await anyio.to_thread.run_sync(fn, *args, limiter=lim)
        await lim.acquire()
        try:
            if await gone():
                raise Abandoned("the caller went away while the search waited for a thread")
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._thread_limiter())
        finally:
            lim.release()
