"""A sync task never leaves its job ``running`` (issue 24), on fakes of the record store, the chunk store and the
task producer (pure logic: which state the job record ends in, and whether a failure is a wait or an attempt).

- the cluster unavailable at the start of a task (the chunk index check, a job record read or write) is a wait
  (``sync_deferred_for_cluster``, ``deferrals`` + 1), never a spent attempt nor a dead task;
- any other failure of the task settles the record ``failed`` with the reason, also one left ``running`` by an
  earlier wait;
- a record left ``running`` by a task that ended without settling it (a worker process ended by the hard time
  limit) is enqueued again once by the reconcile, then failed with the reason.

The real cluster is exercised by ``tests/faults/test_cluster_red.py``.
"""

from __future__ import annotations

import contextlib
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import Retry, SoftTimeLimitExceeded

from scopekb import ops
from scopekb.coordination.memory import MemoryCoordination
from scopekb.errors import Transient
from scopekb.models import Job, JobState, Source
from scopekb.runtime import ControlRuntime
from scopekb.settings import Settings
from scopekb.stores.base import RecordStore, StoreVersionMismatch

RED = "cluster red: no elected cluster manager (a majority of cluster-manager nodes is unreachable)"


class FakeRecords(RecordStore):
    """Records in a dict; ``fail`` names operations (``get``/``put``) that raise :class:`Transient` while set."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], dict[str, Any]] = {}
        self.fail: set[str] = set()

    def ensure(self, kind: str) -> None:
        pass

    def put(self, kind: str, rec_id: str, doc: dict[str, Any], wait: bool = True) -> None:
        if "put" in self.fail:
            raise Transient("search backend unavailable")
        self.data[(kind, rec_id)] = dict(doc)

    def get(self, kind: str, rec_id: str) -> dict[str, Any] | None:
        if "get" in self.fail:
            raise Transient("search backend unavailable")
        doc = self.data.get((kind, rec_id))
        return dict(doc) if doc is not None else None

    def delete(self, kind: str, rec_id: str) -> bool:
        return self.data.pop((kind, rec_id), None) is not None

    def find(self, kind: str, size: int = 1000, sort: str | None = None, **terms: Any) -> list[dict[str, Any]]:
        def match(doc: dict[str, Any]) -> bool:
            return all(v is None or doc.get(k) == v or (isinstance(doc.get(k), list) and v in doc[k])
                       for k, v in terms.items())
        return [dict(d) for (k, _), d in self.data.items() if k == kind and match(d)][:size]


class FakeChunks:
    """The chunk store's start-of-task calls: ``problem`` answers from ``problems`` (then None), ``ensure_index``
    raises ``ensure_error`` when set."""

    kind = "opensearch"

    def __init__(self, problems: list[str | None] | None = None, ensure_error: BaseException | None = None) -> None:
        self.problems = list(problems or [])
        self.ensure_error = ensure_error

    def problem(self, recovering: bool = False) -> str | None:
        return self.problems.pop(0) if self.problems else None

    def sync_guard(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def ensure_index(self) -> str:
        if self.ensure_error is not None:
            raise self.ensure_error
        return "chunks-v1"


@pytest.fixture()
def worker(monkeypatch: pytest.MonkeyPatch):
    """The worker module with a fake runtime (``worker.rt``) and ``retry`` recorded instead of published."""
    import scopekb_worker.app as w

    retries: list[dict[str, Any]] = []

    def fake_retry(exc: BaseException | None = None, countdown: float | None = None,
                   kwargs: dict[str, Any] | None = None, **_: Any) -> Retry:
        retries.append({"exc": exc, "countdown": countdown, "kwargs": kwargs})
        return Retry("recorded", exc=exc)

    rt = SimpleNamespace(settings=Settings(), records=FakeRecords(), coord=MemoryCoordination(), chunks=FakeChunks(),
                         sync_deps=lambda: SimpleNamespace(attempts=None))
    monkeypatch.setattr(w, "runtime", lambda: rt)
    monkeypatch.setattr(w.sync_sources, "retry", fake_retry)
    return SimpleNamespace(module=w, rt=rt, retries=retries)


def _run(worker: SimpleNamespace, job_id: str, **kwargs: Any) -> Any:
    return worker.module.sync_sources.apply(kwargs={"job_id": job_id, "source_ids": ["s1"], **kwargs},
                                            task_id=job_id)


def _job(worker: SimpleNamespace, job_id: str) -> Job | None:
    return worker.rt.records.get_job(job_id)


def test_the_chunk_index_check_failing_on_a_red_cluster_is_a_wait(worker) -> None:
    # the index check runs first (asking a missing index's health waits for it); it failed and the cluster says why
    worker.rt.chunks = FakeChunks(problems=[RED], ensure_error=Transient("search backend error"))
    res = _run(worker, "j-ensure", deferrals=2)
    assert res.state == "RETRY"
    assert [r["kwargs"]["deferrals"] for r in worker.retries] == [3]  # a wait: counted, no attempt spent
    assert worker.retries[0]["countdown"] == worker.module.CLUSTER_WAIT_S


@pytest.mark.parametrize("failing", ["get", "put"])
def test_a_job_record_read_or_write_failing_on_a_red_cluster_is_a_wait(worker, monkeypatch, failing) -> None:
    def fake_run_sync(deps: Any, job_id: str, *_: Any, **__: Any) -> Job:
        worker.rt.records.put_job(Job(id=job_id, state=JobState.running))  # run_sync's first write
        raise AssertionError("not reached")

    monkeypatch.setattr(worker.module, "run_sync", fake_run_sync)
    worker.rt.chunks = FakeChunks(problems=[None, RED])
    worker.rt.records.fail.add(failing)
    worker.rt.coord.mark_queued(Job(id="j-rec", retries={"requeued": 1}), ttl_s=60)  # _carry_marker reads the record
    res = _run(worker, "j-rec")
    assert res.state == "RETRY" and [r["kwargs"]["deferrals"] for r in worker.retries] == [1]


def test_an_outage_nobody_explains_at_task_start_spends_an_attempt(worker) -> None:
    worker.rt.chunks = FakeChunks(problems=[None, "unreachable: ConnectionError"],
                                  ensure_error=Transient("search backend unavailable"))
    res = _run(worker, "j-outage")
    assert res.state == "RETRY"
    assert worker.retries[0]["kwargs"] is None and worker.retries[0]["countdown"] > 0  # a retry, with backoff


def test_an_unanswered_health_question_at_task_start_is_not_a_wait(worker, monkeypatch) -> None:
    # _cluster/health of an index that does not exist yet waits for it: the 2 s question times out although the
    # cluster serves. The sync must run, not defer (it deferred forever before the fix, issue 24 follow-up).
    ran: list[str] = []

    def fake_run_sync(deps: Any, job_id: str, *_: Any, **__: Any) -> Job:
        ran.append(job_id)
        return Job(id=job_id, state=JobState.done)

    monkeypatch.setattr(worker.module, "run_sync", fake_run_sync)
    worker.rt.chunks = FakeChunks(problems=["unreachable: ConnectionTimeout"])
    res = _run(worker, "j-unanswered")
    assert ran == ["j-unanswered"] and worker.retries == [] and res.get()["state"] == "done"


def _failing_write(worker: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run_sync(deps: Any, job_id: str, *_: Any, **__: Any) -> Job:
        raise Transient("search backend unavailable")  # a bulk request or record write timed out

    monkeypatch.setattr(worker.module, "run_sync", fake_run_sync)


def test_a_failed_write_with_a_health_question_nobody_answered_in_time_is_a_wait(worker, monkeypatch) -> None:
    # Under heavy load (cluster-red fault test, load average 15 on 2 cores) a node takes the 2 s health question
    # but does not answer in time while the cluster recovers: that was "no problem" and the failure spent an
    # attempt (sync_retry) on a cluster that could not take the writes (issue 24). Now it is a wait, counted.
    _failing_write(worker, monkeypatch)
    worker.rt.chunks = FakeChunks(problems=[None, "unreachable: ConnectionTimeout"])
    res = _run(worker, "j-slow", deferrals=4, slow_waits=2)
    assert res.state == "RETRY"
    assert len(worker.retries) == 1 and worker.retries[0]["kwargs"] is not None, worker.retries
    assert worker.retries[0]["kwargs"]["deferrals"] == 5 and worker.retries[0]["kwargs"]["slow_waits"] == 3
    assert worker.retries[0]["countdown"] == worker.module.CLUSTER_WAIT_S


def test_waits_for_a_cluster_that_never_answers_in_time_are_bounded(worker, monkeypatch) -> None:
    # a cluster that never answers its health question in time must not keep a sync waiting forever: past
    # SLOW_WAITS_LIMIT such failures spend attempts again (then a dead letter after worker.max_retries)
    _failing_write(worker, monkeypatch)
    worker.rt.chunks = FakeChunks(problems=[None, "unreachable: ConnectionTimeout"])
    res = _run(worker, "j-slow-limit", deferrals=30, slow_waits=worker.module.SLOW_WAITS_LIMIT)
    assert res.state == "RETRY"
    assert worker.retries[0]["kwargs"] is None and worker.retries[0]["countdown"] > 0  # an attempt, with backoff


def test_a_failed_write_while_every_node_refuses_spends_an_attempt(worker, monkeypatch) -> None:
    # an outage (every node refused the connection) is not waited for: bounded attempts, as documented
    _failing_write(worker, monkeypatch)
    worker.rt.chunks = FakeChunks(problems=[None, "unreachable: ConnectionError"])
    res = _run(worker, "j-refused")
    assert res.state == "RETRY" and worker.retries[0]["kwargs"] is None


@pytest.mark.parametrize("where", ["ensure_index", "sync_deps", "run_sync"])
def test_a_task_that_dies_settles_its_running_job_failed_with_the_reason(worker, monkeypatch, where) -> None:
    errors: dict[str, BaseException] = {"ensure_index": StoreVersionMismatch("index v4, this process wants v5"),
                                        "sync_deps": TypeError("a bug"),
                                        "run_sync": SoftTimeLimitExceeded("soft time limit")}
    err = errors[where]
    if where == "ensure_index":
        worker.rt.chunks = FakeChunks(ensure_error=err)
    elif where == "sync_deps":
        worker.rt.sync_deps = lambda: (_ for _ in ()).throw(err)
    else:
        monkeypatch.setattr(worker.module, "run_sync", lambda *a, **k: (_ for _ in ()).throw(err))
    job_id = f"j-{where}"
    worker.rt.records.put_job(Job(id=job_id, state=JobState.running, source_ids=["s1"]))  # left by a wait
    res = _run(worker, job_id, deferrals=1)
    assert res.state == "FAILURE" and isinstance(res.result, type(err))
    job = _job(worker, job_id)
    assert job is not None and job.state == JobState.failed and job.finished_at is not None
    assert job.errors[-1] == f"the task ended: {type(err).__name__}: {err}"
    assert worker.retries == []


def test_a_task_that_dies_before_any_record_settles_its_queued_job_failed(worker) -> None:
    worker.rt.chunks = FakeChunks(ensure_error=StoreVersionMismatch("index v4"))
    worker.rt.coord.mark_queued(Job(id="j-new", source_ids=["s1"], trigger="webhook", ref="main"), ttl_s=60)
    _run(worker, "j-new")
    job = _job(worker, "j-new")
    assert job is not None and job.state == JobState.failed and job.ref == "main"  # the marker's fields kept
    assert "StoreVersionMismatch: index v4" in job.errors[-1]


def test_a_job_already_failed_by_the_sync_is_not_written_again(worker, monkeypatch) -> None:
    def failing_sync(deps: Any, job_id: str, *_: Any, **__: Any) -> Job:
        worker.rt.records.put_job(Job(id=job_id, state=JobState.failed, errors=["ValueError: bad"]))
        raise ValueError("bad")

    monkeypatch.setattr(worker.module, "run_sync", failing_sync)
    _run(worker, "j-failed")
    job = _job(worker, "j-failed")
    assert job is not None and job.errors == ["ValueError: bad"]


class FakeTasks:
    """The task producer: ``held`` answers from ``in_broker``; ``send`` records what was enqueued."""

    def __init__(self) -> None:
        self.in_broker: set[str] = set()
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def held(self, task_ids: Any) -> set[str]:
        return self.in_broker & set(task_ids)

    def send(self, task: str, task_id: str, kwargs: dict[str, Any]) -> None:
        self.sent.append((task, task_id, kwargs))
        self.in_broker.add(task_id)


def _control() -> ControlRuntime:
    rt = ControlRuntime(settings=Settings(), records=FakeRecords(), coord=MemoryCoordination(), tasks=FakeTasks())
    rt.records.put_source(Source(id="s1", agent_name="a", context_id="c", repo_url="/r", ref="main"))
    return rt


def _running_job(rt: ControlRuntime, held: bool) -> str:
    job_id = "j-" + uuid.uuid4().hex[:8]
    kwargs = {"job_id": job_id, "source_ids": ["s1"], "trigger": "webhook"}
    rt.coord.mark_queued(Job(id=job_id, source_ids=["s1"]), ttl_s=600, task_kwargs=kwargs)
    rt.records.put_job(Job(id=job_id, source_ids=["s1"], state=JobState.running))
    if held:
        rt.tasks.in_broker.add(job_id)
    return job_id


def test_reconcile_requeues_then_fails_a_running_job_whose_task_ended() -> None:
    rt = _control()
    dead, alive = _running_job(rt, held=False), _running_job(rt, held=True)
    lost = ops.settle_lost_jobs(rt, grace_s=0, confirm_s=0)
    assert lost.requeued == [dead] and lost.failed == []
    assert [t[1] for t in rt.tasks.sent] == [dead]
    job = rt.records.get_job(dead)
    assert job is not None and job.state == JobState.queued and job.retries["requeued"] == 1
    assert "task ended without settling its running job" in job.errors[-1]
    assert rt.records.get_job(alive).state == JobState.running  # its task still holds its message

    rt.records.put_job(job.model_copy(update={"state": JobState.running}))  # the second run died the same way
    rt.tasks.in_broker.discard(dead)
    lost = ops.settle_lost_jobs(rt, grace_s=0, confirm_s=0)
    assert lost.failed == [dead] and lost.requeued == []  # requeued once already
    job = rt.records.get_job(dead)
    assert job is not None and job.state == JobState.failed and "failed by the reconcile" in job.errors[-1]


class FakeByQueryClient:
    """The calls :meth:`OpenSearchChunkStore._run_by_query_task` makes: a by-query task that never finishes (its
    writes wait for the cluster) and a cluster whose health says ``health``."""

    def __init__(self, health: dict[str, Any], finish_after: int | None = None) -> None:
        self.transport = SimpleNamespace(hosts=[{"host": "n1"}])
        self.looks, self.cancelled, self.finish_after = 0, [], finish_after
        self.cluster = SimpleNamespace(health=lambda index=None, params=None: health)
        self.tasks = SimpleNamespace(get=self._get, cancel=lambda task_id, params=None: self.cancelled.append(task_id))

    def update_by_query(self, **_: Any) -> dict[str, Any]:
        return {"task": "n1:42"}

    def _get(self, task_id: str, params: dict[str, Any]) -> dict[str, Any]:
        self.looks += 1
        if self.finish_after is not None and self.looks >= self.finish_after:
            return {"completed": True, "response": {"updated": 7}}
        return {"completed": False}


def test_a_by_query_task_is_abandoned_when_the_cluster_goes_red() -> None:
    from opensearchpy.exceptions import TransportError

    from scopekb.stores.opensearch import OpenSearchChunkStore

    client = FakeByQueryClient({"status": "red", "discovered_cluster_manager": False})
    with pytest.raises(TransportError) as caught:
        OpenSearchChunkStore(client)._run_by_query_task("update_by_query", "chunks-v1", {})
    assert caught.value.status_code == 503 and "no elected cluster manager" in str(caught.value.info)
    assert client.looks == 1 and client.cancelled == ["n1:42"]

    healthy = FakeByQueryClient({"status": "green", "discovered_cluster_manager": True}, finish_after=3)
    assert OpenSearchChunkStore(healthy)._run_by_query_task("update_by_query", "chunks-v1", {}) == {"updated": 7}
    assert healthy.looks == 3 and healthy.cancelled == []


@pytest.mark.parametrize(("problem", "written"), [(RED, False), (None, True)])
def test_a_sync_failing_on_a_red_cluster_leaves_its_record_to_the_resumed_run(monkeypatch, problem, written) -> None:
    """The failure record of a sync the cluster interrupted is not written while the cluster says it cannot serve
    (the write would hang until a cluster manager is elected); the task waits and its resumed run rewrites it."""
    from scopekb import indexing

    def failing(*_: Any, **__: Any) -> None:
        raise Transient("search backend unavailable")

    monkeypatch.setattr(indexing, "_sync", failing)
    records = FakeRecords()
    records.put_source(Source(id="s1", agent_name="a", context_id="c", repo_url="/r", ref="main"))
    deps = indexing.SyncDeps(settings=Settings(), records=records, chunks=FakeChunks(problems=[problem]), blobs=None)
    with pytest.raises(Transient):
        indexing.run_sync(deps, "j-red", ["s1"])
    job = records.get_job("j-red")
    assert job is not None and job.state == (JobState.failed if written else JobState.running)


@pytest.mark.parametrize("retried", [True, False])
def test_a_sync_the_caller_runs_again_never_reads_failed(monkeypatch, retried: bool) -> None:
    """CI saw a poller read ``failed`` for a job whose task retried a moment later and finished ``done``: the sync
    recorded ``failed`` for a transient error, then the worker marked it queued for the retry (the fault test of
    429s then 503s from the embedding provider). With ``retried`` the record says ``queued`` with the error from
    the first write; without it (a one-shot caller, or no attempt left) the job fails as before."""
    from scopekb import indexing

    records = FakeRecords()
    records.put_source(Source(id="s1", agent_name="a", context_id="c", repo_url="https://example.invalid/r.git",
                              ref="main"))
    states: list[str] = []
    put_job = records.put_job
    monkeypatch.setattr(records, "put_job", lambda job, *a, **k: (states.append(job.state.value),
                                                                   put_job(job, *a, **k))[1])

    def down(*_: Any, **__: Any) -> None:
        raise Transient("embedding provider answered http 503 after 7 attempts")

    monkeypatch.setattr(indexing, "_sync", down)
    deps = SimpleNamespace(records=records, chunks=FakeChunks(), embed_sink=None, embedder=None)
    with pytest.raises(Transient):
        indexing.run_sync(deps, "j1", ["s1"], retried=(lambda e: isinstance(e, Transient)) if retried else None)
    job = records.get_job("j1")
    assert job is not None and job.errors == ["Transient: embedding provider answered http 503 after 7 attempts"]
    if retried:
        assert "failed" not in states and job.state == JobState.queued and job.finished_at is None, states
    else:
        assert job.state == JobState.failed and job.finished_at is not None


def test_the_worker_says_which_errors_it_runs_again(worker, monkeypatch) -> None:
    seen: list[Any] = []

    def failing_sync(deps: Any, job_id: str, *_: Any, retried: Any = None, **__: Any) -> Job:
        seen.append(retried)
        worker.rt.records.put_job(Job(id=job_id, state=JobState.running, source_ids=["s1"]))  # its start
        raise Transient("git host unreachable")

    monkeypatch.setattr(worker.module, "run_sync", failing_sync)
    res = _run(worker, "j-again")
    assert res.state == "RETRY" and len(worker.retries) == 1
    assert seen[0](Transient("x")) and seen[0](OSError("x")) and not seen[0](ValueError("x"))
    job = _job(worker, "j-again")
    assert job is not None and job.state == JobState.queued  # marked for its retry, never failed
