"""Every git host's webhook through the real ingester, broker, worker and query service (issue 5)."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scopekb.realrepo import git
from tests.webhook_fixtures import ZERO, delivery

from .conftest import Stack

pytestmark = pytest.mark.e2e
SECRET = "provider-secret"
PROVS = ["github", "gitlab", "gitea", "forgejo", "bitbucket"]


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    repo = tmp_path_factory.mktemp("prov") / "tiny"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "notes.md").write_text("# Notes\nthe zanzibar_marker lives here\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    return repo, git(repo, "rev-parse", "HEAD")


def _register(stack: Stack, repo: Path, name: str, agent: str) -> tuple[str, str]:
    with stack.admin() as admin:
        r = admin.post("/v1/sources", json={"agent_name": agent, "context_id": "c", "repo_url": str(repo),
                                            "ref": "main", "repo_name": name, "webhook_secret": SECRET})
        assert r.status_code == 201, r.text
        k = admin.post("/v1/keys", json={"agent_name": agent, "context_ids": ["c"]})
        return r.json()["id"], k.json()["key"]


def _post(stack: Stack, provider: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{stack.ingester_url}/webhooks/{provider}", content=body, headers=headers, timeout=30)


@pytest.mark.parametrize("provider", PROVS)
def test_each_provider_verifies_and_syncs(stack: Stack, tiny_repo: tuple[Path, str], provider: str) -> None:
    repo, head = tiny_repo
    name = f"team/{provider}-{uuid.uuid4().hex[:6]}"
    agent = f"agent-{provider}"
    _, key = _register(stack, repo, name, agent)

    body, h = delivery(provider, name, str(repo), ZERO, head, "wrong-secret")
    assert _post(stack, provider, body, h).status_code == 401
    body, h = delivery(provider, name, str(repo), ZERO, head, SECRET, sign=False)
    assert _post(stack, provider, body, h).status_code == 401
    body, h = delivery(provider, name, str(repo), ZERO, head, SECRET)
    if provider != "gitlab":  # a token header does not cover the body; the others sign it
        tampered = body + b" "  # still valid JSON, no longer the signed bytes
        assert _post(stack, provider, tampered, h).status_code == 401
    r = _post(stack, provider, body, h)
    assert r.status_code == 202, r.text
    job = stack.wait_job(r.json()["job_id"])
    assert job["state"] == "done" and job["files_indexed"] == 1
    with stack.agent(key) as c:
        hits = c.post("/v1/search", json={"query": "zanzibar_marker"}).json()["hits"]
    assert [h["path"] for h in hits] == ["notes.md"]


def test_same_delivery_five_times_concurrently_is_one_sync(stack: Stack, tiny_repo: tuple[Path, str]) -> None:
    repo, head = tiny_repo
    name = f"team/dup-{uuid.uuid4().hex[:6]}"
    source_id, _ = _register(stack, repo, name, "agent-dup")
    body, h = delivery("github", name, str(repo), ZERO, head, SECRET)
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        codes = sorted(r.status_code for r in pool.map(lambda _: _post(stack, "github", body, h), range(5)))
    assert codes == [200, 200, 200, 200, 202]
    job_id = _post(stack, "github", body, h).json()["job_id"]  # a sixth: duplicate, naming the one job
    assert job_id.startswith(h["X-GitHub-Delivery"] + ".")
    assert stack.wait_job(job_id)["state"] == "done"
    with stack.admin() as admin:
        # the jobs list is a search (visible after a refresh: 1 s, longer on a loaded machine; a fixed 1.2 s wait
        # failed once in CI), so wait until the job is listed, then check it is listed once and alone
        deadline = time.monotonic() + 30
        while True:
            jobs = admin.get("/v1/jobs", params={"source_id": source_id}).json()
            if jobs or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert [j["id"] for j in jobs] == [job_id]


@pytest.mark.parametrize("url", ["https://169.254.169.254/latest/meta-data", "https://127.0.0.1/x.git",
                                 "file:///etc", "ext::sh -c id", "http://example.com/x.git"])
def test_hostile_clone_urls_are_refused_at_registration(stack: Stack, url: str) -> None:
    with stack.admin() as admin:
        r = admin.post("/v1/sources", json={"agent_name": "a", "context_id": "c", "repo_url": url})
    assert r.status_code == 422 and r.json()["detail"]


def test_submodules_are_never_fetched(stack: Stack, tmp_path: Path) -> None:
    repo = tmp_path / "withsub"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitmodules").write_text('[submodule "x"]\n\tpath = x\n\turl = https://10.0.0.1/internal.git\n')
    (repo / "a.txt").write_text("submodule_canary\n")
    git(repo, "add", "-A")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},x")
    git(repo, "commit", "-q", "-m", "sub")
    name = f"team/sub-{uuid.uuid4().hex[:6]}"
    _, key = _register(stack, repo, name, "agent-sub")
    body, h = delivery("github", name, str(repo), ZERO, git(repo, "rev-parse", "HEAD"), SECRET)
    r = _post(stack, "github", body, h)
    job = stack.wait_job(r.json()["job_id"])
    # The sync completes without touching 10.0.0.1 (it would time out or fail) and records the gitlink as skipped.
    assert job["state"] == "done" and job["files_skipped"].get("submodule") == 1


headers_st = st.dictionaries(
    st.sampled_from(["X-GitHub-Event", "X-GitHub-Delivery", "X-Gitlab-Event", "X-Gitlab-Event-UUID",
                     "X-Gitea-Event", "X-Gitea-Delivery", "X-Event-Key", "X-Request-UUID", "Content-Type",
                     "X-Hub-Signature-256", "X-Gitlab-Token", "X-Hub-Signature", "X-Gitea-Signature"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=60)
    .map(str.strip).filter(bool), max_size=6)  # what an HTTP client can send: no blank or padded values
#: Issue 16: deep nesting (``[`` x 1000 gave a 500) and bodies over the 5 MiB cap, among the fuzzed bodies.
hostile_st = st.one_of(st.builds(lambda opener, n: opener * n, st.sampled_from([b"[", b'{"a":', b'{"repository": [']),
                                 st.integers(65, 20000)),
                       st.builds(lambda n: b"[" * n, st.integers(5 * 1024 * 1024 + 1, 6 * 1024 * 1024)))
body_st = st.one_of(hostile_st, st.binary(max_size=300), st.builds(
    lambda d: __import__("json").dumps(d).encode(),
    # Strings with lone surrogates and control characters too (issue 15): json.dumps sends them as escapes.
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(st.characters(exclude_categories=()), max_size=20),
                 lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(
                     ["ref", "before", "after", "repository", "push", "project", "changes", "full_name"]), c,
                     max_size=4), max_leaves=12)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(provider=st.sampled_from([*PROVS, "nope"]), headers=headers_st, body=body_st)
def test_fuzzed_webhooks_never_5xx_and_unsigned_enqueue_nothing(stack: Stack, provider: str, headers: dict,
                                                                body: bytes) -> None:
    headers = {k: v for k, v in headers.items() if k not in ("X-Hub-Signature-256", "X-Gitlab-Token",
                                                            "X-Hub-Signature", "X-Gitea-Signature")}
    t0 = time.perf_counter()
    try:
        r = httpx.post(f"{stack.ingester_url}/webhooks/{provider}", content=body, headers=headers, timeout=30)
    except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError):
        # Over the cap, the server answers 413 and closes without reading the rest; the client may notice the
        # close while still sending.
        assert len(body) > 5 * 1024 * 1024 and time.perf_counter() - t0 < 2.0
        return
    assert time.perf_counter() - t0 < 2.0  # a generous per-request bound (issue 16)
    assert r.status_code < 500, r.text
    if len(body) > 5 * 1024 * 1024:
        assert r.status_code == 413
    assert r.status_code != 202 or r.json()["status"] == "ignored"
