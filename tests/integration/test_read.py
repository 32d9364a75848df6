"""``GET /v1/read``, the MCP ``read`` tool's body and ``scopekb read`` (issue 23) on both profiles: every search hit
names repo, ref, commit, blob_sha, path and lines, and ``read`` returns exactly those lines of that blob, byte for
byte as git holds them (CRLF, a lone CR, Latin-1, UTF-16 with BOM, no final newline); a blob the caller's scope
never indexed is 404 whether another agent indexed it or nobody did.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from scopekb.indexing import run_sync
from scopekb.reading import split_lines
from scopekb.realrepo import git
from tests.integration.test_api_profiles import api  # noqa: F401 - the two-profile app fixture
from tests.integration.test_cli_errors import CLI as CLI_ARGS

FILES: dict[str, bytes] = {
    "crlf.py": b"def readmarker_crlf():\r\n    return 1\r\n\r\nx = 2\r\n",
    "lone_cr.txt": b"readmarker_cr first\rsecond line\rthird\n",
    "latin1.txt": "readmarker_latin caf\u00e9 na\u00efve \u00e0 la carte\nzweite Zeile\n".encode("latin-1"),
    "utf16.txt": "\ufeffreadmarker_utf16 line one\r\nline two\r\n".encode("utf-16-le"),
    "nofinal.md": b"# readmarker_nofinal\n\nlast line without newline",
}


def _blob_lines(repo: Path, path: str) -> list[bytes]:
    data = subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{path}"], capture_output=True,
                          check=True).stdout
    return split_lines(data)


def _setup(api: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:  # noqa: F811
    c, rt, repo = api["client"], api["rt"], api["repo"]
    for name, data in FILES.items():
        (repo / name).write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "read")
    src = c.post("/v1/sources", json={"agent_name": "reader", "context_id": "c", "repo_url": str(repo),
                                      "ref": "main", "repo_name": "acme/read"}).json()
    other = c.post("/v1/sources", json={"agent_name": "intruder", "context_id": "c", "repo_url": str(repo),
                                        "ref": "main"}).json()
    for s in (src, other):
        run_sync(rt.sync_deps(), "read-" + uuid.uuid4().hex[:8], [s["id"]], trigger="cli")
    rt.chunks.refresh()
    mine = c.post("/v1/keys", json={"agent_name": "reader", "context_ids": ["c"]}).json()["key"]
    lone = c.post("/v1/keys", json={"agent_name": "loner", "context_ids": ["c"]}).json()["key"]
    return {"Authorization": f"Bearer {mine}"}, {"Authorization": f"Bearer {lone}"}


def _stored_key(rt: Any, agent: str, contexts: list[str]) -> Any:
    """A key stored as the admin API stores it (``ops.create_key``), so an MCP tool's check that the key is still
    live (``KeyLookup.live``) finds it."""
    from scopekb import ops
    from scopekb.models import KeyCreate

    return ops.create_key(rt, KeyCreate(agent_name=agent, context_ids=contexts))[0]


def test_every_hit_reads_back_byte_exact(api: dict[str, Any]) -> None:  # noqa: F811
    c, repo = api["client"], api["repo"]
    mine, _ = _setup(api)
    head = git(repo, "rev-parse", "HEAD").strip()
    seen = set()
    for query in ("readmarker_crlf", "readmarker_cr", "readmarker_latin", "readmarker_utf16", "readmarker_nofinal",
                  "profiles_marker_function", "line"):
        hits = c.post("/v1/search", json={"query": query, "max_results": 20}, headers=mine).json()["hits"]
        assert hits, query
        for h in hits:
            assert h["repo"] == "acme/read" and h["ref"] == "main" and h["commit"] == head
            assert len(h["blob_sha"]) == 40 and h["start_line"] >= 1 and h["end_line"] >= h["start_line"]
            assert h["blob_sha"] == git(repo, "rev-parse", f"HEAD:{h['path']}").strip()
            want = b"".join(_blob_lines(repo, h["path"])[h["start_line"] - 1:h["end_line"]])
            q = {"path": h["path"], "blob_sha": h["blob_sha"], "start_line": h["start_line"],
                 "end_line": h["end_line"]}
            r = c.get("/v1/read", params=q, headers=mine)
            assert r.status_code == 200, r.text
            body = r.json()
            got = body["content"].encode() if body["content"] is not None else base64.b64decode(body["content_base64"])
            assert got == want, h["path"]
            assert (body["repo"], body["ref"], body["commit"], body["path"]) == ("acme/read", "main", head, h["path"])
            raw = c.get("/v1/read", params={**q, "format": "raw"}, headers=mine)
            assert raw.status_code == 200 and raw.content == want
            assert raw.headers["content-type"] == "application/octet-stream"
            seen.add(h["path"])
    assert set(FILES) <= seen
    # The whole file by default; ``end_line`` past the end is the last line.
    sha = git(repo, "rev-parse", "HEAD:crlf.py").strip()
    whole = c.get("/v1/read", params={"path": "crlf.py", "blob_sha": sha, "format": "raw"}, headers=mine)
    assert whole.content == FILES["crlf.py"]
    tail = c.get("/v1/read", params={"path": "crlf.py", "blob_sha": sha, "start_line": 4, "end_line": 99},
                 headers=mine).json()
    assert (tail["content"], tail["start_line"], tail["end_line"], tail["total_lines"]) == ("x = 2\r\n", 4, 4, 4)
    # A final line end starts no line (hostile review: line 5 of this 4-line file read as 200 and empty).
    past = c.get("/v1/read", params={"path": "crlf.py", "blob_sha": sha, "start_line": 5}, headers=mine)
    assert past.status_code == 422 and "(4 lines)" in past.text, past.text
    # Latin-1 bytes are not UTF-8: they come back as base64 of the exact bytes.
    lat = git(repo, "rev-parse", "HEAD:latin1.txt").strip()
    body = c.get("/v1/read", params={"path": "latin1.txt", "blob_sha": lat, "end_line": 1}, headers=mine).json()
    assert body["content"] is None
    assert base64.b64decode(body["content_base64"]) == FILES["latin1.txt"].split(b"\n")[0] + b"\n"
    # ... and as the text the hit showed, decoded from the blob's encoding (hostile review: base64 only, and
    # UTF-16 lines as UTF-8 text full of NULs)
    assert body["text"] == "readmarker_latin caf\u00e9 na\u00efve \u00e0 la carte\n", body
    assert body["encoding"] not in ("utf-8", "utf-16-le")
    u16 = git(repo, "rev-parse", "HEAD:utf16.txt").strip()
    for start, want in ((1, "readmarker_utf16 line one\r\n"), (2, "line two\r\n")):
        body = c.get("/v1/read", params={"path": "utf16.txt", "blob_sha": u16, "start_line": start,
                                         "end_line": start}, headers=mine).json()
        assert body["content"] is None and body["encoding"] == "utf-16-le", body
        assert body["text"] == want and "\x00" not in body["text"], body
        assert base64.b64decode(body["content_base64"]) == _blob_lines(repo, "utf16.txt")[start - 1]
    utf8 = c.get("/v1/read", params={"path": "crlf.py", "blob_sha": sha, "end_line": 1}, headers=mine).json()
    assert utf8["text"] is None and utf8["encoding"] == "utf-8" and utf8["content"] is not None


def test_read_refuses_what_the_scope_never_indexed(api: dict[str, Any]) -> None:  # noqa: F811
    c, repo = api["client"], api["repo"]
    mine, lone = _setup(api)
    sha = git(repo, "rev-parse", "HEAD:crlf.py").strip()
    ok = {"path": "crlf.py", "blob_sha": sha}
    assert c.get("/v1/read", params=ok, headers=mine).status_code == 200
    # Another agent's blob (indexed for "reader" and "intruder", not "loner") and a blob nobody indexed: the same 404.
    missing = c.get("/v1/read", params={**ok, "blob_sha": "0" * 40}, headers=lone)
    foreign = c.get("/v1/read", params=ok, headers=lone)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json()
    # The right blob at another path, another repository name, or an unknown sha in the caller's own scope: 404.
    assert c.get("/v1/read", params={**ok, "path": "latin1.txt"}, headers=mine).status_code == 404
    assert c.get("/v1/read", params={**ok, "repo": "acme/other"}, headers=mine).status_code == 404
    assert c.get("/v1/read", params={**ok, "blob_sha": "f" * 40}, headers=mine).status_code == 404
    # Bad input: 422 with the reason, never 500, in one shape: {"detail": "<argument>: <reason>"} (hostile review
    # 2, H8: FastAPI's own checks answered a list, ours a string).
    for bad, word in (({"blob_sha": "xyz"}, "blob_sha"), ({"start_line": 0}, "start_line"),
                      ({"start_line": 3, "end_line": 2}, "end_line"), ({"start_line": 99}, "past the blob"),
                      ({"format": "xml"}, "format"), ({"start_line": "abc"}, "start_line"),
                      ({"end_line": "1.5"}, "end_line"), ({"cross_context": "maybe"}, "cross_context"),
                      ({"context_id": " padded"}, "context_id"), ({"context_id": ""}, "context_id")):
        r = c.get("/v1/read", params={**ok, **bad}, headers=mine)
        assert r.status_code == 422 and word in r.text, (bad, r.status_code, r.text)
        assert isinstance(r.json()["detail"], str), (bad, r.text)
    r = c.get("/v1/read", params={"path": "crlf.py"}, headers=mine)
    assert r.status_code == 422 and r.json()["detail"] == "blob_sha: Field required", r.text
    inverted = c.get("/v1/read", params={**ok, "start_line": 3, "end_line": 2}, headers=mine).json()["detail"]
    assert inverted == "end_line must not be before start_line", inverted  # F9: no empty field name
    assert c.get("/v1/read", params={**ok, "context_id": "other"}, headers=mine).status_code == 403
    assert c.get("/v1/read", params=ok).status_code == 403  # the admin token reads nothing
    assert c.get("/v1/read", params=ok, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_mcp_read_tool_fences_the_exact_lines(api: dict[str, Any]) -> None:  # noqa: F811
    import anyio
    from mcp.server.mcpserver.exceptions import ToolError

    from scopekb_query.mcp_server import build_mcp_server

    c, rt, repo = api["client"], api["rt"], api["repo"]
    _setup(api)
    key = _stored_key(rt, "reader", ["c"])
    server = build_mcp_server(rt, lambda _ctx: key)
    sha = git(repo, "rev-parse", "HEAD:nofinal.md").strip()

    async def call(args: dict[str, Any], tool: str = "read") -> str:
        res = await server.call_tool(tool, args)
        return "".join(getattr(b, "text", "") for b in getattr(res, "content", []))

    text = anyio.run(call, {"path": "nofinal.md", "blob_sha": sha, "start_line": 3})
    lines = text.split("\n")
    assert lines[0].startswith("nofinal.md:3-3 of 3 lines, blob " + sha[:12])
    assert lines[1].startswith("<<<chunk-") and lines[-1].startswith("chunk-") and lines[-1].endswith(">>>")
    assert lines[2:-1] == ["last line without newline"]
    assert f"blob {sha}" in anyio.run(call, {"query": "readmarker_nofinal"}, "search")
    # a UTF-16 file: the decoded lines in the fence (hostile review: base64, or UTF-8 text full of NULs)
    u16 = git(repo, "rev-parse", "HEAD:utf16.txt").strip()
    text = anyio.run(call, {"path": "utf16.txt", "blob_sha": u16, "start_line": 2})
    assert "decoded from utf-16-le" in text.split("\n")[0] and "line two" in text and "\x00" not in text, text
    try:
        anyio.run(call, {"path": "nofinal.md", "blob_sha": "0" * 40})
        raise AssertionError("an unknown blob must be a tool error")
    except ToolError as e:
        assert "not found" in str(e)
    # Arguments the tool's signature refuses (hostile review F7): one line naming the field, like REST.
    for tool, args, word in (("read", {"path": "nofinal.md", "blob_sha": sha, "start_line": -1}, "start_line"),
                             ("read", {"path": "nofinal.md", "blob_sha": sha, "start_line": 3, "end_line": 2},
                              "end_line must not be before start_line"),
                             ("search", {"query": "x", "metadata": {"a": {"b": [1]}}}, "metadata"),
                             ("search", {"query": "x", "min_score": float("nan")}, "finite number")):
        try:
            anyio.run(call, args, tool)
            raise AssertionError(f"{args} must be a tool error")
        except ToolError as e:
            msg = str(e)
            assert "invalid arguments: " in msg and word in msg, msg
            assert "\n" not in msg and "pydantic.dev" not in msg and "Value error" not in msg, msg
    assert c.get("/healthz").status_code == 200


def test_cli_read_writes_the_exact_bytes(tmp_path: Path) -> None:
    from tests.integration.test_cli_errors import assert_one_line_error, base_env, run

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "crlf.py").write_bytes(FILES["crlf.py"])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    env = base_env(tmp_path)
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    found = run(["search", "readmarker_crlf", "--json"], env, tmp_path)
    hit = json.loads(found.stdout)["hits"][0]
    sha = git(repo, "rev-parse", "HEAD:crlf.py").strip()
    assert hit["blob_sha"] == sha
    out = subprocess.run([*CLI_ARGS, "read", "crlf.py", sha, "--start", "1", "--end", "2"], env=env, cwd=tmp_path,
                         capture_output=True, timeout=120)
    assert out.returncode == 0 and out.stdout == b"def readmarker_crlf():\r\n    return 1\r\n", out.stderr
    assert_one_line_error(run(["read", "crlf.py", "0" * 40], env, tmp_path), "not found")
    assert_one_line_error(run(["read", "crlf.py", "zz"], env, tmp_path), "blob_sha")
    inverted = run(["read", "crlf.py", sha, "--start", "2", "--end", "1"], env, tmp_path)
    assert_one_line_error(inverted, "--end must not be before --start")  # the CLI names its options (9ab72fe)
    assert "invalid :" not in inverted.stderr and "Value error" not in inverted.stderr, inverted.stderr
    # a tree, blob or annotated tag id given as ref: the message REST gives, in one line (hostile review 6)
    git(repo, "tag", "-a", "-m", "annotated", "v1")
    head = git(repo, "rev-parse", "HEAD").strip()
    for obj, said in (("HEAD^{tree}", "is a tree id, not a commit"), ("HEAD:crlf.py", "is a blob id, not a commit"),
                      ("v1", f"is an annotated tag id, not a commit: give the tag's name or the commit it tags "
                             f"({head}) as ref")):
        oid = git(repo, "rev-parse", obj).strip()
        if obj == "v1":  # the mirror holds the tag once a sync has fetched it
            assert run(["index", str(repo)], env, tmp_path).returncode == 0
        assert_one_line_error(run(["read", "crlf.py", sha, "--ref", oid], env, tmp_path), f"{oid} {said}")
        assert_one_line_error(run(["search", "readmarker_crlf", "--ref", oid], env, tmp_path), f"{oid} {said}")


def test_search_ref_is_a_name_or_an_indexed_head_else_404(api: dict[str, Any]) -> None:  # noqa: F811
    c, repo = api["client"], api["repo"]
    mine, _ = _setup(api)
    head = git(repo, "rev-parse", "HEAD").strip()
    for ref in ("main", "refs/heads/main", head, head[:10]):
        r = c.post("/v1/search", json={"query": "readmarker_crlf", "ref": ref}, headers=mine)
        assert r.status_code == 200, (ref, r.text)
        assert [(h["path"], h["ref"], h["commit"]) for h in r.json()["hits"]] == [("crlf.py", "main", head)]
    parent = git(repo, "rev-parse", "HEAD~1").strip()  # a commit of the repository that no ref has indexed
    for ref, why in (("dev", "not indexed"), (parent[:10], "full commit id"), ("f" * 40, "not in the repository")):
        r = c.post("/v1/search", json={"query": "readmarker_crlf", "ref": ref}, headers=mine)
        assert r.status_code == 404 and why in r.json()["detail"], (ref, r.status_code, r.text)
    # the head of this repository asked of another repository name: 404
    r = c.post("/v1/search", json={"query": "readmarker_crlf", "ref": head, "repo": "acme/other"}, headers=mine)
    assert r.status_code == 404
    # A source of the same repository that tracks nothing indexed, registered first (hostile review F4): a pin
    # never goes to it while a source with an indexed ref holds the commit (sources list newest first).
    empty = c.post("/v1/sources", json={"agent_name": "reader", "context_id": "c", "repo_url": str(repo),
                                        "refs": ["nothing-here/*"], "repo_name": "acme/read"}).json()
    run_sync(api["rt"].sync_deps(), "empty-" + uuid.uuid4().hex[:6], [empty["id"]], trigger="cli")
    api["rt"].records.put("sources", empty["id"], {**api["rt"].records.get("sources", empty["id"]),
                                                   "created_at": "2999-01-01T00:00:00+00:00"})  # newest: listed first
    assert api["rt"].records.list_sources(agent_name="reader")[0].id == empty["id"]
    # any other commit is pinned on demand: 202 with the job, then searchable at that commit until its TTL
    pin = c.post("/v1/search", json={"query": "profiles_marker_function", "ref": parent}, headers=mine)
    assert pin.status_code == 202 and pin.json()["status"] == "pinning" and pin.json()["ref"] == parent, pin.text
    assert pin.json()["source_id"] != empty["id"], pin.json()
    again = c.post("/v1/search", json={"query": "profiles_marker_function", "ref": parent}, headers=mine)
    assert again.status_code == 202 and again.json()["job_id"] == pin.json()["job_id"]
    src_id = pin.json()["source_id"]
    job = run_sync(api["rt"].sync_deps(), pin.json()["job_id"], [src_id], trigger="pin")
    assert job.state.value == "done" and job.ref_commits[parent] == parent and job.chunks_written == 0, job
    api["rt"].chunks.refresh()
    r = c.post("/v1/search", json={"query": "profiles_marker_function readmarker_crlf", "ref": parent},
               headers=mine)
    assert r.status_code == 200, r.text
    assert [(h["path"], h["ref"], h["commit"]) for h in r.json()["hits"]] == [("lib.py", parent, parent)]
    # read of a blob that the tracked ref holds too names that ref and its commit, not the pin (review F4)
    blob = git(repo, "rev-parse", "HEAD:lib.py").strip()
    read = c.get("/v1/read", params={"path": "lib.py", "blob_sha": blob}, headers=mine)
    assert read.status_code == 200 and (read.json()["ref"], read.json()["commit"]) == ("main", head), read.text
    other = c.post("/v1/search", json={"query": "x", "ref": git(repo, "rev-parse", "HEAD~1^{tree}").strip()},
                   headers=mine)
    assert other.status_code == 404  # a tree id is no commit of the repository
    git(repo, "checkout", "-q", "-b", "side")  # a third commit, fetched by the next sync
    (repo / "side.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "side")
    side = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    git(repo, "tag", "-a", "-m", "annotated", "v0-annotated", parent)
    tag = git(repo, "rev-parse", "v0-annotated").strip()
    git(repo, "tag", "-a", "-m", "annotated", "v1-on-head", head)
    head_tag = git(repo, "rev-parse", "v1-on-head").strip()
    assert tag != parent
    # a commit pushed since the last sync (hostile review L1): 404 saying a sync of the source fetches it
    late = c.post("/v1/search", json={"query": "x", "ref": side}, headers=mine)
    assert late.status_code == 404 and "sync of its source" in late.json()["detail"], late.text
    run_sync(api["rt"].sync_deps(), "side-" + uuid.uuid4().hex[:6], [src_id], trigger="cli")
    # an annotated tag object's id (hostile review L2) names the commit it tags: here the pin of `parent`, done
    # above, so it answers at once (hostile review 5: it answered 202 with the finished pin's job, for ever)
    by_tag = c.post("/v1/search", json={"query": "profiles_marker_function", "ref": tag}, headers=mine)
    assert by_tag.status_code == 200 and {h["commit"] for h in by_tag.json()["hits"]} == {parent}, by_tag.text
    # and a tag object whose commit is main's indexed head answers at once too (it made a pin of that commit)
    for _ in range(2):
        on_head = c.post("/v1/search", json={"query": "profiles_marker_function", "ref": head_tag}, headers=mine)
        assert on_head.status_code == 200, on_head.text
        assert {h["commit"] for h in on_head.json()["hits"]} == {head}, on_head.text
    r = c.post("/v1/search", json={"query": "profiles_marker_function", "ref": parent}, headers=mine)
    assert r.status_code == 200 and {h["commit"] for h in r.json()["hits"]} == {parent}, r.text
    for obj, kind in ((f"{parent}^{{tree}}", "tree"), (f"{parent}:lib.py", "blob")):  # a tree or blob id: 404
        r = c.post("/v1/search", json={"query": "x", "ref": git(repo, "rev-parse", obj).strip()}, headers=mine)
        assert r.status_code == 404, (obj, r.text)
        assert f"is a {kind} id, not a commit" in r.json()["detail"], r.text  # not "a sync fetches it"
    # read with a tree, blob or annotated tag id as ref says which it is, on REST and MCP alike (hostile review 6)
    import anyio

    from scopekb_query.mcp_server import build_mcp_server

    reader = _stored_key(api["rt"], "reader", ["c"])
    server = build_mcp_server(api["rt"], lambda _ctx: reader)
    lib_blob = git(repo, "rev-parse", "HEAD:lib.py").strip()
    for obj, said in ((f"{parent}^{{tree}}", "is a tree id, not a commit"),
                      (f"{parent}:lib.py", "is a blob id, not a commit"),
                      ("v1-on-head", f"is an annotated tag id, not a commit: give the tag's name or the commit it "
                                     f"tags ({head}) as ref")):
        oid = git(repo, "rev-parse", obj).strip()
        r = c.get("/v1/read", params={"path": "lib.py", "blob_sha": lib_blob, "ref": oid}, headers=mine)
        assert r.status_code == 404 and r.json()["detail"].startswith(f"{oid} {said}"), r.text

        async def call(ref: str) -> str:
            res = await server.call_tool("read", {"path": "lib.py", "blob_sha": lib_blob, "ref": ref})
            return "".join(getattr(b, "text", "") for b in getattr(res, "content", []))

        try:
            text = anyio.run(call, oid)
        except Exception as e:  # noqa: BLE001 - the SDK raises a ToolError for a refused call
            text = str(e)
        assert said in text and "\n" not in text, text
    api["rt"].settings.git.max_pins_per_source = 1
    limited = c.post("/v1/search", json={"query": "x", "ref": side}, headers=mine)
    assert limited.status_code == 429 and "git.max_pins_per_source=1" in limited.json()["detail"], limited.text
    from scopekb import ops
    from scopekb.refs import put_ref_state, ref_states

    src = api["rt"].records.get_source(src_id)
    st = ref_states(api["rt"].records, src)[parent]  # the pin's TTL runs out: gc drops it and its chunks
    put_ref_state(api["rt"].records, src, parent, {**st, "expires_at": "2000-01-01T00:00:00+00:00"})
    assert ops.gc_pins(api["rt"])["pins"] == 1
    assert parent not in ref_states(api["rt"].records, src)
    r = c.post("/v1/search", json={"query": "profiles_marker_function", "ref": parent}, headers=mine)
    assert r.status_code == 202  # pinned again on demand
    # A pinned commit's own chunks (side.py exists only at `side`) are searched with that ref, never without one.
    api["rt"].settings.git.max_pins_per_source = 8
    pin = c.post("/v1/search", json={"query": "x", "ref": side}, headers=mine)
    assert pin.status_code == 202 and pin.json()["source_id"] == src_id, pin.text
    run_sync(api["rt"].sync_deps(), pin.json()["job_id"], [src_id], trigger="pin")
    api["rt"].chunks.refresh()

    def side_hits(**kw: Any) -> list[str]:
        r = c.post("/v1/search", json={"query": "x = 1", "mode": "exact", **kw}, headers=mine)
        assert r.status_code == 200, r.text
        return sorted(h["path"] for h in r.json()["hits"])

    assert side_hits(ref=side) == ["side.py"]
    assert "side.py" not in side_hits() and "side.py" not in side_hits(cross_context=True)


def test_a_source_with_many_refs_over_the_api(api: dict[str, Any]) -> None:  # noqa: F811
    """Issue 23 through REST on both profiles: refs patterns, search by branch, tag and head commit, status per
    ref, a deleted branch leaving only its membership."""
    c, rt, repo = api["client"], api["rt"], api["repo"]
    main = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "tag", "v1.0")
    git(repo, "checkout", "-q", "-b", "feature/x")
    (repo / "feature.py").write_text("def multiref_feature_only():\n    return 'x'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "feature")
    feature = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    r = c.post("/v1/sources", json={"agent_name": "multi", "context_id": "c", "repo_url": str(repo), "ref": "main",
                                    "refs": ["main", "feature/*", "v*"]})
    assert r.status_code == 201, r.text
    src = r.json()
    assert src["refs"] == ["main", "feature/*", "v*"]
    for bad in (["a b"], ["-x"], ["@{-1}"], ["HEAD"], ["main", "--upload-pack=x"]):  # hostile review F5
        r = c.post("/v1/sources", json={"agent_name": "multi", "context_id": "c", "repo_url": str(repo),
                                        "refs": bad})
        assert r.status_code == 422 and "refs must be branch or tag names" in r.text, (bad, r.text)
    job = run_sync(rt.sync_deps(), "mr-" + uuid.uuid4().hex[:8], [src["id"]], trigger="cli")
    assert job.ref_commits == {"feature/x": feature, "main": main, "v1.0": main}
    rt.chunks.refresh()
    key = {"Authorization": "Bearer " + c.post("/v1/keys", json={"agent_name": "multi"}).json()["key"]}

    def paths(ref: str | None, query: str = "profiles_marker_function multiref_feature_only") -> list[tuple[str, ...]]:
        body = {"query": query, "max_results": 10, "context_id": "c", **({"ref": ref} if ref else {})}
        r = c.post("/v1/search", json=body, headers=key)
        assert r.status_code == 200, r.text
        return sorted((h["path"], h["ref"], h["commit"]) for h in r.json()["hits"])

    assert paths("feature/x") == [("feature.py", "feature/x", feature), ("lib.py", "feature/x", feature)]
    assert paths("main") == [("lib.py", "main", main)]
    assert paths("v1.0") == [("lib.py", "v1.0", main)]
    assert paths(feature[:12]) == paths("feature/x")
    # main's head is also v1.0's: the commit a hit names resolves to the default ref (hostile review: 409)
    assert paths(main) == paths(main[:9]) == [("lib.py", "main", main)]
    assert len(paths(None)) == 2  # one document for lib.py, shared by the three refs
    one = c.get(f"/v1/sources/{src['id']}").json()
    assert [(x["ref"], x["commit"]) for x in one["refs"]] == [("feature/x", feature), ("main", main), ("v1.0", main)]
    git(repo, "branch", "-q", "-D", "feature/x")
    run_sync(rt.sync_deps(), "mr-" + uuid.uuid4().hex[:8], [src["id"]], trigger="cli")
    rt.chunks.refresh()
    assert c.post("/v1/search", json={"query": "x", "ref": "feature/x", "context_id": "c"},
                  headers=key).status_code == 404
    assert paths(None) == [("lib.py", "main", main)]
    assert paths("v1.0") == [("lib.py", "v1.0", main)]


def test_read_names_the_ref_and_commit_search_names(api: dict[str, Any]) -> None:  # noqa: F811
    """Hostile review M1 on both profiles: ``read`` (REST and MCP) names the ref and commit a search hit names
    (:func:`scopekb.search.name_ref`), not the ref stored on the chunk, which can be a deleted branch: release/3
    made from release/2, release/2 deleted, r2.txt read without ref names release/3 at its commit; with ``ref``,
    that ref, and 404 for a ref that does not hold the blob or is not indexed."""
    import anyio

    from scopekb_query.mcp_server import build_mcp_server

    c, rt, repo = api["client"], api["rt"], api["repo"]
    main = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "-b", "release/2")
    (repo / "r2.txt").write_text("release_two_marker line\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "r2")
    git(repo, "checkout", "-q", "main")
    src = c.post("/v1/sources", json={"agent_name": "rel", "context_id": "c", "repo_url": str(repo), "ref": "main",
                                      "refs": ["main", "release/*"]}).json()
    run_sync(rt.sync_deps(), "rel-" + uuid.uuid4().hex[:8], [src["id"]], trigger="cli")
    git(repo, "branch", "-q", "release/3", "release/2")
    git(repo, "branch", "-q", "-D", "release/2")
    git(repo, "checkout", "-q", "release/3")
    (repo / "r3.txt").write_text("only in three\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "r3")
    r3 = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    job = run_sync(rt.sync_deps(), "rel-" + uuid.uuid4().hex[:8], [src["id"]], trigger="cli")
    assert job.ref_commits == {"main": main, "release/3": r3}, job
    rt.chunks.refresh()
    made = c.post("/v1/keys", json={"agent_name": "rel", "context_ids": ["c"]}).json()
    key = {"Authorization": "Bearer " + made["key"]}
    hits = c.post("/v1/search", json={"query": "release_two_marker"}, headers=key).json()["hits"]
    assert [(h["path"], h["ref"], h["commit"]) for h in hits] == [("r2.txt", "release/3", r3)], hits
    blob = hits[0]["blob_sha"]
    q = {"path": "r2.txt", "blob_sha": blob}
    r = c.get("/v1/read", params=q, headers=key)
    assert r.status_code == 200 and (r.json()["ref"], r.json()["commit"]) == ("release/3", r3), r.text
    assert c.post("/v1/search", json={"query": "x", "ref": r.json()["ref"]}, headers=key).status_code == 200
    r = c.get("/v1/read", params={**q, "ref": "release/3"}, headers=key)
    assert r.status_code == 200 and (r.json()["ref"], r.json()["commit"]) == ("release/3", r3), r.text
    r = c.get("/v1/read", params={**q, "ref": r3[:12]}, headers=key)  # an indexed head commit means its ref
    assert r.status_code == 200 and r.json()["ref"] == "release/3", r.text
    lib = git(repo, "rev-parse", "main:lib.py").strip()  # in both refs: the default ref, unless one is asked
    r = c.get("/v1/read", params={"path": "lib.py", "blob_sha": lib}, headers=key)
    assert (r.json()["ref"], r.json()["commit"]) == ("main", main), r.text
    r = c.get("/v1/read", params={"path": "lib.py", "blob_sha": lib, "ref": "release/3"}, headers=key)
    assert (r.json()["ref"], r.json()["commit"]) == ("release/3", r3), r.text
    for ref in ("main", "release/2"):  # main does not hold r2.txt; release/2 is gone
        r = c.get("/v1/read", params={**q, "ref": ref}, headers=key)
        assert r.status_code == 404, (ref, r.text)
    rel = _stored_key(rt, "rel", ["c"])
    server = build_mcp_server(rt, lambda _ctx: rel)

    async def call(args: dict[str, Any]) -> str:
        res = await server.call_tool("read", args)
        return "".join(getattr(b, "text", "") for b in getattr(res, "content", []))

    head = anyio.run(call, q).split("\n")[0]
    assert f"@release/3 commit {r3[:12]}" in head, head
    head = anyio.run(call, {"path": "lib.py", "blob_sha": lib, "ref": "release/3"}).split("\n")[0]
    assert f"@release/3 commit {r3[:12]}" in head, head
