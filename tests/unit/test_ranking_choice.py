"""Per-context keyword field boosts and the optional reranker stage (issue 21), on planted sets and fake stores.

The boosts test plants a set where the flat boosts (1/1/1/1) put every target first and the default boosts put
it last: ``choose_boosts`` must pick the flat boosts with an interval above 0, and a keyword search of that one
context must then pass them to the store, while another context keeps the default. The reranker tests use a real
HTTP stub of an OpenAI-compatible rerank endpoint (port 0) and check that a configured reranker is used only for a
context whose recorded choice applied it, that it is off by default, and that a failing endpoint keeps the fused
order.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from scopekb import evalsets, rerank, tuning
from scopekb import fields as F
from scopekb.evalsets import Target
from scopekb.evaluation import EvalSet, Lists
from scopekb.models import SearchMode, SearchRequest, Source
from scopekb.search import run_search
from scopekb.settings import QuerySettings
from scopekb.stores.base import ScopeFilter
from tests.unit.test_evalsets import _Records

FLAT = (1.0, 1.0, 1.0, 1.0)


def _hit(path: str) -> dict[str, Any]:
    return {"path": path, "start_line": 1, "end_line": 10,
            "text": f"{path}\n" + ("the wanted code" if path.startswith("t") else "other code")}


def _planted_boost_set(n: int = 40) -> EvalSet:
    """The target is first with the flat boosts and last of ten with the default boosts."""
    queries, lists = [], []
    for i in range(n):
        target = f"t{i}.py"
        others = [f"o{i}_{j}.py" for j in range(9)]
        hits = {f"{p}#0": _hit(p) for p in [target, *others]}
        default = [(f"{p}#0", 9.0 - j * 0.1) for j, p in enumerate(others)] + [(f"{target}#0", 1.0)]
        flat = [(f"{target}#0", 9.0)] + [(f"{p}#0", 8.0 - j * 0.1) for j, p in enumerate(others)]
        by = {tuple(b): default for b in tuning.BOOST_CANDIDATES}
        by[FLAT] = flat
        queries.append(evalsets.EvalQuery("docstring", f"query {i} words here", [Target(target, 1, 10)]))
        lists.append(Lists(keyword=default, vector=[], hits=hits, keyword_by_boosts=by))
    return EvalSet("docstring", queries, lists)


class _Store:
    """Fake chunk store (pure ranking logic): ``t.py`` ranks first only with the flat boosts; the vector list
    puts ``a.py`` first."""

    dimension = 4

    def index_dimension(self) -> int:  # the live index holds vectors of this dimension
        return self.dimension

    def __init__(self) -> None:
        self.boosts: list[Any] = []

    @staticmethod
    def _doc(path: str) -> dict[str, Any]:
        return {F.PATH: path, F.START_LINE: 1, F.END_LINE: 10, F.CHUNK_INDEX: 0,
                F.CONTENT: "the wanted code" if path == "t.py" else "other code",
                F.AGENT_NAME: "a", F.CONTEXT_ID: "c"}

    def keyword_search(self, query, flt, size, offset=0, boosts=None):  # noqa: ANN001, ANN201
        self.boosts.append(boosts)
        paths = ["t.py", "a.py", "b.py"] if boosts == FLAT else ["a.py", "b.py", "t.py"]
        return [(p, 3.0 - n, self._doc(p)) for n, p in enumerate(paths)][:size]

    def vector_search(self, vector, flt, k):  # noqa: ANN001, ANN201
        return [(p, 0.9 - n * 0.1, self._doc(p)) for n, p in enumerate(["a.py", "b.py", "t.py"])][:k]


def _src(context: str = "c") -> Source:
    return Source(agent_name="a", context_id=context, repo_url="https://example.org/r.git", webhooks=False,
                  id="src_1")


def test_planted_boost_set_makes_the_boost_choice_follow_it() -> None:
    es = _planted_boost_set()
    choice = tuning.choose_boosts([es])
    assert choice["applied"] and tuple(choice["boosts"]) == FLAT
    assert choice["ci95"][0] > 0 and choice["ndcg10"] == pytest.approx(1.0)
    assert choice["default_ndcg10"] < 0.4


def test_no_boost_choice_without_a_significant_gain() -> None:
    es = _planted_boost_set(40)
    for ls in es.lists[:19]:  # the flat boosts lose on 19 queries and win on 21: a gain whose interval holds 0
        default = ls.keyword
        ls.keyword = ls.keyword_by_boosts[FLAT]
        ls.keyword_by_boosts = {b: ls.keyword for b in ls.keyword_by_boosts}
        ls.keyword_by_boosts[FLAT] = default
    choice = tuning.choose_boosts([es])
    assert tuple(choice["boosts"]) == FLAT and not choice["applied"]
    assert choice["ci95"][0] <= 0 <= choice["ci95"][1] and "not significant" in choice["reason"]
    for ls in es.lists:  # every candidate ties: the default stays
        ls.keyword_by_boosts = {b: ls.keyword for b in ls.keyword_by_boosts}
    assert tuple(tuning.choose_boosts([es])["boosts"]) == F.KEYWORD_BOOSTS


def test_recorded_boosts_change_keyword_search_of_that_context_only() -> None:
    records = _Records()
    es = _planted_boost_set()
    choice = {**tuning.choose([es], QuerySettings()), "keyword_boosts": tuning.choose_boosts([es])}
    assert not choice["applied"]  # keyword-only lists: no fusion choice, the boosts alone
    tuning.record_choice(records, _src(), choice, "f" * 40)  # type: ignore[arg-type]
    store = _Store()
    req = SearchRequest(query="find t", mode=SearchMode.keyword, max_results=3)
    tuned = run_search(store, req, ScopeFilter("a", ("c",)), QuerySettings(), records=records)  # type: ignore[arg-type]
    other = run_search(store, req, ScopeFilter("a", ("d",)), QuerySettings(), records=records)  # type: ignore[arg-type]
    assert tuned.hits[0].path == "t.py" and other.hits[0].path == "a.py"
    assert store.boosts == [FLAT, None]
    assert "keyword boosts 1/1/1/1" in tuning.describe(tuning.get_choice(records, "a", "c"))  # type: ignore[arg-type]


def test_keyword_fields_validate_boosts() -> None:
    assert F.keyword_fields() == ["symbol^5", "signature^3", "content^1", "path.text^2"]
    assert F.keyword_fields((1, 0, 2, 0)) == ["symbol^1", "content^2"]
    for bad in ((0, 0, 0, 0), (1, 2, 3), (-1, 1, 1, 1), (float("nan"), 1, 1, 1)):
        with pytest.raises(ValueError):
            F.keyword_fields(bad)


class _RerankStub:
    """An OpenAI-compatible rerank endpoint on a free port: scores 1.0 for documents holding ``prefer``, else 0."""

    def __init__(self, prefer: str, fail: bool = False) -> None:
        self.calls: list[dict] = []
        stub = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.calls.append({"path": self.path, **body})
                if fail:
                    self.send_response(503)
                    self.end_headers()
                    return
                res = [{"index": n, "relevance_score": 1.0 if prefer in d else 0.0}
                       for n, d in enumerate(body["documents"])]
                data = json.dumps({"results": res}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Any:
    s = _RerankStub("wanted")
    yield s
    s.close()


def _tuned_for_rerank(records: _Records, cfg: QuerySettings) -> dict:
    es = _planted_boost_set(12)
    for ls in es.lists:  # vector lists like the keyword lists: the target last, so the fusion ranks it last
        ls.vector = [(i, 0.9 - n * 0.01) for n, (i, _) in enumerate(ls.keyword)]
    choice = {**tuning.choose([es], cfg), "rerank": tuning.choose_rerank([es], cfg, rerank.for_settings(cfg))}
    tuning.record_choice(records, _src(), choice, "f" * 40)  # type: ignore[arg-type]
    return choice


def test_reranker_is_off_by_default_and_used_only_where_it_won(stub: _RerankStub) -> None:
    assert QuerySettings().rerank == "off" and rerank.for_settings(QuerySettings()) is None
    cfg = QuerySettings(rerank="http", rerank_url=stub.url, rerank_model="m")
    records = _Records()
    choice = _tuned_for_rerank(records, cfg)
    assert choice["rerank"]["applied"] and choice["rerank"]["ci95"][0] > 0
    assert stub.calls and stub.calls[0]["path"] == "/v1/rerank" and stub.calls[0]["model"] == "m"
    store = _Store()
    req = SearchRequest(query="find t", mode=SearchMode.hybrid, max_results=3)
    emb = lambda q: [1.0, 0, 0, 0]  # noqa: E731
    n = len(stub.calls)
    tuned = run_search(store, req, ScopeFilter("a", ("c",)), cfg, embed=emb, records=records)  # type: ignore[arg-type]
    assert tuned.hits[0].path == "t.py" and "reranked" in tuned.hits[0].why.fusion
    assert [h.score for h in tuned.hits] == sorted((h.score for h in tuned.hits), reverse=True)
    assert all(0.0 <= h.score <= 1.0 for h in tuned.hits)
    other = run_search(store, req, ScopeFilter("a", ("d",)), cfg, embed=emb, records=records)  # type: ignore[arg-type]
    assert other.hits[0].path == "a.py"
    off = run_search(store, req, ScopeFilter("a", ("c",)), QuerySettings(), embed=emb,
                     records=records)  # type: ignore[arg-type]
    assert off.hits[0].path == "a.py"  # the setting off: the recorded choice is not used
    assert len(stub.calls) == n + 1  # one call: the tuned context with the setting on


def test_reranker_that_loses_is_not_applied(stub: _RerankStub) -> None:
    cfg = QuerySettings(rerank="http", rerank_url=stub.url)
    es = _planted_boost_set(12)
    for ls in es.lists:  # the fusion already ranks the target first; the stub prefers another file
        ls.keyword = ls.keyword_by_boosts[FLAT]
        ls.vector = [(i, 0.9 - n * 0.01) for n, (i, _) in enumerate(ls.keyword)]
        for h in ls.hits.values():
            h["text"] = "other code" if h["path"].startswith("t") else "the wanted code"
    choice = tuning.choose_rerank([es], cfg, rerank.for_settings(cfg))
    assert not choice["applied"] and choice["gain"] < 0


def test_failing_reranker_keeps_the_fused_order() -> None:
    bad = _RerankStub("wanted", fail=True)
    try:
        cfg = QuerySettings(rerank="http", rerank_url=bad.url)
        records = _Records()
        tuning.record_choice(records, _src(), {"applied": False, "fusion": "weighted", "keyword_weight": 0.3,
                                              "vector_weight": 0.7, "rerank": {"applied": True}},
                             "f" * 40)  # type: ignore[arg-type]
        store = _Store()
        req = SearchRequest(query="find t", mode=SearchMode.hybrid, max_results=3)
        res = run_search(store, req, ScopeFilter("a", ("c",)), cfg, embed=lambda q: [1.0, 0, 0, 0],
                         records=records)  # type: ignore[arg-type]
        assert res.hits[0].path == "a.py" and res.notice is None and bad.calls
        choice = tuning.choose_rerank([_planted_boost_set(3)], cfg, rerank.for_settings(cfg))
        assert not choice["applied"] and "rerank endpoint failed" in choice["reason"]
    finally:
        bad.close()


def test_rerank_settings_need_their_endpoint_or_model() -> None:
    with pytest.raises(rerank.RerankError, match="rerank_url"):
        rerank.for_settings(QuerySettings(rerank="http"))
    with pytest.raises(rerank.RerankError, match="rerank_model"):
        rerank.for_settings(QuerySettings(rerank="cross_encoder"))
