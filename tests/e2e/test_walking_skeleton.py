"""Walking skeleton (issue 3): a signed GitHub push makes a real repository searchable, end to end.

Real input: click 8.0.4 and 8.1.0 (PyPI sdists) as two commits. Expected symbols, paths and line ranges are
derived from the sources with ``ast``, not hard-coded.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest

from scopekb.realrepo import build_release_repo, git
from scopekb_ingester.providers import github_signature

from .conftest import ROOT, Stack

pytestmark = pytest.mark.e2e

PACKAGE, V1, V2 = "click", "8.0.4", "8.1.0"
SECRET = "e2e-webhook-secret"
ZERO = "0" * 40


def _defs(repo: Path, commit: str) -> dict[str, tuple[str, int, int]]:
    """Functions defined exactly once at ``commit`` whose name occurs nowhere else in the tree's Python files:
    name -> (path, first line, last line)."""
    files = git(repo, "ls-tree", "-r", "--name-only", commit).splitlines()
    found: dict[str, list[tuple[str, int, int]]] = {}
    words: Counter[str] = Counter()
    for path in files:
        if not path.endswith(".py"):
            continue
        src = git(repo, "show", f"{commit}:{path}")
        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found.setdefault(node.name, []).append((path, first, node.end_lineno or node.lineno))
    return {n: locs[0] for n, locs in found.items() if len(locs) == 1 and words[n] == 1 and len(n) > 12}


@pytest.fixture(scope="module")
def click_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    repo = tmp_path_factory.mktemp("repos") / "click"
    c1, c2 = build_release_repo(repo, PACKAGE, [V1, V2], ROOT / ".services" / "cache" / "sdists")
    git(repo, "update-ref", "refs/heads/main", c1)  # the "host" has only release 1 until the second push
    return repo, c1, c2


def _push(stack: Stack, repo: Path, before: str, after: str, delivery: str, secret: str = SECRET) -> httpx.Response:
    body = json.dumps({
        "ref": "refs/heads/main", "before": before, "after": after,
        "repository": {"full_name": "pallets/click", "clone_url": str(repo), "html_url": "https://x.invalid/click"},
        "commits": [],
    }).encode()
    return httpx.post(stack.ingester_url + "/webhooks/github", content=body, headers={
        "Content-Type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": github_signature(secret, body)}, timeout=30)


def _search(stack: Stack, key: str, query: str, **extra: object) -> list[dict]:
    with stack.agent(key) as c:
        r = c.post("/v1/search", json={"query": query, "max_results": 5, **extra})
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert all(0.0 <= h["score"] <= 1.0 for h in hits)
    return hits


def _ids_and_count(stack: Stack, key: str) -> tuple[int, set[str]]:
    from opensearchpy import OpenSearch

    client = OpenSearch(hosts=[stack.env["SCOPEKB_OPENSEARCH__URL"]])
    alias = stack.env["SCOPEKB_OPENSEARCH__ALIAS"]
    client.indices.refresh(index=alias)
    ids = set()
    res = client.search(index=alias, body={"size": 10000, "_source": False, "query": {"match_all": {}}})
    ids = {h["_id"] for h in res["hits"]["hits"]}
    return client.count(index=alias)["count"], ids


def test_signed_push_makes_real_repository_searchable(stack: Stack, click_repo: tuple[Path, str, str]) -> None:
    repo, c1, c2 = click_repo
    defs1, defs2 = _defs(repo, c1), _defs(repo, c2)
    only_v1 = sorted(set(defs1) - set(defs2))
    only_v2 = sorted(set(defs2) - set(defs1))
    both = sorted(n for n in set(defs1) & set(defs2) if defs1[n] == defs2[n])
    assert only_v1 and only_v2 and both, "release pair must add, remove and keep functions"

    with stack.admin() as admin:
        scopes = [("alpha", "ctx-1"), ("beta", "ctx-9")]
        for agent, ctx in scopes:
            r = admin.post("/v1/sources", json={"agent_name": agent, "context_id": ctx, "repo_url": str(repo),
                                                "ref": "main", "repo_name": "pallets/click",
                                                "webhook_secret": SECRET})
            assert r.status_code == 201, r.text
            assert "webhook_secret" not in r.json()
        keys = {}
        for agent, ctx in [*scopes, ("alpha", "ctx-other"), ("gamma", "ctx-1")]:
            r = admin.post("/v1/keys", json={"agent_name": agent, "context_ids": [ctx]})
            assert r.status_code == 201, r.text
            keys[(agent, ctx)] = r.json()["key"]

    # Push release 1.
    d1 = "gh-" + uuid.uuid4().hex
    r = _push(stack, repo, ZERO, c1, d1)
    assert r.status_code == 202, r.text
    assert r.json()["job_id"].startswith(d1 + ".")  # the delivery id keyed by host and sources
    job = stack.wait_job(r.json()["job_id"])
    assert job["state"] == "done", job
    assert job["to_commit"] == c1 and job["files_indexed"] > 50 and job["chunks_written"] > 0

    name = both[0]
    path, first, _last = defs1[name]
    for scope in scopes:
        hits = _search(stack, keys[scope], name)
        assert hits, f"{name} not found in {scope}"
        top = hits[0]
        assert (top["path"], top["agent_name"], top["context_id"]) == (path, *scope)
        assert top["start_line"] <= first <= top["end_line"], (top["start_line"], top["end_line"], first)
        assert top["score"] == 1.0 and f"def {name}" in top["content"]
    for other in [("alpha", "ctx-other"), ("gamma", "ctx-1")]:
        assert _search(stack, keys[other], name) == [], f"leak into {other}"
    # A forged scope in the body does not widen the key's scope: agent_name is no field of a search (422).
    with stack.agent(keys[("gamma", "ctx-1")]) as c:
        r = c.post("/v1/search", json={"query": name, "agent_name": "alpha", "context_id": "ctx-1"})
    assert r.status_code == 422 and "agent_name" in r.text and "hits" not in r.text, r.text

    removed, added = only_v1[0], only_v2[0]
    assert any(f"def {removed}" in h["content"] for h in _search(stack, keys[scopes[0]], removed))
    assert not any(f"def {added}" in h["content"] for h in _search(stack, keys[scopes[0]], added))

    # Push release 2: added function found, removed one gone.
    git(repo, "update-ref", "refs/heads/main", c2)
    d2 = "gh-" + uuid.uuid4().hex
    r = _push(stack, repo, c1, c2, d2)
    assert r.status_code == 202, r.text
    job = stack.wait_job(r.json()["job_id"])
    assert job["state"] == "done", job
    assert job["from_commit"] and set(job["from_commit"].values()) == {c1} and job["to_commit"] == c2
    apath, afirst, _ = defs2[added]
    for scope in scopes:
        hits = _search(stack, keys[scope], added)
        assert hits and hits[0]["path"] == apath and hits[0]["start_line"] <= afirst <= hits[0]["end_line"]
        assert not any(f"def {removed}" in h["content"] for h in _search(stack, keys[scope], removed))
        assert all(h["commit"] in (c1, c2) for h in hits)

    # Re-sending the same delivery changes nothing: same ids, same count.
    before = _ids_and_count(stack, keys[scopes[0]])
    r = _push(stack, repo, c1, c2, d2)
    assert r.status_code == 200 and r.json()["status"] == "duplicate"
    # A new delivery of the same commit is a no-op sync.
    d3 = "gh-" + uuid.uuid4().hex
    r = _push(stack, repo, c1, c2, d3)
    assert r.status_code == 202
    job = stack.wait_job(r.json()["job_id"])
    assert job["state"] == "done" and job["chunks_written"] == 0 and job["files_indexed"] == 0
    assert _ids_and_count(stack, keys[scopes[0]]) == before
    metrics = httpx.get(stack.query_url + "/metrics", timeout=30).text
    assert 'scopekb_jobs{state="done",trigger="webhook"}' in metrics
    assert 'scopekb_query_requests_total{mode="keyword",route="/v1/search",status="200"}' in metrics


def test_bad_webhooks_are_refused_and_enqueue_nothing(stack: Stack, click_repo: tuple[Path, str, str]) -> None:
    repo, c1, _ = click_repo
    with stack.admin() as admin:
        r = admin.post("/v1/sources", json={"agent_name": "delta", "context_id": "c", "repo_url": str(repo),
                                            "ref": "main", "repo_name": "pallets/click-bad",
                                            "webhook_secret": SECRET})
        assert r.status_code == 201
    url = stack.ingester_url + "/webhooks/github"
    body = json.dumps({"ref": "refs/heads/main", "before": ZERO, "after": c1,
                       "repository": {"full_name": "pallets/click-bad"}}).encode()

    def post(content: bytes, **headers: str) -> httpx.Response:
        d = "bad-" + uuid.uuid4().hex
        h = {"Content-Type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": d, **headers}
        resp = httpx.post(url, content=content, headers=h, timeout=30)
        with stack.admin() as admin:
            assert admin.get(f"/v1/jobs/{d}").status_code == 404, "a refused delivery must enqueue nothing"
        return resp

    assert post(body, **{"X-Hub-Signature-256": github_signature("wrong", body)}).status_code == 401
    assert post(body).status_code == 401  # missing signature while a secret is configured
    tampered = body.replace(b"main", b"mainx")
    assert post(tampered, **{"X-Hub-Signature-256": github_signature(SECRET, body)}).status_code == 401
    unknown = json.dumps({"ref": "refs/heads/main", "before": ZERO, "after": c1,
                          "repository": {"full_name": "nobody/nothing"}}).encode()
    assert post(unknown, **{"X-Hub-Signature-256": github_signature(SECRET, unknown)}).status_code == 404
    for bad in (b"{not json", b"[]", b"", json.dumps({"repository": "x"}).encode()):
        assert post(bad, **{"X-Hub-Signature-256": github_signature(SECRET, bad)}).status_code == 400
    for ref in ("refs/tags/v1", "refs/heads/other"):  # tags and untracked branches: acknowledged, ignored
        ign = json.dumps({"ref": ref, "before": ZERO, "after": c1,
                          "repository": {"full_name": "pallets/click-bad"}}).encode()
        r = post(ign, **{"X-Hub-Signature-256": github_signature(SECRET, ign)})
        assert r.status_code == 202 and r.json()["status"] == "ignored"
    ping = json.dumps({"zen": "hi", "repository": {"full_name": "pallets/click-bad"}}).encode()
    r = httpx.post(url, content=ping, headers={"X-GitHub-Event": "ping", "X-GitHub-Delivery": "p1",
                                               "X-Hub-Signature-256": github_signature(SECRET, ping)})
    assert r.status_code == 200
    big = b"{" + b" " * (6 * 1024 * 1024) + b"}"
    assert post(big, **{"X-Hub-Signature-256": github_signature(SECRET, big)}).status_code == 413
