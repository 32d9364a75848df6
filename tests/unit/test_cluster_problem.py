"""cluster_problem: what a worker waits for (red, no cluster manager, shards recovering) and what readiness reports.

A fake client answers ``cluster.health`` (pure logic; the real cluster is exercised by tests/faults).
"""
from __future__ import annotations

from typing import Any

import pytest
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import ConnectionTimeout

from scopekb.stores.base import SLOW_PROBLEM, slow_problem
from scopekb.stores.opensearch import cluster_problem


class _Cluster:
    def __init__(self, health: dict[str, Any]) -> None:
        self.health_doc = health

    def health(self, index: str | None = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.health_doc


class _Client:
    def __init__(self, health: dict[str, Any]) -> None:
        self.cluster = _Cluster(health)


def _health(status: str, initializing: int = 0, relocating: int = 0, unassigned: int = 0) -> dict[str, Any]:
    return {"status": status, "discovered_cluster_manager": True, "initializing_shards": initializing,
            "relocating_shards": relocating, "unassigned_shards": unassigned}


def test_a_serving_cluster_with_recovering_shards_is_not_a_problem_for_readiness() -> None:
    assert cluster_problem(_Client(_health("yellow", initializing=2))) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("status", ["yellow", "green"])
def test_recovering_shards_are_a_problem_a_worker_waits_for(status: str) -> None:
    why = cluster_problem(_Client(_health(status, initializing=2, relocating=1)), recovering=True)  # type: ignore[arg-type]
    assert why == f"cluster {status}: recovering, 2 shard copies initializing, 1 relocating"


def test_a_settled_cluster_is_no_problem_even_when_asked_about_recovery() -> None:
    assert cluster_problem(_Client(_health("green")), recovering=True) is None  # type: ignore[arg-type]


def test_red_is_reported_either_way() -> None:
    for recovering in (False, True):
        why = cluster_problem(_Client(_health("red", unassigned=3)), recovering=recovering)  # type: ignore[arg-type]
        assert why is not None and why.startswith("cluster red")


class _Nodes:
    """Three nodes asked in turn: each ``health`` call raises the next of ``errors``."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = list(errors)
        self.cluster = self
        self.transport = type("T", (), {"hosts": [{}, {}, {}]})()

    def health(self, index: str | None = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
        raise self.errors.pop(0)


def _timeout() -> ConnectionTimeout:
    return ConnectionTimeout("TIMEOUT", "read timed out", OSError("timed out"))


def _refused() -> OSConnectionError:
    return OSConnectionError("N/A", "connection refused", OSError("refused"))


def test_a_slow_node_is_reported_slow_even_when_the_last_try_met_a_dead_node() -> None:
    # cluster red under load: node 0 takes the question and does not answer within 2 s, nodes 1 and 2 are dead.
    # The answer said "ConnectionError" (an outage) from the last try; it is the slow answer a worker waits for.
    why = cluster_problem(_Nodes([_timeout(), _refused(), _refused()]), recovering=True)  # type: ignore[arg-type]
    assert why == SLOW_PROBLEM and slow_problem(why)


def test_every_node_refusing_is_an_outage_not_a_slow_answer() -> None:
    why = cluster_problem(_Nodes([_refused(), _refused(), _refused()]), recovering=True)  # type: ignore[arg-type]
    assert why == "unreachable: ConnectionError" and not slow_problem(why)


def test_a_worker_asks_about_the_system_indices_too_after_a_failed_step() -> None:
    # run 4 of test_cluster_red on a loaded machine: a job record write failed with shard_not_in_primary_mode while a
    # system index recovered, the chunk index was settled, the question named only the chunk index and answered
    # "no problem": each failure spent an attempt until the job was dead-lettered. The worker's question names both.
    from scopekb.stores.opensearch import OpenSearchChunkStore

    asked: list[str | None] = []

    class _Recording(_Cluster):
        def health(self, index: str | None = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
            asked.append(index)
            return self.health_doc

    client = _Client(_health("yellow", initializing=2))
    client.cluster = _Recording(client.cluster.health_doc)
    store = OpenSearchChunkStore(client, alias="kb-chunks", system_prefix="kb-sys")  # type: ignore[arg-type]
    assert store.problem(recovering=True) == "cluster yellow: recovering, 2 shard copies initializing, 0 relocating"
    assert store.problem() is None  # readiness and the start of a task: the chunk index only, a yellow one serves
    assert asked == ["kb-chunks,kb-sys-*", "kb-chunks"]


class _Indices:
    """``indices.exists`` of a fake client: the names that exist, or an error to raise."""

    def __init__(self, existing: set[str], error: Exception | None = None) -> None:
        self.existing, self.error, self.asked = existing, error, []

    def exists(self, index: str, params: dict[str, Any] | None = None) -> bool:
        self.asked.append(index)
        if self.error is not None:
            raise self.error
        return index in self.existing


class _Counted(_Client):
    def __init__(self, health: dict[str, Any], indices: _Indices) -> None:
        super().__init__(health)
        self.indices = indices
        self.health_calls: list[str | None] = []
        inner = self.cluster.health

        def health(index: str | None = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
            self.health_calls.append(index)
            return inner(index, params)

        self.cluster.health = health  # type: ignore[method-assign]


def test_an_index_that_does_not_exist_yet_is_no_problem_and_its_health_is_not_asked() -> None:
    """`_cluster/health/<missing alias>` is held open by OpenSearch until its timeout (README newcomer: `scopekb
    status` before `scopekb init` took 4 s and said "green ...; unreachable: ConnectionTimeout")."""
    c = _Counted(_health("green"), _Indices(set()))
    assert cluster_problem(c, index="chunks") is None  # type: ignore[arg-type]
    assert c.health_calls == [] and c.indices.asked == ["chunks"]
    c = _Counted(_health("red", unassigned=1), _Indices({"chunks"}))
    assert (cluster_problem(c, index="chunks") or "").startswith("cluster red")  # type: ignore[arg-type]
    assert c.health_calls == ["chunks"]
    c = _Counted(_health("green"), _Indices({"sys-jobs"}))
    assert cluster_problem(c, index="chunks,sys-*", recovering=True) is None  # type: ignore[arg-type]
    assert c.health_calls == ["sys-*"]  # the missing alias dropped, the system indices still asked


def test_a_node_that_times_out_on_the_existence_check_is_not_asked_twice() -> None:
    c = _Counted(_health("green"), _Indices(set(), ConnectionTimeout("TIMEOUT", "read timed out", None)))
    assert cluster_problem(c, index="chunks") == SLOW_PROBLEM  # type: ignore[arg-type]
    assert c.health_calls == []
    c = _Counted(_health("green"), _Indices(set(), OSConnectionError("N/A", "refused", None)))
    assert cluster_problem(c, index="chunks") is None  # type: ignore[arg-type]  # refused check: health answers
    assert c.health_calls == ["chunks"]
