"""Request fields that only some modes honour are refused under the others, and an empty ``ref`` is refused, in
the one request model REST, MCP, the CLI and the console share (hostile review, stop 41: ``--mode exact
--prefix`` searched without the prefix rule; ``"ref": ""`` searched every ref over REST while ``read`` refused
it)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scopekb.models import ReadRequest, SearchMode, SearchRequest


@pytest.mark.parametrize(("fields", "why"), [
    ({"mode": "exact", "symbol_match": "prefix"}, "symbol_match 'prefix' applies to mode 'symbol' only"),
    ({"mode": "hybrid", "symbol_match": "prefix"}, "symbol_match 'prefix' applies to mode 'symbol' only"),
    ({"mode": "keyword", "fusion": "rrf"}, "fusion 'rrf' applies to mode 'hybrid' only"),
    ({"mode": "vector", "fusion": "rrf"}, "fusion 'rrf' applies to mode 'hybrid' only"),
    ({"mode": "keyword", "case_sensitive": True}, "keyword search ignores case"),
    ({"mode": "hybrid", "case_sensitive": True}, "hybrid search ignores case"),
    ({"ref": ""}, "ref must not be empty"),
    ({"ref": " \t"}, "ref must not be empty"),
])
def test_refused_naming_the_field(fields: dict[str, object], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        SearchRequest(query="x", **fields)


@pytest.mark.parametrize("fields", [
    {"mode": "symbol", "symbol_match": "prefix"}, {"mode": "hybrid", "fusion": "rrf"},
    {"mode": "keyword", "case_sensitive": False}, {"mode": "exact", "case_sensitive": True},
    {"mode": "regex", "case_sensitive": False}, {"mode": "symbol", "case_sensitive": True}, {"ref": "main"},
])
def test_the_fields_each_mode_honours_are_kept(fields: dict[str, object]) -> None:
    req = SearchRequest(query="x", **fields)
    assert all(getattr(req, k) == (SearchMode(v) if k == "mode" else v) for k, v in fields.items())


def test_read_refuses_an_empty_ref_with_the_same_rule() -> None:
    with pytest.raises(ValidationError, match="ref must not be empty; omit it to read"):
        ReadRequest(path="a.py", blob_sha="0" * 40, ref="  ")
    assert ReadRequest(path="a.py", blob_sha="0" * 40, ref="v1").ref == "v1"


@pytest.mark.parametrize("mode", ["exact", "regex"])
def test_whitespace_alone_is_a_line_mode_query(mode: str) -> None:
    assert SearchRequest(query="\t", mode=mode).query == "\t"


@pytest.mark.parametrize("mode", ["keyword", "vector", "hybrid", "symbol"])
def test_a_blank_query_is_refused_at_the_query_field(mode: str) -> None:
    with pytest.raises(ValidationError) as e:
        SearchRequest(query=" \t", mode=mode)
    assert [err["loc"] for err in e.value.errors()] == [("query",)] and "blank" in str(e.value)


def test_languages_are_matched_as_the_index_names_them_and_unknown_ones_are_refused() -> None:
    """Hostile review (L2): ``["Python"]`` and ``["klingon"]`` matched nothing and said nothing."""
    assert SearchRequest(query="x", languages=["Python", " GO "]).languages == ["python", "go"]
    with pytest.raises(ValidationError, match="unknown language 'klingon'; the index knows: bash, c, "):
        SearchRequest(query="x", languages=["python", "klingon"])
