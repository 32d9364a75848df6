"""A search that fails because a node holding a shard copy left mid-search is sent again (issue 24's node-loss
fault test: one 500 ``search_phase_execution_exception`` caused by ``node_disconnected_exception``, 3 s after a data
node's SIGKILL, although the replicas were already promoted). Pure retry logic against a fake client; the real
node loss is ``tests/faults/test_cluster_node_loss.py``."""

from __future__ import annotations

from typing import Any

import pytest
from opensearchpy.exceptions import RequestError, TransportError

from scopekb.stores import opensearch as O
from scopekb.stores.base import ScopeFilter, SearchFilter

LOST = {"error": {"root_cause": [{"type": "node_disconnected_exception", "reason": "[node-0] disconnected"}],
                  "type": "search_phase_execution_exception", "reason": "all shards failed"}, "status": 500}
OTHER = {"error": {"root_cause": [{"type": "circuit_breaking_exception"}], "type": "search_phase_execution_exception"},
         "status": 500}
HITS = {"hits": {"hits": [{"_id": "a", "_score": 2.0, "_source": {"path": "a.py"}}]}}


class FakeClient:
    """Answers ``search``/``msearch`` from a script: an exception to raise or a response to return, in order."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls = 0

    def _next(self) -> Any:
        self.calls += 1
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def search(self, **_kw: Any) -> Any:
        return self._next()

    def msearch(self, **_kw: Any) -> Any:
        return self._next()


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(O, "LOST_COPY_PAUSE_S", 0.0)


def store(script: list[Any]) -> O.OpenSearchChunkStore:
    return O.OpenSearchChunkStore(FakeClient(script), alias="a")  # type: ignore[arg-type]


FLT = SearchFilter(scope=ScopeFilter("agent", ("ctx",)))


def test_a_keyword_search_that_lost_a_copy_is_sent_again() -> None:
    s = store([TransportError(500, "search_phase_execution_exception", LOST), HITS])
    assert [h[0] for h in s.keyword_search("value", FLT, 5)] == ["a"]
    assert s.client.calls == 2  # type: ignore[attr-defined]


def test_other_failures_and_a_copy_lost_every_time_are_not_hidden() -> None:
    s = store([TransportError(500, "search_phase_execution_exception", OTHER)])
    with pytest.raises(Exception, match="search backend"):
        s.keyword_search("value", FLT, 5)
    assert s.client.calls == 1  # type: ignore[attr-defined]
    s = store([TransportError(500, "x", LOST)] * (O.LOST_COPY_RETRIES + 1))
    with pytest.raises(Exception, match="search backend"):
        s.keyword_search("value", FLT, 5)
    assert s.client.calls == O.LOST_COPY_RETRIES + 1  # type: ignore[attr-defined]
    assert not O.lost_copy(RequestError(400, "x", LOST))


def test_an_msearch_answer_that_lost_a_copy_is_sent_again() -> None:
    failed = {"responses": [{"error": LOST["error"], "status": 500}, HITS]}
    s = store([failed, {"responses": [HITS, HITS]}])
    s.dimension, s.model = 8, None  # a vector index; no model check (no model configured)
    kw, vec = s.hybrid_search("value", [0.1] * 8, FLT, 5, 5)
    assert [h[0] for h in kw] == ["a"] and [h[0] for h in vec] == ["a"]
    assert s.client.calls == 2  # type: ignore[attr-defined]
