"""``scopekb eval`` on a set of one query says it has no interval (README newcomer run: "1.00 ±0.00" and
"intervals 0.00 wide on average" read as exact figures)."""

from __future__ import annotations

from scopekb_cli.main import MIN_EVAL_QUERIES, small_sample_warning


def _rep(queries: int, lo: float, hi: float) -> dict:
    met = {x: {"mean": 1.0, "ci95": [lo, hi]} for x in ("ndcg10", "mrr10", "hit1", "hit10")}
    return {"sets": {"history": {"queries": queries, "modes": {"keyword": met}}}}


def test_one_query_has_no_interval() -> None:
    warn = small_sample_warning(_rep(1, 1.0, 1.0))
    assert warn is not None and "history 1 (no interval from one query)" in warn and "0.00 wide" not in warn


def test_a_small_set_names_its_mean_interval_width_and_a_large_one_nothing() -> None:
    warn = small_sample_warning(_rep(40, 0.5, 0.9))
    assert warn is not None and "history 40 (95% intervals 0.40 wide on average)" in warn
    assert small_sample_warning(_rep(MIN_EVAL_QUERIES, 0.5, 0.9)) is None
