"""The embedding API throttles (429 with Retry-After) and then fails (503) for a while during a sync.

The worker embeds through an OpenAI-compatible endpoint (``tests/openai_stub.py`` on a real socket, with a cheap
deterministic hash encoder instead of a model). Ten requests in a row are refused: more than one request's
retries allow, so the provider's own retries run out, the task retries with backoff, and the sync finishes once
the endpoint recovers. The job records the retries; every text was embedded exactly once (the embedding cache
keeps what was computed before a failure); every chunk has its vector and the index equals a fresh full index.
"""

from __future__ import annotations

import hashlib

import httpx
import numpy as np

from tests.openai_stub import OpenAIStub

from .harness import generate_repo

DIM = 32
FAULTS_429, FAULTS_503 = 5, 5


def hash_encoder(texts: list[str]) -> np.ndarray:
    """Deterministic unit vectors from sha256 of each text (no model needed)."""
    rows = []
    for t in texts:
        raw = np.frombuffer(hashlib.sha256(t.encode()).digest() * (DIM * 4 // 32), dtype=np.uint8)[:DIM]
        v = raw.astype(np.float32) - 127.5
        rows.append(v / (np.linalg.norm(v) or 1.0))
    return np.stack(rows)


def test_embedding_429_then_503_job_finishes_nothing_embedded_twice(make_stack, tmp_path, report) -> None:
    with OpenAIStub(hash_encoder, api_key="faults-key") as stub:
        embedding = {"SCOPEKB_EMBEDDING__PROVIDER": "openai", "SCOPEKB_EMBEDDING__BASE_URL": stub.base_url,
                     "SCOPEKB_EMBEDDING__API_KEY": "faults-key", "SCOPEKB_EMBEDDING__MODEL": "stub-embed",
                     "SCOPEKB_EMBEDDING__DIMENSIONS": str(DIM), "SCOPEKB_EMBEDDING__BACKOFF_MAX_S": "4"}
        stack = make_stack("embedding", SCOPEKB_WORKER__BATCH_FILES="50", **embedding)
        repo = tmp_path / "repo"
        generate_repo(repo, files=120)
        stack.start_query()
        worker = stack.start_worker()
        src = stack.add_source(repo, agent="embed-agent")
        stub.reset()
        stub.fail_with_429(FAULTS_429, retry_after="1")
        stub.fail_with_5xx(FAULTS_503, status=503)
        job_id = stack.sync(src)
        job = stack.wait_job(job_id, timeout=240, procs=[worker])
        statuses = [r.status for r in stub.requests]
        served = [t for r in stub.served() for t in (r.inputs or [])]
        refused = [s for s in statuses if s != 200]
        report("injected", fault=f"{FAULTS_429} x 429 (Retry-After: 1) then {FAULTS_503} x 503 from the embedding "
               "endpoint", requests=len(statuses), refused=len(refused), refused_statuses=sorted(set(refused)))

        stack.os.indices.refresh(index=stack.alias)
        with_vector = stack.os.count(index=stack.alias, body={"query": {"bool": {"filter": [
            {"term": {"source_id": src}}, {"exists": {"field": "embedding"}}]}}})["count"]
        expected, _ = stack.fresh(repo)  # embeds again through the stub, into a fresh cache
        comparison = stack.compare(src, expected)
        key = stack.agent_key("embed-agent")
        vector = httpx.post(stack.query_url + "/v1/search", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                            json={"query": "compute value registry", "mode": "vector", "context_id": "main"})
        report("checked", job_state=job["state"], retries=job["retries"],
               embeddings_computed=job["embeddings_computed"], embeddings_cached=job["embeddings_cached"],
               texts_served=len(served), distinct_texts_served=len(set(served)), chunks_with_vector=with_vector,
               comparison=comparison.summary(), vector_search=(vector.status_code, len(vector.json().get("hits", []))))
        assert job["state"] == "done", job
        assert len(refused) == FAULTS_429 + FAULTS_503
        assert job["retries"].get("embedding", 0) + job["retries"].get("task", 0) == len(refused), job["retries"]
        assert job["retries"].get("task", 0) >= 1, "the outage outlasted one request's retries"
        assert len(served) == len(set(served)) == job["embeddings_computed"], "a text was embedded twice"
        assert with_vector == sum(comparison.actual.values())
        assert comparison.equal and comparison.duplicates == 0, comparison.summary()
        assert vector.status_code == 200 and vector.json()["hits"]
