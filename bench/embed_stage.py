"""Embedding as its own stage (issue 19): 1 vs 2 embedding worker processes, the model elsewhere, sync worker RSS.

Indexes one release of a real project (click 8.1.0 by default, from the bench's sdist cache like ``bench/run``) on
the running services (``scripts/services``; a private alias, system prefix, bucket and queues per case, deleted
at the end) with real ``scopekb worker`` processes:

- a sync worker (``--queues <sync queue>``, ``worker.embed_queue`` set) runs the sync stage alone; its process
  tree's summed PSS is sampled every 0.2 s over the stage and each process's peak RSS (``VmHWM``) is read when
  the stage ends (target: <= 600 MiB), and the model runtimes its processes have loaded are read from their
  memory maps (expected none: with the embedding queue set it never imports torch or onnxruntime);
- then N embedding workers (``--queues <embed queue>``, concurrency 1 each, ``embedding.local_threads`` 1 so two
  processes fit two cores; parts of 32 chunks, so a small corpus still spreads over two) are started together
  and the embedding stage is timed from the moment all of them are ready to the job's ``done`` (a fresh
  embedding cache per case: every chunk is computed);
- cases: the local model (torch) with N = 1 and 2, and the OpenAI-compatible stub (``tests/openai_stub.py``, in
  this process, answering with hashed unit vectors at once) with N = 1 and 2: the stage's own ceiling when the
  model is elsewhere;
- baseline: one worker embedding inline (no embedding queue, the default), whole-sync seconds and peak RSS;
- ``sync``: the sync stage alone with the local model configured and the embedding queue set, no embedding worker
  (the job is left in its embedding stage and deleted): the sync worker's memory in a few seconds
  (``bench/run --quick``);
- per case, index bytes ÷ text bytes of the tree once the job is done (the index with vectors, for the local
  model's cases).

Prints one JSON object; ratios are within this run. ``bench/run`` runs it as its ``embedstage`` phase (full profile
only: about ten minutes here; :func:`measure`).

    .venv/bin/python bench/embed_stage.py [--package click --versions 8.1.0] [--cases local1,local2,stub1,stub2,inline]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[1:1] = [str(REPO / "bench"), str(REPO)]

MIB = 1024 * 1024


def _hash_vectors(texts: list[str]) -> np.ndarray:
    """384-d unit vectors from each text's sha256 (the stub's "model": no arithmetic worth measuring)."""
    out = np.empty((len(texts), 384), dtype=np.float32)
    for i, t in enumerate(texts):
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little"))
        v = rng.standard_normal(384).astype(np.float32)
        out[i] = v / np.linalg.norm(v)
    return out


def _peak_rss(pid: int) -> dict[str, int]:
    """``VmHWM`` (peak resident set) of a process and each descendant, bytes, keyed by pid."""
    import psutil

    out: dict[str, int] = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for p in procs:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        out[str(p.pid)] = int(line.split()[1]) * 1024
    return out


#: Shared libraries whose presence in a process's memory map means a model runtime was imported there.
MODEL_RUNTIME_LIBS = ("libtorch", "libc10", "onnxruntime")


def _model_libs(pid: int) -> list[str]:
    """File names of the model runtimes' shared libraries (:data:`MODEL_RUNTIME_LIBS`) mapped by a process or a
    descendant, from ``/proc/<pid>/maps``: an import of torch or onnxruntime leaves them there for good."""
    import psutil

    found: set[str] = set()
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{p.pid}/maps").read_text().splitlines():
                    name = line.rsplit("/", 1)[-1] if "/" in line else ""
                    if name.endswith(".so") or ".so." in name:
                        if any(k in name for k in MODEL_RUNTIME_LIBS):
                            found.add(name)
    return sorted(found)


def _spawn(env: dict[str, str], queues: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "scopekb_cli.main", "worker", "--concurrency", "1",
                                 "--queues", queues], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _ready(procs: list[tuple[subprocess.Popen, Path]], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p, log in procs:
            if p.poll() is not None:
                raise RuntimeError(f"worker exited: {log.read_text(errors='replace')[-2000:]}")
        if all(" ready." in log.read_text(errors="replace") for _, log in procs):
            return
        time.sleep(0.2)
    raise RuntimeError("workers not ready")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def _wait(records: Any, job_id: str, done: Any, timeout: float = 1800) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = records.get_job(job_id)
        if job is not None and done(job):
            return job
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} not done: {records.get_job(job_id)}")


def _index_bytes(client: Any, alias: str, bare: Path) -> dict[str, Any]:
    """Primary store bytes of the chunk index ÷ text bytes of the indexed tree, after a merge to one segment with
    the deleted copies the embedding stage's partial updates leave gone: OpenSearch keeps soft-deleted copies
    until the shard's retention lease moves past them (synced every 30 s), so the merge is repeated for up to
    90 s until no deleted document is left, and flushed so the files of the merged-away segments are gone. Also
    the vector's share of one chunk's ``_source`` as read back (with derived source, mapping version 6, the
    stored ``_source`` has no vector: the read puts it back)."""
    from scopekb_bench import corpus

    deadline = time.monotonic() + 90
    while True:
        client.indices.refresh(index=alias)
        client.indices.forcemerge(index=alias, params={"max_num_segments": 1, "request_timeout": 600})
        client.indices.refresh(index=alias)
        client.indices.flush(index=alias, params={"force": "true"})  # the merged-away segments' files go
        stats = client.indices.stats(index=alias, metric="store,docs,segments")["_all"]["primaries"]
        if not stats["docs"]["deleted"] or time.monotonic() > deadline:
            break
        time.sleep(5)
    _, _, text = corpus.tree_text_bytes(bare, "main")
    hit = client.search(index=alias, body={"size": 1, "query": {"exists": {"field": "embedding"}}})["hits"]["hits"]
    src = hit[0]["_source"] if hit else {}
    vec_json = len(json.dumps(src.get("embedding", []))) if src else 0
    live = client.indices.get_alias(name=alias)
    settings = client.indices.get_settings(index=next(iter(live)))
    derived = next(iter(settings.values()))["settings"]["index"].get("knn.derived_source", {}).get("enabled")
    return {"index_bytes": stats["store"]["size_in_bytes"], "source_text_bytes": text,
            "index_over_source": round(stats["store"]["size_in_bytes"] / max(1, text), 2),
            "docs": stats["docs"]["count"], "docs_deleted": stats["docs"]["deleted"],
            "segments": stats["segments"]["count"], "derived_source": derived,
            "source_json_bytes_one_doc": len(json.dumps(src)), "vector_json_bytes_one_doc": vec_json}


def run_case(case: str, endpoints: dict[str, str], bare: Path, work: Path, stub_url: str) -> dict[str, Any]:
    """One case: ``local<N>``, ``stub<N>``, ``inline`` or ``sync``; returns its figures."""
    from scopekb_bench.stack import cleanup
    from scopekb_bench.util import RssSampler

    from scopekb import queue
    from scopekb.models import JobStage, Source
    from scopekb.runtime import celery_app
    from scopekb.settings import Settings
    from scopekb.stores.opensearch import make_client
    from scopekb.stores.records import OpenSearchRecordStore

    run_id = "emb" + secrets.token_hex(3)
    prefix = f"bench-{run_id}"
    model = {"SCOPEKB_EMBEDDING__PROVIDER": "local", "SCOPEKB_EMBEDDING__LOCAL_THREADS": "1"}
    if case.startswith("stub"):
        model = {"SCOPEKB_EMBEDDING__PROVIDER": "openai", "SCOPEKB_EMBEDDING__BASE_URL": stub_url,
                 "SCOPEKB_EMBEDDING__API_KEY": "sk-bench", "SCOPEKB_EMBEDDING__MODEL": "hash384"}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SCOPEKB_", "OPENAI_"))}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)  # this checkout first
    env = {**base, **endpoints, "PYTHONPATH": path,
           "HF_HUB_OFFLINE": "1", "SCOPEKB_PROFILE": "distributed",
           "SCOPEKB_OPENSEARCH__ALIAS": f"{prefix}-chunks", "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"{prefix}-sys",
           "SCOPEKB_S3__BUCKET": prefix, "SCOPEKB_WORKER__QUEUE": f"{prefix}-sync",
           "SCOPEKB_WORKER__EMBED_QUEUE": "" if case == "inline" else f"{prefix}-embed",
           "SCOPEKB_WORKER__EMBED_PART_CHUNKS": "32",  # enough parts for two workers on a small corpus
           "SCOPEKB_GIT__CACHE_DIR": str(work / f"git-{run_id}"), "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true",
           "SCOPEKB_LOG_FORMAT": "json", "SCOPEKB_LOG_LEVEL": "INFO", **model}
    s = Settings(opensearch={"url": endpoints["SCOPEKB_OPENSEARCH__URL"], "alias": f"{prefix}-chunks",
                             "system_prefix": f"{prefix}-sys"},
                 redis={"url": endpoints["SCOPEKB_REDIS__URL"]}, worker={"queue": f"{prefix}-sync"})
    records = OpenSearchRecordStore(make_client(s.opensearch), s.opensearch.system_prefix)
    procs: list[subprocess.Popen] = []
    out: dict[str, Any] = {"case": case}
    try:
        sync_log = work / f"{run_id}-sync.log"
        sync = _spawn(env, env["SCOPEKB_WORKER__QUEUE"], sync_log)
        procs.append(sync)
        _ready([(sync, sync_log)])
        records.ensure("sources")
        src = Source(id=f"src_{run_id}", agent_name="bench", context_id="emb", repo_url=str(bare), ref="main",
                     repo_name="bench/emb", webhooks=False)
        records.put_source(src)
        job_id = f"{run_id}-job"
        t0 = time.perf_counter()
        with RssSampler([sync.pid]) as pss:
            celery_app(s, name="bench-emb").send_task(queue.TASK_SYNC_SOURCES, task_id=job_id,
                                                      kwargs={"job_id": job_id, "source_ids": [src.id]})
            job = _wait(records, job_id, lambda j: j.stage == JobStage.embedding or j.finished)
        out["sync_stage_s"] = round(time.perf_counter() - t0, 2)
        rss = _peak_rss(sync.pid)
        out["sync_worker_peak_rss_mib"] = round(max(rss.values()) / MIB, 1)
        out["sync_worker_rss_by_pid_mib"] = {k: round(v / MIB, 1) for k, v in rss.items()}
        out["sync_worker_peak_pss_mib"] = round(pss.peak / MIB, 1)  # the process tree's sum
        out["sync_worker_model_libs"] = _model_libs(sync.pid)
        out["chunks"] = job.chunks_written
        out["embed_parts"] = job.embed_parts
        if case == "sync":  # the sync worker's figures only: no embedding worker, the job is deleted below
            out.update({"state": job.state.value, "stage": str(job.stage), "job_s": out["sync_stage_s"]})
            print(json.dumps(out), file=sys.stderr, flush=True)
            return out
        if case != "inline":
            n = int(case[-1])
            embeds = [(_spawn(env, env["SCOPEKB_WORKER__EMBED_QUEUE"], work / f"{run_id}-embed{i}.log"),
                       work / f"{run_id}-embed{i}.log") for i in range(n)]
            procs += [p for p, _ in embeds]
            _ready(embeds)
            t1 = time.perf_counter()
            job = _wait(records, job_id, lambda j: j.finished)
            out["embed_stage_s"] = round(time.perf_counter() - t1, 2)
            out["embed_chunks_per_s"] = round(job.embeddings_computed / out["embed_stage_s"], 1)
            out["embed_worker_peak_rss_mib"] = round(max(max(_peak_rss(p.pid).values(), default=0)
                                                         for p, _ in embeds) / MIB, 1)
            # the sync worker again once the job is done: what it held and loaded over the whole job
            out["sync_worker_peak_rss_mib_job_end"] = round(max(_peak_rss(sync.pid).values(), default=0) / MIB, 1)
            out["sync_worker_model_libs_job_end"] = _model_libs(sync.pid)
        out.update(_index_bytes(make_client(s.opensearch), s.opensearch.alias, bare))
        out.update({"state": job.state.value, "stage": str(job.stage), "embeddings_computed": job.embeddings_computed,
                    "embeddings_cached": job.embeddings_cached, "job_s": round(time.perf_counter() - t0, 2)})
    finally:
        _stop(procs)
        cleanup(endpoints, run_id)
        import redis

        redis.Redis.from_url(endpoints["SCOPEKB_REDIS__URL"]).delete(f"{prefix}-sync", f"{prefix}-embed")
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def measure(package: str, versions: list[str], prefer: str, cases: list[str],
            endpoints: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cases`` on one release repository of ``package`` (see the module docstring); ``endpoints``: the
    services' environment (None: :func:`scopekb_bench.services.services` finds or starts them). Returns
    ``{"package", "versions", "cases": {case: figures}, "ratios", "load_avg_start", "load_avg_end"}``."""
    from scopekb_bench import corpus
    from scopekb_bench.services import services

    from tests.openai_stub import OpenAIStub

    built = corpus.release_repo(package, versions, prefer)
    results: dict[str, Any] = {"package": package, "versions": built.versions,
                               "load_avg_start": os.getloadavg()[0], "cases": {}}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="scopekb-embstage-"))
        env = endpoints if endpoints is not None else stack.enter_context(services())
        stub = stack.enter_context(OpenAIStub(_hash_vectors, api_key="sk-bench"))
        work = Path(tmp)
        bare = built.clone_bare(work / "repo.git")
        subprocess.run(["git", "--git-dir", str(bare), "update-ref", "refs/heads/main", built.releases[-1]],
                       check=True)
        for case in cases:
            results["cases"][case] = run_case(case, env, bare, work, stub.base_url)
    c = results["cases"]
    ratios: dict[str, Any] = {}
    if "local1" in c and "local2" in c:
        ratios["local_2_vs_1_workers"] = round(c["local2"]["embed_chunks_per_s"] / c["local1"]["embed_chunks_per_s"], 3)
    if "stub1" in c and "stub2" in c:
        ratios["stub_2_vs_1_workers"] = round(c["stub2"]["embed_chunks_per_s"] / c["stub1"]["embed_chunks_per_s"], 3)
    if "stub1" in c and "local1" in c:
        ratios["stub_vs_local_one_worker"] = round(c["stub1"]["embed_chunks_per_s"] / c["local1"]["embed_chunks_per_s"],
                                                   2)
    if "inline" in c and "local1" in c:
        ratios["sync_rss_staged_vs_inline"] = round(c["local1"]["sync_worker_peak_rss_mib"]
                                                    / c["inline"]["sync_worker_peak_rss_mib"], 3)
    results["ratios"] = ratios
    results["load_avg_end"] = os.getloadavg()[0]
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default="click")
    ap.add_argument("--versions", default="8.1.0")
    ap.add_argument("--prefer", default="src/click/")
    ap.add_argument("--cases", default="inline,stub1,stub2,local1,local2")
    args = ap.parse_args()
    results = measure(args.package, args.versions.split(","), args.prefer, args.cases.split(","))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
