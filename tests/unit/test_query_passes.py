"""Length groups of gathered query embeddings (issue 20): bounded padding, every position once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scopekb.embedding.local import length_groups


def test_example() -> None:
    assert length_groups([9, 9, 256, 9], 1024) == [[2], [0, 1, 3]]
    assert length_groups([], 1024) == []


@given(st.lists(st.integers(1, 256), max_size=40), st.integers(1, 2048))
def test_groups_bound_padding_and_cover_every_position(lengths: list[int], cap: int) -> None:
    groups = length_groups(lengths, cap)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        width = max(lengths[i] for i in g)
        assert len(g) == 1 or width * len(g) <= cap
        assert all(2 * lengths[i] >= width for i in g)
