"""Concurrent searches (issue 20): requests/s and latency p50/p95 with 1, 8 and 32 requests in flight, per mode,
through a query service's REST API (the distributed query service or the embedded ``scopekb up``).

A level is measured with ``wrk`` when it is installed (:func:`_level_wrk`: one C event loop holding ``level``
connections, about 0.1 ms of CPU per request; ``scripts/install-wrk``), else (said in the log) with ``level`` asyncio
workers, each with its own httpx client holding one connection (:func:`_level`), whose own CPU per request (1.2-4.6
ms, growing with the level) is taken from the two cores the server runs on. Each row also gives the server's CPU
per request (``/proc`` utime + stime of its processes ÷ requests) and the generator's, so a ratio can be read
against what the server itself spent.

Before that (one httpx client, a pool of ``level`` connections) the generator itself set the figure at 32 in
flight: against one ``scopekb up`` in one run, 32 workers sharing one pooled client gave 33-80 keyword requests/s
with p95 1.2-2.8 s, 32 single-connection clients 147-174 requests/s with p95 0.32-0.35 s, the server's CPU per
request the same (3-5 ms); an empty FastAPI endpoint dropped the same way from 8 to 32 with the pooled client
(httpcore's pool bookkeeping per request grows with the connections it holds, encode/httpcore#1035). Latency is
per request (send to full answer; a dropped connection counts as a failed request), requests/s is ``n`` ÷ the wall
time of the level. Queries cycle through the given list. Acceptance (issue 20): keyword requests/s at 32 in flight
≥ 0.8 × at 8 (no collapse); hybrid p95 at 32 in flight ≤ 32 × its p50 with one in flight.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from scopekb_bench.stack import free_port
from scopekb_bench.util import REPO, log, summary, tree_cpu_seconds

LEVELS = (1, 8, 32)


def proc_cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` and their children
    (:func:`scopekb_bench.util.tree_cpu_seconds`); a process that has gone counts 0."""
    return sum(tree_cpu_seconds(pid) for pid in pids)


async def _level(url: str, key: str, context: str, queries: Sequence[str], mode: str, n: int, level: int,
                 max_results: int, server_pids: Sequence[int] = ()) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    lat: list[float] = []
    bad = 0
    clients = [httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300,
                                 limits=limits) for _ in range(level)]

    async def one(c: httpx.AsyncClient, q: str) -> None:
        nonlocal bad
        t0 = time.perf_counter()
        try:
            r = await c.post("/v1/search", json={"query": q, "mode": mode, "max_results": max_results,
                                                 "context_id": context})
        except httpx.TransportError:  # a dropped connection counts as a failed request; the pool reconnects
            lat.append(time.perf_counter() - t0)
            bad += 1
            return
        lat.append(time.perf_counter() - t0)
        if r.status_code != 200:
            bad += 1

    try:
        # warm-up: every worker's connection, at most 4 at a time
        for i in range(0, level, 4):
            await asyncio.gather(*(one(c, queries[j % len(queries)]) for j, c in enumerate(clients[i:i + 4], i)))
        lat.clear()
        next_i = 0

        async def worker(c: httpx.AsyncClient) -> None:
            nonlocal next_i
            while next_i < n:
                i = next_i
                next_i += 1
                await one(c, queries[i % len(queries)])

        scpu0, cpu0, t0 = proc_cpu_seconds(server_pids), time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(c) for c in clients))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        scpu = proc_cpu_seconds(server_pids) - scpu0
    finally:
        for c in clients:
            await c.aclose()
    s = summary(lat)
    return {"in_flight": level, "requests": n, "rps": n / wall, "p50": s["p50"], "p95": s["p95"], "non_200": bad,
            "client_cpu_per_request": cpu / n, "server_cpu_per_request": scpu / n if server_pids else None}


#: The wrk script of :func:`_level_wrk` (one wrk thread): one request body per line of the file given as its first
#: argument, sent in turn. Once ``n`` (second argument) answers are in it prints ``WRKDONE <seconds>`` (first send to
#: ``n``-th answer, CLOCK_MONOTONIC through LuaJIT's ffi) and stops its thread; wrk's main thread sleeps out its
#: ``-d`` duration, so the caller interrupts it (SIGINT), and ``done`` prints one ``WRKJSON`` line.
WRK_SCRIPT = """
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } scopekb_timespec;
int clock_gettime(int clk_id, scopekb_timespec *tp);
]]
local ts = ffi.new("scopekb_timespec")
local function now() ffi.C.clock_gettime(1, ts); return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end
local bodies, n, sent, got, bad, t0 = {}, 0, 0, 0, 0, 0
local path, headers
function init(args)
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
  n = tonumber(args[2])
  path = args[3]
  headers = {["Content-Type"] = "application/json", ["Authorization"] = args[4]}
end
function request()
  if sent == 0 then t0 = now() end
  sent = sent + 1
  wrk.thread:set("sent", sent)
  return wrk.format("POST", path, headers, bodies[(sent - 1) % #bodies + 1])
end
function response(status, hdrs, body)
  got = got + 1
  if status ~= 200 then bad = bad + 1; wrk.thread:set("bad", bad) end
  if got == n then
    io.write(string.format("WRKDONE %.6f\\n", now() - t0)); io.flush()
    wrk.thread:stop()
  end
end
local threads = {}
function setup(thread) threads[#threads + 1] = thread end
function done(summary, latency, requests)
  local sent_all, bad_all = 0, 0
  for _, t in ipairs(threads) do sent_all = sent_all + (t:get("sent") or 0); bad_all = bad_all + (t:get("bad") or 0) end
  local e = summary.errors
  io.write(string.format(
    '\\nWRKJSON {"requests": %d, "sent": %d, "non_200": %d, "errors": %d, "p50_us": %d, "p95_us": %d}\\n',
    summary.requests, sent_all, bad_all, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(95)))
end
"""


def wrk_available() -> bool:
    """True when the ``wrk`` HTTP benchmarking tool (Debian package ``wrk``) is on ``PATH``."""
    return shutil.which("wrk") is not None


def _settle(pids: Sequence[int], quiet_s: float = 0.3, limit_s: float = 30.0) -> float:
    """Wait until the processes ``pids`` use no more CPU for ``quiet_s`` seconds (at most ``limit_s``); returns
    their CPU seconds then."""
    last, t_end = proc_cpu_seconds(pids), time.monotonic() + limit_s
    while time.monotonic() < t_end:
        time.sleep(quiet_s)
        now = proc_cpu_seconds(pids)
        if now == last:
            break
        last = now
    return last


def _run_wrk(script: Path, lines: Path, url: str, key: str, n: int, level: int) -> tuple[float, dict[str, Any]]:
    """Run wrk until ``n`` answers are in; ``(seconds from first send to n-th answer, WRKJSON fields)``."""
    proc = subprocess.Popen(["wrk", "-t1", f"-c{level}", "-d3600s", "--timeout", "300s", "-s", str(script), url,
                             "--", str(lines), str(n), "/v1/search", f"Bearer {key}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out: list[str] = []
    seconds = math.nan
    for line in proc.stdout:
        out.append(line)
        if line.startswith("WRKDONE "):
            seconds = float(line.split()[1])
            proc.send_signal(signal.SIGINT)  # wrk prints its summary and runs done() on SIGINT
            break
    rest, _ = proc.communicate(timeout=60)
    text = "".join(out) + rest
    got = next((x for x in text.splitlines() if x.startswith("WRKJSON ")), None)
    if got is None or math.isnan(seconds):
        raise RuntimeError(f"wrk failed (exit {proc.returncode}): {text[-800:]}")
    return seconds, json.loads(got[len("WRKJSON "):])


def _level_wrk(url: str, key: str, context: str, queries: Sequence[str], mode: str, n: int, level: int,
               max_results: int, server_pids: Sequence[int] = ()) -> dict[str, Any]:
    """The row of :func:`_level` measured by ``wrk`` (one thread, ``level`` connections, a C event loop: tens of
    microseconds of CPU per request where the httpx generator spends milliseconds). Requests/s is ``n`` ÷ the
    time from wrk's first send to its ``n``-th answer. wrk stops there; the requests it had sent then still cost the
    server, so the server's CPU is read once it is idle again and divided by the requests sent. Latency
    percentiles are wrk's (send to full answer, microsecond resolution); ``non_200`` counts non-200 answers and
    socket errors (a dropped connection, a 300 s timeout). A warm-up run first sends one request per connection."""
    bodies = [json.dumps({"query": q, "mode": mode, "max_results": max_results, "context_id": context})
              for q in queries]
    with tempfile.TemporaryDirectory(prefix="scopekb-wrk-") as tmp:
        script, lines = Path(tmp) / "search.lua", Path(tmp) / "bodies.jsonl"
        script.write_text(WRK_SCRIPT)
        lines.write_text("\n".join(bodies) + "\n")
        _run_wrk(script, lines, url, key, level, level)
        cpu0, ru0 = _settle(server_pids), resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds, r = _run_wrk(script, lines, url, key, n, level)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk, reaped by communicate()
        scpu = _settle(server_pids) - cpu0
    gen_cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    # wrk may count an answer or two that came in after the n-th (its thread stops at the next event)
    return {"in_flight": level, "requests": n, "rps": n / seconds,
            "p50": r["p50_us"] / 1e6, "p95": r["p95_us"] / 1e6, "non_200": r["non_200"] + r["errors"],
            "client_cpu_per_request": gen_cpu / max(r["requests"], n),
            "server_cpu_per_request": scpu / max(r["sent"], 1) if server_pids else None, "generator": "wrk"}


#: Requests per in-flight connection a level sends at least (``max(n, LEVEL_ROUNDS × level)``): with the quick
#: profile's 30 a level of 32 in flight was two requests per connection (64), so its wall time was mostly the
#: ramp-up and the drain of one burst.
LEVEL_ROUNDS = 8


def generator() -> str:
    """The load generator :func:`table` uses: ``wrk`` when installed (``.ci/run`` installs the Debian package),
    else ``httpx`` (said in the bench log; its CPU per request, 1-4 ms, is then taken from the server's cores)."""
    return "wrk" if wrk_available() else "httpx"


def table(url: str, key: str, context: str, queries: Sequence[str], modes: Sequence[str], n: int,
          levels: Sequence[int] = LEVELS, max_results: int = 10, server_pids: Sequence[int] = ()
          ) -> dict[str, list[dict[str, Any]]]:
    """``{mode: [{"in_flight", "requests", "rps", "p50", "p95" (seconds), "non_200", "client_cpu_per_request"
    (seconds of the load generator's CPU), "server_cpu_per_request" (seconds of the ``server_pids`` processes' CPU;
    None without pids), "generator"}, ...]}``; each level sends ``max(n, LEVEL_ROUNDS × level)`` requests, with
    :func:`generator`'s tool."""
    gen = generator()
    if gen != "wrk":
        log("concurrency: wrk is not installed (Debian package wrk); measuring with the httpx generator, whose own "
            "CPU per request grows with the level on the same cores")

    def row(m: str, lv: int) -> dict[str, Any]:
        k = max(n, LEVEL_ROUNDS * lv)
        if gen == "wrk":
            return _level_wrk(url, key, context, queries, m, k, lv, max_results, server_pids)
        return {**asyncio.run(_level(url, key, context, queries, m, k, lv, max_results, server_pids)),
                "generator": "httpx"}

    return {m: [row(m, lv) for lv in levels] for m in modes}


def verdicts(t: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[float, float]]:
    """The two acceptance ratios as ``(value, baseline)``: ``keyword_rps_32_over_8`` (≥ 0.8) and
    ``hybrid_p95_32_over_p50_1`` (≤ 32), for the modes present."""
    out: dict[str, tuple[float, float]] = {}
    by = {m: {r["in_flight"]: r for r in rows} for m, rows in t.items()}
    if "keyword" in by and {8, 32} <= set(by["keyword"]):
        out["keyword_rps_32_over_8"] = (by["keyword"][32]["rps"], by["keyword"][8]["rps"])
    if "hybrid" in by and {1, 32} <= set(by["hybrid"]):
        out["hybrid_p95_32_over_p50_1"] = (by["hybrid"][32]["p95"], by["hybrid"][1]["p50"])
    return out


def embedded_up(workdir: Path, logs: Path, bare: Path, commit: str, queries: Sequence[str], modes: Sequence[str],
                n: int, embed_cache: Path | None = None) -> dict[str, Any]:
    """The table of :func:`table` against ``scopekb up`` (the embedded profile: one process, SQLite, the local
    model), after indexing ``commit`` of ``bare`` into a fresh data folder in this process (vectors from
    ``embed_cache`` when given, the SQLite embedding cache keyed by model and text, as a sync uses it).
    Returns ``{"chunks", "index_seconds", "table"}``."""
    from scopekb import ops
    from scopekb.indexing import run_sync
    from scopekb.models import KeyCreate, Source
    from scopekb.runtime import build_embedded_runtime
    from scopekb.settings import Settings

    subprocess.run(["git", "-C", str(bare), "update-ref", "refs/heads/main", commit], check=True)
    data = workdir / "up-data"
    emb: dict[str, Any] = {"provider": "local"}
    if embed_cache is not None:
        emb |= {"cache": "sqlite", "cache_path": str(embed_cache)}
    settings = Settings(profile="embedded", data_dir=data, embedding=emb, git={"allow_local_paths": True},
                        log_level="WARNING", log_format="console")
    rt = build_embedded_runtime(settings)
    rt.chunks.ensure_index()
    src = Source(id="src_benchup", agent_name="bench", context_id="eval", repo_url=str(bare), ref="main",
                 repo_name="bench/eval")
    rt.records.put_source(src)
    t0 = time.perf_counter()
    job = run_sync(rt.sync_deps(), "bench-up", [src.id], trigger="bench")
    index_seconds = time.perf_counter() - t0
    _rec, key = ops.create_key(rt, KeyCreate(agent_name="bench", context_ids=["eval"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}
    env |= {"SCOPEKB_DATA_DIR": str(data), "SCOPEKB_EMBEDDING__PROVIDER": "local", "SCOPEKB_LOG_LEVEL": "WARNING",
            "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true", "TOKENIZERS_PARALLELISM": "false"}
    if embed_cache is not None:
        env |= {"SCOPEKB_EMBEDDING__CACHE": "sqlite", "SCOPEKB_EMBEDDING__CACHE_PATH": str(embed_cache)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(logs / "embedded-up.log", "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "scopekb_cli.main", "up", "--port", str(port)], env=env,
                                stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"scopekb up exited with {proc.returncode}")
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("scopekb up did not answer in time")
                time.sleep(0.3)
            log(f"scopekb up (pid {proc.pid}) on {job.chunks_written} chunks")
            t = table(url, key, "eval", queries, modes, n, server_pids=[proc.pid])
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    return {"chunks": job.chunks_written, "index_seconds": index_seconds, "table": t}
