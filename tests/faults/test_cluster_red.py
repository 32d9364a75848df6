"""Two of the three OpenSearch nodes crash during a sync: the cluster is red until they are back.

Nodes 1 and 2 of the 3-node cluster (all three cluster-manager eligible) are SIGKILLed while the worker writes
sync A. The survivor is alone: no cluster manager can be elected (a majority of the three is gone) and writes are
blocked; a chunk-index shard whose two copies were both on the lost nodes has none left. This is a whole-cluster
red state, reproducible on every run (the node-loss test kills one node and stays green/yellow).

While red:
- the query service says so, fast: ``/readyz`` 503 naming the reason, every search 503 with the reason in its
  ``detail`` - also a search with a key the service has not cached yet, whose key lookup in the system indices
  is what fails (it said only ``search backend error`` before);
- sync A, caught mid-write, and sync B, enqueued during red (as the ingester would), wait for the cluster
  without spending their retry attempts and without running into the task time limit: the red phase lasts
  longer than the task time limit of this stack (60 s), so a sync that kept waiting inside its task would be
  ended by it.
After the two nodes are started again, the service is ready (200), both jobs end ``done`` with no dead letter,
no attempt spent while the cluster was red (a write failing while the nodes rejoin may still spend one: seen once
in three runs, a few attempts over 3 minutes, hence 8 attempts here) and each source's index equals a fresh full
index of its commit.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from .harness import generate_repo, wait_until

QUERY = {"query": "compute value", "context_id": "main"}
REASON = "no elected cluster manager"
#: Seconds the cluster is kept red: longer than the stack's task time limit (TIME_LIMIT_S).
RED_S = 75
TIME_LIMIT_S = 60


@pytest.mark.known_failing  # issue 24: failed after the red phase in a clean-clone CI run on main (2026-11-30)
def test_cluster_red_gives_503_with_reason_and_syncs_wait(make_cluster_stack, private_cluster, tmp_path,
                                                          report) -> None:
    stack = make_cluster_stack("red", SCOPEKB_OPENSEARCH__SHARDS="3", SCOPEKB_OPENSEARCH__REPLICAS="1",
                               SCOPEKB_WORKER__MAX_RETRIES="8",
                               SCOPEKB_WORKER__BATCH_FILES="30", SCOPEKB_OPENSEARCH__BULK_MAX_BYTES="131072",
                               SCOPEKB_WORKER__TASK_SOFT_TIME_LIMIT_S=str(TIME_LIMIT_S - 5),
                               SCOPEKB_WORKER__TASK_TIME_LIMIT_S=str(TIME_LIMIT_S))
    repo_a, repo_b = tmp_path / "repo-a", tmp_path / "repo-b"
    commit_a, commit_b = generate_repo(repo_a, files=240), generate_repo(repo_b, files=40)
    stack.start_query()
    worker = stack.start_worker()
    src_a = stack.add_source(repo_a, agent="red-agent")
    src_b = stack.add_source(repo_b, agent="red-agent", context="other")
    key = stack.agent_key("red-agent")
    cold_key = stack.agent_key("red-agent")  # never used before the red state: its lookup is not cached
    search = httpx.Client(base_url=stack.query_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert search.post("/v1/search", json=QUERY).status_code == 200  # warms this key's cache entry
    job_a = stack.sync(src_a)
    at_kill = wait_until(lambda: (n := stack.count(src_a)) > 400 and n, timeout=180, interval=0.05,
                         what="sync A writing")

    killed = [private_cluster.kill(private_cluster.node_pid_name(i)) for i in (1, 2)]
    red_at = time.monotonic()
    wait_until(lambda: httpx.get(stack.query_url + "/readyz", timeout=30).status_code == 503, timeout=60,
               interval=0.1, what="readiness reporting the red cluster")
    detected_s = round(time.monotonic() - red_at, 2)
    job_b = f"red-b-{uuid.uuid4().hex[:10]}"  # enqueued as the ingester does (it needs no OpenSearch to enqueue)
    stack.send_task("scopekb.sync_sources", job_id=job_b, source_ids=[src_b], trigger="webhook")
    cold = httpx.post(stack.query_url + "/v1/search", json=QUERY, headers={"Authorization": f"Bearer {cold_key}"},
                      timeout=60)
    answers, ready = [], []
    while time.monotonic() - red_at < RED_S:
        t0 = time.monotonic()
        r = search.post("/v1/search", json=QUERY)
        answers.append((r.status_code, round(time.monotonic() - t0, 2), r.json().get("detail")))
        rz = httpx.get(stack.query_url + "/readyz", timeout=30)
        ready.append((rz.status_code, rz.json().get("checks", {}).get("opensearch")))
        time.sleep(3)
    red_s = round(time.monotonic() - red_at, 1)
    report("injected", fault="SIGKILL of nodes 1 and 2 of 3 mid sync (no quorum: no cluster manager, a shard "
           "without a copy)", pids=killed, commits=(commit_a[:10], commit_b[:10]), chunks_at_kill=at_kill,
           readyz_503_after_s=detected_s, red_for_s=red_s, task_time_limit_s=TIME_LIMIT_S,
           cold_key_search=(cold.status_code, cold.json().get("detail")), searches=answers[:6],
           searches_total=len(answers), readyz=ready[:3])
    assert answers and all(status == 503 and took < 5 for status, took, _ in answers), answers
    assert all(REASON in (detail or "") for _, _, detail in answers), answers
    assert cold.status_code == 503 and REASON in cold.json().get("detail", ""), cold.text
    assert ready and all(status == 503 and REASON in (why or "") for status, why in ready), ready

    restart_s = private_cluster.up(private_cluster.node_service(1), private_cluster.node_service(2))
    wait_until(lambda: httpx.get(stack.query_url + "/readyz", timeout=30).status_code == 200, timeout=180,
               interval=0.5, what="readiness after the restart")
    ready_s, ready_wall = round(time.monotonic() - red_at, 1), datetime.now(UTC)
    after = search.post("/v1/search", json=QUERY)
    a = stack.wait_job(job_a, timeout=300, procs=[worker])
    b = stack.wait_job(job_b, timeout=120, procs=[worker])
    settled_s = round(time.monotonic() - red_at, 1)
    expected_a, _ = stack.fresh(repo_a)
    expected_b, _ = stack.fresh(repo_b)
    cmp_a, cmp_b = stack.compare(src_a, expected_a), stack.compare(src_b, expected_b)
    log = worker.log_text()
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    retries_at = [datetime.fromisoformat(e["timestamp"]) for e in events if e.get("event") == "sync_retry"]
    report("checked", nodes_restart_s=round(restart_s, 1), ready_again_after_kill_s=ready_s,
           search_after=(after.status_code, len(after.json().get("hits", []))),
           job_a=(a["state"], a["retries"]), job_b=(b["state"], b["retries"]), jobs_settled_after_kill_s=settled_s,
           deferrals_logged=log.count('"sync_deferred_for_cluster"'),
           task_retries_after_ready_s=[round((t - ready_wall).total_seconds(), 1) for t in retries_at],
           dead_letters=len(stack.dead_letters()), comparison_a=cmp_a.summary(), comparison_b=cmp_b.summary())
    assert after.status_code == 200 and after.json()["hits"]
    assert a["state"] == "done" and b["state"] == "done", (a, b)
    for job in (a, b):  # waiting for the cluster is no redelivery
        assert not job["retries"].get("redelivered"), job["retries"]
    # waiting spent no attempt: an attempt is only spent (sync_retry) by a failure once the cluster serves again
    # (the nodes rejoining may still fail a write or two; the retry policy covers that)
    assert log.count('"sync_deferred_for_cluster"') >= 2
    assert all(t >= ready_wall - timedelta(seconds=20) for t in retries_at), (retries_at, ready_wall)
    assert "TimeLimitExceeded" not in log and "Hard time limit" not in log
    assert stack.dead_letters() == []
    assert cmp_a.equal and cmp_a.duplicates == 0, cmp_a.summary()
    assert cmp_b.equal and cmp_b.duplicates == 0, cmp_b.summary()
