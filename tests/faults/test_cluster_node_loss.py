"""A data node of a 3-node OpenSearch cluster is SIGKILLed during a large sync while agents search.

The chunk index has 3 primary shards and 1 replica, so every shard has a copy on two of the three nodes. A node
that is not the elected cluster manager and holds a primary is killed (a crash: nothing flushed) while the
worker is writing and a searcher keeps asking. The survivors promote the replicas of the lost primaries;
searches must keep answering 200 throughout (every non-200 is counted and reported), the sync must finish (or
be redelivered) and the index must then equal a fresh full index of the commit. The node is started again and
the cluster must come back to green.
"""

from __future__ import annotations

import time

import pytest

from .harness import Searcher, Stack, generate_repo, wait_until

QUERY = {"query": "compute value registry", "context_id": "main"}


def node_to_kill(stack: Stack, index: str) -> tuple[int, str]:
    """A node that is not the elected cluster manager and holds a primary shard of ``index``: (i, name)."""
    manager = stack.os.cat.cluster_manager(params={"format": "json"})[0]["node"]
    shards = stack.os.cat.shards(index=index, params={"format": "json"})
    primaries = sorted({s["node"] for s in shards if s["prirep"] == "p" and s["node"] and s["node"] != manager})
    name = primaries[0]
    return int(name.rsplit("-", 1)[1]), name


@pytest.mark.timeout(1200)  # the cluster's start (~100 s) and a loaded 2-core machine: 5.5-9.5 min seen
def test_data_node_sigkill_during_sync_and_searches(make_cluster_stack, private_cluster, tmp_path, report) -> None:
    stack = make_cluster_stack("nodeloss", SCOPEKB_OPENSEARCH__SHARDS="3", SCOPEKB_OPENSEARCH__REPLICAS="1",
                               SCOPEKB_WORKER__BATCH_FILES="40", SCOPEKB_OPENSEARCH__BULK_MAX_BYTES="131072")
    repo = tmp_path / "repo"
    commit = generate_repo(repo, files=400)
    stack.start_query()
    worker = stack.start_worker()
    src = stack.add_source(repo, agent="nodeloss-agent")
    key = stack.agent_key("nodeloss-agent")
    index = stack.os.indices.get_alias(name=stack.alias).popitem()[0]
    stack.os.cluster.health(index=index, wait_for_status="green", params={"timeout": "60s", "request_timeout": 70})

    searcher = Searcher(stack, key, QUERY)
    searcher.start()
    job_id = stack.sync(src)
    at_kill = wait_until(lambda: (n := stack.count(src)) > 1000 and n, timeout=180, interval=0.05,
                         what="sync writing")
    i, name = node_to_kill(stack, index)
    killed_pid = private_cluster.kill(private_cluster.node_pid_name(i))
    killed_at = time.monotonic()
    survivor = stack.os  # its connection pool marks the dead node and retries on the others

    def primaries_active() -> dict | None:
        h = survivor.cluster.health(index=index, params={"request_timeout": 10})
        return h if h["status"] in ("yellow", "green") and h["active_primary_shards"] == 3 and \
            h["number_of_nodes"] == 2 else None

    health = wait_until(primaries_active, timeout=120, interval=0.2, what="primaries promoted on the survivors")
    promoted_s = round(time.monotonic() - killed_at, 1)
    report("injected", fault=f"SIGKILL of data node {name} (not the cluster manager, holds a primary)",
           pid=killed_pid, commit=commit[:10], chunks_at_kill=at_kill, primaries_active_after_s=promoted_s,
           health_after=(health["status"], health["number_of_nodes"], health["unassigned_shards"]))

    job = stack.wait_job(job_id, timeout=300, procs=[worker])
    job_done_s = round(time.monotonic() - killed_at, 1)
    during = searcher.summary()
    restart_s = private_cluster.up(private_cluster.node_service(i))
    green = survivor.cluster.health(wait_for_status="green", params={"timeout": "120s", "request_timeout": 130})
    green_s = round(time.monotonic() - killed_at, 1)
    searcher.stop()
    after = searcher.summary()
    expected, _ = stack.fresh(repo)
    comparison = stack.compare(src, expected)
    report("checked", job_state=job["state"], job_retries=job["retries"], job_done_after_kill_s=job_done_s,
           searches_until_job_done=during, searches_total=after, node_restart_s=round(restart_s, 1),
           cluster=(green["status"], green["number_of_nodes"]), green_after_kill_s=green_s,
           comparison=comparison.summary())
    assert job["state"] == "done", job
    assert after["non_200"] == 0, after
    assert green["status"] == "green" and green["number_of_nodes"] == 3
    assert comparison.equal and comparison.duplicates == 0, comparison.summary()
