"""A file whose chunking kills the worker process every time (a segfault in a parser, an OOM kill).

With the test-only hook (``SCOPEKB_TESTING_FAULTS=1`` and ``SCOPEKB_TEST_CRASH_CHUNKING=<path>``) chunking that
path calls ``os._exit``. Celery re-queues the task each time the pool process dies (``reject_on_worker_lost``);
from the first redelivery on, the worker counts the attempts per file in Redis and, after
``FILE_ATTEMPTS_LIMIT`` counted ones (so ``FILE_ATTEMPTS_LIMIT + 1`` deaths), skips the file with a recorded
reason and parks it as a dead letter naming the path, so the rest of the sync completes. After the
"fix" (a worker without the hook), replaying the dead letter indexes the file: the index equals a fresh full
index of the commit.
"""

from __future__ import annotations

from scopekb.coordination import keys
from scopekb_worker.app import FILE_ATTEMPTS_LIMIT

from .harness import generate_repo

POISON = "src/parsers/poison.py"


def test_poison_file_parked_after_n_crashes_rest_indexed_replay_after_fix(make_stack, tmp_path, report) -> None:
    stack = make_stack("poison", SCOPEKB_WORKER__BATCH_FILES="20")
    repo = tmp_path / "repo"
    generate_repo(repo, files=80, extra={POISON: "def tricky(x):\n    return x  # the chunker dies here\n" * 20})
    stack.start_query()
    crashing = stack.start_worker("worker-with-bug", env={"SCOPEKB_TESTING_FAULTS": "1",
                                                          "SCOPEKB_TEST_CRASH_CHUNKING": POISON})
    src = stack.add_source(repo, agent="poison-agent")
    job_id = stack.sync(src)
    job = stack.wait_job(job_id, timeout=180, procs=[crashing])
    crashes = crashing.log_text().count('"test_fault_crash_chunking"')
    lost = crashing.log_text().count("WorkerLostError")
    parked = [d for d in stack.dead_letters() if d.get("path") == POISON]
    pattern = f"scopekb:attempts:{keys.repo_hash(src)}:*"  # this source's counters
    attempts_keys = {k.decode(): int(stack.redis().get(k)) for k in stack.redis().keys(pattern)}
    expected, fresh_job = stack.fresh(repo)
    without_poison = type(expected)({c: n for c, n in expected.items() if c[0] != POISON})
    partial = stack.compare(src, without_poison)
    report("injected", fault=f"chunking {POISON} calls os._exit in the worker's pool process", crashes=crashes,
           worker_lost_errors=lost)
    report("checked (before fix)", job_state=job["state"], skipped=job["files_skipped"], retries=job["retries"],
           errors=[e for e in job["errors"] if POISON in e], dead_letters=[(d["id"], d["attempts"], d["path"])
                                                                           for d in parked],
           attempt_counters=attempts_keys, comparison_without_poison=partial.summary(),
           poison_chunks_in_fresh_index=sum(n for c, n in expected.items() if c[0] == POISON))
    assert crashes == FILE_ATTEMPTS_LIMIT + 1
    assert job["state"] == "partial", job
    assert job["files_skipped"].get("poison") == 1
    assert job["retries"].get("redelivered") == FILE_ATTEMPTS_LIMIT + 1
    assert len(parked) == 1 and parked[0]["attempts"] == FILE_ATTEMPTS_LIMIT
    assert parked[0]["kwargs"]["source_ids"] == [src]
    assert partial.equal and partial.duplicates == 0, partial.summary()
    state = stack.state(src)  # the ref may advance past a file it did not index only while naming it (H1, review 2)
    failed = state.get("refs", {}).get("main", {}).get("failed", [])
    assert state.get("commit") is None or POISON in failed, f"the sync state passed a file it did not index: {state}"

    # The fix ships: a worker without the bug; the dead letter is replayed through the admin API.
    stack.stop(crashing)
    fixed = stack.start_worker("worker-fixed")
    with stack.admin() as c:
        r = c.post(f"/v1/deadletters/{parked[0]['id']}/replay")
    assert r.status_code == 202, r.text
    replay_job = stack.wait_job(r.json()["job_id"], timeout=120, procs=[fixed])
    full = stack.compare(src, expected)
    replayed = [d for d in stack.dead_letters(include_replayed=True) if d["id"] == parked[0]["id"]]
    report("checked (after fix and replay)", replay_job=replay_job["id"], state=replay_job["state"],
           files_indexed=replay_job["files_indexed"], chunks_written=replay_job["chunks_written"],
           dead_letter_replayed_at=replayed[0]["replayed_at"], open_dead_letters=len(stack.dead_letters()),
           attempt_counters=len(stack.redis().keys(pattern)), comparison=full.summary())
    assert replay_job["state"] == "done", replay_job
    assert full.equal and full.duplicates == 0, full.summary()
    assert replayed[0]["replayed_at"] and stack.dead_letters() == []
    assert stack.redis().keys(pattern) == []
    assert stack.state(src).get("commit") == fresh_job["to_commit"]
