"""Every published example delivery, replayed signed, JSON and form-encoded, on both profiles (issue 15 item 7).

The corpora (tests/data/webhooks, see its README): the 726 bodies of ``@octokit/webhooks-examples`` (404 after
exact duplicates) for GitHub, and examples written from the documented fields for GitLab, Gitea/Forgejo and
Bitbucket. Sources are registered for ``Codertocat/Hello-World`` and ``Octocoders/Hello-World`` (the
repositories the examples name most) with a ref no example pushes to, so every push is acknowledged without a
sync. Each body is sent as the host sends it (GitHub also form-encoded), correctly signed, to the ingester app of
each profile (embedded: SQLite records, in-memory coordination; distributed: OpenSearch records, Redis, a Celery
queue of its own), and the answer is checked against what the delivery is:

- never a 5xx;
- a ping or test event of a known repository or organisation: 200 ``pong`` naming the hook;
- an event scopekb does not act on, of a known repository or organisation: 202 ``ignored`` with the reason;
- a push of a known repository: 202 ``ignored`` (no source tracks that ref);
- anything of an unknown repository (or naming none): 404; a bad signature: 401.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scopekb.models import Source
from scopekb.settings import Settings

DATA = Path(__file__).resolve().parents[1] / "data" / "webhooks"
SECRET = "corpus-" + uuid.uuid4().hex
KNOWN_REPOS = {"codertocat/hello-world", "octocoders/hello-world"}
KNOWN_OWNERS = {"codertocat", "octocoders"}
#: Where each host's example repositories live (their clone URLs must match what the payloads carry).
HOSTS = {"github": "https://github.com", "gitlab": "https://gitlab.example.com",
         "gitea": "https://gitea.example.com", "bitbucket": "https://bitbucket.example.com"}
PING = {"github": "ping", "gitea": "ping", "gitlab": "Test Hook", "bitbucket": "diagnostics:ping"}


def corpus(host: str) -> list[dict[str, Any]]:
    if host == "github":
        return json.loads(gzip.decompress((DATA / "github" / "octokit-webhooks-examples-7.6.1.json.gz").read_bytes()))
    return json.loads((DATA / host / "examples.json").read_text())


def _hex(body: bytes) -> str:
    return hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


def request_for(host: str, event: str, body: bytes, form: bool = False, secret_ok: bool = True
                ) -> tuple[bytes, dict[str, str]]:
    """The body and headers the host sends (signature or token included)."""
    if form:
        body = b"payload=" + quote_plus(body.decode()).encode()
    did = str(uuid.uuid4())
    sig = _hex(body) if secret_ok else _hex(body + b"tampered")
    h = {"Content-Type": "application/x-www-form-urlencoded" if form else "application/json"}
    if host == "github":
        h.update({"X-GitHub-Event": event, "X-GitHub-Delivery": did, "X-Hub-Signature-256": "sha256=" + sig})
    elif host == "gitlab":
        h.update({"X-Gitlab-Event": event, "X-Gitlab-Event-UUID": did,
                  "X-Gitlab-Token": SECRET if secret_ok else "wrong"})
    elif host == "gitea":
        h.update({"X-Gitea-Event": event, "X-Gitea-Delivery": did, "X-Gitea-Signature": sig})
    else:
        h.update({"X-Event-Key": event, "X-Request-UUID": did, "X-Hub-Signature": "sha256=" + sig})
    return body, h


def _repo_and_owner(host: str, body: dict[str, Any]) -> tuple[str | None, str | None]:
    repo = body.get("repository") if isinstance(body.get("repository"), dict) else None
    project = body.get("project") if isinstance(body.get("project"), dict) else None
    name = (repo or {}).get("full_name") or (project or {}).get("path_with_namespace")
    if host == "gitlab" and name is None and repo and isinstance(repo.get("homepage"), str):
        name = repo["homepage"].split("://", 1)[-1].split("/", 1)[-1]
    owner = None
    for cand in ((body.get("organization") or {}).get("login") if isinstance(body.get("organization"), dict)
                 else None, ((repo or {}).get("owner") or {}).get("login") if isinstance((repo or {}).get("owner"),
                                                                                       dict) else None,
                 (body.get("workspace") or {}).get("slug") if isinstance(body.get("workspace"), dict) else None,
                 (project or {}).get("namespace"), body.get("group_path"), body.get("full_path")):
        if isinstance(cand, str):
            owner = cand.split("/")[0]
            break
    if owner is None and isinstance(name, str) and "/" in name:
        owner = name.split("/")[0]
    return name, owner


def expected(host: str, event: str, body: dict[str, Any]) -> tuple[int, str | None]:
    """(status, JSON status) the ingester must give this delivery, correctly signed."""
    name, owner = _repo_and_owner(host, body)
    known_repo = isinstance(name, str) and name.lower() in KNOWN_REPOS
    known_owner = isinstance(owner, str) and owner.lower() in KNOWN_OWNERS
    is_push = (event in ("push", "repo:push", "Push Hook", "Tag Push Hook")
               or (event == "System Hook" and body.get("event_name") in ("push", "tag_push")))
    if is_push:
        return (202, "ignored") if known_repo else (404, None)
    if event == PING[host]:
        if known_repo or (not name and known_owner) or (not name and not owner):
            return 200, "pong"
        return (200, "pong") if known_owner else (404, None)
    if known_repo or known_owner:
        return 202, "ignored"
    return 404, None


@pytest.fixture(scope="module", params=["embedded", "distributed"])
def ingester(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from scopekb_ingester.app import create_app

    run = f"corpus-{uuid.uuid4().hex[:8]}"
    common: dict[str, Any] = {"embedding": {"provider": "none"}, "log_format": "json", "log_level": "WARNING",
                              "profile": request.param}
    if request.param == "embedded":
        s = Settings(data_dir=tmp_path_factory.mktemp("corpus"), **common)
    else:
        s = Settings(opensearch={"url": request.getfixturevalue("opensearch_url"), "alias": f"{run}-chunks",
                                 "system_prefix": f"{run}-sys"},
                     redis={"url": request.getfixturevalue("redis_url")}, worker={"queue": f"{run}-queue"},
                     s3={**request.getfixturevalue("s3_config"), "bucket": run}, **common)
    app = create_app(s)
    rt = app.state.ingester.rt
    for host, base in HOSTS.items():
        for full in ("Codertocat/Hello-World", "Octocoders/Hello-World"):
            rt.records.put_source(Source(
                id=Source.new_id(), agent_name="corpus", context_id=host, repo_url=f"{base}/{full}.git",
                repo_name=full, ref="scopekb-corpus-no-push-here", webhook_secret=SecretStr(SECRET)))
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield client
    finally:
        if request.param == "distributed":
            rt.records.client.indices.delete(index=f"{run}-*", ignore_unavailable=True)


def _post(client: TestClient, host: str, body: bytes, headers: dict[str, str]) -> Any:
    path = "gitea" if host == "gitea" else host
    return client.post(f"/webhooks/{path}", content=body, headers=headers)


@pytest.mark.parametrize("host", list(HOSTS))
def test_every_example_delivery_gets_the_right_answer(ingester: TestClient, host: str) -> None:
    forms = (False, True) if host == "github" else (False,)
    wrong: list[str] = []
    seen: dict[tuple[int, str | None], int] = {}
    for ex in corpus(host):
        raw = json.dumps(ex["body"]).encode()
        want = expected(host, ex["event"], ex["body"])
        for form in forms:
            body, headers = request_for(host, ex["event"], raw, form=form)
            r = _post(ingester, host, body, headers)
            got = (r.status_code, r.json().get("status") if r.status_code < 300 else None)
            seen[got] = seen.get(got, 0) + 1
            if r.status_code >= 500 or got != want:
                wrong.append(f"{ex['event']} {ex['sets']} form={form}: want {want}, got {r.status_code} {r.text[:200]}")
                continue
            if got == (200, "pong"):
                assert r.json()["hook"], r.text
            if got == (202, "ignored"):
                assert r.json()["reason"], r.text
    assert not wrong, f"{len(wrong)} wrong answers:\n" + "\n".join(wrong[:20])
    assert (202, "ignored") in seen and (host == "gitea" or (200, "pong") in seen), seen  # Gitea tests by a push


def test_github_pings_name_the_repository_and_organisation_hooks(ingester: TestClient) -> None:
    pings = [ex["body"] for ex in corpus("github") if ex["event"] == "ping"]
    answers = []
    for b in pings:
        body, headers = request_for("github", "ping", json.dumps(b).encode())
        r = _post(ingester, "github", body, headers)
        assert r.status_code == 200, r.text
        answers.append(r.json())
    assert {a["hook"] for a in answers} >= {"Repository hook 109948940", "Organization hook 109948940"}
    org = next(a for a in answers if a["hook"] == "Organization hook 109948940")
    assert org["repository"] is None and org["owner"] == "Octocoders"


@pytest.mark.parametrize("host", list(HOSTS))
def test_bad_signatures_and_unknown_repositories_stay_4xx(ingester: TestClient, host: str) -> None:
    examples = [ex for ex in corpus(host) if expected(host, ex["event"], ex["body"])[0] != 404]
    for ex in examples[:25]:
        raw = json.dumps(ex["body"]).encode()
        name, owner = _repo_and_owner(host, ex["body"])
        body, headers = request_for(host, ex["event"], raw, secret_ok=False)
        r = _post(ingester, host, body, headers)
        want = 404 if not (name or owner) else 401
        assert r.status_code == want, (ex["event"], ex["sets"], r.status_code, r.text)
        other = json.loads(json.dumps(ex["body"]).replace("Hello-World", "Not-Registered-Repo").replace(
            "hello-world", "not-registered-repo").replace("Codertocat", "Nobody").replace("Octocoders", "Nobody"))
        body, headers = request_for(host, ex["event"], json.dumps(other).encode())
        r = _post(ingester, host, body, headers)
        assert r.status_code in (404, 200) if not (name or owner) else r.status_code == 404, (ex["event"], r.text)


def _github_push(ref: str) -> bytes:
    push = next(ex["body"] for ex in corpus("github") if ex["event"] == "push" and
                str(ex["body"].get("ref", "")).startswith("refs/heads/"))
    return json.dumps({**push, "ref": ref}).encode()


@pytest.mark.parametrize("ref", ["refs/heads/../../etc", "refs/heads/--upload-pack=touch /tmp/pwn",
                                 "refs/heads/a\u0000b", "refs/heads/" + "x" * 5000, "refs/tags/v1\x1b[2J"])
def test_pushed_ref_names_are_checked_like_registered_ones(ingester: TestClient, ref: str) -> None:
    """Hostile review 2 (H4): a pushed ref git check-ref-format refuses gets a 400 naming the reason, bounded."""
    body, headers = request_for("github", "push", _github_push(ref))
    r = _post(ingester, "github", body, headers)
    assert r.status_code == 400 and "is not a valid ref name" in r.json()["detail"], r.text
    assert len(r.text) < 500 and "\x1b" not in r.text


@pytest.mark.parametrize("did", ["<img src=x onerror=alert(1)>", "\x1b[31mred", "../../x", "d" * 5000, "a b"])
def test_delivery_ids_that_cannot_be_job_ids_are_refused(ingester: TestClient, did: str) -> None:
    """Hostile review 2 (H5): the delivery id becomes the task and job id, so only a safe alphabet is taken."""
    body, headers = request_for("github", "push", _github_push("refs/heads/main"))
    headers["X-GitHub-Delivery"] = did
    r = _post(ingester, "github", body, headers)
    assert r.status_code == 400 and r.json()["detail"].startswith("invalid delivery id"), r.text


def test_a_push_naming_thousands_of_refs_is_one_job_per_pattern_source(ingester: TestClient) -> None:
    """Hostile review 4: a signed Bitbucket push naming 10,000 distinct branches queued a sync job per branch
    (13 s to answer), each syncing every ref the source's patterns match. Now the pushes of sources that all
    track ref patterns are one job per set of sources; a source tracking its one ``ref`` keeps a job per push
    (with the pushed commit)."""
    rt = ingester.app.state.ingester.rt
    full = f"Many/Refs-{uuid.uuid4().hex[:6]}"
    url = f"{HOSTS['bitbucket']}/{full}.git"
    every = Source(id=Source.new_id(), agent_name="corpus", context_id="many", repo_url=url, repo_name=full,
                   ref="main", refs=["*"], webhook_secret=SecretStr(SECRET))
    one = Source(id=Source.new_id(), agent_name="corpus", context_id="one", repo_url=url, repo_name=full,
                 ref="main", webhook_secret=SecretStr(SECRET))
    for src in (every, one):
        rt.records.put_source(src)
    rt.coord.bump_sources_version()  # as registering through ops.add_source does
    head = "a" * 40

    def change(name: str) -> dict[str, Any]:
        return {"old": None, "new": {"name": name, "type": "branch", "target": {"hash": head}}}

    names = [f"topic/{n}" for n in range(3000)] + ["main"] + [f"later/{n}" for n in range(10)]
    payload = {"repository": {"full_name": full, "links": {"html": {"href": f"{HOSTS['bitbucket']}/{full}"}}},
               "push": {"changes": [change(n) for n in names]}}
    body, headers = request_for("bitbucket", "repo:push", json.dumps(payload).encode())
    r = _post(ingester, "bitbucket", body, headers)
    assert r.status_code == 202 and r.json()["status"] == "queued", r.text
    from scopekb import ops

    jobs = [ops.get_job(rt, j) for j in r.json()["job_ids"]]
    assert len(jobs) == 2, r.json()["job_ids"]
    merged, main = jobs
    assert merged.source_ids == [every.id] and merged.ref is None and merged.to_commit is None, merged
    assert sorted(main.source_ids) == sorted([every.id, one.id]) and (main.ref, main.to_commit) == ("main", head)
