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
  longer than the task time limit of this stack (120 s), so a sync that kept waiting inside its task would be
  ended by it. B starts during red and waits (a deferral logged before the nodes restart).
- a second worker process is started during red: its first sync checks the chunk index (and reads and writes
  job records) in a process that has never reached the cluster, right as the nodes come back;
- sync C is enqueued the moment the restarted nodes answer, so it starts while the cluster elects a cluster
  manager and recovers its shards: whatever the first requests of a task meet then (connection refused, no
  cluster manager, a shard without a copy) is a wait or a retry, never a task that dies and leaves its job
  ``running`` (issue 24: it did, from the worker's chunk index check at task start).
After the two nodes are started again (and a primary OpenSearch left out of primary mode is failed, see below), the
service is ready (200) and searches answer 200 within 30 s of that (the failures in between are reported), all three
jobs end ``done`` with no dead letter, no attempt spent while the cluster was red (a write failing while the nodes
rejoin may still spend one: seen once in three runs, a few attempts over 3 minutes, hence 8 attempts here) and each
source's index equals a fresh full index of its commit.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from .harness import generate_repo, wait_until

QUERY = {"query": "compute value", "context_id": "main"}
REASON = "no elected cluster manager"
#: Seconds the cluster is kept red: longer than the stack's task time limit (TIME_LIMIT_S).
RED_S = 135
#: The task time limit of this stack. A sync caught mid-write needs up to about 35 s to see the red state before it
#: waits (its bulk request's 30 s client timeout, a job-record write's 15 s in parallel, health checks), and sync A's
#: whole run after the wait took over 75 s on this loaded 2-core machine (the soft limit ended it once at 80 s, and
#: the red state took 60 s runs past the limit mid-write); production's limit is an hour.
TIME_LIMIT_S = 120


@pytest.mark.timeout(1200)  # the cluster's start (~100 s) and a loaded 2-core machine: 5.5-9.5 min seen
def test_cluster_red_gives_503_with_reason_and_syncs_wait(make_cluster_stack, private_cluster, tmp_path,
                                                          report) -> None:
    stack = make_cluster_stack("red", SCOPEKB_OPENSEARCH__SHARDS="3", SCOPEKB_OPENSEARCH__REPLICAS="1",
                               SCOPEKB_WORKER__MAX_RETRIES="8",
                               SCOPEKB_WORKER__BATCH_FILES="30", SCOPEKB_OPENSEARCH__BULK_MAX_BYTES="131072",
                               SCOPEKB_WORKER__TASK_SOFT_TIME_LIMIT_S=str(TIME_LIMIT_S - 5),
                               SCOPEKB_WORKER__TASK_TIME_LIMIT_S=str(TIME_LIMIT_S))
    repo_a, repo_b, repo_c = tmp_path / "repo-a", tmp_path / "repo-b", tmp_path / "repo-c"
    commit_a, commit_b = generate_repo(repo_a, files=240), generate_repo(repo_b, files=40)
    commit_c = generate_repo(repo_c, files=20)
    stack.start_query()
    worker = stack.start_worker()
    src_a = stack.add_source(repo_a, agent="red-agent")
    src_b = stack.add_source(repo_b, agent="red-agent", context="other")
    src_c = stack.add_source(repo_c, agent="red-agent", context="third")
    key = stack.agent_key("red-agent")
    cold_key = stack.agent_key("red-agent")  # never used before the red state: its lookup is not cached
    search = httpx.Client(base_url=stack.query_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert search.post("/v1/search", json=QUERY).status_code == 200  # warms this key's cache entry
    job_a = stack.sync(src_a)
    at_kill = wait_until(lambda: (n := stack.count(src_a)) > 400 and n, timeout=180, interval=0.05,
                         what="sync A writing")

    scenario = stack.alias.removesuffix("chunks") + "*"  # the scenario's chunk and system indices
    primaries_before = private_cluster.primaries(scenario)
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
    worker_2 = None
    while time.monotonic() - red_at < RED_S:
        t0 = time.monotonic()
        r = search.post("/v1/search", json=QUERY)
        answers.append((r.status_code, round(time.monotonic() - t0, 2), r.json().get("detail")))
        rz = httpx.get(stack.query_url + "/readyz", timeout=30)
        ready.append((rz.status_code, rz.json().get("checks", {}).get("opensearch")))
        time.sleep(3)
        if worker_2 is None and time.monotonic() - red_at > RED_S / 2:  # a process that never reached the cluster
            worker_2 = stack.start_worker("worker-2")
    red_s = round(time.monotonic() - red_at, 1)
    report("injected", fault="SIGKILL of nodes 1 and 2 of 3 mid sync (no quorum: no cluster manager, a shard "
           "without a copy); a second worker started during red; sync C sent as the nodes answer again",
           pids=killed, commits=(commit_a[:10], commit_b[:10], commit_c[:10]), chunks_at_kill=at_kill,
           readyz_503_after_s=detected_s, red_for_s=red_s, task_time_limit_s=TIME_LIMIT_S,
           cold_key_search=(cold.status_code, cold.json().get("detail")), searches=answers[:6],
           searches_total=len(answers), readyz=ready[:3])
    assert answers and all(status == 503 and took < 5 for status, took, _ in answers), answers
    assert all(REASON in (detail or "") for _, _, detail in answers), answers
    assert cold.status_code == 503 and REASON in cold.json().get("detail", ""), cold.text
    assert ready and all(status == 503 and REASON in (why or "") for status, why in ready), ready

    restart_wall = datetime.now(UTC)
    restart_s = private_cluster.up(private_cluster.node_service(1), private_cluster.node_service(2))
    # OpenSearch 2.19 sometimes (3 runs in 8 here, and the CI run at 8c08e7d) leaves the shards whose primary was on
    # the node that rejoined during the election with a replica made primary on node 0 but the metadata's primary
    # term unchanged: that copy never enters primary mode, every write or refresh of the shard fails with
    # shard_not_in_primary_mode_exception and its replicas never recover. The syncs rightly keep waiting for it
    # ("recovering"); an operator would fail that copy, and so does the test (said in the report), as it restarts nodes
    repair = ThreadPoolExecutor(1, thread_name_prefix="repair").submit(
        private_cluster.repair_unpromoted_primaries, scenario, primaries_before)
    job_c = f"red-c-{uuid.uuid4().hex[:10]}"  # starts while the cluster recovers (the worker is idle or waiting)
    stack.send_task("scopekb.sync_sources", job_id=job_c, source_ids=[src_c], trigger="webhook")
    wait_until(lambda: httpx.get(stack.query_url + "/readyz", timeout=30).status_code == 200, timeout=180,
               interval=0.5, what="readiness after the restart")
    ready_s, ready_wall = round(time.monotonic() - red_at, 1), datetime.now(UTC)
    # readiness asks the node reached about the chunk index; for a few seconds more that node may still fail a
    # search whose shard copies sit on a node it has not reconnected to (node_not_connected_exception): counted
    after_ready: list[tuple[int, str | None]] = []
    while True:
        after = search.post("/v1/search", json=QUERY)
        if after.status_code == 200 or len(after_ready) >= 30:
            break
        after_ready.append((after.status_code, after.json().get("detail")))
        time.sleep(1)
    search_ok_s = round(time.monotonic() - red_at - ready_s, 1)
    workers = [worker, *([worker_2] if worker_2 is not None else [])]
    repaired = repair.result(timeout=300)
    try:
        a = stack.wait_job(job_a, timeout=300, procs=workers)
        b = stack.wait_job(job_b, timeout=120, procs=workers)
        c = stack.wait_job(job_c, timeout=120, procs=workers)
        settled_s = round(time.monotonic() - red_at, 1)
        expected = {src: stack.fresh(repo)[0] for src, repo in ((src_a, repo_a), (src_b, repo_b), (src_c, repo_c))}
        cmp = {src: stack.compare(src, chunks) for src, chunks in expected.items()}
    except Exception as e:  # a sync still waiting, or the index not readable: what the cluster says about it now
        cluster = private_cluster.cluster_report(scenario)
        raise AssertionError(f"{type(e).__name__}: {str(e)[:6000]}\n--- cluster now\n{cluster}") from e
    log = "\n".join(w.log_text() for w in workers)
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    retries_at = [datetime.fromisoformat(e["timestamp"]) for e in events if e.get("event") == "sync_retry"]
    waits = [e for e in events if e.get("event") == "sync_deferred_for_cluster"]
    b_waits_in_red = [e for e in waits if e.get("job_id") == job_b
                      and datetime.fromisoformat(e["timestamp"]) < restart_wall]
    report("checked", nodes_restart_s=round(restart_s, 1), primaries_failed_for_opensearch=repaired,
           ready_again_after_kill_s=ready_s,
           search_after=(after.status_code, len(after.json().get("hits", []))), search_200_after_ready_s=search_ok_s,
           searches_failed_after_ready=(len(after_ready), after_ready[:2]),
           job_a=(a["state"], a["retries"]), job_b=(b["state"], b["retries"]), job_c=(c["state"], c["retries"]),
           jobs_settled_after_kill_s=settled_s, deferrals_logged=len(waits),
           deferrals_by_job={j: sum(e.get("job_id") == j for e in waits) for j in (job_a, job_b, job_c)},
           b_waits_during_red=len(b_waits_in_red),
           task_retries_after_ready_s=[round((t - ready_wall).total_seconds(), 1) for t in retries_at],
           crashed=log.count('"sync_crashed"'), dead_letters=len(stack.dead_letters()),
           comparisons=[cmp[src].summary() for src in (src_a, src_b, src_c)])
    assert after.status_code == 200 and after.json()["hits"]
    assert (a["state"], b["state"], c["state"]) == ("done", "done", "done"), (a, b, c)
    for job in (a, b, c):  # waiting for the cluster is no redelivery
        assert not job["retries"].get("redelivered"), job["retries"]
    # waiting spent no attempt: an attempt is only spent (sync_retry) by a failure once the cluster serves again
    # (the nodes rejoining may still fail a write or two; the retry policy covers that)
    assert len(waits) >= 2 and b_waits_in_red, (len(waits), b_waits_in_red)
    assert all(t >= ready_wall - timedelta(seconds=20) for t in retries_at), (retries_at, ready_wall)
    assert "TimeLimitExceeded" not in log and "Hard time limit" not in log
    assert '"sync_crashed"' not in log  # no task ended on an error outside the wait/retry policy
    assert stack.dead_letters() == []
    for src, comparison in cmp.items():
        assert comparison.equal and comparison.duplicates == 0, (src, comparison.summary())
