"""How many searches run in threads at once (issue 20, :mod:`scopekb.searchlimit`)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from scopekb.searchlimit import EMBEDDED_SEARCH_THREADS_PER_CPU, Abandoned, SearchLimiter, _cpus, search_threads
from scopekb.settings import Settings


def test_search_threads_default_per_profile_and_setting_wins() -> None:
    s = Settings(http={"worker_threads": 40})
    assert search_threads(s, embedded=False) == 40
    assert search_threads(s, embedded=True) == min(40, EMBEDDED_SEARCH_THREADS_PER_CPU * _cpus())
    assert search_threads(Settings(http={"worker_threads": 3}), embedded=True) == min(
        3, EMBEDDED_SEARCH_THREADS_PER_CPU * _cpus())
    chosen = Settings(http={"worker_threads": 40}, query={"search_threads": 5})
    assert search_threads(chosen, embedded=True) == 5
    assert search_threads(chosen, embedded=False) == 5


def test_a_limiter_of_no_thread_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SearchLimiter(0)


def test_at_most_total_bodies_run_at_once_and_every_caller_gets_its_own_answer() -> None:
    lim = SearchLimiter(2)
    running = 0
    most = 0
    guard = threading.Lock()

    def body(i: int) -> int:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with guard:
            running -= 1
        return i * i

    async def main() -> list[int]:
        return await asyncio.gather(*(lim.run(body, i) for i in range(12)))

    assert asyncio.run(main()) == [i * i for i in range(12)]
    assert most == 2
    # a second event loop gets its own limiter of the same size (TestClient and uvicorn each run their own loop)
    most = 0
    assert asyncio.run(main()) == [i * i for i in range(12)]
    assert most == 2


def test_a_body_that_raises_raises_in_its_caller_and_frees_its_place() -> None:
    lim = SearchLimiter(1)

    def bad() -> None:
        raise KeyError("boom")

    async def main() -> str:
        with pytest.raises(KeyError, match="boom"):
            await lim.run(bad)
        return await asyncio.wait_for(lim.run(str, 7), timeout=10)  # the one place was given back

    assert asyncio.run(main()) == "7"


def test_a_caller_gone_while_it_waited_is_not_run_and_its_place_goes_to_the_next() -> None:
    """Hostile review (issue 20): searches whose clients disconnected in the queue all ran. With ``gone``, a caller
    that waited is asked once it has a place; gone, its body is not run (Abandoned), and the place is released for
    the next. A caller that gets a place at once is not asked."""
    lim = SearchLimiter(1)
    ran: list[str] = []
    asked: list[str] = []
    release = threading.Event()

    def body(name: str) -> str:
        if name == "first":
            assert release.wait(10)
        ran.append(name)
        return name

    def gone_as(name: str, answer: bool):  # noqa: ANN202
        async def gone() -> bool:
            asked.append(name)
            return answer
        return gone

    async def main() -> list[object]:
        first = asyncio.create_task(lim.run(body, "first", gone=gone_as("first", False)))
        await asyncio.sleep(0.05)
        queued = [asyncio.create_task(lim.run(body, n, gone=gone_as(n, n == "gone"))) for n in ("gone", "kept")]
        await asyncio.sleep(0.05)
        release.set()
        return list(await asyncio.gather(first, *queued, return_exceptions=True))

    got = asyncio.run(main())
    assert got[0] == "first" and isinstance(got[1], Abandoned) and got[2] == "kept"
    assert ran == ["first", "kept"]
    assert asked == ["gone", "kept"]  # the first had its place at once
