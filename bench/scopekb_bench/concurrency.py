"""Concurrent searches (issue 20): requests/s and latency p50/p95 with 1, 8 and 32 requests in flight, per mode,
through a query service's REST API (the distributed query service or the embedded ``scopekb up``).

A level runs ``n`` requests with ``level`` asyncio workers, each with its own httpx client holding one
connection. Before (one client, a pool of ``level`` connections) the generator itself set the figure at 32 in
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
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from scopekb_bench.stack import free_port
from scopekb_bench.util import REPO, log, summary

LEVELS = (1, 8, 32)


async def _level(url: str, key: str, context: str, queries: Sequence[str], mode: str, n: int, level: int,
                 max_results: int) -> dict[str, Any]:
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

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(c) for c in clients))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        for c in clients:
            await c.aclose()
    s = summary(lat)
    return {"in_flight": level, "requests": n, "rps": n / wall, "p50": s["p50"], "p95": s["p95"], "non_200": bad,
            "client_cpu_per_request": cpu / n}


def table(url: str, key: str, context: str, queries: Sequence[str], modes: Sequence[str], n: int,
          levels: Sequence[int] = LEVELS, max_results: int = 10) -> dict[str, list[dict[str, Any]]]:
    """``{mode: [{"in_flight", "requests", "rps", "p50", "p95" (seconds), "non_200", "client_cpu_per_request"
    (seconds of the load generator's CPU)}, ...]}``; each level sends ``max(n, 2 × level)`` requests."""
    return {m: [asyncio.run(_level(url, key, context, queries, m, max(n, 2 * lv), lv, max_results))
                for lv in levels] for m in modes}


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
            t = table(url, key, "eval", queries, modes, n)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    return {"chunks": job.chunks_written, "index_seconds": index_seconds, "table": t}
