"""A worker dies mid-sync: its task comes back within seconds (the visibility timeout), never while it lives.

Two workers consume one queue; the broker's visibility timeout is 12 s, far shorter than the sync, and each
worker re-stamps the messages it holds every 3 s (the heartbeat, :mod:`scopekb_worker.heartbeat`). While the
worker running the sync lives, the other one must not start it, although the sync runs longer than the
visibility timeout. Then the running worker is SIGKILLed (parent and pool process): its message is no longer
stamped, the other worker gets it back after about the visibility timeout (measured: from the kill to the
second ``sync_started``) and finishes it; the index equals a fresh full index.

The sync is paced by its embeddings (an OpenAI-compatible stub that takes :data:`PACE_S` per request) so that it
outlives the visibility timeout on a fast idle machine as on a loaded one; the pace is lifted after the kill.
"""

from __future__ import annotations

import time

from tests.openai_stub import OpenAIStub

from .harness import generate_repo, wait_until
from .test_embedding_faults import DIM, hash_encoder

VISIBILITY_S = 12
#: Seconds each embedding request takes before the kill: 500 files in batches of 40 make 13 or more requests,
#: so the sync runs well past VISIBILITY_S + 6 s whatever the machine's speed.
PACE_S = 2.5


def test_dead_worker_task_redelivered_fast_live_one_never_doubled(make_stack, tmp_path, report) -> None:
    pace = {"s": PACE_S}

    def paced(texts: list[str]):  # noqa: ANN202 - the stub's encode signature
        time.sleep(pace["s"])
        return hash_encoder(texts)

    with OpenAIStub(paced, api_key="faults-key") as stub:
        embedding = {"SCOPEKB_EMBEDDING__PROVIDER": "openai", "SCOPEKB_EMBEDDING__BASE_URL": stub.base_url,
                     "SCOPEKB_EMBEDDING__API_KEY": "faults-key", "SCOPEKB_EMBEDDING__MODEL": "stub-embed",
                     "SCOPEKB_EMBEDDING__DIMENSIONS": str(DIM)}
        stack = make_stack("redeliver", SCOPEKB_WORKER__BATCH_FILES="40",
                           SCOPEKB_OPENSEARCH__BULK_MAX_BYTES="131072",
                           SCOPEKB_WORKER__VISIBILITY_TIMEOUT_S=str(VISIBILITY_S), SCOPEKB_WORKER__HEARTBEAT_S="3",
                           **embedding)
        _kill_and_redeliver(stack, tmp_path, report, pace)


def _kill_and_redeliver(stack, tmp_path, report, pace: dict[str, float]) -> None:  # noqa: ANN001
    repo = tmp_path / "repo"
    commit = generate_repo(repo, files=500)
    stack.start_query()
    workers = [stack.start_worker("worker-a"), stack.start_worker("worker-b")]
    src = stack.add_source(repo, agent="redeliver-agent")
    job_id = stack.sync(src)

    def started(proc) -> int:
        return sum(1 for line in proc.log_text().splitlines() if '"sync_started"' in line and job_id in line)

    runner = wait_until(lambda: next((p for p in workers if started(p)), None), timeout=60, interval=0.1,
                        what="a worker starting the sync")
    other = next(p for p in workers if p is not runner)
    t_start = time.monotonic()
    # live for longer than the visibility timeout plus two restore sweeps, and still writing
    wait_until(lambda: time.monotonic() - t_start > VISIBILITY_S + 6 and stack.count(src) > 0, timeout=120,
               interval=0.2, what="the sync running past the visibility timeout")
    running_for = round(time.monotonic() - t_start, 1)
    job_before = stack.job(job_id) or {}
    doubled = started(other)
    killed = stack.kill(runner)
    killed_at = time.monotonic()
    pace["s"] = 0.0
    report("injected", fault=f"SIGKILL of {runner.name} (parent + pool) after the sync ran {running_for}s",
           visibility_timeout_s=VISIBILITY_S, heartbeat_s=3, pids=killed, commit=commit[:10],
           job_state_before_kill=job_before.get("state"), chunks_at_kill=stack.count(src),
           other_worker_started_it_while_alive=doubled)
    assert job_before.get("state") == "running", job_before
    assert doubled == 0, "a live worker's task was redelivered to the other worker"

    wait_until(lambda: started(other), timeout=120, interval=0.2, what="the task redelivered to the other worker")
    redelivered_s = round(time.monotonic() - killed_at, 1)
    job = stack.wait_job(job_id, timeout=300, procs=[other])
    expected, _ = stack.fresh(repo)
    comparison = stack.compare(src, expected)
    report("checked", redelivered_after_kill_s=redelivered_s, job_state=job["state"], retries=job["retries"],
           done_after_kill_s=round(time.monotonic() - killed_at, 1), comparison=comparison.summary())
    assert redelivered_s < 60, redelivered_s  # the visibility timeout (12 s) plus sweeps, not hours
    assert job["state"] == "done" and job["retries"].get("redelivered") == 1, job
    assert comparison.equal and comparison.duplicates == 0, comparison.summary()
