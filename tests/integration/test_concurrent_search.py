"""Many searches at once through a real HTTP server answer exactly as one at a time (issue 20), on the embedded
profile (SQLite, one connection per thread) and the distributed one (real OpenSearch): 96 keyword searches, 32 in
flight, each on its own connection, all 200 with the hits and scores of the same query sent alone.

In the distributed profile the OpenSearch client keeps a connection for each worker thread (``http.worker_threads``):
before, opensearch-py's pool kept one, and urllib3 closed the connection of every concurrent request past the first
after its answer, logging "Connection pool is full, discarding connection".
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from scopekb.realrepo import git
from tests.profiles import profile_settings

ADMIN = "concurrent-admin-" + uuid.uuid4().hex
FILES = 12
IN_FLIGHT = 32
REQUESTS = 96


class _Discards(logging.Handler):
    """Counts urllib3's "pool is full" warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Connection pool is full" in record.getMessage():
            self.count += 1


@pytest.fixture(params=["embedded", "distributed"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The query app of one profile behind uvicorn on a free port, with FILES indexed files and an agent key."""
    from scopekb.indexing import run_sync
    from scopekb_query.app import create_app

    profile = request.param
    run = f"conc-{uuid.uuid4().hex[:8]}"
    services = {name: request.getfixturevalue(name) for name in ("opensearch_url", "redis_url", "s3_config")
                } if profile == "distributed" else {}
    s = profile_settings(profile, tmp_path, services, run, ADMIN, http={"worker_threads": 40})
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for i in range(FILES):
        (repo / f"mod{i}.py").write_text(
            f"def concurrent_marker_{i}(value):\n    '''shared words {'alpha ' * (i + 1)}'''\n"
            f"    return value + {i}\n\n\ndef helper_{i}():\n    return concurrent_marker_{i}({i})\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    app = create_app(s)
    rt = app.state.runtime
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert t.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    discards = _Discards()
    logging.getLogger("urllib3.connectionpool").addHandler(discards)
    try:
        src = httpx.post(url + "/v1/sources", headers=admin, json={
            "agent_name": "conc", "context_id": "c", "repo_url": str(repo), "ref": "main"}).json()
        run_sync(rt.sync_deps(), run, [src["id"]], trigger="cli")
        rt.chunks.refresh()
        key = httpx.post(url + "/v1/keys", headers=admin, json={"agent_name": "conc", "context_ids": ["c"]}
                         ).json()["key"]
        yield {"url": url, "key": key, "rt": rt, "profile": profile, "discards": discards, "settings": s}
    finally:
        logging.getLogger("urllib3.connectionpool").removeHandler(discards)
        server.should_exit = True
        t.join(30)
        if profile == "distributed":
            rt.opensearch_client.indices.delete(index=f"{run}-*", ignore_unavailable=True)


def _answer(r: httpx.Response) -> list[tuple[str, float]]:
    assert r.status_code == 200, r.text
    return [(h["path"], h["score"]) for h in r.json()["hits"]]


def test_concurrent_searches_answer_as_sequential_ones(served: dict[str, Any]) -> None:
    queries = [f"concurrent_marker_{i}" for i in range(FILES)] + ["shared words alpha", "helper value"]
    headers = {"Authorization": f"Bearer {served['key']}"}

    def body(q: str) -> dict[str, Any]:
        return {"query": q, "context_id": "c", "max_results": 5, "mode": "keyword"}

    with httpx.Client(base_url=served["url"], headers=headers) as c:
        alone = {q: _answer(c.post("/v1/search", json=body(q))) for q in queries}
    assert all(alone[f"concurrent_marker_{i}"][0][0] == f"mod{i}.py" for i in range(FILES))
    assert len(alone["shared words alpha"]) == 5
    served["discards"].count = 0

    async def main() -> list[tuple[str, httpx.Response]]:
        clients = [httpx.AsyncClient(base_url=served["url"], headers=headers, timeout=120,
                                     limits=httpx.Limits(max_connections=1)) for _ in range(IN_FLIGHT)]
        todo = list(range(REQUESTS))
        out: list[tuple[str, httpx.Response]] = []

        async def worker(cl: httpx.AsyncClient) -> None:
            while todo:
                q = queries[todo.pop() % len(queries)]
                out.append((q, await cl.post("/v1/search", json=body(q))))

        try:
            await asyncio.gather(*(worker(cl) for cl in clients))
        finally:
            for cl in clients:
                await cl.aclose()
        return out

    answers = asyncio.run(main())
    assert len(answers) == REQUESTS
    for q, r in answers:
        assert _answer(r) == alone[q], q
    if served["profile"] == "distributed":
        conns = served["rt"].opensearch_client.transport.connection_pool.connections
        pools = [conn.pool.pool.maxsize for conn in conns]
        assert pools == [served["settings"].http.worker_threads]
        assert served["discards"].count == 0  # every worker thread kept its OpenSearch connection


def test_searches_past_the_limit_wait_on_the_event_loop(served: dict[str, Any]) -> None:
    """Issue 20: 32 searches in flight run in at most ``rt.search_limiter.total`` threads at once (embedded: 4 per
    CPU, its searches being CPU work under the GIL; distributed: ``http.worker_threads``), every answer still that of
    the query alone. Each store search is held for 100 ms so the overlap can be seen."""
    from scopekb.searchlimit import EMBEDDED_SEARCH_THREADS_PER_CPU, _cpus

    rt = served["rt"]
    total = rt.search_limiter.total
    if served["profile"] == "embedded":
        assert total == min(served["settings"].http.worker_threads, EMBEDDED_SEARCH_THREADS_PER_CPU * _cpus())
    else:
        assert total == served["settings"].http.worker_threads
    headers = {"Authorization": f"Bearer {served['key']}"}
    body = {"query": "shared words alpha", "context_id": "c", "max_results": 5, "mode": "keyword"}
    with httpx.Client(base_url=served["url"], headers=headers) as c:
        alone = _answer(c.post("/v1/search", json=body))
    real = rt.chunks.keyword_search
    running = most = 0
    guard = threading.Lock()

    def held(*a: Any, **kw: Any) -> Any:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        try:
            time.sleep(0.1)
            return real(*a, **kw)
        finally:
            with guard:
                running -= 1

    async def main() -> list[httpx.Response]:
        clients = [httpx.AsyncClient(base_url=served["url"], headers=headers, timeout=120,
                                     limits=httpx.Limits(max_connections=1)) for _ in range(IN_FLIGHT)]
        try:
            return list(await asyncio.gather(*(cl.post("/v1/search", json=body) for cl in clients)))
        finally:
            for cl in clients:
                await cl.aclose()

    rt.chunks.keyword_search = held
    try:
        answers = asyncio.run(main())
    finally:
        del rt.chunks.keyword_search
    assert [_answer(r) for r in answers] == [alone] * IN_FLIGHT
    assert most <= total
    if served["profile"] == "embedded":
        assert most == total  # the searches did overlap up to the limit
    else:  # not held to the embedded bound: a distributed search mostly waits for OpenSearch
        assert most > EMBEDDED_SEARCH_THREADS_PER_CPU * _cpus()


def test_a_key_revoked_while_its_search_waits_for_a_thread_is_refused(served: dict[str, Any]) -> None:
    """Hostile review (issue 20): a search that had passed its key check and then waited for a search thread was
    answered after its key was revoked. With one search thread held busy, a REST search and an MCP search of a
    second key wait; the key is revoked; once the thread is free each is refused (401, and the MCP tool's error),
    while the first key's held search is answered."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from scopekb.searchlimit import SearchLimiter

    rt = served["rt"]
    admin = {"Authorization": f"Bearer {ADMIN}"}
    made = httpx.post(served["url"] + "/v1/keys", headers=admin,
                      json={"agent_name": "conc", "context_ids": ["c"]}).json()
    body = {"query": "shared words alpha", "context_id": "c", "max_results": 5, "mode": "keyword"}
    first = {"Authorization": f"Bearer {served['key']}"}
    second = {"Authorization": f"Bearer {made['key']}"}
    with httpx.Client(base_url=served["url"], headers=second) as c:  # the second key works, and is cached
        alone = _answer(c.post("/v1/search", json=body))
        hit = c.post("/v1/search", json=body).json()["hits"][0]
        assert c.get("/v1/read", params={"path": hit["path"], "blob_sha": hit["blob_sha"]}).status_code == 200
    real = rt.chunks.keyword_search
    entered, release = threading.Event(), threading.Event()

    def held(*a: Any, **kw: Any) -> Any:
        entered.set()
        assert release.wait(60)
        return real(*a, **kw)

    def waiting() -> int:
        return sum(lim.statistics().tasks_waiting for lim in list(rt.search_limiter._by_loop.values()))

    async def mcp_search() -> Any:
        async with httpx2.AsyncClient(headers=second, timeout=60) as hc:
            async with streamable_http_client(served["url"] + "/mcp", http_client=hc) as (rs, ws):
                async with ClientSession(rs, ws) as session:
                    await session.initialize()
                    return await session.call_tool("search", {"query": "shared words alpha", "mode": "keyword"})

    out: dict[str, Any] = {}

    def run(name: str, fn: Any) -> threading.Thread:
        t = threading.Thread(target=lambda: out.__setitem__(name, fn()), daemon=True)
        t.start()
        return t

    saved = rt._search_limiter
    rt._search_limiter = SearchLimiter(1)
    rt.chunks.keyword_search = held
    try:
        threads = [run("held", lambda: httpx.post(served["url"] + "/v1/search", headers=first, json=body,
                                                  timeout=60))]
        assert entered.wait(30)
        threads += [run("rest", lambda: httpx.post(served["url"] + "/v1/search", headers=second, json=body,
                                                   timeout=60)),
                    run("mcp", lambda: asyncio.run(mcp_search()))]
        deadline = time.monotonic() + 30
        while waiting() < 2:
            assert time.monotonic() < deadline, "the two searches of the second key did not queue"
            time.sleep(0.02)
        assert httpx.delete(served["url"] + f"/v1/keys/{made['id']}", headers=admin).status_code == 200
        release.set()
        for t in threads:
            t.join(60)
    finally:
        release.set()
        del rt.chunks.keyword_search
        rt._search_limiter = saved
    assert _answer(out["held"]) == alone
    assert out["rest"].status_code == 401, out["rest"].text
    assert out["rest"].json()["detail"] == "unknown or revoked key"
    assert out["mcp"].is_error and "unknown or revoked key" in out["mcp"].content[0].text


def test_a_search_whose_client_left_while_it_waited_is_not_run(served: dict[str, Any]) -> None:
    """Hostile review (issue 20): searches whose clients had disconnected while they waited for a search thread
    still ran, each taking a thread from the searches still waited for. With the one search thread held, a search
    is sent on a raw connection that is then closed; once the thread is free that search is not run (the store
    sees only the held one), and the next search is answered as before."""
    import json

    from scopekb.searchlimit import SearchLimiter

    rt = served["rt"]
    body = {"query": "shared words alpha", "context_id": "c", "max_results": 5, "mode": "keyword"}
    headers = {"Authorization": f"Bearer {served['key']}"}
    with httpx.Client(base_url=served["url"], headers=headers) as c:
        alone = _answer(c.post("/v1/search", json=body))
    real = rt.chunks.keyword_search
    entered, release = threading.Event(), threading.Event()
    calls = [0]

    def held(*a: Any, **kw: Any) -> Any:
        calls[0] += 1
        entered.set()
        assert release.wait(60)
        return real(*a, **kw)

    def waiting() -> int:
        return sum(lim.statistics().tasks_waiting for lim in list(rt.search_limiter._by_loop.values()))

    out: dict[str, Any] = {}
    saved = rt._search_limiter
    rt._search_limiter = SearchLimiter(1)
    rt.chunks.keyword_search = held
    try:
        t = threading.Thread(target=lambda: out.__setitem__("held", httpx.post(
            served["url"] + "/v1/search", headers=headers, json=body, timeout=60)), daemon=True)
        t.start()
        assert entered.wait(30)
        data = json.dumps(body).encode()
        host, port = served["url"].removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        + f"Authorization: Bearer {served['key']}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                        + data)
            deadline = time.monotonic() + 30
            while waiting() < 1:
                assert time.monotonic() < deadline, "the raw connection's search did not queue"
                time.sleep(0.02)
        time.sleep(0.2)  # the server reads the close
        release.set()
        t.join(60)
        deadline = time.monotonic() + 30
        while waiting() > 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)  # a search that got the thread has reached the store by now
        assert calls[0] == 1  # only the held search reached the store
    finally:
        release.set()
        del rt.chunks.keyword_search
        rt._search_limiter = saved
    assert _answer(out["held"]) == alone
    with httpx.Client(base_url=served["url"], headers=headers) as c:
        assert _answer(c.post("/v1/search", json=body)) == alone
