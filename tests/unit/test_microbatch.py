"""MicroBatcher (issue 20): concurrent calls share batched runs, results go to their callers, errors to every
caller of the failing batch, and no call is lost or answered twice."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from scopekb.embedding.batching import MicroBatcher


def test_concurrent_calls_share_runs_and_get_their_own_results() -> None:
    sizes: list[int] = []

    def run(items: Sequence[int]) -> list[int]:
        sizes.append(len(items))
        time.sleep(0.02)  # a forward pass: callers arriving meanwhile wait for the next one
        return [x * 10 for x in items]

    b = MicroBatcher(run, max_batch=8)
    with ThreadPoolExecutor(32) as pool:
        out = list(pool.map(b, range(100)))
    assert out == [x * 10 for x in range(100)]
    assert sum(sizes) == 100 and b.items == 100 and b.batches == len(sizes)
    assert max(sizes) <= 8
    assert len(sizes) < 100  # some runs carried several calls


def test_an_error_reaches_every_caller_of_its_batch_and_later_calls_still_run() -> None:
    gate = threading.Event()
    calls = 0

    def run(items: Sequence[str]) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            gate.wait(2)  # hold the first run so the others queue behind it
            raise ValueError("model failed")
        return [s.upper() for s in items]

    b = MicroBatcher(run)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(b, "a")
        time.sleep(0.05)
        rest = [pool.submit(b, x) for x in ("b", "c", "d")]
        time.sleep(0.05)
        gate.set()
        with pytest.raises(ValueError, match="model failed"):
            first.result(5)
        assert [f.result(5) for f in rest] == ["B", "C", "D"]
    assert b("e") == "E"  # not stuck after an error


def test_a_wrong_result_count_is_an_error_not_a_silent_mismatch() -> None:
    b = MicroBatcher(lambda items: [1])
    assert b("x") == 1
    with ThreadPoolExecutor(2) as pool:
        gate = threading.Event()
        slow = MicroBatcher(lambda items: (gate.wait(1), [])[1])
        futs = [pool.submit(slow, i) for i in range(2)]
        gate.set()
        for f in futs:
            with pytest.raises(RuntimeError, match="results for"):
                f.result(5)
