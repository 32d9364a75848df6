"""Batching within request limits, Retry-After parsing and backoff (scopekb.embedding.limits)."""

from __future__ import annotations

import email.utils
import random

import pytest

from scopekb.embedding.limits import backoff_delay, estimate_tokens, parse_retry_after, plan_batches


def _check_cover(batches: list[list[int]], n: int) -> None:
    assert [i for b in batches for i in b] == list(range(n)), "every position once, in order"
    assert all(batches), "no empty batch"


def test_batches_respect_the_2048_input_limit() -> None:
    batches = plan_batches([1] * 5000, max_inputs=2048, max_tokens=300_000)
    assert [len(b) for b in batches] == [2048, 2048, 904]
    _check_cover(batches, 5000)


def test_batches_respect_the_token_limit() -> None:
    counts = [100_000, 150_000, 60_000, 1, 299_999, 5]
    batches = plan_batches(counts, max_inputs=2048, max_tokens=300_000)
    _check_cover(batches, len(counts))
    for b in batches:
        assert sum(counts[i] for i in b) <= 300_000
    assert batches == [[0, 1], [2, 3], [4], [5]]


def test_an_input_over_the_token_limit_goes_alone() -> None:
    batches = plan_batches([10, 400_000, 10], max_inputs=10, max_tokens=300_000)
    assert batches == [[0], [1], [2]]


def test_exact_limits_fill_a_batch() -> None:
    assert plan_batches([150, 150, 1], max_inputs=10, max_tokens=300) == [[0, 1], [2]]
    assert plan_batches([1, 1, 1], max_inputs=3, max_tokens=3) == [[0, 1, 2]]


def test_no_inputs_no_batches_and_bad_limits_refused() -> None:
    assert plan_batches([], max_inputs=1, max_tokens=1) == []
    with pytest.raises(ValueError):
        plan_batches([1], max_inputs=0, max_tokens=1)


def test_estimate_tokens_over_counts_plain_text() -> None:
    assert estimate_tokens("a", 2.5) == 1
    assert estimate_tokens("hello world", 2.5) == 5  # 11 bytes / 2.5 -> 4.4 -> 5
    assert estimate_tokens("é" * 10, 2.5) == 8  # 20 UTF-8 bytes


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"Retry-After": " 0 "}, 0.0),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"Retry-After-Ms": "nonsense", "Retry-After": "2"}, 2.0),
        ({"Retry-After": "-1"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "inf"}, None),
        ({"Retry-After": "soon"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str] | None, expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    future = email.utils.formatdate(now + 42, usegmt=True)
    past = email.utils.formatdate(now - 42, usegmt=True)
    assert parse_retry_after({"Retry-After": future}, now=now) == pytest.approx(42, abs=1)
    assert parse_retry_after({"Retry-After": past}, now=now) == 0.0


def test_backoff_grows_and_is_capped() -> None:
    rng = random.Random(7)
    for attempt in range(10):
        d = min(8.0, 0.5 * 2**attempt)
        for _ in range(20):
            assert d / 2 <= backoff_delay(attempt, 0.5, 8.0, rng) <= d
