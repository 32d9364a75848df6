"""The accepted push path after issue 20's cut (the delivery claim and the queued markers in one atomic step, then
the publish): a 202 means the task message is in the broker, a redelivery is a 200 naming the same job with
nothing enqueued again, and a broker that refuses the publish gives 503 with nothing remembered - no claim (the
sender's retry is accepted), no queued marker, no message. Distributed profile, real Redis and OpenSearch; the
broker failure is a real Celery producer on a port nothing listens on.
"""

from __future__ import annotations

import dataclasses
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scopekb import ops, queue
from scopekb.coordination import keys
from scopekb.models import SourceCreate
from scopekb.runtime import CeleryTasks
from scopekb_ingester.state import Ingester
from tests.profiles import profile_settings
from tests.webhook_fixtures import ZERO, delivery

SECRET = "enqueue-" + uuid.uuid4().hex
NAME = "team/enqueue-repo"
AFTER = "a" * 40


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ingester(tmp_path: Path, opensearch_url: str, redis_url: str, s3_config: dict[str, Any]
             ) -> Iterator[tuple[TestClient, str]]:
    """An in-process ingester on the distributed profile (a queue nobody consumes) and a registered source."""
    from scopekb_ingester.app import create_app

    run = f"enq-{uuid.uuid4().hex[:8]}"
    services = {"opensearch_url": opensearch_url, "redis_url": redis_url, "s3_config": s3_config}
    app = create_app(profile_settings("distributed", tmp_path, services, run, "enqueue-admin"))
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            rt = app.state.ingester.rt
            ops.register_source(rt, SourceCreate(agent_name="enq", context_id="c", repo_url=str(repo),
                                                 repo_name=NAME, webhook_secret=SecretStr(SECRET)))
            yield client, str(repo)
    finally:
        rt = app.state.ingester.rt
        rt.records.client.indices.delete(index=f"{run}-*", ignore_unavailable=True)
        rt.coord.client.delete(rt.settings.worker.queue)


def _messages(client: TestClient, job_id: str) -> set[str]:
    rt = client.app.state.ingester.rt  # type: ignore[attr-defined]
    return queue.task_ids_in_redis(rt.coord.client, {rt.settings.worker.queue}, [job_id])


def test_a_redelivery_is_200_naming_the_same_job_and_enqueues_nothing_more(ingester: tuple[TestClient, str]
                                                                            ) -> None:
    client, repo = ingester
    rt = client.app.state.ingester.rt  # type: ignore[attr-defined]
    body, headers = delivery("github", NAME, repo, ZERO, AFTER, SECRET)
    first = client.post("/webhooks/github", content=body, headers=headers)
    assert first.status_code == 202, first.text
    job_id = first.json()["job_id"]
    assert _messages(client, job_id) == {job_id}  # 202: the message is in the broker
    marker = rt.coord.client.get(keys.job_queued(job_id))
    job = rt.coord.queued_job(job_id)
    assert job is not None and job.state.value == "queued" and job.to_commit == AFTER
    for _ in range(2):
        again = client.post("/webhooks/github", content=body, headers=headers)
        assert again.status_code == 200, again.text
        assert again.json() == {"status": "duplicate", "job_id": job_id}
    assert rt.coord.client.llen(rt.settings.worker.queue) == 1  # nothing enqueued again
    assert rt.coord.client.get(keys.job_queued(job_id)) == marker  # the marker is not rewritten by a repeat


def test_a_broker_refusing_the_publish_is_503_and_nothing_is_remembered(ingester: tuple[TestClient, str]) -> None:
    client, repo = ingester
    app = client.app
    good: Ingester = app.state.ingester  # type: ignore[attr-defined]
    rt = good.rt
    dead = rt.settings.model_copy(update={"redis": rt.settings.redis.model_copy(
        update={"url": f"redis://127.0.0.1:{_free_port()}/0"})})
    # The coordination (claim, markers) is the real Redis; the producer publishes to a port nothing listens on.
    app.state.ingester = Ingester(dataclasses.replace(rt, tasks=CeleryTasks(dead, "enqueue-dead")), good.sources)
    body, headers = delivery("github", NAME, repo, ZERO, AFTER, SECRET)
    refused = client.post("/webhooks/github", content=body, headers=headers)
    assert refused.status_code == 503, refused.text
    assert refused.json() == {"detail": "queue unavailable, retry later"}
    claims = list(rt.coord.client.scan_iter(match=keys.delivery("github", headers["X-GitHub-Delivery"] + "*")))
    assert claims == []  # no claim: the sender's retry is not a duplicate
    markers = [k for k in rt.coord.client.scan_iter(match=keys.JOB_QUEUED_PATTERN)
               if headers["X-GitHub-Delivery"] in k.decode()]
    assert markers == []  # no job shows as queued that the sender was told failed
    assert rt.coord.client.llen(rt.settings.worker.queue) == 0

    app.state.ingester = good  # the broker is back: the sender's retry of the same delivery is accepted
    retry = client.post("/webhooks/github", content=body, headers=headers)
    assert retry.status_code == 202, retry.text
    job_id = retry.json()["job_id"]
    assert job_id.startswith(headers["X-GitHub-Delivery"])
    assert _messages(client, job_id) == {job_id} and rt.coord.queued_job(job_id) is not None


def test_coordination_down_after_the_cache_is_warm_is_503_and_the_retry_is_accepted(
        ingester: tuple[TestClient, str]) -> None:
    """Hostile pass: Redis (claims, markers, sources version) goes away after the ingester cached its sources; the
    accepted-push path reads no version first, so the claim itself is what fails: 503, and once Redis is back the
    sender's retry of the same delivery is queued."""
    from scopekb.coordination.rediscoord import RedisCoordination

    client, repo = ingester
    app = client.app
    good: Ingester = app.state.ingester  # type: ignore[attr-defined]
    rt = good.rt
    warm, warm_headers = delivery("github", NAME, repo, ZERO, "b" * 40, SECRET)
    assert client.post("/webhooks/github", content=warm, headers=warm_headers).status_code == 202
    dead = RedisCoordination.from_url(f"redis://127.0.0.1:{_free_port()}/0")
    app.state.ingester = Ingester(dataclasses.replace(rt, coord=dead), good.sources)
    body, headers = delivery("github", NAME, repo, ZERO, AFTER, SECRET)
    down = client.post("/webhooks/github", content=body, headers=headers)
    assert down.status_code == 503, down.text
    app.state.ingester = good
    retry = client.post("/webhooks/github", content=body, headers=headers)
    assert retry.status_code == 202, retry.text
    assert _messages(client, retry.json()["job_id"]) == {retry.json()["job_id"]}


def test_a_source_cache_loaded_while_redis_was_down_still_sees_a_later_registration(
        ingester: tuple[TestClient, str]) -> None:
    """Hostile pass: the ingester's first load of its sources came while Redis was down (the sources version could
    not be read; the push was a 503). Once Redis is back, a source registered for the same repository must get
    the next push: the cached list has no version to confirm, so it cannot be trusted without a version read."""
    from scopekb.coordination.rediscoord import RedisCoordination
    from scopekb_ingester.state import SourceCache

    client, repo = ingester
    app = client.app
    good: Ingester = app.state.ingester  # type: ignore[attr-defined]
    rt = good.rt
    dead = RedisCoordination.from_url(f"redis://127.0.0.1:{_free_port()}/0")
    cache = SourceCache(lambda: rt.records.list_sources(), dead.sources_version)  # a fresh ingester, Redis down
    app.state.ingester = Ingester(dataclasses.replace(rt, coord=dead), cache)
    body, headers = delivery("github", NAME, repo, ZERO, "c" * 40, SECRET)
    assert client.post("/webhooks/github", content=body, headers=headers).status_code == 503
    cache._version = rt.coord.sources_version  # Redis is back
    app.state.ingester = Ingester(rt, cache)
    late = ops.register_source(rt, SourceCreate(agent_name="enq", context_id="late", repo_url=repo, repo_name=NAME,
                                                webhook_secret=SecretStr(SECRET))).id
    got = client.post("/webhooks/github", content=body, headers=headers)
    assert got.status_code == 202, got.text
    assert late in got.json()["sources"], got.json()
