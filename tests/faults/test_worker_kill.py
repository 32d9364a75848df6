"""A worker machine dies in the middle of a bulk write of a large sync; another worker finishes the job.

The whole worker (Celery parent and its pool process) is SIGKILLed while the index is half written, so nothing
is acknowledged or cleaned up: the task message stays unacknowledged in Redis, the repository lock stays held
and the source's sync state keeps its ``writing`` marker. A new worker gets the message back after the
visibility timeout (acks_late), the lock has expired by then, and the redelivered sync - seeing the marker -
rewrites what the dead one may have half-written. The index must then equal a fresh full index of the commit.
"""

from __future__ import annotations

import time
from collections import Counter

from .harness import generate_repo, wait_until


def test_sigkill_worker_mid_bulk_then_new_worker_completes(make_stack, tmp_path, report) -> None:
    stack = make_stack("kill", SCOPEKB_WORKER__BATCH_FILES="40", SCOPEKB_OPENSEARCH__BULK_MAX_BYTES="131072",
                       SCOPEKB_WORKER__TASK_SOFT_TIME_LIMIT_S="45", SCOPEKB_WORKER__TASK_TIME_LIMIT_S="50",
                       SCOPEKB_WORKER__VISIBILITY_TIMEOUT_S="55")
    repo = tmp_path / "big-repo"
    commit = generate_repo(repo, files=500)
    stack.start_query()
    worker_a = stack.start_worker("worker-a")
    src = stack.add_source(repo, agent="kill-agent")
    job_id = stack.sync(src)

    # Kill while a batch is being written: past 1,500 chunks, as soon as OpenSearch holds more chunks than the job
    # recorded at its last batch (a batch of 40 files is about 400 chunks in bulk requests of 128 KiB).
    def writing_a_batch() -> tuple[int, int] | None:
        recorded = (stack.job(job_id) or {}).get("chunks_written", 0)
        stack.os.indices.refresh(index=stack.alias)
        n = stack.count(src)
        return (n, recorded) if n > 1500 and n > recorded else None

    seen, recorded = wait_until(writing_a_batch, timeout=120, interval=0.01, what="a batch being written")
    killed = stack.kill(worker_a)
    killed_at = time.monotonic()
    at_kill = stack.chunks(src)  # refreshed: everything OpenSearch took before the worker died
    after_kill = sum(at_kill.values())
    lock_ttls = [stack.redis().ttl(k) for k in stack.redis().keys("scopekb:lock:repo:*")]
    state = stack.state(src)
    report("injected", fault="SIGKILL of the whole worker (parent + pool process) mid bulk write", pids=killed,
           commit=commit[:10], chunks_visible_at_kill=seen, chunks_after_kill=after_kill,
           chunks_recorded_by_job_before_kill=recorded,
           job_state_after_kill=(stack.job(job_id) or {}).get("state"), repo_lock_ttls_left=lock_ttls,
           sync_state_after_kill=state)
    ref_at_kill = (state.get("refs") or {}).get("main", {})  # the sync state is per ref (issue 23)
    assert ref_at_kill.get("writing") == commit and ref_at_kill.get("commit") is None

    worker_b = stack.start_worker("worker-b")
    expected, fresh_job = stack.fresh(repo)  # meanwhile the message waits out the visibility timeout
    total = sum(expected.values())
    per_path = Counter(p for p, _, _ in expected)
    killed_paths = Counter(p for p, _, _ in at_kill)
    half_written = sorted(p for p, n in killed_paths.items() if n < per_path[p])
    report("left by the dead worker", fresh_index_chunks=total, fresh_index_files=fresh_job["files_indexed"],
           files_complete=len(killed_paths) - len(half_written), files_half_written=len(half_written),
           sample=half_written[:3])
    assert recorded < after_kill < total, "the kill did not land in the middle of a batch's writes"
    job = stack.wait_job(job_id, timeout=180, procs=[worker_b])
    comparison = stack.compare(src, expected)
    report("checked", job_state=job["state"], done_after_kill_s=round(time.monotonic() - killed_at, 1),
           retries=job["retries"], chunks_written_by_redelivery=job["chunks_written"],
           comparison=comparison.summary(), sync_state=stack.state(src))
    assert job["state"] == "done", job
    assert job["retries"].get("redelivered") == 1, job["retries"]
    assert comparison.duplicates == 0
    assert comparison.equal, comparison.summary()
    final = stack.state(src)
    final_ref = (final.get("refs") or {}).get("main", {})
    assert final_ref.get("commit") == commit and "writing" not in final_ref
