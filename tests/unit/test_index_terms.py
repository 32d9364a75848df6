"""``index_terms_in`` (the hit-reason check of :func:`scopekb.search.matched_fields`) answers exactly what a full
index-time analysis answers: ``t in set(index_tokens(text))`` for every query term, on ASCII and other text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scopekb.stores.sqlite.text import index_terms_in, index_tokens, query_tokens

_ASCII = st.text(alphabet=st.sampled_from(list("abcXYZ_019 .-(\n")), max_size=60)
_ANY = st.text(alphabet=st.sampled_from(list("abcXYZ_019 .-(\nßİΣσςéÉ\u0301")), max_size=60)


def _expected(text: str, terms: list[str]) -> list[str]:
    have = set(index_tokens(text))
    return [t for t in terms if t in have]


@settings(max_examples=600, deadline=None)
@given(text=_ASCII, query=_ASCII, extra=st.lists(_ASCII, max_size=3))
def test_same_answer_as_the_full_analysis_on_ascii(text: str, query: str, extra: list[str]) -> None:
    terms = query_tokens(query) + [t.lower() for t in extra]
    terms += [p for t in index_tokens(text)[:5] for p in (t, t[1:], t[:-1])]  # tokens, near misses
    assert index_terms_in(text, terms) == _expected(text, terms)


@settings(max_examples=300, deadline=None)
@given(text=_ANY, query=_ANY)
def test_same_answer_as_the_full_analysis_on_other_text(text: str, query: str) -> None:
    terms = query_tokens(query) + index_tokens(text)[:5]
    assert index_terms_in(text, terms) == _expected(text, terms)


def test_examples() -> None:
    text = "def parseRFC3339_date(HTTPServer): return retry_upload"
    assert index_terms_in(text, ["parse", "rfc", "3339", "date", "httpserver", "http", "server", "retry",
                                 "retry_upload", "upload", "pload", "parserfc3339_date", "def"]) == [
        "parse", "rfc", "3339", "date", "httpserver", "retry", "retry_upload", "upload", "parserfc3339_date", "def"]
    assert index_terms_in("", ["a"]) == [] and index_terms_in("a", []) == []
    assert index_terms_in(12345, ["12345"]) == ["12345"]
