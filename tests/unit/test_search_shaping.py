"""Hit shaping of ranked searches (issue 20): a hybrid search ranks up to 2 × depth candidates but builds hits and
their reasons for the ``max_results`` it returns only, with the same hits, order, scores and reasons as before
(the best ``max_results`` of the fused list that pass ``min_score``). Fake chunk store: pure ranking logic."""

from __future__ import annotations

from typing import Any

import pytest

from scopekb import fields as F
from scopekb import scoring
from scopekb import search as S
from scopekb.models import SearchMode, SearchRequest
from scopekb.settings import QuerySettings
from scopekb.stores.base import ScopeFilter

N = 40  # candidates per list: the depth of a 10-result search (candidate_factor 4)


def _doc(n: int) -> dict[str, Any]:
    return {F.PATH: f"p{n}.py", F.START_LINE: 1, F.END_LINE: 3, F.CHUNK_INDEX: 0, F.SYMBOL: f"retry_{n}",
            F.CONTENT: f"def retry_{n}(upload):\n    return upload{n}\n", F.AGENT_NAME: "a", F.CONTEXT_ID: "c"}


class _Store:
    """Keyword list p0..p39 by descending BM25, vector list the reverse half-overlapping; vectors of dim 4."""

    dimension = 4

    def index_dimension(self) -> int:
        return self.dimension

    def keyword_search(self, query, flt, size, offset=0, boosts=None):  # noqa: ANN001, ANN201
        return [(f"c{n}", 20.0 - n * 0.4, _doc(n)) for n in range(N)][:size]

    def vector_search(self, vector, flt, k):  # noqa: ANN001, ANN201
        return [(f"c{n}", 0.99 - i * 0.01, _doc(n)) for i, n in enumerate(range(N // 2, N + N // 2))][:k]


@pytest.mark.parametrize("min_score", [0.0, 0.3])
def test_hybrid_builds_reasons_for_the_returned_hits_only(monkeypatch: pytest.MonkeyPatch, min_score: float) -> None:
    calls: list[str] = []
    real = S.matched_fields

    def counted(terms: Any, d: dict[str, Any], content: str | None = None) -> Any:
        calls.append(d[F.PATH])
        return real(terms, d, content)

    monkeypatch.setattr(S, "matched_fields", counted)
    cfg = QuerySettings()
    store = _Store()
    req = SearchRequest(query="retry upload", mode=SearchMode.hybrid, max_results=10, min_score=min_score)
    resp = S.run_search(store, req, ScopeFilter("a", ("c",)), cfg, embed=lambda q: [0.1, 0.2, 0.3, 0.4])  # type: ignore[arg-type]

    depth = 10 * cfg.candidate_factor
    kw = [(i, s) for i, s, _ in store.keyword_search("", None, depth)]
    vec = [(i, s) for i, s, _ in store.vector_search([], None, depth)]
    fused = scoring.weighted_fusion(kw, vec, cfg.keyword_weight, cfg.vector_weight)
    want = [(i, round(s, 6)) for i, s in fused if round(s, 6) >= min_score][:10]
    assert len(fused) > 10  # more candidates than hits: the case the change is about
    assert [(h._chunk_id, h.score) for h in resp.hits] == want
    assert calls == [h.path for h in resp.hits]  # one reason per returned hit, none for the others
    kw_rank = {i: n for n, (i, _) in enumerate(kw, 1)}
    vec_rank = {i: n for n, (i, _) in enumerate(vec, 1)}
    for h in resp.hits:
        assert h.why is not None
        assert h.why.keyword_rank == kw_rank.get(h._chunk_id) and h.why.vector_rank == vec_rank.get(h._chunk_id)
        assert {m.field: m.terms for m in h.why.matched} == {"symbol": ["retry"], "content": ["retry", "upload"]}
