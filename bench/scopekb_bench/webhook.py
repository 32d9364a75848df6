"""Webhook latency (issue 5): the ingester's p50/p99 and requests/s under a local load generator ÷ a bare FastAPI
endpoint (:mod:`scopekb_bench.bare_webhook`) on the same machine, same uvicorn settings.

Every request to the ingester is a distinct, correctly signed GitHub push for a registered source, so it takes
the whole accepted path: signature check, parsing, source lookup, the delivery claim with the job's queued marker
(one Redis script) and ``send_task``. The ingester under test is a separate process whose Celery queue no worker
consumes; the run's cleanup deletes the queued tasks and keys. The load generator is asyncio + httpx with
``concurrency`` requests in flight, each worker with its own single-connection client (:data:`GENERATORS`); both
servers are measured in two alternating rounds, and each server's CPU per request (``/proc`` utime + stime ÷
requests) is reported next to the latencies: with two shared cores the p50 ratio follows whichever process is
bound by its CPU (issue 20), so the CPU ratio reads the same on any load.
"""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from uvicorn.protocols.http.h11_impl import H11Protocol

from scopekb.http.server import uvicorn_options
from scopekb.settings import HttpSettings
from scopekb_bench.stack import Stack, free_port, github_push
from scopekb_bench.util import REPO, log, tree_cpu_seconds

#: Load generators: ``single``, every asyncio worker with its own httpx client holding one connection (as
#: :mod:`scopekb_bench.concurrency`); ``pooled``, one client with a pool of ``concurrency`` connections (before).
GENERATORS = ("single", "pooled")


async def _load(url: str, requests: list[tuple[bytes, dict[str, str]]], concurrency: int, generator: str = "single"
                ) -> tuple[list[float], float, int]:
    """POST every request with ``concurrency`` in flight; (latencies in s, requests/s, answers other than 202).
    A connection the server drops counts as a non-202 answer."""
    if generator not in GENERATORS:
        raise ValueError(f"generator {generator!r}: one of {GENERATORS}")
    per_client = 1 if generator == "single" else concurrency
    limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
    clients = [httpx.AsyncClient(timeout=30, limits=limits)
               for _ in range(concurrency if generator == "single" else 1)]
    lat: list[float] = []
    bad = 0
    next_i = 0

    async def worker(c: httpx.AsyncClient) -> None:
        nonlocal next_i, bad
        while next_i < len(requests):
            body, headers = requests[next_i]
            next_i += 1
            t0 = time.perf_counter()
            try:
                r = await c.post(url, content=body, headers=headers)
                ok = r.status_code == 202
            except httpx.TransportError:
                ok = False
            lat.append(time.perf_counter() - t0)
            bad += not ok

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(concurrency)))
        wall = time.perf_counter() - t0
    finally:
        for c in clients:
            await c.aclose()
    return lat, len(requests) / wall, bad


def run_load(url: str, requests: list[tuple[bytes, dict[str, str]]], concurrency: int, server_pid: int,
             generator: str = "single") -> dict[str, Any]:
    """One load of ``requests`` against ``url`` with the CPU it cost: ``{"latencies" (s), "rps", "non_202",
    "server_cpu_per_request", "client_cpu_per_request"}`` (CPU seconds per request: user + system time of the
    server process ``server_pid`` and its children from ``/proc``, and of this process, over the load ÷
    requests). On an idle machine with two cores each process of a p50 ratio is bound by its own CPU, so the CPU
    ratio says what the latency ratio can be on any load (issue 20, fifth pass)."""
    s0, c0 = tree_cpu_seconds(server_pid), time.process_time()
    lat, rps, bad = asyncio.run(_load(url, requests, concurrency, generator))
    s1, c1 = tree_cpu_seconds(server_pid), time.process_time()
    n = max(1, len(requests))
    return {"latencies": lat, "rps": rps, "non_202": bad, "server_cpu_per_request": (s1 - s0) / n,
            "client_cpu_per_request": (c1 - c0) / n}


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Wait until ``url`` answers a POST (any status); raises when ``proc`` exits or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"webhook server exited with {proc.returncode}")
        try:
            httpx.post(url, content=b"{}", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("webhook server did not answer")


def push_batches(repo_name: str, clone_url: str, delivery_prefix: str
                 ) -> Callable[[int], list[tuple[bytes, dict[str, str]]]]:
    """``batch(k)``: the next ``k`` distinct, signed GitHub pushes ``(body, headers)`` of ``repo_name`` (commits
    ``<n as 40 hex>``, delivery ids ``<delivery_prefix>-<n>``, ``n`` counting on over every call)."""
    counter = 0

    def batch(k: int) -> list[tuple[bytes, dict[str, str]]]:
        nonlocal counter
        out = []
        for _ in range(k):
            counter += 1
            out.append(github_push(repo_name, clone_url, "0" * 40, f"{counter:040x}", f"{delivery_prefix}-{counter}"))
        return out

    return batch


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
            concurrency: int = 16, generator: str = "single") -> dict[str, Any]:
    """Load both endpoints with ``n`` requests each (two alternating rounds of ``n/2``; ``generator`` as in
    :data:`GENERATORS`). Per side: ``latencies`` (s), ``rps`` (mean of the rounds), ``non_202``,
    ``server_cpu_per_request`` and ``client_cpu_per_request`` (CPU seconds per request over both rounds, see
    :func:`run_load`)."""
    ingester = Stack("webhook", env, logs, parts=("ingester",)).start()
    port = free_port()
    fh = open(logs / "bare-webhook.log", "wb")  # noqa: SIM115 - closed below
    bare = subprocess.Popen([sys.executable, "-m", "uvicorn", "scopekb_bench.bare_webhook:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning", "--no-access-log", *bare_server_args()],
                            cwd=REPO / "bench", stdout=fh, stderr=subprocess.STDOUT)
    bare_url = f"http://127.0.0.1:{port}/webhooks/github"
    try:
        wait_ready(bare_url, bare)
        batch = push_batches(repo_name, clone_url, f"bench-{run_id}-wh")

        sides = {"scopekb": (ingester.ingester_url + "/webhooks/github", ingester.pid("ingester")),
                 "bare": (bare_url, bare.pid)}
        res: dict[str, dict[str, Any]] = {name: {"lat": [], "rps": [], "bad": 0, "cpu": 0.0, "client_cpu": 0.0}
                                          for name in sides}
        for url, pid in sides.values():  # warm-up
            run_load(url, batch(min(50, n)), concurrency, pid, generator)
        half = max(1, n // 2)
        for rnd in range(2):
            for name in (("bare", "scopekb") if rnd == 0 else ("scopekb", "bare")):
                url, pid = sides[name]
                r = run_load(url, batch(half), concurrency, pid, generator)
                res[name]["lat"].extend(r["latencies"])
                res[name]["rps"].append(r["rps"])
                res[name]["bad"] += r["non_202"]
                res[name]["cpu"] += r["server_cpu_per_request"] / 2
                res[name]["client_cpu"] += r["client_cpu_per_request"] / 2
        for name in res:
            if res[name]["bad"]:
                log(f"webhook load: {res[name]['bad']} non-202 answers from {name}")
        return {name: {"latencies": r["lat"], "rps": sum(r["rps"]) / len(r["rps"]), "non_202": r["bad"],
                       "server_cpu_per_request": r["cpu"], "client_cpu_per_request": r["client_cpu"]}
                for name, r in res.items()} | {"concurrency": concurrency, "requests_each": 2 * half,
                                               "generator": generator}
    finally:
        bare.terminate()
        try:
            bare.wait(timeout=20)
        except subprocess.TimeoutExpired:
            bare.kill()
            bare.wait(timeout=10)
        fh.close()
        ingester.stop()
