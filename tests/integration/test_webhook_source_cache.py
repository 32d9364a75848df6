"""A source registered for a repository other sources already track gets the very next push (both profiles).

The ingester keeps the registered sources in memory (``scopekb_ingester.state.SourceCache``). It read the sources
version at most once a second, and a push whose repository the cache already matched (through the older sources)
never forced a reload, so a source registered less than a second before the push was left out of the push's sync:
its scope did not get that push at all. Found as the flaky e2e test
``test_same_delivery_five_times_concurrently_is_one_sync`` (its job never listed the new source).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scopekb import ops
from scopekb.models import SourceCreate
from scopekb.settings import Settings
from tests.webhook_fixtures import ZERO, delivery

SECRET = "cache-" + uuid.uuid4().hex
NAME = "team/cached-repo"


def _repo(tmp: Path) -> tuple[Path, list[str]]:
    """A repository with three commits on main; returns its path and the commits, oldest first."""
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp), "PATH": "/usr/bin:/bin"}
    repo = tmp / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    commits = []
    for n in range(3):
        (repo / "a.txt").write_text(f"line {n}\n")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", f"c{n}"], check=True, env=env)
        commits.append(subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env,
                                      capture_output=True, text=True).stdout.strip())
    return repo, commits


@pytest.fixture(params=["embedded", "distributed"])
def ingester(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    from scopekb_ingester.app import create_app

    run = f"srccache-{uuid.uuid4().hex[:8]}"
    common: dict[str, Any] = {"embedding": {"provider": "none"}, "log_format": "json", "log_level": "WARNING",
                              "profile": request.param, "git": {"allow_local_paths": True}}
    if request.param == "embedded":
        s = Settings(data_dir=tmp_path / "data", **common)
    else:  # a queue no worker reads: the pushes are only enqueued
        s = Settings(opensearch={"url": request.getfixturevalue("opensearch_url"), "alias": f"{run}-chunks",
                                 "system_prefix": f"{run}-sys"},
                     redis={"url": request.getfixturevalue("redis_url")}, worker={"queue": f"{run}-queue"},
                     s3={**request.getfixturevalue("s3_config"), "bucket": run}, **common)
    app = create_app(s)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield client
    finally:
        if request.param == "distributed":
            app.state.ingester.rt.records.client.indices.delete(index=f"{run}-*", ignore_unavailable=True)


def _register(client: TestClient, repo: Path, context: str) -> str:
    rt = client.app.state.ingester.rt  # type: ignore[attr-defined]
    body = SourceCreate(agent_name="cache", context_id=context, repo_url=str(repo), repo_name=NAME,
                        webhook_secret=SecretStr(SECRET))
    return ops.register_source(rt, body).id


def _push(client: TestClient, repo: Path, before: str, after: str) -> dict[str, Any]:
    body, headers = delivery("github", NAME, str(repo), before, after, SECRET)
    r = client.post("/webhooks/github", content=body, headers=headers)
    assert r.status_code == 202, r.text
    return dict(r.json())


def test_a_source_registered_just_before_a_push_gets_it(ingester: TestClient, tmp_path: Path) -> None:
    repo, commits = _repo(tmp_path)
    first = _register(ingester, repo, "one")
    assert _push(ingester, repo, ZERO, commits[0])["sources"] == [first]  # the cache now holds the repository
    for n, commit in enumerate(commits[1:], 1):
        newer = _register(ingester, repo, f"ctx{n}")  # within a millisecond of the push below
        got = _push(ingester, repo, commits[n - 1], commit)
        assert newer in got["sources"], (n, got)


def test_a_source_removed_just_before_a_push_is_not_matched(ingester: TestClient, tmp_path: Path) -> None:
    """The cached list held the source; its removal (the records and the version bump ``ops.remove_source``
    makes) answered before the push, so the push must not queue a sync for it (issue 20: an accepted push reads no
    separate version, the delivery claim checks the version it was judged against)."""
    repo, commits = _repo(tmp_path)
    keep, gone = _register(ingester, repo, "keep"), _register(ingester, repo, "gone")
    assert sorted(_push(ingester, repo, ZERO, commits[0])["sources"]) == sorted([keep, gone])  # both cached
    rt = ingester.app.state.ingester.rt  # type: ignore[attr-defined]
    rt.records.delete("sources", gone)
    rt.coord.bump_sources_version()
    assert _push(ingester, repo, commits[0], commits[1])["sources"] == [keep]
    rt.records.delete("sources", keep)
    rt.coord.bump_sources_version()
    body, headers = delivery("github", NAME, str(repo), commits[1], commits[2], SECRET)
    r = ingester.post("/webhooks/github", content=body, headers=headers)
    assert r.status_code == 404, r.text  # no source left: unknown, not queued against the cached list


def test_a_source_tracking_another_ref_registered_just_before_its_push_gets_it(ingester: TestClient,
                                                                               tmp_path: Path) -> None:
    """A push of a ref no cached source tracks is answered "ignored" only after the sources version is confirmed:
    a source for that ref registered a moment before gets the push."""
    repo, commits = _repo(tmp_path)
    _register(ingester, repo, "main")
    assert _push(ingester, repo, ZERO, commits[0])["status"] == "queued"  # the cache holds the repository
    rt = ingester.app.state.ingester.rt  # type: ignore[attr-defined]
    dev = ops.register_source(rt, SourceCreate(agent_name="cache", context_id="dev", repo_url=str(repo),
                                               repo_name=NAME, ref="dev", webhook_secret=SecretStr(SECRET))).id
    body, headers = delivery("github", NAME, str(repo), ZERO, commits[1], SECRET, branch="dev")
    r = ingester.post("/webhooks/github", content=body, headers=headers)
    assert r.status_code == 202 and r.json()["status"] == "queued" and r.json()["sources"] == [dev], r.text


def test_a_source_registered_between_the_lookup_and_the_claim_gets_the_push(ingester: TestClient, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile pass: the registration lands after the delivery was judged against the cached list and before its
    claim; the claim sees the sources version moved, and the push is judged again and reaches the new source."""
    from scopekb_ingester import webhooks

    repo, commits = _repo(tmp_path)
    first = _register(ingester, repo, "one")
    assert _push(ingester, repo, ZERO, commits[0])["sources"] == [first]  # cached
    real = ops.enqueue_delivery
    added: list[str] = []

    def register_then_claim(*args: Any, **kwargs: Any) -> bool:
        if not added:
            added.append(_register(ingester, repo, "late"))
        return real(*args, **kwargs)

    monkeypatch.setattr(webhooks.ops, "enqueue_delivery", register_then_claim)
    got = _push(ingester, repo, commits[0], commits[1])
    assert sorted(got["sources"]) == sorted([first, added[0]]), got


def test_the_same_delivery_sent_concurrently_is_queued_once(ingester: TestClient, tmp_path: Path) -> None:
    """Hostile pass: 12 copies of one delivery at once: one 202, every other a 200 duplicate naming the same job."""
    from concurrent.futures import ThreadPoolExecutor

    repo, commits = _repo(tmp_path)
    _register(ingester, repo, "one")
    body, headers = delivery("github", NAME, str(repo), ZERO, commits[0], SECRET)
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: ingester.post("/webhooks/github", content=body, headers=headers),
                                range(12)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 11 + [202], [r.text for r in answers]
    jobs = {r.json()["job_id"] for r in answers}
    assert len(jobs) == 1, jobs
