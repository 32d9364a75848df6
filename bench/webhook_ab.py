"""A/B of the ingester's push webhook (issue 20; not a test): the bare FastAPI endpoint and one ingester per
checkout (this one, and ``--base``'s code when given: its ``shared``, ``services``, ``workers`` and ``cli`` folders
first on ``PYTHONPATH``), on the running services (``SCOPEKB_OPENSEARCH__URL``, ``SCOPEKB_REDIS__URL``), loaded
in alternating order round by round, so every side sees the same machine load.

    .venv/bin/python bench/webhook_ab.py [--base /path/to/old/checkout] [--n 600] [--rounds 3] \
        [--generators single,pooled] [--kind accepted|duplicate|unknown|noevent] [--pyspy PATH]

Every request is a distinct, correctly signed GitHub push for a source registered here (a queue nobody consumes;
the run's keys, queue and indices are deleted at the end), ``--concurrency`` in flight
(:func:`scopekb_bench.webhook.run_load`). Prints per round and side: p50/p99, requests/s, the server's CPU per request
(utime + stime from ``/proc`` ÷ requests) and the generator's; then the medians of the rounds and each side's
p50 ÷ the bare p50 and CPU per request ÷ the bare CPU per request.
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path)
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--generators", default="single")
    ap.add_argument("--kind", default="accepted", choices=("accepted", "duplicate", "unknown", "noevent"),
                    help="what the ingesters get (the bare app always the accepted pushes): distinct pushes, one "
                    "delivery repeated (200 duplicate after the first), an unknown provider's route (404), or the "
                    "pushes without their event header (400 after the body is read and handed to a thread)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--pyspy", type=Path, help="py-spy binary: record each ingester during its first load "
                    "(raw collapsed stacks next to the logs)")
    args = ap.parse_args()

    from scopekb_bench import webhook
    from scopekb_bench.stack import WEBHOOK_SECRET, cleanup, free_port, new_admin_token, stack_env
    from scopekb_bench.util import log, stop_processes, summary

    from scopekb import ops
    from scopekb.models import SourceCreate
    from scopekb.runtime import build_control_runtime
    from scopekb.settings import Settings

    endpoints = {k: v for k, v in os.environ.items() if k.startswith(("SCOPEKB_OPENSEARCH__", "SCOPEKB_REDIS__",
                                                                     "SCOPEKB_S3__"))}
    run_id = "whab" + uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix="webhook-ab-"))
    env = stack_env(endpoints, run_id, "wh", tmp, "none", new_admin_token(), queue=f"bench-{run_id}-whload")
    repo = tmp / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    repo_name = f"bench/{run_id}"
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        rt = build_control_runtime(Settings())
        ops.register_source(rt, SourceCreate(agent_name="bench", context_id="wh", repo_url=str(repo), ref="main",
                                             repo_name=repo_name, webhook_secret=WEBHOOK_SECRET))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    sides: dict[str, dict[str, Any]] = {}
    procs: list[subprocess.Popen[bytes]] = []
    handles = []

    def start(name: str, cmd: list[str], root: Path, url: str, e: dict[str, str]) -> None:
        fh = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed at the end
        handles.append(fh)
        p = subprocess.Popen(cmd, env={**e, "PYTHONPATH": _pythonpath(root)}, stdout=fh, stderr=subprocess.STDOUT,
                             cwd=root)
        procs.append(p)
        webhook.wait_ready(url, p)
        sides[name] = {"pid": p.pid, "url": url}

    try:
        port = free_port()
        start("bare", [sys.executable, "-m", "uvicorn", "scopekb_bench.bare_webhook:app", "--host", "127.0.0.1",
                       "--port", str(port), "--log-level", "warning", "--no-access-log",
                       *webhook.bare_server_args()], REPO, f"http://127.0.0.1:{port}/webhooks/github",
              {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")})
        roots = {"head": REPO} | ({"base": args.base.resolve()} if args.base else {})
        for name, root in roots.items():
            port = free_port()
            start(name, [sys.executable, "-m", "scopekb_cli.main", "serve", "ingester", "--port", str(port)], root,
                  f"http://127.0.0.1:{port}/webhooks/github", env)
        batch = webhook.push_batches(repo_name, str(repo), f"bench-{run_id}")

        gens = args.generators.split(",")
        for s in sides.values():  # warm-up
            webhook.run_load(s["url"], batch(50), args.concurrency, s["pid"], gens[0])
        rows: list[dict[str, Any]] = []
        order = list(sides)
        for rnd in range(args.rounds):
            seq = order if rnd % 2 == 0 else order[::-1]
            la = os.getloadavg()[0]
            for gen in gens:
                for name in seq:
                    spy = None
                    if args.pyspy and rnd == 0 and name != "bare":
                        spy = subprocess.Popen([str(args.pyspy), "record", "--pid", str(sides[name]["pid"]), "-r",
                                                "200", "--threads", "-f", "raw", "-o",
                                                str(tmp / f"pyspy-{name}-{gen}.txt")], stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL)
                        time.sleep(1.0)
                    url, reqs = sides[name]["url"], batch(args.n)
                    if name != "bare" and args.kind == "duplicate":
                        reqs = [reqs[0]] * len(reqs)
                    elif name != "bare" and args.kind == "noevent":
                        reqs = [(b, {k: v for k, v in h.items() if k != "X-GitHub-Event"}) for b, h in reqs]
                    elif name != "bare" and args.kind == "unknown":
                        url = url.replace("/webhooks/github", "/webhooks/nope")
                    r = webhook.run_load(url, reqs, args.concurrency, sides[name]["pid"],
                                         gen)
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        spy.wait(timeout=30)
                    s = summary(r["latencies"])
                    row = {"round": rnd, "side": name, "generator": gen, "load": la, "p50_ms": s["p50"] * 1000,
                           "p99_ms": s["p99"] * 1000, "rps": r["rps"], "non_202": r["non_202"],
                           "server_cpu_ms": r["server_cpu_per_request"] * 1000,
                           "client_cpu_ms": r["client_cpu_per_request"] * 1000}
                    rows.append(row)
                    log(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        print(f"\nmedians over {args.rounds} rounds, {args.n} requests a round, {args.concurrency} in flight; "
              f"load average now {os.getloadavg()[0]:.1f}")
        print("| generator | side | p50 ms | p99 ms | req/s | server CPU ms/req | generator CPU ms/req | p50 ÷ bare "
              "| CPU ÷ bare |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for gen in gens:
            med = {name: {k: statistics.median(r[k] for r in rows if r["side"] == name and r["generator"] == gen)
                          for k in ("p50_ms", "p99_ms", "rps", "server_cpu_ms", "client_cpu_ms")} for name in sides}
            for name in sides:
                m, b = med[name], med["bare"]
                print(f"| {gen} | {name} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['rps']:.0f} | "
                      f"{m['server_cpu_ms']:.2f} | {m['client_cpu_ms']:.2f} | {m['p50_ms'] / b['p50_ms']:.2f} | "
                      f"{m['server_cpu_ms'] / b['server_cpu_ms']:.2f} |")
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
    finally:
        stop_processes(procs)
        for fh in handles:
            fh.close()
        log(f"cleanup: {cleanup(endpoints, run_id)}; logs in {tmp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
