"""Embedding as its own stage and Celery queue (issue 19), on real Redis, OpenSearch and S3 with real worker
processes, and in the embedded profile.

The sync stage writes chunks without vectors (keyword-searchable at once) and enqueues their embedding on
``worker.embed_queue``; embedding workers add the vectors; the job says which stage it is in (``syncing`` ->
``embedding`` -> ``done``) and is finished only after both. A sync worker never imports torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from scopekb import fields as F
from scopekb import queue
from scopekb.embedding.local import LocalEmbedder
from scopekb.models import Job, JobStage, JobState, Source
from scopekb.runtime import build_runtime, celery_app
from scopekb.settings import Settings
from scopekb.stores.base import ScopeFilter, SearchFilter
from scopekb.stores.opensearch import make_client
from scopekb.stores.records import OpenSearchRecordStore
from tests.openai_stub import OpenAIStub

from . import test_vector_pipeline as vec
from .test_git_sync import Repo

ROOT = Path(__file__).resolve().parents[2]
#: The vector pipeline's files and fixtures (the local model, and the OpenAI-compatible stub serving its vectors).
local, stub = vec.local, vec.stub
FILES = {**{p: t for p, t in vec.FILES.items() if p != "poison.py"},
         **{f"pkg/mod_{i}.py": f'def helper_{i}(x):\n    """Helper number {i} of the package."""\n    return x + {i}\n'
            for i in range(12)}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    r = Repo(tmp_path_factory.mktemp("stage") / "r")
    for path, text in FILES.items():
        r.write(path, text)
    r.commit()
    return r


def _env(run: str, opensearch_url: str, redis_url: str, s3: dict[str, Any], workdir: Path,
         **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SCOPEKB_", "OPENAI_"))}
    return {**base, "PYTHONPATH": str(ROOT) + os.pathsep + base.get("PYTHONPATH", ""),
            "SCOPEKB_PROFILE": "distributed", "SCOPEKB_OPENSEARCH__URL": opensearch_url,
            "SCOPEKB_OPENSEARCH__ALIAS": f"{run}-chunks", "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"{run}-sys",
            "SCOPEKB_REDIS__URL": redis_url, "SCOPEKB_S3__ENDPOINT": s3["endpoint"],
            "SCOPEKB_S3__ACCESS_KEY": s3["access_key"], "SCOPEKB_S3__SECRET_KEY": s3["secret_key"],
            "SCOPEKB_S3__BUCKET": run, "SCOPEKB_WORKER__QUEUE": f"{run}-sync",
            "SCOPEKB_WORKER__EMBED_QUEUE": f"{run}-embed", "SCOPEKB_WORKER__EMBED_PART_CHUNKS": "4",
            "SCOPEKB_GIT__CACHE_DIR": str(workdir / "git"), "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true",
            "SCOPEKB_LOG_FORMAT": "json", "SCOPEKB_LOG_LEVEL": "INFO", "HF_HUB_OFFLINE": "1", **extra}


def _settings(env: dict[str, str]) -> Settings:
    return Settings(opensearch={"url": env["SCOPEKB_OPENSEARCH__URL"], "alias": env["SCOPEKB_OPENSEARCH__ALIAS"],
                                "system_prefix": env["SCOPEKB_OPENSEARCH__SYSTEM_PREFIX"]},
                    redis={"url": env["SCOPEKB_REDIS__URL"]},
                    worker={"queue": env["SCOPEKB_WORKER__QUEUE"], "embed_queue": env["SCOPEKB_WORKER__EMBED_QUEUE"]})


def _worker(env: dict[str, str], queue_name: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "scopekb_cli.main", "worker", "--concurrency", "1",
                                 "--queues", queue_name], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"worker exited: {log.read_text(errors='replace')[-3000:]}")
        if " ready." in log.read_text(errors="replace"):
            return proc
        time.sleep(0.3)
    pytest.fail(f"worker not ready: {log.read_text(errors='replace')[-3000:]}")


def _wait_job(records: OpenSearchRecordStore, job_id: str, done: Any, logs: list[Path],
              timeout: float = 180) -> Job:
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = records.get_job(job_id)
        if job is not None and done(job):
            return job
        time.sleep(0.3)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in logs if p.exists())
    pytest.fail(f"job {job_id} not there after {timeout}s: {job}\n{tails}")


def _docs(client: Any, alias: str, source_id: str) -> list[dict[str, Any]]:
    client.indices.refresh(index=alias)
    res = client.search(index=alias, body={"size": 1000, "query": {"term": {F.SOURCE_ID: source_id}}})
    return [{"_id": h["_id"], **h["_source"]} for h in res["hits"]["hits"]]


def test_two_stage_job_states_vectors_after_embedding_and_redelivered_part_no_duplicates(
        opensearch_url: str, redis_url: str, s3_config: dict, stub: OpenAIStub, local: LocalEmbedder, repo: Repo,
        tmp_path: Path) -> None:
    run = f"it-stage-{uuid.uuid4().hex[:8]}"
    env = _env(run, opensearch_url, redis_url, s3_config, tmp_path, SCOPEKB_EMBEDDING__PROVIDER="openai",
               SCOPEKB_EMBEDDING__BASE_URL=stub.base_url, SCOPEKB_EMBEDDING__API_KEY="sk-test",
               SCOPEKB_EMBEDDING__MODEL="minilm")
    s = _settings(env)
    client = make_client(s.opensearch)
    records = OpenSearchRecordStore(client, s.opensearch.system_prefix)
    r = redis.Redis.from_url(redis_url)
    sync_log, embed_log = tmp_path / "sync.log", tmp_path / "embed.log"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_worker(env, s.worker.queue, sync_log))
        src = Source(id=Source.new_id(), agent_name="stage", context_id="c", repo_url=str(repo.path), ref="main")
        records.put_source(src)
        job_id = f"job-{uuid.uuid4().hex[:8]}"
        app = celery_app(s, name="it-stage")
        app.send_task(queue.TASK_SYNC_SOURCES, task_id=job_id, kwargs={"job_id": job_id, "source_ids": [src.id]})

        # Stage 1 done, no embedding worker yet: chunks written and keyword-searchable, no vectors, job running.
        job = _wait_job(records, job_id, lambda j: j.stage == JobStage.embedding or j.finished, [sync_log])
        assert job.state == JobState.running and job.stage == JobStage.embedding, job
        assert job.chunks_written >= len(FILES) and job.embed_parts >= 2  # 4 chunks a part
        assert job.embeddings_computed == 0 and job.embeddings_cached == 0
        docs = _docs(client, s.opensearch.alias, src.id)
        assert len(docs) == job.chunks_written
        assert not any(F.EMBEDDING in d for d in docs) and {d[F.BLOB_SHA] for d in docs} == {""}
        hits = client.search(index=s.opensearch.alias, body={"query": {"match": {F.CONTENT: "retry_failed_uploads"}}})
        assert hits["hits"]["hits"][0]["_source"][F.PATH] == "storage/upload.py"
        assert r.llen(s.worker.embed_queue) == job.embed_parts
        # At-least-once delivery: the same part (same task id and arguments) delivered twice, as after an embedding
        # worker's death; queued as a message of its own (a new delivery tag) so both copies run.
        dup = json.loads(r.lindex(s.worker.embed_queue, 0))
        dup["properties"]["delivery_tag"] = str(uuid.uuid4())
        r.lpush(s.worker.embed_queue, json.dumps(dup))

        procs.append(_worker(env, s.worker.embed_queue, embed_log))
        job = _wait_job(records, job_id, lambda j: j.finished, [sync_log, embed_log])
        assert job.state == JobState.done and job.stage == JobStage.done, job
        assert job.embeddings_computed + job.embeddings_cached == job.chunks_written  # the repeat is not counted
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and embed_log.read_text().count('"embed_part_done"') < job.embed_parts + 1:
            time.sleep(0.3)
        assert embed_log.read_text().count('"embed_part_done"') == job.embed_parts + 1  # the duplicate really ran
        again = records.get_job(job_id)
        assert again is not None and again.model_dump() == job.model_dump()  # and changed nothing in the record
        docs_after = _docs(client, s.opensearch.alias, src.id)
        assert sorted(d["_id"] for d in docs_after) == sorted(d["_id"] for d in docs)  # nothing duplicated
        assert all(len(d[F.EMBEDDING]) == local.dimension for d in docs_after)
        assert all(d[F.BLOB_SHA] and d[F.EMBEDDING_MODEL] == "openai:minilm" for d in docs_after)
        assert '"embed_part_done"' not in sync_log.read_text()  # the sync worker embedded nothing
        # Each chunk got its own vector: of every chunk's content, its own is the nearest to its stored vector.
        stored = np.array([d[F.EMBEDDING] for d in docs_after], dtype=np.float32)
        own = local.encode([d[F.CONTENT] for d in docs_after])
        nearest = (stored @ own.T).argmax(axis=1)
        assert [docs_after[i][F.PATH] for i in nearest] == [d[F.PATH] for d in docs_after]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        r.delete(s.worker.queue, s.worker.embed_queue)
        client.indices.delete(index=f"{run}*", params={"expand_wildcards": "open"})


SYNC_ONLY = """
import json, sys
from scopekb.indexing import run_sync
from scopekb_worker.app import ensure_chunk_index, runtime
rt = runtime()
ensure_chunk_index(rt)  # as the sync task does first (the runtime itself no longer touches the index)
job = run_sync(rt.sync_deps(), sys.argv[1], [sys.argv[2]])
print(json.dumps({"torch": "torch" in sys.modules, "st": "sentence_transformers" in sys.modules,
                  "onnxruntime": "onnxruntime" in sys.modules,
                  "stage": job.stage, "parts": job.embed_parts, "model": rt.embedder.model_id,
                  "dimension": rt.embedder.dimension}))
"""


def test_sync_worker_with_an_embedding_queue_never_imports_torch(
        opensearch_url: str, redis_url: str, s3_config: dict, local: LocalEmbedder, repo: Repo,
        tmp_path: Path) -> None:
    """The sync stage of a worker whose model is local and whose chunks go to the embedding queue: the index is
    checked and created for the local model's id and dimension, the chunks are written and their parts queued,
    and neither torch, sentence-transformers nor onnxruntime (the default local backend's runtime) is imported in
    that process."""
    run = f"it-stage-{uuid.uuid4().hex[:8]}"
    env = _env(run, opensearch_url, redis_url, s3_config, tmp_path, SCOPEKB_EMBEDDING__PROVIDER="local")
    s = _settings(env)
    client = make_client(s.opensearch)
    records = OpenSearchRecordStore(client, s.opensearch.system_prefix)
    r = redis.Redis.from_url(redis_url)
    try:
        records.ensure("sources")
        src = Source(id=Source.new_id(), agent_name="light", context_id="c", repo_url=str(repo.path), ref="main")
        records.put_source(src)
        out = subprocess.run([sys.executable, "-c", SYNC_ONLY, f"job-{uuid.uuid4().hex[:8]}", src.id], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got == {"torch": False, "st": False, "onnxruntime": False, "stage": "embedding", "parts": got["parts"],
                       "model": local.model_id, "dimension": local.dimension}
        assert got["parts"] >= 2 and r.llen(s.worker.embed_queue) == got["parts"]
    finally:
        r.delete(s.worker.queue, s.worker.embed_queue)
        client.indices.delete(index=f"{run}*", params={"expand_wildcards": "open"})


def test_embedded_profile_runs_both_stages_in_process(repo: Repo, tmp_path: Path) -> None:
    """The embedded profile with ``worker.embed_queue``: the same stages, the embedding stage run in this process
    after the sync stage; the job returned is done and every chunk has its vector."""
    s = Settings(profile="embedded", data_dir=tmp_path / "data", embedding={"provider": "local"},
                 worker={"embed_queue": "embed", "embed_part_chunks": 4},
                 git={"allow_local_paths": True, "cache_dir": str(tmp_path / "git")})
    rt = build_runtime(s)
    deps = rt.sync_deps()
    stages: list[tuple[str | None, str]] = []
    put_job = deps.records.put_job

    def spy(job: Job) -> None:
        stages.append((job.stage, job.state.value))
        put_job(job)

    deps.records.put_job = spy  # type: ignore[method-assign]  # records what the real store is given
    src = Source(id=Source.new_id(), agent_name="emb", context_id="c", repo_url=str(repo.path), ref="main")
    rt.records.put_source(src)
    from scopekb.indexing import run_sync

    job = run_sync(deps, "job-embedded", [src.id])
    assert job.state == JobState.done and job.stage == JobStage.done and job.embed_parts >= 2
    assert job.embeddings_computed + job.embeddings_cached == job.chunks_written
    seen = [st for st, _ in stages]
    assert seen[0] == "syncing" and "embedding" in seen and seen[-1] == "done"
    assert seen.index("embedding") > max(i for i, st in enumerate(seen) if st == "syncing")
    assert [state for st, state in stages if st != "done"] == ["running"] * (len(stages) - 1)
    hits = rt.chunks.vector_search(local_vector("send failed uploads again with backoff"),
                                   SearchFilter(scope=ScopeFilter("emb", ("c",))), 3)
    assert hits and hits[0][2][F.PATH] == "storage/upload.py"
    assert all(h[2][F.BLOB_SHA] for h in hits)


def local_vector(text: str) -> list[float]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return [float(x) for x in LocalEmbedder().encode([text])[0]]
