"""Scoring contract: scores in [0, 1], higher is better, edge cases guarded (DESIGN §5)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scopekb.scoring import is_name_query, min_max, normalise_by_max, rrf_fusion, weighted_fusion

scores = st.lists(st.tuples(st.text(min_size=1, max_size=4),
                            st.floats(allow_nan=True, allow_infinity=True, width=32)), max_size=30)


def _ok(out: list[tuple[str, float]]) -> bool:
    return all(0.0 <= s <= 1.0 and not math.isnan(s) for _, s in out)


def test_empty_single_and_ties() -> None:
    assert normalise_by_max([]) == [] and weighted_fusion([], []) == [] and rrf_fusion([], []) == []
    assert min_max([("a", 3.0)]) == {"a": 1.0}
    assert min_max([("a", 2.0), ("b", 2.0)]) == {"a": 1.0, "b": 1.0}
    assert normalise_by_max([("a", 0.0)]) == [("a", 0.0)]


def test_weighted_fusion_uses_03_07_and_renormalises() -> None:
    kw = [("a", 10.0), ("b", 5.0), ("c", 0.0)]
    vec = [("c", 0.9), ("b", 0.8), ("a", 0.1)]
    out = dict(weighted_fusion(kw, vec))
    # min-max: kw a=1 b=.5 c=0; vec c=1 b=.875 a=0 -> a=.3 b=.7625 c=.7 ; /max
    assert math.isclose(out["b"], 1.0)
    assert math.isclose(out["a"], 0.3 / 0.7625)
    assert math.isclose(out["c"], 0.7 / 0.7625)


def test_one_list_empty() -> None:
    out = weighted_fusion([("a", 3.0), ("b", 1.0)], [])
    assert out[0] == ("a", 1.0) and out[1][1] == 0.0


def test_rrf_ranks() -> None:
    out = rrf_fusion([("a", 9), ("b", 8)], [("b", 0.9), ("c", 0.1)])
    assert out[0][0] == "b" and out[0][1] == 1.0


@given(scores, scores)
def test_fusions_always_in_range(kw, vec) -> None:
    assert _ok(weighted_fusion(kw, vec))
    assert _ok(rrf_fusion(kw, vec))
    assert _ok(normalise_by_max(kw))
    assert all(0.0 <= v <= 1.0 for v in min_max(kw).values())


@pytest.mark.parametrize(("query", "name"), [
    ("resultcallback", True), ("get_terminal_size", True), ("Context.invoke", True), ("fmt::format", True),
    ("  __init__ ", True), ("名前", True), ("parse headers", False), ("a\tb", False), ("123", False), ("_", False),
    ("foo()", False), ("x" * 201, False), ("", False)])
def test_a_name_query_is_one_word_with_a_letter(query: str, name: bool) -> None:
    assert is_name_query(query) is name
