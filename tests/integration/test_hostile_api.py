"""Issue 16 on both profiles, in-process (embedded: SQLite + in-memory coordination; distributed: real OpenSearch
and Redis): revocation applies to every replica within the stated bound; every JSON route answers ``[`` × 1000 with
400; pathological patterns get 400 naming the limit; a generated webhook secret is shown once and unsigned
deliveries change nothing; security headers on every answer. Real processes: tests/e2e/test_hostile_callers.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scopekb.settings import Settings
from tests.profiles import profile_settings
from tests.webhook_fixtures import ZERO, delivery

ADMIN = "hostile-admin-" + uuid.uuid4().hex
PROVS = ["github", "gitlab", "gitea", "forgejo", "bitbucket"]


def _settings(profile: str, tmp: Path, services: dict[str, Any], run: str) -> Settings:
    return profile_settings(profile, tmp, services, run, ADMIN, ingester={"s3_event_token": "s3-token"})


@pytest.fixture(params=["embedded", "distributed"])
def apps(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Two query replicas and an ingester of one profile, on the same stores."""
    from scopekb_ingester.app import create_app as ingester_app
    from scopekb_query.app import create_app as query_app

    profile = request.param
    run = f"hostile-{uuid.uuid4().hex[:8]}"
    services = {name: request.getfixturevalue(name) for name in ("opensearch_url", "redis_url", "s3_config")
                } if profile == "distributed" else {}
    s = _settings(profile, tmp_path, services, run)
    a, b, ing = query_app(s), query_app(s), ingester_app(s)
    try:
        with TestClient(a, raise_server_exceptions=False) as ca, TestClient(b, raise_server_exceptions=False) as cb, \
                TestClient(ing, raise_server_exceptions=False) as ci:
            yield {"a": ca, "b": cb, "ingester": ci, "profile": profile, "tmp": tmp_path}
    finally:
        if profile == "distributed":
            a.state.runtime.opensearch_client.indices.delete(index=f"{run}-*", ignore_unavailable=True)


def _one_commit_repo(repo: Path) -> Path:
    """A git repository at ``repo`` (created) whose branch ``main`` has one commit of ``a.py``."""
    from scopekb.realrepo import git

    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    return repo


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def test_revocation_applies_to_every_replica_within_the_stated_bound(apps: dict[str, Any]) -> None:
    """docs/security.md: the revoking replica refuses the key on its next request; every other replica within
    ``query.revocation_bound_s`` (issue 20: the keys version is read at most that often, not per request)."""
    key = apps["a"].post("/v1/keys", json={"agent_name": "rev", "context_ids": ["c"]}, headers=_admin()).json()
    auth = {"Authorization": f"Bearer {key['key']}"}
    for c in (apps["a"], apps["b"]):  # both replicas have the live key cached now
        assert c.post("/v1/search", json={"query": "x"}, headers=auth).status_code == 200
    assert apps["a"].delete(f"/v1/keys/{key['id']}", headers=_admin()).status_code == 200
    revoked_at = time.monotonic()
    bound = Settings().query.revocation_bound_s
    for c in (apps["a"], apps["b"]):
        if c is apps["b"]:  # the other replica: once the bound has passed since the revocation
            time.sleep(max(0.0, revoked_at + bound - time.monotonic()) + 0.05)
        assert c.post("/v1/search", json={"query": "x"}, headers=auth).status_code == 401
        r = c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                   headers={**auth, "Accept": "application/json, text/event-stream"})
        assert r.status_code == 401


def test_deep_nesting_is_400_on_every_json_route(apps: dict[str, Any]) -> None:
    key = apps["a"].post("/v1/keys", json={"agent_name": "deep", "context_ids": ["c"]}, headers=_admin()).json()
    deep = b"[" * 1000
    agent = {"Authorization": f"Bearer {key['key']}", "Content-Type": "application/json",
             "Accept": "application/json, text/event-stream"}
    for path, headers in (("/v1/search", agent), ("/mcp", agent), ("/v1/sources", _admin()),
                          ("/v1/keys", _admin())):
        r = apps["a"].post(path, content=deep, headers={"Content-Type": "application/json", **headers})
        assert r.status_code == 400, (path, r.status_code, r.text)
    for prov in PROVS:  # unauthenticated, as in the issue
        _, h = delivery(prov, "team/none", "https://example.invalid/x.git", ZERO, "1" * 40, "s")
        r = apps["ingester"].post(f"/webhooks/{prov}", content=deep, headers=h)
        assert r.status_code == 400, (prov, r.status_code, r.text)
    r = apps["ingester"].post("/webhooks/s3", content=deep, headers={"X-Scopekb-Token": "s3-token"})
    assert r.status_code == 400, r.text


def test_pathological_patterns_are_400_naming_the_limit(apps: dict[str, Any]) -> None:
    key = apps["a"].post("/v1/keys", json={"agent_name": "pat", "context_ids": ["c"]}, headers=_admin()).json()
    auth = {"Authorization": f"Bearer {key['key']}"}
    r = apps["a"].post("/v1/search", json={"query": "x", "file_patterns": ["*?*?*?*?*?*?*?*?*?*?Z"]}, headers=auth)
    assert r.status_code == 400 and "query.max_pattern_wildcards" in r.json()["detail"]
    r = apps["a"].post("/v1/sources", headers=_admin(), json={
        "agent_name": "pat", "context_id": "c", "repo_url": str(apps["tmp"]), "include": ["*?*?*?*?*?*?*?*?*?Z"]})
    assert r.status_code == 422 and "wildcards" in r.text


def test_unsigned_and_unknown_deliveries_change_nothing(apps: dict[str, Any]) -> None:
    from scopekb.realrepo import git

    repo = _one_commit_repo(apps["tmp"] / "repo")
    head = git(repo, "rev-parse", "HEAD")
    name = "team/" + uuid.uuid4().hex[:6]
    r = apps["a"].post("/v1/sources", headers=_admin(), json={"agent_name": "w", "context_id": "c",
                                                              "repo_url": str(repo), "repo_name": name})
    assert r.status_code == 201 and len(r.json()["webhook_secret"]) >= 40, r.text
    src = r.json()
    assert "webhook_secret" not in apps["b"].get(f"/v1/sources/{src['id']}", headers=_admin()).json()
    for prov in PROVS:
        body, h = delivery(prov, name, str(repo), head, ZERO, "", sign=False)
        assert apps["ingester"].post(f"/webhooks/{prov}", content=body, headers=h).status_code == 401, prov
        body, h = delivery(prov, name, str(repo), head, ZERO, "guessed")
        assert apps["ingester"].post(f"/webhooks/{prov}", content=body, headers=h).status_code == 401, prov
    body, h = delivery("github", name, str(repo), head, ZERO, src["webhook_secret"])
    assert apps["ingester"].post("/webhooks/github", content=body, headers=h).status_code == 202


def test_security_headers_and_exposure(apps: dict[str, Any]) -> None:
    for c, path in ((apps["a"], "/healthz"), (apps["a"], "/v1/search"), (apps["ingester"], "/healthz"),
                    (apps["ingester"], "/webhooks/nope"), (apps["a"], "/docs")):
        r = c.get(path) if path != "/webhooks/nope" else c.post(path)
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "no-referrer", path
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
    assert "https://" not in apps["a"].get("/docs").text


def test_a_delivery_id_chosen_by_another_scope_neither_blocks_nor_reveals_a_job(apps: dict[str, Any]) -> None:
    """Dedupe and job ids are keyed by (host, the sources the signature admits, delivery id): a tenant replaying
    another tenant's delivery id with its own valid signature gets a job of its own (not 'duplicate' with the
    other job's id), the other tenant's delivery is still queued, and a true redelivery is still one job."""
    from scopekb.realrepo import git

    repos, secrets, names = [], [], []
    for n in range(2):
        repo = apps["tmp"] / f"repo{n}"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        (repo / "a.py").write_text(f"x = {n}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "one")
        name = f"team{n}/" + uuid.uuid4().hex[:6]
        r = apps["a"].post("/v1/sources", headers=_admin(), json={"agent_name": f"tenant{n}", "context_id": "c",
                                                                  "repo_url": str(repo), "repo_name": name})
        assert r.status_code == 201, r.text
        repos.append(repo)
        secrets.append(r.json()["webhook_secret"])
        names.append(name)
    for prov in PROVS:
        did = f"{{{uuid.uuid4()}}}" if prov == "bitbucket" else str(uuid.uuid4())
        answers = []
        for n in (1, 0, 0):  # tenant 1 first with tenant 0's id, then tenant 0, then tenant 0's redelivery
            body, h = delivery(prov, names[n], str(repos[n]), ZERO, git(repos[n], "rev-parse", "HEAD"), secrets[n],
                               delivery_id=did)
            answers.append(apps["ingester"].post(f"/webhooks/{prov}", content=body, headers=h))
        first, second, again = answers
        assert (first.status_code, second.status_code, again.status_code) == (202, 202, 200), (prov, answers)
        assert first.json()["job_id"] != second.json()["job_id"], prov
        assert again.json() == {"status": "duplicate", "job_id": second.json()["job_id"]}, prov
        for a in (first, second):  # the job id still names the delivery, so logs trace one push end to end
            assert a.json()["job_id"].startswith(did), (prov, a.json())
        jobs = {a.json()["job_id"]: apps["a"].get(f"/v1/jobs/{a.json()['job_id']}", headers=_admin()).json()
                for a in (first, second)}
        assert {tuple(j["source_ids"]) for j in jobs.values()} == {(first.json()["sources"][0],),
                                                                   (second.json()["sources"][0],)}, prov


def _mcp(client: TestClient, key: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    r = client.post("/mcp", json=call, headers={"Authorization": f"Bearer {key}",
                                                 "Accept": "application/json, text/event-stream"})
    assert r.status_code == 200, r.text
    return r.json()["result"]


def test_unknown_arguments_are_refused_naming_them_on_mcp_and_rest(apps: dict[str, Any]) -> None:
    """Hostile review 6: MCP dropped an unknown argument silently (``serch_mode``, ``contextId``: the caller got an
    answer to a question it did not ask); now a tool error naming it, as REST's 422 names an unknown body field."""
    key = apps["a"].post("/v1/keys", json={"agent_name": "args", "context_ids": ["c"]}, headers=_admin()).json()
    for tool, args in (("search", {"query": "x", "contextId": "c"}), ("status", {"context": "c"}),
                       ("index", {"source_id": "s", "force": True}),
                       ("read", {"path": "a", "blob_sha": "0" * 40, "lines": "1-3"})):
        res = _mcp(apps["a"], key["key"], tool, args)
        text = res["content"][0]["text"]
        bad = next(k for k in args if k not in ("query", "source_id", "path", "blob_sha"))
        assert res["isError"] and f"unknown argument {bad};" in text and "\n" not in text, (tool, text)
    res = _mcp(apps["a"], key["key"], "search", {"query": "x", "a\nb": 1, "<b>": 2})  # names stay one line
    assert res["isError"] and "unknown arguments" in res["content"][0]["text"]
    assert "\n" not in res["content"][0]["text"]
    tools = apps["a"].post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers={
        "Authorization": f"Bearer {key['key']}", "Accept": "application/json, text/event-stream"}).json()
    assert all(t["inputSchema"]["additionalProperties"] is False for t in tools["result"]["tools"])
    assert not _mcp(apps["a"], key["key"], "search", {"query": "x"})["isError"]  # known arguments still work
    auth = {"Authorization": f"Bearer {key['key']}"}
    r = apps["a"].post("/v1/search", json={"query": "x", "contextId": "c"}, headers=auth)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "contextId"], r.text
    r = apps["a"].post("/v1/keys", json={"agent_name": "x", "context_ids": ["c"], "ttl": 5}, headers=_admin())
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "ttl"], r.text


def test_422_answers_never_echo_the_input(apps: dict[str, Any]) -> None:
    """Hostile review 6: FastAPI's 422 echoed each error's ``input`` (a 1 MB body of bad metadata came back as
    1.4 MB); now ``type``, ``loc`` and ``msg`` only, at most 10 errors and a count of the rest."""
    key = apps["a"].post("/v1/keys", json={"agent_name": "echo", "context_ids": ["c"]}, headers=_admin()).json()
    auth = {"Authorization": f"Bearer {key['key']}"}
    secret = "canary_" + uuid.uuid4().hex
    bodies = [("/v1/search", auth, {"query": "x", "metadata": {"a": [{"b": secret * 20}] * 900}}),
              ("/v1/search", auth, {"q": secret, "file_patterns": [secret] * 10}),
              ("/v1/search", auth, {"query": "x", "file_patterns": [1] * 60, "languages": [{secret: 1}] * 30}),
              ("/v1/sources", _admin(), {"agent_name": "a", "context_id": "c", "repo_url": 5, "junk": secret}),
              ("/v1/keys", _admin(), {"agent_name": secret * 100, "context_ids": [[secret]] * 200})]
    for path, headers, body in bodies:
        r = apps["a"].post(path, json=body, headers=headers)
        assert r.status_code == 422, (path, r.text[:300])
        assert secret not in r.text and len(r.content) < 4000, (path, len(r.content), r.text[:300])
        detail = r.json()["detail"]
        assert 1 <= len(detail) <= 11 and all(set(d) == {"type", "loc", "msg"} for d in detail), detail
    r = apps["a"].get("/v1/jobs", params={"limit": "9" * 5000}, headers=_admin())
    assert r.status_code == 422 and "9" * 50 not in r.text and len(r.content) < 1000, r.text[:300]
    r = apps["ingester"].post("/webhooks/github", content=b"x", headers={"Content-Type": "application/json"})
    assert r.status_code < 500 and len(r.content) < 1000


def test_an_id_past_the_id_limit_is_404_on_every_route_that_takes_one(apps: dict[str, Any]) -> None:
    """Hostile review: a 5,000-character id reached OpenSearch in the request line and came back as 400 "the search
    backend refused the query (too_long_http_line_exception)"; no record has such an id, so it is not found."""
    long_id = "x" * 5000
    c = apps["a"]
    for method, path in (("GET", f"/v1/jobs/{long_id}"), ("GET", f"/v1/sources/{long_id}"),
                         ("DELETE", f"/v1/sources/{long_id}"), ("POST", f"/v1/sources/{long_id}/sync"),
                         ("DELETE", f"/v1/keys/{long_id}"), ("POST", f"/v1/deadletters/{long_id}/replay")):
        r = c.request(method, path, headers=_admin())
        assert r.status_code == 404, (method, path[:30], r.status_code, r.text[:200])
        assert "search backend" not in r.text


def test_fields_a_mode_cannot_honour_an_empty_ref_and_a_non_json_body_are_refused_naming_why(
        apps: dict[str, Any]) -> None:
    """Hostile review (LOW, stop 41): ``symbol_match: prefix`` outside symbol mode was ignored (``--mode exact
    --prefix`` searched without the prefix rule), ``"ref": ""`` searched every ref over REST while ``read`` refused
    it, and a JSON body sent as ``text/plain`` got "Input should be a valid dictionary". Now each is refused naming
    the reason, on REST and MCP alike; the same requests without the offending field are answered."""
    key = apps["a"].post("/v1/keys", json={"agent_name": "modes", "context_ids": ["c"]}, headers=_admin()).json()
    auth = {"Authorization": f"Bearer {key['key']}"}
    refused = [({"query": "x", "mode": "exact", "symbol_match": "prefix"}, "symbol_match 'prefix' applies"),
               ({"query": "x", "mode": "keyword", "fusion": "rrf"}, "fusion 'rrf' applies"),
               ({"query": "x", "mode": "keyword", "case_sensitive": True}, "keyword search ignores case"),
               ({"query": "x", "ref": ""}, "ref must not be empty"),
               ({"query": "x", "ref": "  "}, "ref must not be empty")]
    for body, why in refused:
        r = apps["a"].post("/v1/search", json=body, headers=auth)
        assert r.status_code == 422 and why in r.text, (body, r.text)
        if "fusion" not in body:  # the MCP tool has no fusion argument (REST only)
            res = _mcp(apps["a"], key["key"], "search", body)
            assert res["isError"] and why in res["content"][0]["text"], (body, res)
    for body in ({"query": "x", "mode": "symbol", "symbol_match": "prefix"}, {"query": "x", "mode": "keyword",
                                                                               "case_sensitive": False},
                 {"query": "x", "mode": "exact", "case_sensitive": True}):
        assert apps["a"].post("/v1/search", json=body, headers=auth).status_code == 200, body
    r = apps["a"].get("/v1/read", params={"path": "a.py", "blob_sha": "0" * 40, "ref": " "}, headers=auth)
    assert r.status_code == 422 and "ref must not be empty" in r.text, r.text
    r = apps["a"].post("/v1/search", content=b'{"query": "x"}', headers={**auth, "Content-Type": "text/plain"})
    assert r.status_code == 415 and "Content-Type: application/json" in r.text and "text/plain" in r.text, r.text
    r = apps["a"].post("/v1/keys", content=b'{"agent_name": "x"}', headers={
        **_admin(), "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and "application/json" in r.text, r.text
    r = apps["a"].post("/v1/search", content=b'{"query": "x"}', headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("profile", ["embedded", "distributed"])
def test_without_an_admin_token_an_unknown_bearer_says_the_admin_api_is_off(profile: str, tmp_path: Path,
                                                                            request: pytest.FixtureRequest) -> None:
    """README newcomer run: `scopekb up` without SCOPEKB_QUERY__ADMIN_TOKEN, then `POST /v1/keys` with the token
    meant for it, answered "unknown or revoked key"; only the server log said the admin API was off."""
    from scopekb_query.app import create_app as query_app

    run = f"noadmin-{uuid.uuid4().hex[:8]}"
    services = {name: request.getfixturevalue(name) for name in ("opensearch_url", "redis_url", "s3_config")
                } if profile == "distributed" else {}
    s = profile_settings(profile, tmp_path, services, run, ADMIN).model_copy(deep=True)
    s.query.admin_token = None
    app = query_app(s)
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            r = c.post("/v1/keys", json={"agent_name": "a", "context_ids": ["c"]},
                       headers={"Authorization": "Bearer change-me"})
            assert r.status_code == 401 and "SCOPEKB_QUERY__ADMIN_TOKEN is not set" in r.text, r.text
    finally:
        if profile == "distributed":
            app.state.runtime.opensearch_client.indices.delete(index=f"{run}-*", ignore_unavailable=True)


def test_a_search_of_a_context_or_source_the_agent_lacks_says_so_and_a_capped_max_results_too(
        apps: dict[str, Any]) -> None:
    """README newcomer (stop 43): with an all-contexts key, a typo'd ``context_id`` got 200 with no hits and no
    notice on REST and "No results" on MCP, while the CLI named the mistake: an agent could not tell a typo from
    an empty answer. Now the notice says which context (or source) the agent has no sources in, without naming
    the agent's other contexts (a key bound to some must not learn the others); ``max_results`` above
    ``query.max_results_cap`` is lowered with a notice saying so."""
    repo = _one_commit_repo(apps["tmp"] / "typo-repo")
    r = apps["a"].post("/v1/sources", json={"agent_name": "typo", "context_id": "real",
                                            "repo_url": str(repo)}, headers=_admin())
    assert r.status_code == 201, r.text
    key = apps["a"].post("/v1/keys", json={"agent_name": "typo"}, headers=_admin()).json()["key"]
    auth = {"Authorization": f"Bearer {key}"}
    r = apps["a"].post("/v1/search", json={"query": "x", "mode": "keyword", "context_id": "nope"}, headers=auth)
    assert r.status_code == 200 and r.json()["hits"] == [], r.text
    assert r.json()["notice"] == "context nope has no sources for agent typo", r.text
    assert "real" not in r.json()["notice"]
    res = _mcp(apps["a"], key, "search", {"query": "x", "mode": "keyword", "context_id": "nope"})
    assert not res["isError"] and "context nope has no sources for agent typo" in res["content"][0]["text"], res
    r = apps["a"].post("/v1/search", json={"query": "x", "mode": "keyword", "source_id": "src-nope",
                                            "cross_context": True}, headers=auth)
    assert r.status_code == 200 and r.json()["notice"] == "agent typo has no source src-nope", r.text
    r = apps["a"].post("/v1/search", json={"query": "x", "mode": "keyword", "context_id": "real"}, headers=auth)
    assert r.status_code == 200 and r.json()["notice"] is None, r.text  # a real, empty context: no match, no note
    other = apps["a"].post("/v1/keys", json={"agent_name": "nobody-here"}, headers=_admin()).json()["key"]
    r = apps["a"].post("/v1/search", json={"query": "x", "mode": "keyword", "cross_context": True},
                       headers={"Authorization": f"Bearer {other}"})
    assert r.json()["notice"] == "agent nobody-here has no sources", r.text
