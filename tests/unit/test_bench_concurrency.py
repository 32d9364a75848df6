"""The concurrency benchmark's load generator (issue 20): each of ``level`` workers holds its own connection (one
shared httpx pool costs the generator more CPU per request the more connections it holds), every request is
counted, and a connection the server drops is a failed request, not a crashed level."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from scopekb_bench import concurrency  # noqa: E402 - bench/ is not an installed package


def _serve() -> tuple[uvicorn.Server, threading.Thread, str, Counter[tuple[str, int]]]:
    """A search stand-in that counts requests per client (address, port), i.e. per connection."""
    seen: Counter[tuple[str, int]] = Counter()

    async def search(request: Request) -> Response:
        body = await request.json()
        assert request.headers["authorization"] == "Bearer k" and body["context_id"] == "ctx"
        client = request.client
        assert client is not None
        seen[(client.host, client.port)] += 1
        await asyncio.sleep(0.002)
        return JSONResponse({"hits": []})

    app = Starlette(routes=[Route("/v1/search", search, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    return server, t, f"http://127.0.0.1:{port}", seen


def _dropping_server(every: int) -> tuple[socket.socket, threading.Thread, str]:
    """A raw HTTP/1.1 server answering 200 with keep-alive, except that it closes the connection without an
    answer on every ``every``-th request."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    count = 0
    mu = threading.Lock()

    def conn(c: socket.socket) -> None:
        nonlocal count
        buf = b""
        with c:
            while True:
                while b"\r\n\r\n" not in buf:
                    got = c.recv(65536)
                    if not got:
                        return
                    buf += got
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(
                    b"content-length:"))
                while len(buf) < length:
                    buf += c.recv(65536)
                buf = buf[length:]
                with mu:
                    count += 1
                    drop = count % every == 0
                if drop:
                    return
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")

    def accept() -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=conn, args=(c,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    return lsock, t, f"http://127.0.0.1:{lsock.getsockname()[1]}"


def test_each_worker_has_its_own_connection_and_every_request_is_counted() -> None:
    server, t, url, seen = _serve()
    try:
        row = asyncio.run(concurrency._level(url, "k", "ctx", ["a", "b", "c"], "keyword", 96, 8, 10))
    finally:
        server.should_exit = True
        t.join(10)
    assert row["requests"] == 96 and row["non_200"] == 0 and row["in_flight"] == 8
    assert row["rps"] > 0 and 0 < row["p50"] <= row["p95"] and row["client_cpu_per_request"] >= 0
    assert len(seen) == 8  # one connection per worker, each reused (keep-alive) for its share
    assert sum(seen.values()) == 96 + 8  # the measured requests plus one warm-up per connection
    assert all(n >= 2 for n in seen.values())


def test_a_dropped_connection_is_a_failed_request_not_a_crash() -> None:
    lsock, t, url = _dropping_server(every=10)
    try:
        row = asyncio.run(concurrency._level(url, "k", "ctx", ["a"], "keyword", 40, 4, 10))
    finally:
        lsock.close()
        t.join(10)
    assert row["requests"] == 40 and 3 <= row["non_200"] <= 5


def test_wrk_sends_distinct_bodies_counts_every_answer_and_reads_the_servers_cpu() -> None:
    """The wrk generator (issue 20; scripts/install-wrk installs it): one connection per in-flight request, the
    request bodies in turn (each with the bearer key and context), ``n`` answers counted, the server's CPU read
    from /proc, and its own CPU a small fraction of the httpx generator's."""
    import os

    assert concurrency.wrk_available(), "wrk is not installed: run scripts/install-wrk"
    server, t, url, seen = _serve()
    try:
        row = concurrency._level_wrk(url, "k", "ctx", ["a", "b", "c"], "keyword", 96, 8, 10,
                                     server_pids=[os.getpid()])
    finally:
        server.should_exit = True
        t.join(10)
    assert row["requests"] == 96 and row["non_200"] == 0 and row["in_flight"] == 8 and row["generator"] == "wrk"
    assert row["rps"] > 0 and 0 < row["p50"] <= row["p95"]
    assert row["server_cpu_per_request"] is not None and row["server_cpu_per_request"] >= 0
    assert 0 <= row["client_cpu_per_request"] < 0.001
    assert len(seen) == 16  # the warm-up's 8 connections (one request or two each), then the measured run's 8
    assert sum(seen.values()) >= 96 + 8
    assert sorted(seen.values())[-8:] >= [96 // 8 - 2] * 8  # each measured connection carried its share


def test_proc_cpu_seconds_counts_this_process_and_ignores_a_gone_one() -> None:
    import os

    before = concurrency.proc_cpu_seconds([os.getpid()])
    t_end = time.process_time() + 0.05
    while time.process_time() < t_end:
        pass
    assert concurrency.proc_cpu_seconds([os.getpid()]) >= before + 0.03
    assert concurrency.proc_cpu_seconds([2 ** 22 + 12345]) == 0
