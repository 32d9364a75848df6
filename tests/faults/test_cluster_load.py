"""Load on the 3-node cluster: 1, 2 and 3 worker processes, then concurrent pushes while agents search.

Six repositories are registered. Throughput: for 1, 2 and then 3 worker processes on the same queue, six new
sources (one per repository) are full-synced at once, and chunks written per second from the first enqueue to
the last job done are reported with their ratios to one worker. The machine has 2 shared cores, so the ratio
says what this host gives (workers, three OpenSearch nodes and the test share the cores), not what separate
machines would; it is reported, never asserted.

Then 12 pushes arrive concurrently (two commits per repository, each followed at once by a sync, one thread per
repository) to the three workers while a searcher keeps asking. After everything settles every source's index
must equal a fresh full index of its repository at HEAD: no chunk lost, none duplicated, none stale. The
workers share the repository lock, so two syncs of one repository never write at once. Search p95 and the
count of non-200 answers are reported.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from .harness import Searcher, Stack, generate_repo, git

REPOS = 6
FILES = 30
QUERY = {"query": "compute value registry", "context_id": "main"}


def _push(repo: Path, n: int) -> str:
    """Edit two modules, add one, delete one; commit; returns the commit id."""
    modules = sorted(repo.glob("src/pkg*/module_*.py"))
    for path in modules[n:n + 2]:
        path.write_text(path.read_text() + f"\n\ndef pushed_{n}() -> int:\n    return {n}\n")
    (repo / "src" / f"added_{n}.py").write_text(f'"""Added by push {n}."""\n\nVALUE_{n} = {n}\n')
    modules[-1 - n].unlink()
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "-m", f"push {n}")
    return git(repo, "rev-parse", "HEAD")


def _sync_all(stack: Stack, sources: list[str], workers: list) -> tuple[float, int, list[dict]]:
    """Enqueue a sync of every source at once; wait for all; returns (seconds, chunks written, jobs)."""
    t0 = time.monotonic()
    job_ids = [stack.sync(s) for s in sources]
    jobs = [stack.wait_job(j, timeout=600, procs=workers) for j in job_ids]
    return time.monotonic() - t0, sum(j["chunks_written"] for j in jobs), jobs


@pytest.mark.timeout(1200)  # the cluster's start (~100 s) and a loaded 2-core machine: 5.5-9.5 min seen
def test_workers_throughput_and_concurrent_pushes(make_cluster_stack, tmp_path, report) -> None:
    stack = make_cluster_stack("load", SCOPEKB_OPENSEARCH__SHARDS="3", SCOPEKB_OPENSEARCH__REPLICAS="1",
                               SCOPEKB_WORKER__BATCH_FILES="40")
    repos = [tmp_path / f"repo{i}" for i in range(REPOS)]
    for repo in repos:
        generate_repo(repo, files=FILES)
    stack.start_query()
    workers = [stack.start_worker("worker-1")]
    main = [stack.add_source(repo, agent="load-agent") for repo in repos]
    warm_s, warm_chunks, _ = _sync_all(stack, main, workers)  # clones the mirrors; the base of the pushes

    throughput: dict[int, float] = {}
    for n in (1, 2, 3):
        while len(workers) < n:
            workers.append(stack.start_worker(f"worker-{len(workers) + 1}"))
        sources = [stack.add_source(repo, agent=f"tp{n}-agent") for repo in repos]
        secs, chunks, jobs = _sync_all(stack, sources, workers)
        assert all(j["state"] == "done" for j in jobs), jobs
        throughput[n] = chunks / secs
        report(f"throughput with {n} worker process(es)", repos=REPOS, chunks=chunks, seconds=round(secs, 1),
               chunks_per_s=round(throughput[n], 1))
    report("throughput ratios", cores=os.cpu_count(), two_vs_one=round(throughput[2] / throughput[1], 2),
           three_vs_one=round(throughput[3] / throughput[1], 2), warmup=(round(warm_s, 1), warm_chunks))

    key = stack.agent_key("load-agent")
    searcher = Searcher(stack, key, QUERY, pause_s=0.05)
    searcher.start()
    job_ids: list[str] = []
    lock = threading.Lock()

    def pushes(i: int) -> None:
        for k in range(2):
            _push(repos[i], k)
            job = stack.sync(main[i])
            with lock:
                job_ids.append(job)

    t0 = time.monotonic()
    threads = [threading.Thread(target=pushes, args=(i,)) for i in range(REPOS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs = [stack.wait_job(j, timeout=600, procs=workers) for j in job_ids]
    settle_s = time.monotonic() - t0
    searcher.stop()
    searches = searcher.summary()
    comparisons = [stack.compare(src, stack.fresh(repo)[0]) for src, repo in zip(main, repos, strict=True)]
    handled_by = {p.name: p.log_text().count('"sync_started"') for p in workers}
    report("concurrent pushes", pushes=len(job_ids), workers=len(workers), settle_s=round(settle_s, 1),
           job_states=sorted(j["state"] for j in jobs), syncs_started_per_worker=handled_by, searches=searches,
           comparisons=[c.summary() for c in comparisons])
    assert all(j["state"] == "done" for j in jobs), jobs
    assert searches["non_200"] == 0, searches
    for c in comparisons:
        assert c.equal and c.duplicates == 0, c.summary()
