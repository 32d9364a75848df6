"""A/B of the query service's per-request overhead (issue 20; not a test): one index, the raw OpenSearch requests
the service issues, the empty FastAPI endpoint (:mod:`scopekb_bench.bare_search`) and one query service per
checkout (this one, and ``--base``'s code when given: its ``shared``, ``services``, ``workers`` and ``cli`` folders
first on ``PYTHONPATH``), requests sent one at a time and interleaved query by query, the sides in a rotating
order, so every side sees the same machine load.

    .venv/bin/python bench/service_ab.py [--base /path/to/old/checkout] [--n 200] [--rounds 3] [--modes keyword,vector]

The index is a copy of an installed package's Python sources (``--package``, default ``click``) synced through a
stack of this checkout (ingester, worker with the local model, query service); the queries are the first lines of
its docstrings. The raw side replays the requests :func:`scopekb.search.run_search` sends
(:func:`scopekb_bench.query.capture`), with the same ``httpx`` client set-up as ``bench/run``'s query phase.
Prints per round and side p50 in ms, then the medians of the rounds and each side's p50 ÷ the raw p50; with
``--cpu`` also each server's CPU per request (``/proc`` of the server process ÷ requests).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "shared"), str(REPO / "services"), str(REPO / "workers"),
                str(REPO / "cli")]


def _pythonpath(root: Path) -> str:
    return os.pathsep.join(str(root / d) for d in ("shared", "services", "workers", "cli", "bench"))


def _queries(src: Path, limit: int) -> list[str]:
    out: list[str] = []
    for f in sorted(src.rglob("*.py")):
        try:
            tree = ast.parse(f.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                doc = ast.get_docstring(node)
                line = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
                if 12 <= len(line) <= 120 and line not in out:
                    out.append(line)
    return out[:limit]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path)
    ap.add_argument("--n", type=int, default=200, help="requests per side and mode per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="keyword,vector")
    ap.add_argument("--package", default="click")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--pyspy", type=Path, help="py-spy binary: record this checkout's service during round 0 "
                    "(collapsed stacks, idle threads included, next to the logs)")
    args = ap.parse_args()

    import httpx
    from scopekb_bench import query, webhook
    from scopekb_bench.stack import ZERO, Stack, cleanup, free_port, new_admin_token, stack_env
    from scopekb_bench.util import log, stop_processes, tree_cpu_seconds

    from scopekb.auth import resolve_scope
    from scopekb.realrepo import git
    from scopekb.runtime import build_runtime
    from scopekb.settings import Settings

    modes = args.modes.split(",")
    endpoints = {k: v for k, v in os.environ.items() if k.startswith(("SCOPEKB_OPENSEARCH__", "SCOPEKB_REDIS__",
                                                                     "SCOPEKB_S3__"))}
    run_id = "svab" + uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix="service-ab-"))
    env = stack_env(endpoints, run_id, "q", tmp, "local", new_admin_token())
    pkg = Path(__import__(args.package).__file__).parent
    repo = tmp / "repo"
    shutil.copytree(pkg, repo / args.package, ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "--quiet", "--initial-branch", "main")
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "corpus")
    head = git(repo, "rev-parse", "HEAD")
    queries = _queries(repo, max(args.n, 10))
    st = Stack("ab", env, tmp / "logs")
    procs: list[subprocess.Popen[bytes]] = []
    handles = []
    sides: dict[str, dict[str, Any]] = {}
    try:
        st.start()
        _src, key = st.register("bench", "ab", repo, "bench/ab")
        r = st.push("bench/ab", str(repo), ZERO, head, f"{run_id}-push")
        r.raise_for_status()
        job = st.wait_job(r.json()["job_id"], timeout_s=1800)
        log(f"indexed: {job.get('state')} {job.get('stats', {})}")
        sides["head"] = {"url": st.query_url, "pid": st.pid("query")}

        def start(name: str, cmd: list[str], root: Path, e: dict[str, str]) -> None:
            port = free_port()
            fh = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed at the end
            handles.append(fh)
            p = subprocess.Popen([*cmd, "--port", str(port)], env={**e, "PYTHONPATH": _pythonpath(root)},
                                 stdout=fh, stderr=subprocess.STDOUT, cwd=root)
            procs.append(p)
            url = f"http://127.0.0.1:{port}"
            webhook.wait_ready(url + "/v1/search", p)
            sides[name] = {"url": url, "pid": p.pid}

        if args.base:
            start("base", [sys.executable, "-m", "scopekb_cli.main", "serve", "query"], args.base.resolve(), env)
        start("bare", [sys.executable, "-m", "uvicorn", "scopekb_bench.bare_search:app", "--host", "127.0.0.1",
                       "--log-level", "warning", "--no-access-log", *webhook.bare_server_args()], REPO,
              {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")})

        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            rt = build_runtime(Settings(), name="service-ab")
            scope = resolve_scope(rt.keys(key), "ab", False)  # type: ignore[arg-type]
            emb = rt.embedder
            captured, embed_times = query.capture(rt.chunks.client, rt.chunks.alias, emb.dimension, emb.model_id,
                                                  scope, queries, emb.embed_query)
        finally:
            for k_, v in old.items():
                if v is None:
                    os.environ.pop(k_, None)
                else:
                    os.environ[k_] = v
        log(f"{len(queries)} queries; bare embed p50 {statistics.median(embed_times) * 1000:.2f} ms")
        os_url = endpoints["SCOPEKB_OPENSEARCH__URL"]
        clients = {name: httpx.Client(base_url=s["url"], headers={"Authorization": f"Bearer {key}"}, timeout=60)
                   for name, s in sides.items()}
        raw = httpx.Client(base_url=os_url, timeout=60)

        def one(name: str, q: str, mode: str) -> None:
            if name == "raw":
                for index, body in captured[mode][q]:
                    path, kw = query.raw_request(index, body)
                    raw.post(path, **kw).raise_for_status()
                return
            r = clients[name].post("/v1/search", json={"query": q, "mode": mode, "max_results": 10,
                                                       "context_id": "ab"})
            r.raise_for_status()

        names = ["raw", *sides]
        for q in queries[:10]:  # warm-up
            for mode in modes:
                for name in names:
                    one(name, q, mode)
        rows: list[dict[str, Any]] = []
        for rnd in range(args.rounds):
            times: dict[tuple[str, str], list[float]] = {(n, m): [] for n in names for m in modes}
            cpu0 = {n: tree_cpu_seconds(s["pid"]) for n, s in sides.items()}
            la = os.getloadavg()[0]
            spy = None
            if args.pyspy and rnd == 0:
                spy = subprocess.Popen([str(args.pyspy), "record", "--pid", str(sides["head"]["pid"]), "-r", "250",
                                        "--threads", "--idle", "-f", "raw", "-o", str(tmp / "pyspy-head.txt")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            for i in range(args.n):
                q = queries[i % len(queries)]
                order = names[i % len(names):] + names[:i % len(names)]
                for mode in modes:
                    for name in order:
                        t0 = time.perf_counter()
                        one(name, q, mode)
                        times[(name, mode)].append(time.perf_counter() - t0)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            cpu = {n: (tree_cpu_seconds(s["pid"]) - cpu0[n]) / (args.n * len(modes)) for n, s in sides.items()}
            for mode in modes:
                rawp = statistics.median(times[("raw", mode)])
                for name in names:
                    p50 = statistics.median(times[(name, mode)])
                    row = {"round": rnd, "mode": mode, "side": name, "load": round(la, 1),
                           "p50_ms": round(p50 * 1000, 3), "ratio": round(p50 / rawp, 3),
                           "cpu_ms": round(cpu.get(name, 0.0) * 1000, 3)}
                    rows.append(row)
                    log(json.dumps(row))
        print(f"\nmedians over {args.rounds} rounds, {args.n} requests a side and mode a round; load now "
              f"{os.getloadavg()[0]:.1f}; bare query embedding p50 {statistics.median(embed_times) * 1000:.2f} ms")
        print("| mode | side | p50 ms | p50 ÷ raw | server CPU ms/req (all modes) |")
        print("|---|---|---:|---:|---:|")
        for mode in modes:
            for name in names:
                rs = [r for r in rows if r["mode"] == mode and r["side"] == name]
                print(f"| {mode} | {name} | {statistics.median(r['p50_ms'] for r in rs):.2f} | "
                      f"{statistics.median(r['ratio'] for r in rs):.2f} | "
                      f"{statistics.median(r['cpu_ms'] for r in rs):.2f} |")
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
    finally:
        stop_processes(procs)
        st.stop()
        for fh in handles:
            fh.close()
        log(f"cleanup: {cleanup(endpoints, run_id)}; logs in {tmp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
