"""The query API answers the same in both profiles (issue 17): every test here runs on the embedded profile
(SQLite stores, in-memory coordination, the in-process broker) and on the distributed one (real OpenSearch and
Redis under a prefix of their own), through the same in-process app.

Readiness and ``/v1/status`` are among them: in the embedded profile they answered 503 and 500 before issue 17.
Document upload goes to S3 in the distributed profile and to the data folder in the embedded one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scopekb.realrepo import git
from scopekb.settings import Settings
from tests.profiles import profile_settings

ADMIN = "profiles-admin-" + uuid.uuid4().hex
PROFILES = ["embedded", "distributed"]


def _settings(profile: str, tmp: Path, services: dict[str, Any], run: str) -> Settings:
    return profile_settings(profile, tmp, services, run, ADMIN)


def one_file_repo(repo: Path, lib_py: str, name: str = "lib.py") -> Path:
    """A new git repository at ``repo`` whose branch ``main`` has one commit holding ``name`` (text ``lib_py``)."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / name).write_text(lib_py)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    return repo


@pytest.fixture(params=PROFILES)
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The query app of one profile, an admin client and a local git repository to register."""
    from scopekb_query.app import create_app

    profile = request.param
    run = f"prof-{uuid.uuid4().hex[:8]}"
    services = {name: request.getfixturevalue(name) for name in ("opensearch_url", "redis_url", "s3_config")
                } if profile == "distributed" else {}
    s = _settings(profile, tmp_path, services, run)
    repo = one_file_repo(tmp_path / "repo", "def profiles_marker_function():\n    return 'same answer'\n")
    app = create_app(s)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {ADMIN}"
            yield {"client": client, "rt": app.state.runtime, "repo": repo, "profile": profile}
    finally:
        if profile == "distributed":
            import redis

            rt = app.state.runtime
            rt.opensearch_client.indices.delete(index=f"{run}-*", ignore_unavailable=True)
            redis.Redis.from_url(services["redis_url"]).delete(s.worker.queue)


def _register(api: dict[str, Any]) -> dict[str, Any]:
    r = api["client"].post("/v1/sources", json={"agent_name": "prof", "context_id": "c",
                                                "repo_url": str(api["repo"]), "ref": "main"})
    assert r.status_code == 201, r.text
    return r.json()


def test_health_and_readiness(api: dict[str, Any]) -> None:
    c = api["client"]
    assert c.get("/healthz").json() == {"status": "ok"}
    r = c.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ready"] is True and set(body["checks"].values()) == {"ok"}
    want = {"sqlite", "memory"} if api["profile"] == "embedded" else {"opensearch", "redis", "s3"}
    assert set(body["checks"]) == want, body
    assert "scopekb_query_requests_total" in c.get("/metrics").text


def test_status_lists_the_index_and_every_source(api: dict[str, Any]) -> None:
    src = _register(api)
    r = api["client"].get("/v1/status")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["index"] and body["chunks"] == 0
    assert [(s["id"], s["status"]) for s in body["sources"]] == [(src["id"], "EMPTY")]


def test_source_lifecycle(api: dict[str, Any]) -> None:
    c = api["client"]
    src = _register(api)
    assert [s["id"] for s in c.get("/v1/sources").json()] == [src["id"]]
    one = c.get(f"/v1/sources/{src['id']}").json()
    assert one["status"] == "EMPTY" and one["last_job"] is None and "webhook_secret" not in one
    assert c.get("/v1/sources/src_missing").status_code == 404
    r = c.post("/v1/sources", json={"agent_name": "prof", "context_id": "c", "repo_url": "ext::sh -c x"})
    assert r.status_code == 422 and "remote helpers" in r.json()["detail"]
    assert c.delete(f"/v1/sources/{src['id']}").json() == {"deleted": True, "chunks_deleted": 0}
    assert c.delete(f"/v1/sources/{src['id']}").status_code == 404


def test_a_queued_sync_is_visible_as_a_job_at_once(api: dict[str, Any]) -> None:
    c = api["client"]
    src = _register(api)
    r = c.post(f"/v1/sources/{src['id']}/sync")
    assert r.status_code == 202 and r.json()["status"] == "queued"
    job = c.get(f"/v1/jobs/{r.json()['job_id']}")
    assert job.status_code == 200, job.text
    assert job.json()["state"] == "queued" and job.json()["source_ids"] == [src["id"]]
    assert job.json()["trigger"] == "manual"
    assert c.get("/v1/jobs/nope").status_code == 404
    # hostile review: an agent told (by a pin's 202) to poll its job got 403; its own scope's jobs answer now,
    # another scope's are 404 like an unknown id, and the job list stays admin-only
    keys = {}
    for agent, contexts in (("prof", ["c"]), ("prof", ["other"]), ("intruder", None)):
        made = c.post("/v1/keys", json={"agent_name": agent, "context_ids": contexts, "label": "jobs"})
        assert made.status_code == 201, made.text
        keys[(agent, str(contexts))] = {"Authorization": f"Bearer {made.json()['key']}"}
    mine = c.get(f"/v1/jobs/{r.json()['job_id']}", headers=keys[("prof", "['c']")])
    assert mine.status_code == 200 and mine.json()["id"] == r.json()["job_id"], mine.text
    for who in (("prof", "['other']"), ("intruder", "None")):
        other = c.get(f"/v1/jobs/{r.json()['job_id']}", headers=keys[who])
        assert other.status_code == 404 and "state" not in other.text, (who, other.text)
    assert c.get("/v1/jobs", headers=keys[("prof", "['c']")]).status_code == 403
    assert c.post("/v1/sources/src_missing/sync").status_code == 404
    for bad in ("-1", "0", "100000000", "x"):  # out of 1..200: a 422 naming the range, not a silent clamp
        r = c.get(f"/v1/jobs?limit={bad}")
        assert r.status_code == 422 and "limit" in r.text, (bad, r.status_code, r.text)


def test_keys_search_and_revocation(api: dict[str, Any]) -> None:
    from scopekb.indexing import run_sync

    c, rt = api["client"], api["rt"]
    src = _register(api)
    run_sync(rt.sync_deps(), "prof-" + uuid.uuid4().hex[:8], [src["id"]], trigger="cli")
    rt.chunks.refresh()
    # hostile review 5: an empty list was stored as null, a key that could search every context of the agent
    empty = c.post("/v1/keys", json={"agent_name": "prof", "context_ids": []})
    assert empty.status_code == 422 and "at least one context" in empty.text, empty.text
    assert c.get("/v1/keys").json() == []
    made = c.post("/v1/keys", json={"agent_name": "prof", "context_ids": ["c"], "label": "t"})
    assert made.status_code == 201
    key, key_id = made.json()["key"], made.json()["id"]
    assert [k["id"] for k in c.get("/v1/keys").json()] == [key_id]
    agent = {"Authorization": f"Bearer {key}"}
    hits = c.post("/v1/search", json={"query": "profiles_marker_function"}, headers=agent).json()["hits"]
    assert [h["path"] for h in hits] == ["lib.py"]
    assert c.post("/v1/search", json={"query": "x", "context_id": "other"}, headers=agent).status_code == 403
    assert c.post("/v1/search", json={"query": "x"}).status_code == 403  # the admin token does not search
    for fmt in ("xml", "%ff%00", "TEXT"):  # an unknown format is refused, not answered as JSON
        r = c.post(f"/v1/search?format={fmt}", json={"query": "profiles_marker_function"}, headers=agent)
        assert r.status_code == 422 and "format" in r.text, (fmt, r.status_code, r.text)
    text = c.post("/v1/search?format=text", json={"query": "profiles_marker_function"}, headers=agent)
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    assert c.get("/v1/status").json()["chunks"] >= 1
    assert c.delete(f"/v1/keys/{key_id}").json() == {"revoked": True}
    assert c.post("/v1/search", json={"query": "x"}, headers=agent).status_code == 401
    assert c.delete("/v1/keys/key_missing").status_code == 404


def test_unknown_request_fields_are_422_naming_them(api: dict[str, Any]) -> None:
    """Hostile review L3 on both profiles: a search, source or key request with a field the API does not have (a
    typo, ``secret`` for ``webhook_secret``, a forged ``agent_name``) is refused, 422 naming the field, and
    nothing is registered; it was silently dropped (a typo'd filter searched without it)."""
    from scopekb.indexing import run_sync

    c, rt = api["client"], api["rt"]
    src = _register(api)
    run_sync(rt.sync_deps(), "prof-" + uuid.uuid4().hex[:8], [src["id"]], trigger="cli")
    rt.chunks.refresh()
    agent = {"Authorization": "Bearer " + c.post("/v1/keys", json={"agent_name": "prof"}).json()["key"]}
    ok = {"query": "profiles_marker_function", "context_id": "c"}
    assert c.post("/v1/search", json=ok, headers=agent).json()["hits"]
    for extra in ({"max_result": 1}, {"cross_contexts": True}, {"source": src["id"]}, {"agent_name": "other"}):
        for fmt in ("json", "text"):
            r = c.post(f"/v1/search?format={fmt}", json={**ok, **extra}, headers=agent)
            assert r.status_code == 422 and next(iter(extra)) in r.text and "hits" not in r.text, (extra, r.text)
    before = [s["id"] for s in c.get("/v1/sources").json()]
    body = {"agent_name": "prof", "context_id": "d", "repo_url": str(api["repo"]), "ref": "main"}
    for extra in ({"secret": "s3cr3t"}, {"source_id": "x"}, {"reff": "dev"}):
        r = c.post("/v1/sources", json={**body, **extra})
        assert r.status_code == 422 and next(iter(extra)) in r.text, (extra, r.text)
    assert [s["id"] for s in c.get("/v1/sources").json()] == before
    r = c.post("/v1/keys", json={"agent_name": "prof", "contexts": ["c"]})
    assert r.status_code == 422 and "contexts" in r.text, r.text
    assert c.post("/v1/sources", json=body).status_code == 201  # the same body without the extra field


def test_oversized_source_locations_are_422_and_nothing_is_stored(api: dict[str, Any]) -> None:
    """A clone URL over 2,048 characters, a bucket over 63 or a prefix over 1,024 bytes is refused, 422 naming
    the field and its bound, on both profiles; nothing is registered (an unbounded URL grew the ingester's
    URL-key cache, noticed in the issue 20 pass). The same URL at the bound is accepted past this check."""
    c = api["client"]
    before = [s["id"] for s in c.get("/v1/sources").json()]
    base = {"agent_name": "prof", "context_id": "long"}
    url = "https://github.com/owner/" + "r" * 2100 + ".git"
    for body, field in (({**base, "repo_url": url}, "repo_url"),
                        ({**base, "kind": "s3", "bucket": "b" * 64, "prefix": "docs"}, "bucket"),
                        ({**base, "kind": "s3", "prefix": "é" * 513}, "prefix")):
        r = c.post("/v1/sources", json=body)
        assert r.status_code == 422 and field in r.text and "at most" in r.text, (field, r.status_code, r.text)
        assert len(r.text) < 4000, "the refusal must not echo the whole oversized value back"
    assert [s["id"] for s in c.get("/v1/sources").json()] == before
    at_bound = "https://github.com/owner/" + "r" * (2048 - len("https://github.com/owner/.git")) + ".git"
    r = c.post("/v1/sources", json={**base, "repo_url": at_bound, "webhooks": False})
    assert "at most" not in r.text, r.text


def test_admin_routes_need_the_admin_token(api: dict[str, Any]) -> None:
    c = api["client"]
    assert c.get("/v1/sources", headers={"Authorization": ""}).status_code == 401
    assert c.get("/v1/sources", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_dead_letters_list_and_replay(api: dict[str, Any]) -> None:
    from scopekb.models import DeadLetter

    c, rt = api["client"], api["rt"]
    src = _register(api)
    dl = DeadLetter(id="dl-" + uuid.uuid4().hex[:8], task="scopekb.sync_sources",
                    kwargs={"job_id": "old", "source_ids": [src["id"]], "trigger": "manual"}, error="boom",
                    attempts=3)
    rt.records.put("deadletters", dl.id, dl.model_dump(mode="json"))
    assert [d["id"] for d in c.get("/v1/deadletters").json()] == [dl.id]
    r = c.post(f"/v1/deadletters/{dl.id}/replay")
    assert r.status_code == 202 and r.json()["job_id"].startswith(dl.id + "-replay-")
    assert c.get(f"/v1/jobs/{r.json()['job_id']}").json()["state"] == "queued"
    assert c.get("/v1/deadletters").json() == []
    assert c.post("/v1/deadletters/replay").json() == {"status": "queued", "job_ids": []}
    assert c.post("/v1/deadletters/missing/replay").status_code == 404


def test_document_upload_to_an_object_store_source(api: dict[str, Any]) -> None:
    """S3 in the distributed profile, the data folder in the embedded one (issue 16): the same answers."""
    c = api["client"]
    r = c.post("/v1/sources", json={"agent_name": "prof", "context_id": "docs", "kind": "s3", "prefix": "runbooks"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    up = c.post(f"/v1/sources/{sid}/documents?name=restart.md", content=b"# Restart\n",
                headers={"content-type": "text/markdown"})
    assert up.status_code == 202, up.text
    assert up.json()["key"] == "runbooks/restart.md" and up.json()["status"] == "queued"
    assert c.get(f"/v1/jobs/{up.json()['job_id']}").json()["trigger"] == "upload"
    assert c.post(f"/v1/sources/{sid}/documents?name=../x.md", content=b"x").status_code == 422
    git_src = _register(api)
    assert c.post(f"/v1/sources/{git_src['id']}/documents?name=a.md", content=b"x").status_code == 400


def test_document_names_are_one_rule_and_every_accepted_name_is_indexed(api: dict[str, Any]) -> None:
    """Hostile review 3: ``a//b.md``, ``dir/``, ``.`` and ``a/./b.md`` gave 500s in the embedded profile (and
    ``.``/``a/./b.md`` in the distributed one, where ``dir/`` became a folder marker never indexed); now 422 in
    both. An accepted name holding ".tmp" (``release.tmpl.md``) was skipped by the embedded folder's listing
    and never indexed; it is searchable in both."""
    c = api["client"]
    r = c.post("/v1/sources", json={"agent_name": "prof", "context_id": "names", "kind": "s3", "prefix": "n"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for bad in ("a//b.md", "dir/", ".", "a/./b.md", "x.md.tmp123", "a" * 901):
        got = c.post(f"/v1/sources/{sid}/documents", params={"name": bad}, content=b"# x\n")
        assert got.status_code == 422, (bad, got.status_code, got.text)
    # hostile review: a file name over 255 bytes was a 500 (embedded: ENAMETOOLONG) or a 503 (S3), a key over
    # 1,024 UTF-8 bytes in under 900 characters a 503, and a long middle part left an empty folder behind
    for bad, says in (("a" * 300 + ".md", "255"), ("x/" + "b" * 256 + "/c.md", "255"), ("é" * 899, "1024"),
                      ("d/" + "/".join(["😀" * 60] * 5) + "/e.md", "1024")):
        got = c.post(f"/v1/sources/{sid}/documents", params={"name": bad}, content=b"# x\n")
        assert got.status_code == 422 and f"at most {says}" in got.text, (bad[:20], got.status_code, got.text)
    # hostile review 4: these were stored under another name (stripped, or U+FFFD for the byte that is not UTF-8)
    for raw in ("a.md%0A", "%20a.md", "a.md%20", "%FFa.md", "b%C3.md", "a%EF%BF%BD.md", "x/%C2%85nel.md"):  # C1 too
        got = c.post(f"/v1/sources/{sid}/documents?name={raw}", content=b"# x\n")
        assert got.status_code == 422, (raw, got.status_code, got.text)
    assert c.post(f"/v1/sources/{sid}/documents?name=%2Fslash.md", content=b"# s\n").json()["key"] == "n/slash.md"
    up = c.post(f"/v1/sources/{sid}/documents", params={"name": "release.tmpl.md"},
                content=b"# Release\nquorvane template notes\n", headers={"content-type": "text/markdown"})
    assert up.status_code == 202, up.text
    from scopekb.indexing import run_sync

    run_sync(api["rt"].sync_deps(), "names-" + uuid.uuid4().hex[:8], [sid], trigger="upload")  # no worker here
    key = c.post("/v1/keys", json={"agent_name": "prof", "context_ids": ["names"]}).json()["key"]
    hits = c.post("/v1/search", json={"query": "quorvane"}, headers={"Authorization": f"Bearer {key}"}).json()
    assert [h["path"] for h in hits.get("hits", [])] == ["release.tmpl.md"], hits


def test_a_source_removed_while_it_syncs_leaves_no_chunks(api: dict[str, Any]) -> None:
    """Hostile review 3: ``DELETE /v1/sources/{id}`` during the source's sync deleted the chunks written so far;
    the sync went on and left the rest (22,500 of 30,000 embedded) searchable with no source to remove. The sync
    now deletes what it wrote for a source removed meanwhile and says so (state partial)."""
    from scopekb import ops
    from scopekb.indexing import run_sync

    c, rt, repo = api["client"], api["rt"], api["repo"]
    for i in range(700):  # 4 write batches of 200 files: the removal comes after the first
        (repo / f"m{i}.py").write_text(f"def removed_marker_{i}():\n    return 'zelqorith'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "many")
    sid = _register(api)["id"]
    removed: list[int] = []

    def progress(stage: str, done: int, total: int) -> None:
        if stage == "index" and not removed:
            removed.append(ops.remove_source(rt, sid))

    job = run_sync(rt.sync_deps(), "rm-" + uuid.uuid4().hex[:8], [sid], trigger="cli", progress=progress)
    assert removed  # the removal happened mid-sync
    assert c.get(f"/v1/sources/{sid}").status_code == 404
    key = c.post("/v1/keys", json={"agent_name": "prof", "context_ids": None}).json()["key"]
    hits = c.post("/v1/search", json={"query": "zelqorith", "cross_context": True, "max_results": 5},
                  headers={"Authorization": f"Bearer {key}"}).json()
    assert hits["hits"] == [], [h["path"] for h in hits["hits"]]
    assert rt.chunks.delete_source(sid) == 0  # nothing of it left to delete
    assert job.state.value == "partial" and any("removed during this sync" in e for e in job.errors), job.errors


def test_document_names_one_folder_cannot_hold_are_409_in_the_embedded_profile(api: dict[str, Any]) -> None:
    """Hostile review 4: ``a.md`` then ``a.md/b.md`` (or ``d/x.md`` then ``d``) gave a 500 in the embedded
    profile's data folder, where documents are files; S3 holds both names side by side. Now the folder answers
    409 naming the clash and keeps what it holds; S3 accepts both (tests/unit/test_document_folder.py covers
    the folder without services)."""
    from scopekb.documents import FolderPrefix

    c = api["client"]
    r = c.post("/v1/sources", json={"agent_name": "prof", "context_id": "clash", "kind": "s3", "prefix": "k"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    # an embedded runtime given S3 settings (as in CI, where SCOPEKB_S3__* is set) keeps documents in S3
    folder = isinstance(api["rt"].documents(None, "k"), FolderPrefix)
    assert folder or api["profile"] == "distributed" or "s3" in api["rt"].settings.model_fields_set
    for first, second in (("a.md", "a.md/b.md"), ("d/x.md", "d"), ("e/f.md", "e/f.md/g.md")):
        assert c.post(f"/v1/sources/{sid}/documents", params={"name": first}, content=b"# one\n").status_code == 202
        got = c.post(f"/v1/sources/{sid}/documents", params={"name": second}, content=b"# two\n")
        if folder:
            assert got.status_code == 409, (second, got.status_code, got.text)
            assert "folder" in got.json()["detail"] and repr(second) in got.json()["detail"], got.text
        else:
            assert got.status_code == 202, (second, got.status_code, got.text)
    from scopekb.indexing import run_sync

    run_sync(api["rt"].sync_deps(), "clash-" + uuid.uuid4().hex[:8], [sid], trigger="upload")
    key = c.post("/v1/keys", json={"agent_name": "prof", "context_ids": ["clash"]}).json()["key"]
    hits = c.post("/v1/search", json={"query": "one", "max_results": 20},
                  headers={"Authorization": f"Bearer {key}"}).json()["hits"]
    assert {"a.md", "d/x.md", "e/f.md"} <= {h["path"] for h in hits}, hits  # nothing already stored was lost


def test_s3_down_is_503_for_uploads_and_reads_and_reported_by_readiness(
        tmp_path: Path, opensearch_url: str, redis_url: str, s3_config: dict[str, Any]) -> None:
    """Hostile review 4 (distributed profile, the one with S3): a document upload with S3 unreachable was a 500
    and ``/readyz`` did not look at S3. Now uploads and ``/v1/read`` answer 503 naming the store, and readiness
    reports ``s3`` without going unready (searches do not read S3, and keep answering)."""
    from scopekb.indexing import run_sync
    from scopekb_query.app import create_app

    run = f"s3down-{uuid.uuid4().hex[:8]}"
    services = {"opensearch_url": opensearch_url, "redis_url": redis_url, "s3_config": s3_config}
    repo = one_file_repo(tmp_path / "repo", "def s3down_marker():\n    return 1\n")
    up_app = create_app(_settings("distributed", tmp_path, services, run))
    dead = {**services, "s3_config": {**s3_config, "endpoint": "127.0.0.1:9"}}
    down_app = create_app(_settings("distributed", tmp_path, dead, run))
    try:
        with TestClient(up_app, raise_server_exceptions=False) as up, \
                TestClient(down_app, raise_server_exceptions=False) as down:
            for c in (up, down):
                c.headers["Authorization"] = f"Bearer {ADMIN}"
            src = up.post("/v1/sources", json={"agent_name": "s3d", "context_id": "c", "repo_url": str(repo),
                                               "ref": "main"}).json()
            docs = up.post("/v1/sources", json={"agent_name": "s3d", "context_id": "c", "kind": "s3",
                                                "prefix": "p"}).json()
            run_sync(up_app.state.runtime.sync_deps(), "s3d-" + uuid.uuid4().hex[:8], [src["id"]], trigger="cli")
            up_app.state.runtime.chunks.refresh()
            secret = up.post("/v1/keys", json={"agent_name": "s3d", "context_ids": ["c"]}).json()["key"]
            key = {"Authorization": f"Bearer {secret}"}

            r = down.get("/readyz")
            assert r.status_code == 200 and r.json()["ready"] is True, r.text
            assert r.json()["checks"]["s3"].startswith("error: ") and r.json()["checks"]["opensearch"] == "ok", r.text
            assert up.get("/readyz").json()["checks"]["s3"] == "ok"

            r = down.post(f"/v1/sources/{docs['id']}/documents", params={"name": "a.md"}, content=b"# a\n")
            assert r.status_code == 503 and r.json()["detail"].startswith("object store unavailable"), r.text
            r = down.post("/v1/search", json={"query": "s3down_marker"}, headers=key)
            assert r.status_code == 200, r.text
            hits = r.json()["hits"]
            assert [h["path"] for h in hits] == ["lib.py"], hits  # searches go on
            r = down.get("/v1/read", params={"path": "lib.py", "blob_sha": hits[0]["blob_sha"]}, headers=key)
            assert r.status_code == 503 and "unavailable" in r.json()["detail"], r.text
            assert up.get("/v1/read", params={"path": "lib.py", "blob_sha": hits[0]["blob_sha"]},
                          headers=key).status_code == 200
    finally:
        up_app.state.runtime.opensearch_client.indices.delete(index=f"{run}-*", ignore_unavailable=True)


def test_the_console_shows_bidi_and_control_characters_of_indexed_names_as_escapes(api: dict[str, Any],
                                                                                  tmp_path: Path) -> None:
    """Hostile review: a file named ``U+202E exe.txt.py`` showed in the console as ``2–1:yp.txt.exe`` (the override
    reversed the name and its line range); content, symbols and refs the same. Every value the templates print
    and every highlighted line show such characters as visible escapes; HTML escaping is unchanged."""
    import re as _re

    from scopekb.indexing import run_sync

    repo = one_file_repo(tmp_path / "bidi", "def bidimarker_fn():\n    return '\u202eevil\u2066 <b>x</b>'\n",
                         "\u202eexe.txt.py")
    c = api["client"]
    src = c.post("/v1/sources", json={"agent_name": "prof", "context_id": "bidi", "repo_url": str(repo),
                                      "ref": "main"}).json()
    job = run_sync(api["rt"].sync_deps(), "bidi-" + uuid.uuid4().hex[:8], [src["id"]], trigger="manual")
    assert job.state.value == "done", job.errors
    api["rt"].chunks.refresh()
    login = c.get("/console/login")
    token = _re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)
    assert c.post("/console/login", data={"token": ADMIN, "csrf": token}, follow_redirects=False).status_code == 303
    page = c.get("/console/search", params={"q": "bidimarker_fn", "agent": "prof", "context": "bidi",
                                            "mode": "keyword"})
    assert page.status_code == 200 and "bidimarker" in page.text, page.text[:500]
    for raw in ("\u202e", "\u2066"):
        assert raw not in page.text
    assert "\\u202eexe.txt.py" in page.text and "\\u202eevil\\u2066" in page.text
    assert "&lt;b&gt;x&lt;/b&gt;" in page.text and "<b>x</b>" not in page.text
    # hostile review (stop 43): a newline in a name showed as a space, the same as a real space
    nl = one_file_repo(tmp_path / "nl", "def nlmarker_fn():\n    return 1\n", "a\nb.py")
    src = c.post("/v1/sources", json={"agent_name": "prof", "context_id": "nl", "repo_url": str(nl),
                                      "ref": "main"}).json()
    assert run_sync(api["rt"].sync_deps(), "nl-" + uuid.uuid4().hex[:8], [src["id"]],
                    trigger="manual").state.value == "done"
    api["rt"].chunks.refresh()
    page = c.get("/console/search", params={"q": "nlmarker_fn", "agent": "prof", "context": "nl", "mode": "keyword"})
    assert page.status_code == 200 and "nlmarker" in page.text, page.text[:500]
    assert '<span class="path">a\\nb.py:' in page.text and 'aria-label="a\\nb.py lines' in page.text, page.text
    # newcomer review (stop 43): the console offered keyword, vector and hybrid only; exact, regex and symbol too,
    # with the matching lines flagged
    for mode, q in (("exact", "return 1"), ("regex", r"ret\w+ 1$"), ("symbol", "nlmarker_fn")):
        assert f'<option value="{mode}"' in page.text
        got = c.get("/console/search", params={"q": q, "agent": "prof", "context": "nl", "mode": mode})
        assert got.status_code == 200 and '<p role="status">1 hit for' in got.text, (mode, got.text[-3000:])
        assert f"({mode}," in got.text and '<span class="line match"><span class="ln" aria-hidden="true">' \
            f'{2 if mode != "symbol" else 1}</span>' in got.text, (mode, got.text[-3000:])


def test_the_same_repository_registered_twice_in_a_scope_is_409_naming_the_first(api: dict[str, Any]) -> None:
    """Hostile review (M2): the same repository registered again in one scope (the same path, with a trailing
    slash, as file://, through '..') was accepted each time, and every hit then came back once per copy. Now a
    409 names the source already registered; another context, another ref or other include globs still register."""
    c = api["client"]
    repo = Path(str(api["repo"]))
    body = {"agent_name": "dup", "context_id": "c", "repo_url": str(repo), "ref": "main", "webhooks": False}
    first = c.post("/v1/sources", json=body)
    assert first.status_code == 201, first.text
    for spelling in (str(repo), str(repo) + "/", f"{repo.parent}/../{repo.parent.name}/{repo.name}"):
        again = c.post("/v1/sources", json={**body, "repo_url": spelling})
        assert again.status_code == 409 and first.json()["id"] in again.text, (spelling, again.text)
    for other in ({"context_id": "d"}, {"include": ["*.py"]}, {"agent_name": "dup2"}):
        assert c.post("/v1/sources", json={**body, **other}).status_code == 201, other
    assert len([s for s in c.get("/v1/sources").json() if s["agent_name"] == "dup"]) == 3
