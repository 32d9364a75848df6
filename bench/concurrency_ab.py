"""A/B under concurrent searches (issue 20; not a test): two servers on one index of the quick evaluation corpus,
one running another checkout's code (``--base``: its ``shared``, ``services``, ``workers`` and ``cli`` folders
first on ``PYTHONPATH``), one this checkout's, measured level by level in alternating order
(:func:`scopekb_bench.concurrency.table` rows), so both see the same machine load.

    .venv/bin/python bench/concurrency_ab.py --base /path/to/old/checkout [--profile embedded|distributed]
        [--generator httpx|wrk] [--n 96] [--rounds 2]

``--profile embedded`` (default): two ``scopekb up`` processes on one SQLite index. ``--profile distributed``: two
``scopekb serve query`` processes on one OpenSearch index (names private to the run), with the services of the
environment (``eval "$(scripts/services env)"``). ``--base`` may be this checkout (the same code twice: the
noise floor). Prints, per mode and in-flight level, requests/s, p50/p95, the server's and the generator's CPU
per request of each side, and the two acceptance ratios of issue 20 per side (keyword requests/s 32 ÷ 8, hybrid
p95 at 32 ÷ p50 at 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "shared"), str(REPO / "services"), str(REPO / "workers"),
                str(REPO / "cli")]


def _pythonpath(root: Path) -> str:
    return os.pathsep.join(str(root / d) for d in ("shared", "services", "workers", "cli", ""))


def _serve(root: Path, data: Path, log: Path, distributed: dict[str, str] | None = None,
           extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    import httpx
    from scopekb_bench.stack import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}
    env |= {"SCOPEKB_DATA_DIR": str(data), "SCOPEKB_EMBEDDING__PROVIDER": "local", "SCOPEKB_LOG_LEVEL": "WARNING",
            "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": _pythonpath(root)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = ["up", "--port", str(port)]
    if distributed is not None:
        env |= distributed
        cmd = ["serve", "query", "--port", str(port)]
    env |= extra_env or {}
    fh = open(log, "wb")  # noqa: SIM115 - the process's log, left open while it runs
    proc = subprocess.Popen([sys.executable, "-m", "scopekb_cli.main", *cmd], env=env,
                            stdout=fh, stderr=subprocess.STDOUT, cwd=root)
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"scopekb up ({root}) exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("scopekb up did not answer in time")
        time.sleep(0.3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, type=Path)
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="keyword,hybrid")
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--profile", choices=("embedded", "distributed"), default="embedded")
    ap.add_argument("--generator", default="httpx",
                    help="httpx, wrk, or both (httpx,wrk): each level is then measured with each, same servers")
    ap.add_argument("--base-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable of the base side's server only (repeatable)")
    ap.add_argument("--new-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable of the new side's server only (repeatable)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    side_env = {"base": dict(x.split("=", 1) for x in args.base_env),
                "new": dict(x.split("=", 1) for x in args.new_env)}

    from scopekb_bench import concurrency, corpus, quality, sets
    from scopekb_bench.profiles import QUICK
    from scopekb_bench.util import stop_processes, summary

    from scopekb import ops
    from scopekb.indexing import run_sync
    from scopekb.models import KeyCreate, Source
    from scopekb.runtime import build_embedded_runtime, build_runtime
    from scopekb.settings import Settings

    ev = corpus.eval_repo(list(QUICK.eval_projects))
    queries = [p["query"] for p in quality.sample(ev.pairs, 30, seed=23)]
    modes = args.modes.split(",")
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory(prefix="scopekb-ab-") as tmp:
        work = Path(tmp)
        bare = ev.clone_bare(work / "eval.git")
        subprocess.run(["git", "-C", str(bare), "update-ref", "refs/heads/main", ev.releases[-1]], check=True)
        data = work / "data"
        emb = {"provider": "local", "cache": "sqlite", "cache_path": str(sets.EMBED_CACHE)}
        distributed: dict[str, str] | None = None
        if args.profile == "distributed":
            run = f"ab{os.getpid()}"
            distributed = {k: v for k, v in os.environ.items() if k.startswith(("SCOPEKB_OPENSEARCH__",
                                                                                "SCOPEKB_REDIS__", "SCOPEKB_S3__"))}
            if "SCOPEKB_OPENSEARCH__URL" not in distributed:
                ap.error("--profile distributed needs the services' environment (eval \"$(scripts/services env)\")")
            distributed |= {"SCOPEKB_OPENSEARCH__ALIAS": f"bench-{run}-chunks",
                            "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"bench-{run}-sys",
                            "SCOPEKB_S3__BUCKET": f"bench-{run}", "SCOPEKB_QUERY__ADMIN_TOKEN": f"ab-admin-{run}"}
            os.environ.update(distributed)  # the settings below read the services from the environment
            settings = Settings(data_dir=data, embedding=emb, log_level="WARNING", log_format="console",
                                git={"allow_local_paths": True, "cache_dir": str(work / "git")})
            rt = build_runtime(settings)
            rt.blobs.ensure_bucket()
            for kind in ("sources", "jobs", "state", "keys", "overlays"):
                rt.records.ensure(kind)
        else:
            settings = Settings(profile="embedded", data_dir=data, embedding=emb, git={"allow_local_paths": True},
                                log_level="WARNING", log_format="console")
            rt = build_embedded_runtime(settings)
        rt.chunks.ensure_index()
        src = Source(id="src_ab", agent_name="bench", context_id="eval", repo_url=str(bare), ref="main",
                     repo_name="bench/eval")
        rt.records.put_source(src)
        job = run_sync(rt.sync_deps(), "ab", [src.id], trigger="bench")
        _rec, key = ops.create_key(rt, KeyCreate(agent_name="bench", context_ids=["eval"]))
        if args.profile == "embedded":
            rt.chunks.close()
        print(f"indexed {job.chunks_written} chunks ({args.profile}); load {os.getloadavg()[0]:.1f}", flush=True)
        sides = {"base": args.base.resolve(), "new": REPO}
        procs = {}
        gens = args.generator.split(",")
        level_fns = {"wrk": concurrency._level_wrk,
                     "httpx": lambda *a, **kw: asyncio.run(concurrency._level(*a, **kw))}
        labels = {f"{s}/{g}" if len(gens) > 1 else s: (s, g) for s in sides for g in gens}
        try:
            for name, root in sides.items():
                procs[name] = _serve(root, data, work / f"{name}.log", distributed, side_env[name])
            rows: dict[str, dict[str, dict[int, list[dict[str, Any]]]]] = {
                s: {m: {lv: [] for lv in levels} for m in modes} for s in labels}
            for r in range(args.rounds):
                for m in modes:
                    for lv in levels:
                        order = list(labels) if (r + lv) % 2 == 0 else list(reversed(labels))
                        for s in order:
                            side, gen = labels[s]
                            row = level_fns[gen](procs[side][1], key, "eval", queries, m, max(args.n, 2 * lv), lv,
                                                 10, server_pids=[procs[side][0].pid])
                            rows[s][m][lv].append(row)
                            print(f"round {r} {m:7} {lv:2} {s:4}: {row['rps']:7.1f} req/s  p50 "
                                  f"{row['p50'] * 1000:7.1f} ms  p95 {row['p95'] * 1000:7.1f} ms  "
                                  f"server {row['server_cpu_per_request'] * 1000:5.2f} ms CPU/req  "
                                  f"generator {row['client_cpu_per_request'] * 1000:5.2f}  "
                                  f"non-200 {row['non_200']}  load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            stop_processes([p for p, _ in procs.values()], timeout_s=30)
            if distributed is not None:
                from scopekb_bench.stack import cleanup

                print(f"cleaned up {cleanup(distributed, run)}", flush=True)
        for name in sides:  # urllib3 drops a connection its pool has no room for, and says so (issue 20)
            text = (work / f"{name}.log").read_text(errors="replace")
            print(f"{name}: 'Connection pool is full' warnings in its log: {text.count('Connection pool is full')}")
    out: dict[str, Any] = {}
    for s in labels:
        agg = {m: {lv: {"rps": sum(x["rps"] for x in rs) / len(rs),
                        "server_cpu_per_request": sum(x["server_cpu_per_request"] for x in rs) / len(rs),
                        "client_cpu_per_request": sum(x["client_cpu_per_request"] for x in rs) / len(rs),
                        "p50": summary([x["p50"] for x in rs])["p50"],
                        "p95": summary([x["p95"] for x in rs])["p50"]} for lv, rs in d.items()}
               for m, d in rows[s].items()}
        out[s] = {"levels": agg, "raw": rows[s]}
        line = [f"{s}:"]
        if "keyword" in agg and {8, 32} <= set(agg["keyword"]):
            line.append(f"keyword rps 32/8 = {agg['keyword'][32]['rps'] / agg['keyword'][8]['rps']:.2f}")
        if "hybrid" in agg and {1, 32} <= set(agg["hybrid"]):
            line.append(f"hybrid p95@32 / p50@1 = {agg['hybrid'][32]['p95'] / agg['hybrid'][1]['p50']:.1f}")
        print("  ".join(line))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
