"""Answers an agent can use (issue 22b), on both profiles: one result per file, a token budget, each hit's reason,
and the MCP defaults — called through REST, the official ``mcp`` SDK client (streamable HTTP and ``scopekb mcp``
over stdio) and the MCP Inspector CLI (a client we did not write; ``scripts/install-mcp-inspector``).

The world: one agent with two contexts whose sources hold a file with several matching functions, and a stranger
agent holding the same marker. A bare ``search(query=...)`` must search both contexts of the agent's key and never
the stranger's, in the best mode the index supports (keyword here: no embedding model), one result per file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from fastapi.testclient import TestClient
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from scopekb.realrepo import git
from scopekb.settings import Settings
from tests.profiles import profile_settings

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "answers-admin-" + uuid.uuid4().hex
RUN = uuid.uuid4().hex[:6]
MARKER = f"upload_retry_{RUN}"
AGENT, STRANGER = "answers", "stranger"

#: A file with several functions that match, far enough apart to be separate chunks, plus a helper between them.
RETRY = "\n".join([
    '"""Retries."""', "", "",
    f"def first_{MARKER}(blob):", f'    """{MARKER}: the first attempt."""', "    return send(blob)", "", "",
    *[line for i in range(30) for line in (f"def filler_{i}(x):", f"    return x * {i} + helper_{i}(x)", "", "")],
    f"def second_{MARKER}(blob, tries=3):", f'    """{MARKER}: try again."""',
    *[f"    step_{i} = prepare(blob, {i})" for i in range(40)], "    return send(blob)", "", "",
    *[line for i in range(30, 60) for line in (f"def filler_{i}(x):", f"    return x * {i} + helper_{i}(x)", "", "")],
    f"def third_{MARKER}():", f"    return {MARKER}()", ""])


def _repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "one")
    return path


def _env_for(s: Settings, profile: str) -> dict[str, str]:
    """The environment that makes a child process (``scopekb mcp``) use the same stores as ``s``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}
    env.update({"SCOPEKB_PROFILE": profile, "SCOPEKB_EMBEDDING__PROVIDER": "none", "SCOPEKB_LOG_FORMAT": "json",
                "SCOPEKB_LOG_LEVEL": "WARNING"})
    if profile == "embedded":
        env["SCOPEKB_DATA_DIR"] = str(s.data_dir)
        return env
    env.update({"SCOPEKB_OPENSEARCH__URL": s.opensearch.url, "SCOPEKB_OPENSEARCH__ALIAS": s.opensearch.alias,
                "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": s.opensearch.system_prefix, "SCOPEKB_REDIS__URL": s.redis.url,
                "SCOPEKB_WORKER__QUEUE": s.worker.queue})
    for name in ("endpoint", "access_key", "secret_key", "secure", "bucket"):
        value = getattr(s.s3, name)
        value = value.get_secret_value() if hasattr(value, "get_secret_value") else value
        env[f"SCOPEKB_S3__{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


@pytest.fixture(scope="module", params=["embedded", "distributed"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The query app of one profile, served in-process (TestClient) and on a real port (uvicorn), with the
    sources synced and keys made."""
    import uvicorn

    from scopekb.indexing import run_sync
    from scopekb_query.app import create_app

    profile = request.param
    tmp = tmp_path_factory.mktemp(f"answers-{profile}")
    run = f"ans-{uuid.uuid4().hex[:8]}"
    services = {name: request.getfixturevalue(name) for name in ("opensearch_url", "redis_url", "s3_config")
                } if profile == "distributed" else {}
    s = profile_settings(profile, tmp, services, run, ADMIN)
    mine = _repo(tmp / "mine", {"pkg/retry.py": RETRY, "pkg/other.py": f"def use():\n    return {MARKER}()\n",
                                "docs/guide.md": f"# Guide\n\nCall `{MARKER}` when an upload fails.\n"})
    second = _repo(tmp / "second", {"notes/ctx2.md": f"# Second context\n\n{MARKER} lives here too.\n"})
    theirs = _repo(tmp / "theirs", {"secret.py": f"def stranger():\n    return {MARKER}\n"})
    app = create_app(s)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {ADMIN}"
            rt = app.state.runtime
            ids = []
            for agent, ctx, repo in ((AGENT, "c1", mine), (AGENT, "c2", second), (STRANGER, "c1", theirs)):
                r = client.post("/v1/sources", json={"agent_name": agent, "context_id": ctx, "repo_url": str(repo),
                                                     "ref": "main"})
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            for n, src_id in enumerate(ids):  # one sync per repository
                job = run_sync(rt.sync_deps(), f"{run}-sync{n}", [src_id], trigger="cli")
                assert job.state.value == "done", job
            rt.chunks.refresh()
            keys = {}
            for name, body in {"agent": {"agent_name": AGENT}, "stranger": {"agent_name": STRANGER}}.items():
                r = client.post("/v1/keys", json=body)
                assert r.status_code == 201, r.text
                keys[name] = r.json()["key"]
            thread.start()
            for _ in range(200):
                if server.started:
                    break
                time.sleep(0.05)
            assert server.started
            yield {"client": client, "rt": rt, "profile": profile, "keys": keys, "env": _env_for(s, profile),
                   "url": f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"}
    finally:
        server.should_exit = True
        if thread.is_alive():
            thread.join(20)
        if profile == "distributed":
            import redis

            app.state.runtime.opensearch_client.indices.delete(index=f"{run}-*", ignore_unavailable=True)
            redis.Redis.from_url(services["redis_url"]).delete(s.worker.queue)


def _search(world: dict[str, Any], key: str, body: dict[str, Any], fmt: str = "json") -> Any:
    r = world["client"].post(f"/v1/search?format={fmt}", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json() if fmt == "json" else r.text


# ------------------------------------------------------------------------------------------------------ REST


def test_grouped_results_show_each_file_once_with_its_other_ranges(world: dict[str, Any]) -> None:
    key = world["keys"]["agent"]
    body = {"query": MARKER, "context_id": "c1", "max_results": 10}
    chunks = _search(world, key, body)["hits"]
    assert [h["path"] for h in chunks].count("pkg/retry.py") >= 2, chunks  # per chunk: the file comes back twice
    grouped = _search(world, key, {**body, "group_by": "file"})
    paths = [h["path"] for h in grouped["hits"]]
    assert len(paths) == len(set(paths)) and set(paths) == {"pkg/retry.py", "pkg/other.py", "docs/guide.md"}
    assert grouped["group_by"] == "file"
    retry = next(h for h in grouped["hits"] if h["path"] == "pkg/retry.py")
    ranges = [(retry["start_line"], retry["end_line"])] + [(r["start_line"], r["end_line"])
                                                           for r in retry["other_ranges"]]
    lines = RETRY.split("\n")
    for name in ("first_", "second_", "third_"):  # every matching definition is the block or a listed range
        at = next(n for n, ln in enumerate(lines, 1) if ln.startswith(f"def {name}{MARKER}"))
        assert any(lo <= at <= hi for lo, hi in ranges), (name, at, ranges)
    assert retry["content"] == "\n".join(lines[retry["start_line"] - 1:retry["end_line"]])


def test_each_hit_says_why_it_was_chosen(world: dict[str, Any]) -> None:
    resp = _search(world, world["keys"]["agent"], {"query": f"def {MARKER} blob", "context_id": "c1"})
    assert resp["scope"] == {"agent_name": AGENT, "context_ids": ["c1"]} and resp["mode"] == "keyword"
    for rank, h in enumerate(resp["hits"], 1):
        why = h["why"]
        assert why["keyword_rank"] == rank and why["vector_rank"] is None and why["fusion"] == "keyword"
        assert why["matched"], h
    top = resp["hits"][0]["why"]["matched"]
    fields = {m["field"]: m["terms"] for m in top}
    assert any(MARKER in terms for terms in fields.values()), top
    text = _search(world, world["keys"]["agent"], {"query": MARKER, "context_id": "c1"}, fmt="text")
    assert re.search(r"^why: keyword #1 \(1\.00\); fusion keyword; matched .*" + MARKER, text, re.M), text


def test_exact_and_symbol_modes_group_by_file_and_say_why(world: dict[str, Any]) -> None:
    key = world["keys"]["agent"]
    exact = _search(world, key, {"query": MARKER, "mode": "exact", "context_id": "c1", "group_by": "file",
                                 "max_results": 10})
    paths = [h["path"] for h in exact["hits"]]
    assert sorted(paths) == ["docs/guide.md", "pkg/other.py", "pkg/retry.py"], paths
    for h in exact["hits"]:
        assert h["why"]["fusion"].startswith("exact") and h["why"]["matched"] == [{"field": "content",
                                                                                  "terms": [MARKER]}]
        assert h["match_lines"] and all(h["start_line"] <= n <= h["end_line"] for n in h["match_lines"])
    sym = _search(world, key, {"query": f"second_{MARKER}", "mode": "symbol", "context_id": "c1",
                               "group_by": "file"})
    assert [h["path"] for h in sym["hits"]] == ["pkg/retry.py"] and sym["hits"][0]["why"]["fusion"].startswith(
        "symbol: exact")
    text = _search(world, key, {"query": MARKER, "mode": "exact", "context_id": "c1", "group_by": "file"}, "text")
    assert f"why: exact: every listed line matches; matched content: {MARKER}" in text, text


@pytest.mark.parametrize("budget", [100, 180, 333, 700, 2000])
def test_text_answer_fits_the_budget_counted_with_the_model_tokenizer(world: dict[str, Any], budget: int) -> None:
    counter = world["rt"].counter
    text = _search(world, world["keys"]["agent"], {"query": MARKER, "cross_context": True, "group_by": "file",
                                                    "max_results": 10, "max_tokens": budget}, fmt="text")
    assert counter.count(text) <= budget, (counter.name, counter.count(text), text)
    # the summary line survives every budget, unless the first result's header and lines took its place (a budget
    # too small for both, hostile review 2 H8)
    assert re.match(r"4 files for '", text) or re.match(r"\[1\] ", text), text
    whole = _search(world, world["keys"]["agent"], {"query": MARKER, "cross_context": True, "group_by": "file",
                                                     "max_results": 10}, fmt="text")
    if counter.count(whole) > budget:
        assert "Budget:" in text or "cut at the token budget" in text, text


# ------------------------------------------------------------------------------------------------------ MCP


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


async def _http_calls(url: str, key: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[Any], list[Any]]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as hc:
        async with streamable_http_client(url, http_client=hc) as (rs, ws):
            async with ClientSession(rs, ws) as session:
                await session.initialize()
                tools = {t.name: t.input_schema for t in (await session.list_tools()).tools}
                return tools, [await session.call_tool(name, args) for name, args in calls]


async def _stdio_calls(env: dict[str, str], key: str, log: Path, calls: list[tuple[str, dict[str, Any]]]
                       ) -> tuple[list[Any], list[Any]]:
    params = StdioServerParameters(command=str(ROOT / ".venv/bin/scopekb") if (ROOT / ".venv/bin/scopekb").exists()
                                   else sys.executable, cwd=str(ROOT), env={**env, "SCOPEKB_MCP_KEY": key},
                                   args=["mcp"] if (ROOT / ".venv/bin/scopekb").exists()
                                   else ["-m", "scopekb_cli.main", "mcp"])
    with open(log, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (rs, ws):
            async with ClientSession(rs, ws, read_timeout_seconds=120) as session:
                await session.initialize()
                tools = {t.name: t.input_schema for t in (await session.list_tools()).tools}
                return tools, [await session.call_tool(name, args) for name, args in calls]


def _check_bare_search(world: dict[str, Any], text: str) -> None:
    """A bare search: both contexts of the agent, never the stranger's, keyword (no model), one per file."""
    first = text.split("\n", 1)[0]
    assert re.match(rf"\d+ files for '{MARKER}' \(mode keyword; agent '{AGENT}', every context the key may see; "
                    r"one result per file\)\.$", first), first
    heads = re.findall(r"^\[\d+\] (\S+?):\d+-\d+ \(score", text, re.M)
    assert "notes/ctx2.md" in heads and "pkg/retry.py" in heads, text  # contexts c1 and c2
    assert len(heads) == len(set(heads)), heads  # grouped: no file twice (paths are unique across contexts here)
    assert "stranger" not in text and "secret.py" not in text
    assert world["rt"].counter.count(text) <= world["rt"].settings.query.mcp_max_tokens
    assert "why: keyword #" in text


def _check_tools(tools: dict[str, dict[str, Any]]) -> None:
    """``tools``: name -> input schema, as listed by a client."""
    assert sorted(tools) == ["index", "read", "search", "status"]
    props = tools["search"]["properties"]
    assert tools["search"]["required"] == ["query"]
    assert props["group_by"]["default"] == "file" and props["max_tokens"]["default"] == 2000
    modes = json.dumps(props["mode"])
    assert all(m in modes for m in ("hybrid", "keyword", "vector", "exact", "regex", "symbol"))
    assert "best ranked mode" in props["mode"]["description"] and "grep -F" in props["mode"]["description"]
    assert "every context" in props["context_id"]["description"]


def test_mcp_sdk_client_over_http_bare_search_and_tools(world: dict[str, Any]) -> None:
    tools, (bare, one_ctx, chunked, small, bad) = anyio.run(_http_calls, world["url"], world["keys"]["agent"], [
        ("search", {"query": MARKER}),
        ("search", {"query": MARKER, "context_id": "c2"}),
        ("search", {"query": MARKER, "group_by": "chunk", "max_results": 10, "max_tokens": 100000}),
        ("search", {"query": MARKER, "max_tokens": 150}),
        ("search", {"query": MARKER, "max_tokens": 5}),
    ])
    _check_tools(tools)
    assert not bare.is_error, _text(bare)
    _check_bare_search(world, _text(bare))
    assert _text(one_ctx).startswith(f"1 file for '{MARKER}' (mode keyword; agent '{AGENT}', context 'c2'; ")
    heads = re.findall(r"^\[\d+\] (\S+?):", _text(chunked), re.M)
    assert heads.count("pkg/retry.py") >= 2, _text(chunked)  # group_by=chunk: a file may come back twice
    assert world["rt"].counter.count(_text(small)) <= 150 and "Budget: 150 tokens" in _text(small), _text(small)
    assert bad.is_error and "max_tokens" in _text(bad)
    _, (theirs,) = anyio.run(_http_calls, world["url"], world["keys"]["stranger"], [("search", {"query": MARKER})])
    assert "secret.py" in _text(theirs) and "pkg/retry.py" not in _text(theirs)


def test_mcp_sdk_client_over_stdio_bare_search(world: dict[str, Any], tmp_path: Path) -> None:
    tools, (bare, status) = anyio.run(_stdio_calls, world["env"], world["keys"]["agent"], tmp_path / "stdio.log",
                                      [("search", {"query": MARKER}), ("status", {})])
    _check_tools(tools)
    assert not bare.is_error, _text(bare)
    _check_bare_search(world, _text(bare))
    assert _text(status).startswith(f"2 source(s) for agent '{AGENT}'"), _text(status)


# ----------------------------------------------------------------------------------------- MCP Inspector CLI


@pytest.fixture(scope="session")
def inspector() -> str:
    """The MCP Inspector wrapper installed by scripts/install-mcp-inspector (CI runs it; so does scripts/test)."""
    r = subprocess.run([str(ROOT / "scripts/install-mcp-inspector"), "--path"], capture_output=True, text=True)
    if r.returncode != 0 or not shutil.which(r.stdout.strip()):
        pytest.fail(f"the MCP Inspector is not installed: run scripts/install-mcp-inspector ({r.stderr.strip()})",
                    pytrace=False)
    return r.stdout.strip()


def _inspect(inspector: str, target: list[str], *args: str) -> dict[str, Any]:
    r = subprocess.run([inspector, "--cli", *target, *args], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return json.loads(r.stdout)


def _inspector_targets(world: dict[str, Any], key: str) -> dict[str, list[str]]:
    stdio_env = [a for k, v in {**world["env"], "SCOPEKB_MCP_KEY": key}.items() if k.startswith("SCOPEKB_")
                 for a in ("-e", f"{k}={v}")]
    scopekb = ROOT / ".venv/bin/scopekb"
    return {"stdio": [*stdio_env, "--", str(scopekb), "mcp"],
            "http": [world["url"], "--transport", "http", "--header", f"Authorization: Bearer {key}"]}


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_mcp_inspector_cli_lists_tools_and_searches(world: dict[str, Any], inspector: str, transport: str) -> None:
    target = _inspector_targets(world, world["keys"]["agent"])[transport]
    listed = _inspect(inspector, target, "--method", "tools/list")
    _check_tools({t["name"]: t["inputSchema"] for t in listed["tools"]})
    called = _inspect(inspector, target, "--method", "tools/call", "--tool-name", "search",
                      "--tool-arg", f"query={MARKER}")
    assert not called.get("isError"), called
    _check_bare_search(world, "\n".join(c["text"] for c in called["content"] if c["type"] == "text"))
    narrowed = _inspect(inspector, target, "--method", "tools/call", "--tool-name", "search",
                        "--tool-arg", f"query={MARKER}", "context_id=c2", "max_tokens=120")
    text = "\n".join(c["text"] for c in narrowed["content"] if c["type"] == "text")
    assert text.startswith(f"1 file for '{MARKER}' (mode keyword; agent '{AGENT}', context 'c2'; "), text
    assert world["rt"].counter.count(text) <= 120
