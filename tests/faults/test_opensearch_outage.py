"""OpenSearch goes away for 30 s in the middle of a sync and comes back.

The node is stopped (SIGTERM) while the worker is writing a sync, kept down for 30 s and started again. Meanwhile
searches through the query service must fail fast with a clear 503 (not hang), and the worker must neither spin
nor give up: bulk items it could not write are re-sent with jittered backoff, then the task retries with
backoff, bounded. Once OpenSearch is back the job finishes with its retries on record and no chunk lost: the
index equals a fresh full index of the commit.
"""

from __future__ import annotations

import time

import httpx

from scopekb.indexing import BULK_RETRY_ROUNDS
from scopekb.settings import WorkerSettings

from .harness import generate_repo, wait_until

OUTAGE_S = 30
FILES = 400
BATCH_FILES = 40
#: The query service's answer while OpenSearch cannot be reached (``scopekb_query.app``).
UNAVAILABLE = "search backend unavailable"
QUERY = {"query": "compute value", "context_id": "main"}


def test_opensearch_down_30s_during_sync(make_stack, private_services, tmp_path, report) -> None:
    stack = make_stack("opensearch", SCOPEKB_WORKER__BATCH_FILES=str(BATCH_FILES),
                       SCOPEKB_OPENSEARCH__BULK_MAX_BYTES="262144")
    repo = tmp_path / "repo"
    generate_repo(repo, files=FILES)
    stack.start_query()
    worker = stack.start_worker()
    src = stack.add_source(repo, agent="os-agent")
    key = stack.agent_key("os-agent")
    search = httpx.Client(base_url=stack.query_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert search.post("/v1/search", json=QUERY).status_code == 200  # warm the key cache
    job_id = stack.sync(src)
    at_stop = wait_until(lambda: (n := stack.count(src)) > 800 and n, timeout=120, interval=0.05,
                         what="sync writing")

    stopped = private_services.down("opensearch")
    down_at = time.monotonic()
    answers = []
    while time.monotonic() - down_at < OUTAGE_S:
        t0 = time.monotonic()
        r = search.post("/v1/search", json=QUERY)
        answers.append((r.status_code, round(time.monotonic() - t0, 2), r.json().get("detail")))
        time.sleep(5)
    readyz = httpx.get(stack.query_url + "/readyz", timeout=30)
    job_during = stack.job(job_id)
    report("injected", fault=f"OpenSearch stopped for {OUTAGE_S}s mid sync", chunks_at_stop=at_stop,
           stop_took_s=round(stopped, 1), searches_during_outage=answers, readyz=(readyz.status_code, readyz.json()),
           job_during_outage=job_during)
    assert answers and all(status == 503 and took < 5 for status, took, _ in answers), answers
    # The node is unreachable (connection refused): exactly the service's "unavailable" answer, nothing else.
    assert all(detail == UNAVAILABLE for _, _, detail in answers), answers

    started = private_services.up("opensearch")
    job = stack.wait_job(job_id, timeout=300, procs=[worker])
    expected, _ = stack.fresh(repo)
    comparison = stack.compare(src, expected)
    after = search.post("/v1/search", json=QUERY)
    log = worker.log_text()
    report("checked", opensearch_start_s=round(started, 1), job_state=job["state"], retries=job["retries"],
           bulk_retry_rounds_logged=log.count('"bulk_retry"'), task_retries_logged=log.count('"sync_retry"'),
           chunks_written=job["chunks_written"], comparison=comparison.summary(),
           search_after=(after.status_code, len(after.json().get("hits", []))))
    assert job["state"] == "done", job
    # Bounded retries: the task retried at most worker.max_retries times (never dead-lettered), and the bulk
    # retry rounds never exceeded BULK_RETRY_ROUNDS per write attempt (one per batch of files per task run).
    task_runs = job["retries"].get("task", 0) + 1
    assert task_runs - 1 <= WorkerSettings().max_retries, job["retries"]
    assert stack.dead_letters() == []
    batches = -(-FILES // BATCH_FILES)
    assert log.count('"bulk_retry"') <= task_runs * batches * BULK_RETRY_ROUNDS, (log.count('"bulk_retry"'), job)
    assert '"repo_lock_release_failed"' not in log, "the repository lock expired during the sync (not renewed)"
    assert job["retries"].get("bulk_items", 0) + job["retries"].get("task", 0) > 0, job["retries"]
    assert comparison.equal and comparison.duplicates == 0, comparison.summary()
    assert after.status_code == 200 and after.json()["hits"]
