"""The webhook benchmark's load generator (issue 20): every request is sent and counted, each of the
``concurrency`` workers holds its own connection (as the concurrency benchmark's generator), a connection the
server drops is a failed request, and the server's and the generator's CPU per request come with the latencies."""

from __future__ import annotations

import os
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

from scopekb_bench import webhook  # noqa: E402 - bench/ is not an installed package


def _serve() -> tuple[uvicorn.Server, threading.Thread, str, Counter[tuple[str, int]]]:
    """A webhook stand-in answering 202, counting requests per client connection."""
    seen: Counter[tuple[str, int]] = Counter()

    async def hook(request: Request) -> Response:
        await request.body()
        assert request.client is not None
        seen[(request.client.host, request.client.port)] += 1
        return JSONResponse({"status": "queued"}, status_code=202)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/webhooks/github", hook, methods=["POST"])]),
                                           log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    return server, t, f"http://127.0.0.1:{sock.getsockname()[1]}/webhooks/github", seen


def test_each_worker_has_its_own_connection_and_cpu_is_reported() -> None:
    server, t, url, seen = _serve()
    try:
        reqs = [(b'{"n": %d}' % i, {"Content-Type": "application/json"}) for i in range(96)]
        r = webhook.run_load(url, reqs, 8, os.getpid(), "single")
        assert len(r["latencies"]) == 96 and r["non_202"] == 0 and r["rps"] > 0
        assert len(seen) == 8 and sum(seen.values()) == 96  # eight connections, every request answered
        # the stand-in server runs in this process: both figures are this process's CPU (/proc counts whole ticks)
        assert r["server_cpu_per_request"] > 0 and r["client_cpu_per_request"] > 0
        assert abs(r["server_cpu_per_request"] - r["client_cpu_per_request"]) * 96 < 0.05
    finally:
        server.should_exit = True
        t.join(timeout=10)


def test_a_refused_connection_is_a_failed_request_not_a_crash() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    r = webhook.run_load(f"http://127.0.0.1:{port}/webhooks/github", [(b"{}", {})] * 5, 2, os.getpid(), "single")
    assert len(r["latencies"]) == 5 and r["non_202"] == 5
