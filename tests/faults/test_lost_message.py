"""A sync's task message is lost from the broker: the reconcile settles the job instead of leaving it ``queued``.

Real Redis (the Celery broker), real query service, worker and CLI. Two syncs are enqueued while no worker runs,
then their messages are deleted from the queue's Redis list (what a Redis failover without persistence, an
eviction or an operator's ``DEL`` does). ``scopekb reconcile`` (the pass beat runs) must see that each job's
queued marker is older than the grace period and that no queue and no worker holds its message, and enqueue it
again once: job A then runs to ``done`` when a worker starts. Job B's message is lost a second time: the next
pass records it ``failed`` with the reason. A job whose message is still queued is left alone.

The embedded profile has no broker to lose a message from (its tasks run in the process that also holds the
queued markers); ``tests/integration/test_lost_jobs_embedded.py`` checks that its reconcile settles nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from .harness import Stack, generate_repo


def _drop_message(stack: Stack, job_id: str) -> int:
    """Delete the message of ``job_id`` from the scenario's queue list; the number removed."""
    r = stack.redis()
    try:
        for raw in r.lrange(stack.queue, 0, -1):
            if json.loads(raw)["headers"]["id"] == job_id:
                return int(r.lrem(stack.queue, 1, raw))
        return 0
    finally:
        r.close()


def _reconcile(stack: Stack) -> str:
    """One reconcile pass through the CLI (``scopekb reconcile``); its output line."""
    proc = subprocess.run([sys.executable, "-m", "scopekb_cli.main", "reconcile"], env=stack.env, cwd=stack.workdir,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_lost_message_requeued_once_then_failed_with_reason(make_stack, tmp_path, report) -> None:
    stack = make_stack("lostmsg", SCOPEKB_WORKER__LOST_MESSAGE_GRACE_S="1")
    repo = tmp_path / "repo"
    commit = generate_repo(repo, files=30)
    stack.start_query()
    src = stack.add_source(repo, agent="lost-agent")
    job_a, job_b, job_c = stack.sync(src), stack.sync(src), stack.sync(src)
    dropped = {j: _drop_message(stack, j) for j in (job_a, job_b)}
    time.sleep(1.5)  # past the grace period
    assert dropped == {job_a: 1, job_b: 1}, dropped
    assert stack.job(job_a)["state"] == "queued"

    first = _reconcile(stack)
    a1, b1, c1 = stack.job(job_a), stack.job(job_b), stack.job(job_c)
    requeued_b = _drop_message(stack, job_b)  # lost once more
    time.sleep(1.5)
    second = _reconcile(stack)
    b2 = stack.job(job_b)
    report("injected", fault="task messages deleted from the Redis queue list", commit=commit[:10],
           lost_once=job_a, lost_twice=job_b, kept=job_c, first_pass=first, second_pass=second)
    assert a1["state"] == "queued" and a1["retries"].get("requeued") == 1, a1
    assert any("lost by the broker" in e for e in a1["errors"]), a1
    assert b1["retries"].get("requeued") == 1 and requeued_b == 1, b1
    assert c1["state"] == "queued" and not c1["retries"].get("requeued"), c1  # its message was never lost
    assert b2["state"] == "failed" and b2["finished_at"], b2
    assert any("lost by the broker" in e and "again" in e for e in b2["errors"]), b2["errors"]

    worker = stack.start_worker()
    a = stack.wait_job(job_a, timeout=180, procs=[worker])
    c = stack.wait_job(job_c, timeout=180, procs=[worker])
    b = stack.job(job_b)
    report("checked", job_a=(a["state"], a["retries"], a["chunks_written"]), job_b=(b["state"], b["errors"]),
           job_c=c["state"], chunks=stack.count(src))
    assert a["state"] == "done" and a["retries"].get("requeued") == 1, a
    assert c["state"] == "done", c
    assert b["state"] == "failed", b  # not revived by anything
