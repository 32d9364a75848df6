"""Redis (the broker) crashes during a sync and comes back with whatever its last snapshot held.

While the first repository is being synced, a sync of a second repository waits in the queue. Redis is
SIGKILLed (no snapshot on the way down) and started again: queued and unacknowledged messages, the repository
lock and the queued-job marker are gone. The worker reconnects by itself; the reconcile (what beat runs every
``worker.reconcile_interval_s``) then brings both sources to their ref: the index equals a fresh full index of
each repository.
"""

from __future__ import annotations

import time

from scopekb import queue

from .harness import generate_repo, wait_until


def test_redis_crash_during_sync_then_reconcile_heals(make_stack, private_services, tmp_path, report) -> None:
    stack = make_stack("redis", SCOPEKB_WORKER__BATCH_FILES="40")
    repo_a, repo_b = tmp_path / "repo-a", tmp_path / "repo-b"
    generate_repo(repo_a, files=300)
    generate_repo(repo_b, files=40)
    stack.start_query()
    worker = stack.start_worker()
    src_a = stack.add_source(repo_a, agent="redis-agent", context="a")
    src_b = stack.add_source(repo_b, agent="redis-agent", context="b")
    job_a = stack.sync(src_a)
    wait_until(lambda: stack.count(src_a) > 300, timeout=120, interval=0.05, what="sync A writing")
    job_b = stack.sync(src_b)  # waits behind A (one worker process)
    rds = stack.redis()
    queued_before = rds.llen(stack.queue)
    unacked_before = rds.hlen("unacked")

    pid = private_services.kill("redis")
    down_at = time.monotonic()
    time.sleep(3)
    private_services.up("redis")
    report("injected", fault="SIGKILL of Redis during sync A, restart after 3 s", redis_pid=pid,
           queued_before=queued_before, unacked_before=unacked_before, queued_after=rds.llen(stack.queue),
           unacked_after=rds.hlen("unacked"), job_b_marker_after=bool(rds.exists(f"scopekb:job:{job_b}")),
           chunks_a_at_crash=stack.count(src_a), restart_s=round(time.monotonic() - down_at, 1))

    # The worker reconnects and finishes (or retries) what it was doing; the message of B is lost.
    wait_until(lambda: " ready." in worker.log_text().split("Connection to broker lost")[-1]
               or "Connected to redis" in worker.log_text().split("Connection to broker lost")[-1],
               timeout=60, what="worker reconnected")
    # A failed when Redis went away (its retry could not be enqueued either) or finishes; either way it settles.
    wait_until(lambda: (stack.job(job_a) or {}).get("state") not in (None, "running", "queued"), timeout=90,
               what="sync A settled")
    before = {"job_a": (stack.job(job_a) or {}).get("state"), "job_b": (stack.job(job_b) or {}).get("state"),
              "chunks_a": stack.count(src_a), "chunks_b": stack.count(src_b),
              "state_a": stack.state(src_a).get("commit", "-")[:10], "state_b": stack.state(src_b).get("commit")}
    report("after restart, before reconcile", **before)

    # The reconcile skips a repository whose lock is held; Redis may have come back from a snapshot taken during
    # sync A, holding A's lock until it expires. Like beat, send it again until both sources were reconciled.
    passes, jobs = 0, {}
    deadline = time.monotonic() + 180
    while len(jobs) < 2 and time.monotonic() < deadline:
        stack.send_task(queue.TASK_RECONCILE)
        passes += 1
        t_pass = time.monotonic()
        while len(jobs) < 2 and time.monotonic() - t_pass < 20:
            for src in (src_a, src_b):
                found = [j for j in stack.jobs(src) if j["trigger"] == "reconcile"]
                if found and all(j["state"] in ("done", "partial", "failed") for j in found):
                    jobs[src] = found[0]
            time.sleep(0.5)
    assert len(jobs) == 2, f"reconcile did not sync both sources after {passes} passes"
    expected_a, _ = stack.fresh(repo_a)
    expected_b, _ = stack.fresh(repo_b)
    cmp_a, cmp_b = stack.compare(src_a, expected_a), stack.compare(src_b, expected_b)
    report("checked", reconcile_passes=passes,
           reconcile_jobs={s[:12]: (j["state"], j["chunks_written"], j["drift"]) for s, j in jobs.items()},
           repo_a=cmp_a.summary(), repo_b=cmp_b.summary())
    assert all(j["state"] == "done" for j in jobs.values()), jobs
    assert cmp_a.equal and cmp_a.duplicates == 0, cmp_a.summary()
    assert cmp_b.equal and cmp_b.duplicates == 0, cmp_b.summary()
