"""Result shaping for agents (issue 22): one result per file, the token budget of the text answer, and the reason
each hit gives.

Pure logic over hand-made stored chunks and responses; the stores are exercised by the integration and e2e tests.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scopekb import fields as F
from scopekb.chunking.tokens import EstimateCounter, HFTokenizerCounter
from scopekb.models import (
    MAX_ANSWER_TOKENS,
    MIN_ANSWER_TOKENS,
    HitReason,
    SearchHit,
    SearchMode,
    SearchRequest,
    SearchResponse,
    SearchScope,
)
from scopekb.render import is_unsafe, render_text
from scopekb.search import group_by_file, matched_fields
from scopekb.stores.sqlite.text import query_tokens


def _minilm() -> Any:
    try:
        return HFTokenizerCounter.minilm()
    except ImportError:  # the [local] extra is not installed: the documented fallback
        return EstimateCounter()


COUNTERS = [EstimateCounter(), _minilm()]


WHY = HitReason(fusion="keyword", keyword_rank=1, keyword_score=1.0)


def chunk(path: str, start: int, n_lines: int, score: float, ctx: str = "c", text: str | None = None,
          match_lines: list[int] | None = None) -> SearchHit:
    body = text if text is not None else "\n".join(f"line {path} {start + i}" for i in range(n_lines))
    return SearchHit(path=path, start_line=start, end_line=start + n_lines - 1, content=body, score=score,
                     chunk_index=0, agent_name="a", context_id=ctx, source_id="s", why=WHY, match_lines=match_lines)


def test_grouping_merges_touching_chunks_and_lists_the_rest() -> None:
    ranked = [chunk("a.py", 10, 5, 0.9, match_lines=[11]), chunk("b.py", 1, 3, 0.8),
              chunk("a.py", 15, 5, 0.7, match_lines=[19, 16]), chunk("a.py", 12, 6, 0.6), chunk("a.py", 40, 3, 0.5),
              chunk("a.py", 43, 2, 0.4), chunk("a.py", 100, 2, 0.45)]
    hits = group_by_file(ranked, 5)
    assert [h.path for h in hits] == ["a.py", "b.py"]
    a = hits[0]
    assert (a.start_line, a.end_line, a.chunks, a.score) == (10, 19, 3, 0.9)
    assert a.content.split("\n") == [f"line a.py {n}" for n in range(10, 20)] and a.match_lines == [11, 16, 19]
    assert [(r.start_line, r.end_line, r.score) for r in a.other_ranges] == [(40, 44, 0.5), (100, 101, 0.45)]
    assert hits[1].chunks == 1 and hits[1].other_ranges == []


def test_grouping_keeps_contexts_apart_and_stops_at_size() -> None:
    ranked = [chunk("a.py", 1, 2, 0.9, ctx="c1"), chunk("a.py", 1, 2, 0.8, ctx="c2"), chunk("b.py", 1, 2, 0.7),
              chunk("a.py", 3, 2, 0.6, ctx="c1")]
    hits = group_by_file(ranked, 2)
    assert [(h.path, h.context_id, h.chunks) for h in hits] == [("a.py", "c1", 2), ("a.py", "c2", 1)]


def test_chunk_whose_content_is_not_its_lines_is_not_merged() -> None:
    odd = chunk("a.py", 5, 3, 0.8, text="only one line")
    hits = group_by_file([chunk("a.py", 1, 4, 0.9), odd], 5)
    assert hits[0].chunks == 1 and hits[0].content == chunk("a.py", 1, 4, 0.9).content
    assert [(r.start_line, r.end_line) for r in hits[0].other_ranges] == [(5, 7)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a.py", "b.py", "c/d.md", "e.txt"]), st.sampled_from(["c1", "c2"]),
                          st.integers(1, 60), st.integers(1, 12), st.floats(0, 1)), max_size=40),
       st.integers(1, 6))
def test_grouped_results_never_show_one_file_twice(items: list[tuple[str, str, int, int, float]], size: int) -> None:
    ranked = sorted((chunk(p, s, n, sc, ctx=c) for p, c, s, n, sc in items), key=lambda h: -h.score)
    hits = group_by_file(ranked, size)
    keys = [(h.context_id, h.path) for h in hits]
    assert len(keys) == len(set(keys)) and len(hits) <= size
    assert len(hits) == min(size, len({(c, p) for p, c, *_ in items}))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    for h in hits:  # the block covers the best chunk; other ranges never overlap or touch it
        for r in h.other_ranges:
            assert r.end_line + 1 < h.start_line or r.start_line > h.end_line + 1
        assert len(h.content.split("\n")) == h.end_line - h.start_line + 1


def test_matched_fields_follow_the_index_analysis() -> None:
    d = {F.SYMBOL: "RetryPolicy.retry_upload", F.SIGNATURE: "def retry_upload(self, blob)",
         F.PATH: "src/uploads/retry.py", F.CONTENT: "def retry_upload(self, blob):\n    return send(blob)"}
    got = {m.field: m.terms for m in matched_fields(query_tokens("retry blob Upload missing"), d)}
    assert got == {"symbol": ["retry", "upload"], "signature": ["retry", "blob", "upload"],
                   "path": ["retry"], "content": ["retry", "blob", "upload"]}
    assert matched_fields(query_tokens("nothing"), d) == []


# ------------------------------------------------------------------------------------------- token budget


def hit(n: int, content: str, path: str | None = None) -> SearchHit:
    lines = content.count("\n") + 1
    return SearchHit(path=path or f"src/m{n}.py", start_line=n * 100, end_line=n * 100 + lines - 1, content=content,
                     score=round(1 - n / 100, 4), chunk_index=0, agent_name="a", context_id="c",
                     why=HitReason(fusion="weighted 0.3×keyword + 0.7×vector", keyword_rank=n, vector_rank=n + 1,
                                   keyword_score=0.5, vector_score=0.7))


def response(hits: list[SearchHit], query: str = "retry upload") -> SearchResponse:
    return SearchResponse(query=query, mode=SearchMode.hybrid, hits=hits, took_ms=1.0, group_by="file",
                          scope=SearchScope(agent_name="a", context_ids=None))


def fenced(text: str) -> tuple[list[str], list[str]]:
    """(lines outside fences, contents inside fences); every fence closed."""
    m = re.search(r"^<<<chunk-([0-9a-f]{12})$", text, re.M)
    if not m:
        return [ln for ln in text.split("\n") if ln], []
    opening, closing = f"<<<chunk-{m.group(1)}", f"chunk-{m.group(1)}>>>"
    outside, inside, cur, inner = [], [], [], False
    for line in text.split("\n"):
        if not inner and line == opening:
            inner, cur = True, []
        elif inner and line == closing:
            inner = False
            inside.append("\n".join(cur))
        elif inner:
            cur.append(line)
        elif line:
            outside.append(line)
    assert not inner, "a fence was left open"
    return outside, inside


CODE = st.lists(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80), min_size=1,
                max_size=60).map("\n".join)


@settings(max_examples=120, deadline=None)
@given(contents=st.lists(CODE, min_size=0, max_size=8), budget=st.integers(MIN_ANSWER_TOKENS, 3000),
       counter=st.sampled_from(COUNTERS), query=st.text(min_size=1, max_size=300))
@example(contents=["x = 1\n" * 400] * 3, budget=MIN_ANSWER_TOKENS, counter=COUNTERS[1], query="x")
def test_text_answer_never_exceeds_max_tokens(contents: list[str], budget: int, counter: Any, query: str) -> None:
    resp = response([hit(n, c) for n, c in enumerate(contents, 1)], query=query)
    text = render_text(resp, budget, counter)
    assert counter.count(text) <= budget
    outside, inside = fenced(text)
    assert not any(is_unsafe(c) for ln in outside for c in ln)
    for body, h in zip(inside, resp.hits, strict=False):  # best first, each cut at a line boundary
        assert h.content == body or h.content.startswith(body + "\n") or (body == "" and h.content.startswith("\n"))


def test_budget_cuts_at_a_line_boundary_and_names_what_was_cut() -> None:
    counter = COUNTERS[1]
    big = "\n".join(f"    value_{i} = compute(value_{i - 1}, {i})" for i in range(1, 200))
    resp = response([hit(1, "def small():\n    return 1"), hit(2, big), hit(3, "def tail():\n    pass")])
    text = render_text(resp, 600, counter)
    assert counter.count(text) <= 600
    outside, inside = fenced(text)
    assert outside[0].startswith("3 files for 'retry upload' (mode hybrid; agent 'a', every context")
    assert inside[0] == "def small():\n    return 1" and big.startswith(inside[1] + "\n")
    kept = inside[1].count("\n") + 1
    cut = next(ln for ln in outside if ln.startswith("[2] cut at the token budget"))
    assert f"lines {200 + kept}-{200 + 198} not shown" in cut
    assert outside[-1].startswith("Budget: 600 tokens") and "1 result omitted: [3] src/m3.py:300-301" in outside[-1]
    assert any(ln.startswith("why: keyword #1 (0.50), vector #2 (0.70); fusion weighted") for ln in outside)
    whole = render_text(resp)  # no budget: everything, no budget line
    assert big in whole and "Budget:" not in whole


def test_empty_answer_names_mode_and_scope() -> None:
    resp = SearchResponse(query="q", mode=SearchMode.keyword, hits=[], took_ms=1.0,
                          scope=SearchScope(agent_name="a", context_ids=["c1", "c2"]))
    assert render_text(resp) == "No results for 'q' (mode keyword; agent 'a', contexts 'c1', 'c2')."
    long_query = response([], query="w " * 2000)
    assert COUNTERS[1].count(render_text(long_query, MIN_ANSWER_TOKENS, COUNTERS[1])) <= MIN_ANSWER_TOKENS


@pytest.mark.parametrize("bad", [0, MIN_ANSWER_TOKENS - 1, MAX_ANSWER_TOKENS + 1])
def test_max_tokens_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        SearchRequest(query="x", max_tokens=bad)
