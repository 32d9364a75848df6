"""Webhook latency (issue 5): the ingester's p50/p99 and requests/s under a local load generator ÷ a bare FastAPI
endpoint (:mod:`scopekb_bench.bare_webhook`) on the same machine, same uvicorn settings.

Every request to the ingester is a distinct, correctly signed GitHub push for a registered source, so it takes
the whole accepted path: signature check, parsing, source lookup, delivery dedupe (Redis ``SET NX``), job marker
and ``send_task``. The ingester under test is a separate process whose Celery queue no worker consumes; the run's
cleanup deletes the queued tasks and keys. The load generator is asyncio + httpx with ``concurrency`` requests in
flight; both servers are measured in two alternating rounds.
"""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from uvicorn.protocols.http.h11_impl import H11Protocol

from scopekb.http.server import uvicorn_options
from scopekb.settings import HttpSettings
from scopekb_bench.stack import Stack, free_port, github_push
from scopekb_bench.util import REPO, log


async def _load(url: str, requests: list[tuple[bytes, dict[str, str]]], concurrency: int
                ) -> tuple[list[float], float, int]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    lat: list[float] = []
    bad = 0
    async with httpx.AsyncClient(timeout=30, limits=limits) as c:
        next_i = 0

        async def worker() -> None:
            nonlocal next_i, bad
            while next_i < len(requests):
                body, headers = requests[next_i]
                next_i += 1
                t0 = time.perf_counter()
                r = await c.post(url, content=body, headers=headers)
                lat.append(time.perf_counter() - t0)
                if r.status_code != 202:
                    bad += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return lat, len(requests) / wall, bad


def _wait(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bare webhook app exited with {proc.returncode}")
        try:
            httpx.post(url, content=b"{}", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("bare webhook app did not answer")


def bare_server_args(http: HttpSettings | None = None) -> list[str]:
    """uvicorn command-line options giving the bare app the server settings ``scopekb serve`` gives the ingester
    (:func:`scopekb.http.server.uvicorn_options`): the same HTTP implementation (h11; the ingester's protocol is
    h11 with a header deadline, so the bare app must not pick httptools when it happens to be installed), event
    loop choice (uvicorn's default for both), keep-alive timeout, concurrency limit, backlog and head-size cap."""
    opts = uvicorn_options(http or HttpSettings())
    if not issubclass(_protocol(opts["http"]), H11Protocol):
        raise RuntimeError(f"scopekb serve's protocol {opts['http']} is not h11: update the bare baseline")
    return ["--http", "h11", "--timeout-keep-alive", str(int(opts["timeout_keep_alive"])),
            "--limit-concurrency", str(opts["limit_concurrency"]), "--backlog", str(opts["backlog"]),
            "--h11-max-incomplete-event-size", str(opts["h11_max_incomplete_event_size"])]


def _protocol(name: str) -> type:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def measure(env: dict[str, str], logs: Path, run_id: str, repo_name: str, clone_url: str, n: int,
            concurrency: int = 16) -> dict[str, Any]:
    """Load both endpoints with ``n`` requests each (two rounds of ``n/2``); latencies in seconds."""
    ingester = Stack("webhook", env, logs, parts=("ingester",)).start()
    port = free_port()
    fh = open(logs / "bare-webhook.log", "wb")  # noqa: SIM115 - closed below
    bare = subprocess.Popen([sys.executable, "-m", "uvicorn", "scopekb_bench.bare_webhook:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning", "--no-access-log", *bare_server_args()],
                            cwd=REPO / "bench", stdout=fh, stderr=subprocess.STDOUT)
    bare_url = f"http://127.0.0.1:{port}/webhooks/github"
    try:
        _wait(bare_url, bare)
        counter = 0

        def batch(k: int) -> list[tuple[bytes, dict[str, str]]]:
            nonlocal counter
            out = []
            for _ in range(k):
                counter += 1
                after = f"{counter:040x}"
                out.append(github_push(repo_name, clone_url, "0" * 40, after, f"bench-{run_id}-wh-{counter}"))
            return out

        scopekb_url = ingester.ingester_url + "/webhooks/github"
        res: dict[str, dict[str, Any]] = {"scopekb": {"lat": [], "rps": [], "bad": 0},
                                          "bare": {"lat": [], "rps": [], "bad": 0}}
        for url in (scopekb_url, bare_url):  # warm-up
            asyncio.run(_load(url, batch(min(50, n)), concurrency))
        half = max(1, n // 2)
        for _ in range(2):
            for url, name in ((bare_url, "bare"), (scopekb_url, "scopekb")):
                lat, rps, bad = asyncio.run(_load(url, batch(half), concurrency))
                res[name]["lat"].extend(lat)
                res[name]["rps"].append(rps)
                res[name]["bad"] += bad
        for name in res:
            if res[name]["bad"]:
                log(f"webhook load: {res[name]['bad']} non-202 answers from {name}")
        return {name: {"latencies": r["lat"], "rps": sum(r["rps"]) / len(r["rps"]), "non_202": r["bad"]}
                for name, r in res.items()} | {"concurrency": concurrency, "requests_each": 2 * half}
    finally:
        bare.terminate()
        try:
            bare.wait(timeout=20)
        except subprocess.TimeoutExpired:
            bare.kill()
            bare.wait(timeout=10)
        fh.close()
        ingester.stop()
