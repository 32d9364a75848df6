"""The 3-gram candidate filter of exact/regex search on OpenSearch (:func:`scopekb.fields.trigram_clauses`,
mapping version 9): every document holding the literals passes it, whatever the budget."""

from __future__ import annotations

import random

from scopekb import fields as F


def _grams(clause: dict) -> set[str]:
    q = clause.get("term") or clause["terms"]
    v = q[F.CONTENT_TRI]
    return set(v) if isinstance(v, list) else {v}


def _passes(text: str, clauses: list[dict]) -> bool:
    """What OpenSearch does with the clauses on a document whose content is ``text`` (3-grams of code points)."""
    have = {text[i:i + 3] for i in range(len(text) - 2)}
    return all(_grams(c) & have for c in clauses)


def test_grams_of_each_literal_and_short_literals() -> None:
    assert F.trigram_clauses(["abcd", "xy"], True) == [{"term": {F.CONTENT_TRI: "abc"}},
                                                       {"term": {F.CONTENT_TRI: "bcd"}}]
    assert F.trigram_clauses(["ab"], True) == []
    # code points, as Lucene's ngram tokenizer cuts them (a supplementary character is one)
    assert _grams(F.trigram_clauses(["a\U0001F600b"], True)[0]) == {"a\U0001F600b"}


def test_case_variants_include_letters_that_fold_to_ascii() -> None:
    (c,) = F.trigram_clauses(["k-S"], False)
    assert _grams(c) == {"k-S", "k-s", "K-S", "K-s", "\u212a-S", "\u212a-s", "k-\u017f", "K-\u017f", "\u212a-\u017f"}
    assert _passes("the \u212aelvin scale", F.trigram_clauses(["kelvin"], False))
    assert not _passes("the \u212aelvin scale", F.trigram_clauses(["kelvin"], True))


def test_superset_under_any_budget() -> None:
    rng = random.Random(19)
    alphabet = "abcKk_(\\*?\u212a\u00e9 \n"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        lits = []
        for _ in range(rng.randint(1, 6)):
            if len(text) >= 3:
                i = rng.randrange(len(text) - 2)
                lits.append(text[i:i + rng.randint(3, 60)])
        sensitive = rng.random() < 0.5
        if not sensitive:  # ASCII literals (LiteralQuery), in any case
            lits = [x.swapcase() if rng.random() < 0.5 else x for x in lits if x.isascii()]
        budget = rng.choice([1, 3, 8, 40, 512])
        clauses = F.trigram_clauses(lits, sensitive, budget)
        assert _passes(text, clauses), (text, lits, sensitive, budget)
        assert sum(len(_grams(c)) for c in clauses) <= budget


def test_long_literal_stays_within_the_clause_limit() -> None:
    lit = "".join(chr(0x4E00 + i) for i in range(5000))
    clauses = F.trigram_clauses([lit], True)
    assert 2 <= len(clauses) <= F.MAX_TRIGRAM_CLAUSES
    assert _grams(clauses[0]) == {lit[:3]} and _grams(clauses[-1]) == {lit[-3:]}
    assert not F.trigram_clauses([lit], True, 0)
