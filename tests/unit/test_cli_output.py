"""Pure helpers of the CLI's text output (README newcomer review, 2026-12-01)."""

from __future__ import annotations

from scopekb_cli.main import score_labels


def test_scores_that_differ_never_print_alike_and_ties_are_marked() -> None:
    # max-normalised scores: the best is exactly 1, a close second printed 1.00 with two decimals
    assert score_labels([1.0, 0.996, 0.5]) == ["1.000", "0.996", "0.500"]
    assert score_labels([1.0, 0.87, 0.61]) == ["1.00", "0.87", "0.61"]
    assert score_labels([1.0, 1.0, 0.4]) == ["1.00 (tie)", "1.00 (tie)", "0.40"]
    assert score_labels([1.0, 0.9999991]) == ["1.000000", "0.999999"]
    assert score_labels([]) == []
