"""S3 object metadata as chunk metadata (issue 22), on both profiles against real S3 (SeaweedFS from
scripts/services): embedded (SQLite store, documents read from S3 because S3 settings are given) and distributed
(OpenSearch, Redis, S3).

Objects are written with user metadata (``x-amz-meta-*``) by the ``minio`` SDK, a prefix source is synced with
the real pipeline and an embedding model (an OpenAI-compatible stub on a free port whose vectors are hashed bags of
words), and the ``metadata`` filter ``{"s3.<key>": value}`` must return exactly the chunks of the objects carrying
that value in keyword, vector, hybrid, exact and regex modes. Then one object's metadata is replaced by a
server-side copy onto itself (``x-amz-metadata-directive: REPLACE``): S3 keeps its ETag (checked), and the next
sync must still re-index exactly that object, re-embedding nothing (its text did not change).
"""

from __future__ import annotations

import hashlib
import io
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from minio.commonconfig import REPLACE, CopySource

from scopekb.blobs import ensure_bucket
from tests.openai_stub import OpenAIStub
from tests.profiles import profile_settings

ADMIN = "objmeta-admin-" + uuid.uuid4().hex
AGENT, CONTEXT = "objmeta", "kb"
MARK = f"wombat_ledger_{uuid.uuid4().hex[:6]}"
DIM = 64

#: path -> (text, user metadata as the uploader sends it). Every chunk holds MARK, so an unfiltered exact search
#: lists every chunk of every object.
OBJECTS: dict[str, tuple[str, dict[str, str]]] = {
    "a.md": (f"---\ntitle: Alpha\nabout: the {MARK} guide\n---\n# Install\n\nThe {MARK} is installed first.\n\n"
             f"# Usage\n\nThen the {MARK} is used.\n", {"Team": "Docs", "Owner-Email": "ops@example.com"}),
    "sub/d.md": (f"# Delta\n\nA second {MARK} page of the docs team.\n", {"team": "Docs"}),
    "b.txt": (f"The {MARK} for operations.\n", {"TEAM": "ops"}),
    "c.md": (f"# Plain\n\nA {MARK} without metadata.\n", {}),
}


def _bag_of_words(texts: list[str]) -> np.ndarray:
    """Unit vectors of hashed word counts (plus a constant component, so no vector is zero)."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, text in enumerate(texts):
        out[i, 0] = 1.0
        for w in re.findall(r"[a-z0-9]+", text.lower()):
            out[i, 1 + int(hashlib.md5(w.encode()).hexdigest(), 16) % (DIM - 1)] += 1.0
        out[i] /= np.linalg.norm(out[i])
    return out


@pytest.fixture(scope="module")
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub(_bag_of_words, api_key="sk-objmeta") as s:
        yield s


@pytest.fixture(scope="module", params=["embedded", "distributed"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, stub: OpenAIStub,
          s3_client: Any, s3_config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One profile's app with an S3 prefix source over objects that carry user metadata, synced once."""
    from scopekb_query.app import create_app

    profile = request.param
    tmp = tmp_path_factory.mktemp(f"objmeta-{profile}")
    run = f"objmeta-{uuid.uuid4().hex[:8]}"
    embedding = {"provider": "openai", "model": "bow-64", "base_url": stub.base_url, "api_key": "sk-objmeta"}
    if profile == "distributed":
        services = {name: request.getfixturevalue(name) for name in ("opensearch_url", "redis_url")}
        s = profile_settings(profile, tmp, {**services, "s3_config": s3_config}, run, ADMIN, embedding=embedding)
    else:  # embedded with S3 settings: documents come from S3, the index is SQLite
        s = profile_settings(profile, tmp, {}, run, ADMIN, embedding=embedding, s3={**s3_config, "bucket": run})
    ensure_bucket(s3_client, run)  # retries SeaweedFS's racing NoSuchBucket answer
    prefix = "docs/kb"
    for rel, (text, meta) in OBJECTS.items():
        data = text.encode()
        s3_client.put_object(run, f"{prefix}/{rel}", io.BytesIO(data), len(data), content_type="text/plain",
                             metadata=meta or None)
    app = create_app(s)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {ADMIN}"
            r = client.post("/v1/sources", json={"agent_name": AGENT, "context_id": CONTEXT, "kind": "s3",
                                                 "prefix": prefix})
            assert r.status_code == 201, r.text
            key = client.post("/v1/keys", json={"agent_name": AGENT, "context_ids": [CONTEXT]}).json()["key"]
            w = {"client": client, "rt": app.state.runtime, "source": r.json()["id"], "key": key, "bucket": run,
                 "prefix": prefix, "profile": profile, "s3": s3_client}
            job = _sync(w)
            assert job.state.value == "done" and job.files_indexed == len(OBJECTS), (job.errors, job.files_skipped)
            yield w
    finally:
        for obj in s3_client.list_objects(run, recursive=True):
            s3_client.remove_object(run, obj.object_name)
        s3_client.remove_bucket(run)
        if profile == "distributed":
            app.state.runtime.opensearch_client.indices.delete(index=f"{run}-*", ignore_unavailable=True)


def _sync(w: dict[str, Any]) -> Any:
    from scopekb.indexing import run_sync

    job = run_sync(w["rt"].sync_deps(), "objmeta-" + uuid.uuid4().hex[:8], [w["source"]], trigger="cli")
    w["rt"].chunks.refresh()
    return job


def _chunks(w: dict[str, Any], mode: str, **filters: Any) -> set[tuple[str, int]]:
    """(path, start line) of every hit of a search for MARK (exact/regex: a pattern matching it) with the filters."""
    query = {"exact": MARK, "regex": MARK.replace("_", "[_]") + "\\b"}.get(mode, MARK.replace("_", " "))
    r = w["client"].post("/v1/search", headers={"Authorization": f"Bearer {w['key']}"},
                         json={"query": query, "mode": mode, "max_results": 50, **filters})
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert len(hits) < 50  # never cut by max_results: the sets below are complete
    return {(h["path"], h["start_line"]) for h in hits}


MODES = ["keyword", "vector", "hybrid", "exact", "regex"]


def test_metadata_filter_returns_exactly_the_objects_chunks_in_every_mode(world: dict[str, Any]) -> None:
    every = _chunks(world, "exact")
    assert {p for p, _ in every} == set(OBJECTS) and len(every) >= len(OBJECTS) + 1  # a.md has two sections

    def of(*paths: str) -> set[tuple[str, int]]:
        return {c for c in every if c[0] in paths}

    cases = [({"s3.team": "Docs"}, of("a.md", "sub/d.md")), ({"s3.team": "ops"}, of("b.txt")),
             ({"s3.team": ["ops", "Docs"]}, of("a.md", "sub/d.md", "b.txt")),
             ({"s3.owner-email": "ops@example.com"}, of("a.md")),
             ({"s3.team": "Docs", "front_matter.title": "Alpha"}, of("a.md")),
             ({"s3.team": "docs"}, set()),  # values compare exactly; keys are lower-cased
             ({"s3.Team": "Docs"}, set())]
    for mode in MODES:
        assert _chunks(world, mode) == every, mode
        for flt, want in cases:
            assert _chunks(world, mode, metadata=flt) == want, (mode, flt)
    print(f"{world['profile']}: {len(MODES)} modes x {len(cases)} metadata filters -> exactly the objects' chunks")


def test_a_metadata_only_change_is_picked_up_by_the_next_sync(world: dict[str, Any]) -> None:
    s3, bucket, key = world["s3"], world["bucket"], f"{world['prefix']}/a.md"
    before = s3.stat_object(bucket, key)
    every = _chunks(world, "exact")
    unchanged = _sync(world)
    assert unchanged.state.value == "done" and unchanged.files_indexed == 0 and unchanged.chunks_written == 0
    time.sleep(1.1)  # S3 lists last-modified times in whole seconds
    s3.copy_object(bucket, key, CopySource(bucket, key), metadata={"Team": "Ops", "Owner-Email": "x@example.com"},
                   metadata_directive=REPLACE)
    after = s3.stat_object(bucket, key)
    assert after.etag == before.etag and after.last_modified > before.last_modified  # what S3 gives us to see it
    job = _sync(world)
    assert job.state.value == "done", job.errors
    assert job.files_indexed == 1 and job.embeddings_computed == 0, job  # only a.md; its text is unchanged
    assert _chunks(world, "exact") == every  # old versions gone, nothing duplicated
    a_chunks = {c for c in every if c[0] == "a.md"}
    for mode in MODES:
        assert _chunks(world, mode, metadata={"s3.team": "Ops"}) == a_chunks, mode
        assert _chunks(world, mode, metadata={"s3.team": "Docs"}) == {c for c in every if c[0] == "sub/d.md"}, mode
        assert _chunks(world, mode, metadata={"s3.owner-email": "ops@example.com"}) == set(), mode
    print(f"{world['profile']}: metadata replaced with the same ETag -> 1 file re-indexed, 0 embeddings computed")
