"""Index batches (:func:`scopekb.indexing.batch_bounds`): every path in exactly one batch, in order, the first
batches smaller so writing starts early (issue 20), none larger than the configured size."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scopekb.indexing import batch_bounds


@given(n=st.integers(0, 3000), size=st.integers(1, 500))
def test_batches_cover_every_path_once_in_order(n: int, size: int) -> None:
    b = batch_bounds(n, size)
    assert [i for s, e in b for i in range(s, e)] == list(range(n))
    assert all(0 < e - s <= size for s, e in b)
    schedule = [max(1, size // 8), max(1, size // 4), max(1, size // 2)] + [size] * len(b)
    assert [e - s for s, e in b][:-1] == schedule[:max(0, len(b) - 1)]  # size/8, /4, /2, then size; last: the rest


def test_examples() -> None:
    assert batch_bounds(120, 200) == [(0, 25), (25, 75), (75, 120)]
    assert batch_bounds(1000, 200)[:5] == [(0, 25), (25, 75), (75, 175), (175, 375), (375, 575)]
    assert batch_bounds(0, 200) == []
    assert batch_bounds(3, 1) == [(0, 1), (1, 2), (2, 3)]
