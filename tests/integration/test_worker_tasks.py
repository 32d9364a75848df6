"""Worker task behaviour on real services: dead letters after exhausted retries, replay, reconcile."""

from __future__ import annotations

import json
import uuid

import pytest

from scopekb.models import Source
from scopekb.ops import list_dead_letters, replay_dead_letter
from scopekb.settings import get_settings


@pytest.fixture()
def worker_module(opensearch_url: str, redis_url: str, s3_config: dict, tmp_path, monkeypatch):
    run = uuid.uuid4().hex[:8]
    env = {"SCOPEKB_OPENSEARCH__URL": opensearch_url, "SCOPEKB_OPENSEARCH__ALIAS": f"it-w-{run}",
           "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"it-w-{run}-sys", "SCOPEKB_REDIS__URL": redis_url,
           "SCOPEKB_S3__ENDPOINT": s3_config["endpoint"], "SCOPEKB_S3__ACCESS_KEY": s3_config["access_key"],
           "SCOPEKB_S3__SECRET_KEY": s3_config["secret_key"], "SCOPEKB_S3__BUCKET": f"it-w-{run}",
           "SCOPEKB_WORKER__MAX_RETRIES": "0", "SCOPEKB_WORKER__QUEUE": f"it-w-{run}",
           "SCOPEKB_GIT__CACHE_DIR": str(tmp_path / "git"), "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    import scopekb_worker.app as w

    w.runtime.cache_clear()
    w.app.conf.update(task_always_eager=False)
    yield w
    w.app.connection().default_channel.client.delete(w.app.conf.task_default_queue)
    rt = w.runtime()
    rt.records.client.indices.delete(index=f"it-w-{run}*", params={"expand_wildcards": "open"})
    w.runtime.cache_clear()
    get_settings.cache_clear()


def test_exhausted_retries_park_a_dead_letter_that_can_be_replayed(worker_module, tmp_path) -> None:
    w = worker_module
    rt = w.runtime()
    src = Source(id=Source.new_id(), agent_name="a", context_id="c", repo_url=str(tmp_path / "gone"), ref="main")
    rt.records.put_source(src)  # the repository does not exist: every fetch fails
    job_id = "dl-" + uuid.uuid4().hex[:8]
    res = w.sync_sources.apply(kwargs={"job_id": job_id, "source_ids": [src.id]}, task_id=job_id).get()
    assert res["state"] == "failed" and res["dead_letter"] is True
    parked = list_dead_letters(rt)
    assert [d.id for d in parked] == [job_id] and parked[0].kwargs["source_ids"] == [src.id]
    assert "git fetch" in parked[0].error
    # git's own cause, without GitPython's "stderr: '...'" wrapper (scopekb.gitrepo.git_cause)
    assert f"failed: fatal: repository '{tmp_path / 'gone'}' does not exist" in parked[0].error, parked[0].error
    job = rt.records.get_job(job_id)
    assert job is not None and job.state.value == "failed" and any("dead letter" in e for e in job.errors)

    new_job = replay_dead_letter(rt, job_id)
    assert new_job.startswith(job_id + "-replay-")
    assert list_dead_letters(rt) == []  # replayed ones are hidden by default
    assert len(list_dead_letters(rt, include_replayed=True)) == 1
    queued = rt.coord.queued_job(new_job)  # visible to GET /v1/jobs/{id} before a worker starts it
    assert queued is not None and queued.state.value == "queued" and queued.source_ids == [src.id]
    client = rt.tasks.app
    # The replayed task is on the broker under the new id.
    # The worker module may have been imported earlier with another queue: look where the replay client sent it.
    q = client.conf.task_default_queue
    r = client.connection().default_channel.client  # the Redis client of the broker connection
    try:
        assert r.llen(q) == 1 and new_job in r.lindex(q, 0).decode()
    finally:
        r.delete(q)


def test_reconcile_enqueues_one_sync_per_repository_and_ref(worker_module, tmp_path) -> None:
    w = worker_module
    rt = w.runtime()
    for agent in ("a", "b"):
        rt.records.put_source(Source(id=Source.new_id(), agent_name=agent, context_id="c",
                                     repo_url=str(tmp_path / "r1"), ref="main"))
    rt.records.put_source(Source(id=Source.new_id(), agent_name="a", context_id="c",
                                 repo_url=str(tmp_path / "r1"), ref="dev"))
    rt.records.client.indices.refresh(index=rt.records.index_name("sources"))
    # Reconcile enqueues through the runtime's producer: look in the queue it uses (the worker module may have
    # been imported earlier with another queue).
    producer = rt.tasks.app
    r = producer.connection().default_channel.client
    q = producer.conf.task_default_queue
    r.delete(q)
    try:
        got = w.reconcile.apply().get()
        jobs = got.pop("jobs", None)  # the verifying syncs' job ids (8b95a26: the embedded CLI reports how they end)
        assert got == {"groups": 2, "busy": 0, "requeued": [], "failed": []}
        assert r.llen(q) == 2 and jobs is not None and len(jobs) == 2
        # Each reconcile job has its queued marker (GET /v1/jobs/{id} answers before a worker starts it).
        ids = [json.loads(m)["headers"]["id"] for m in r.lrange(q, 0, -1)]
        assert all(i.startswith("reconcile-") and rt.coord.queued_job(i) is not None for i in ids)
    finally:
        r.delete(q)
