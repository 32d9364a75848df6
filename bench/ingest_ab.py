"""Keyword ingest against ``helpers.bulk``, side by side, with what OpenSearch was asked to do (issue 20; not a
test): per round a fresh keyword-only stack (ingester, query service, worker) indexes the large repository's first
release from a signed push until the probe search finds it, exactly as ``bench/run``'s keyword phase does
(:func:`scopekb_bench.pipeline.measured_push`), and ``helpers.bulk`` loads the same documents into a fresh index
(:mod:`scopekb_bench.baseline_bulk`); the sides run in alternating order. With ``--base`` a second pipeline side
runs another checkout's code (its ``shared``, ``services``, ``workers`` and ``cli`` first on ``PYTHONPATH``).

    .venv/bin/python bench/ingest_ab.py [--rounds 3] [--base /path/to/old/checkout] [--profile quick|full]

Around each side it reads the node's ``_nodes/stats`` (indexing, refresh, flush, merge, search, get counters and
their times, thread pool completions, process CPU) and prints the differences, and for a pipeline side the
worker's log steps (POST to ``sync_started``, the plan, chunk-and-write, the end). Uses the services of the
environment (``SCOPEKB_OPENSEARCH__URL`` ...), as ``bench/run --no-start`` does; deletes what each round made.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "shared"), str(REPO / "services"), str(REPO / "workers"),
                str(REPO / "cli")]

#: ``_nodes/stats`` counters compared per side: (label, path in a node's stats).
COUNTERS = [
    ("cpu_ms", ("process", "cpu", "total_in_millis")),
    ("index_ops", ("indices", "indexing", "index_total")),
    ("index_ms", ("indices", "indexing", "index_time_in_millis")),
    ("refreshes", ("indices", "refresh", "total")),
    ("refresh_ms", ("indices", "refresh", "total_time_in_millis")),
    ("ext_refreshes", ("indices", "refresh", "external_total")),
    ("flushes", ("indices", "flush", "total")),
    ("merges", ("indices", "merges", "total")),
    ("merge_ms", ("indices", "merges", "total_time_in_millis")),
    ("merge_docs", ("indices", "merges", "total_docs")),
    ("searches", ("indices", "search", "query_total")),
    ("search_ms", ("indices", "search", "query_time_in_millis")),
    ("gets", ("indices", "get", "total")),
    ("get_ms", ("indices", "get", "time_in_millis")),
    ("write_tasks", ("thread_pool", "write", "completed")),
    ("search_tasks", ("thread_pool", "search", "completed")),
    ("get_tasks", ("thread_pool", "get", "completed")),
    ("refresh_tasks", ("thread_pool", "refresh", "completed")),
    ("mgmt_tasks", ("thread_pool", "management", "completed")),
    ("segments", ("indices", "segments", "count")),
    ("gc_young_ms", ("jvm", "gc", "collectors", "young", "collection_time_in_millis")),
    ("gc_old_ms", ("jvm", "gc", "collectors", "old", "collection_time_in_millis")),
]


def node_stats(client: Any) -> dict[str, float]:
    """The :data:`COUNTERS` summed over the cluster's nodes."""
    res = client.nodes.stats(metric="indices,process,thread_pool,jvm")
    out = dict.fromkeys((k for k, _ in COUNTERS), 0.0)
    for node in res["nodes"].values():
        for label, path in COUNTERS:
            v: Any = node
            for p in path:
                v = (v or {}).get(p)
            out[label] += float(v or 0)
    return out


def index_breakdown(client: Any, pattern: str) -> dict[str, dict[str, float]]:
    """Per index matching ``pattern``: index ops, refreshes (and external), gets, searches, merges."""
    res = client.indices.stats(index=pattern, metric="indexing,refresh,get,search,merge,flush",
                               params={"expand_wildcards": "all"})
    out = {}
    for name, st in res.get("indices", {}).items():
        t = st["total"]
        out[name] = {"index_ops": t["indexing"]["index_total"], "refreshes": t["refresh"]["total"],
                     "ext_refreshes": t["refresh"]["external_total"], "gets": t["get"]["total"],
                     "searches": t["search"]["query_total"], "merges": t["merges"]["total"],
                     "flushes": t["flush"]["total"]}
    return out


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in d.items()}


def diff(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a}


def _ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def worker_steps(log_path: Path, job_id: str, posted_at: float) -> dict[str, float]:
    """Seconds from the POST (``posted_at``, epoch) to the worker log's ``sync_started``, ``sync_planned`` and
    ``sync_finished`` of ``job_id``."""
    out: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{") or job_id not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        ev = rec.get("event")
        if ev in ("sync_started", "sync_planned", "sync_finished") and ev not in out:
            out[ev] = _ts(rec["timestamp"]) - posted_at
    return out


def pipeline_side(c: Any, name: str, pythonpath: str | None, bare: Path, commit: str, probe: str,
                  workdir: Path, logs: Path, docs_out: Path | None,
                  settings: dict[str, str] | None = None) -> dict[str, Any]:
    from scopekb_bench import pipeline
    from scopekb_bench.main import _warm_up
    from scopekb_bench.stack import ZERO, Stack, cleanup, new_admin_token, stack_env

    run_id = f"ab{int(time.time() * 1000) % 10**9}"
    env = stack_env(c["endpoints"], run_id, name, workdir, "none", new_admin_token())
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(settings or {})
    st = Stack(name, env, logs)
    client = c["client"]
    try:
        st.start()
        _warm_up(st, workdir, run_id, name)
        _src, key = st.register("bench", "large", bare, "bench/large")
        client.indices.refresh(index="_all")
        s0 = node_stats(client)
        i0 = index_breakdown(client, f"bench-{run_id}-*")
        posted = time.time()
        push = pipeline.measured_push(st, client, bare, "bench/large", ZERO, commit, f"bench-{run_id}-full", key,
                                      "large", probe=probe)
        s1 = node_stats(client)
        i1 = index_breakdown(client, f"bench-{run_id}-*")
        steps = worker_steps(logs / f"{name}-worker.log", push.job["id"], posted)
        steps |= {"job_seen": push.job_seconds, "searchable": push.seconds,
                  "probe_searches": push.extra.get("probe_searches", 0)}
        again = []
        for _ in range(2):  # the same probe once more: what one search costs once the first has run
            t = time.perf_counter()
            pipeline.search_hits(st, key, probe, "large")
            again.append(round(time.perf_counter() - t, 3))
        steps["probe_again"] = again
        if docs_out is not None:
            pipeline.export_docs(client, env["SCOPEKB_OPENSEARCH__ALIAS"], docs_out, "bench", "large")
        per_index = {k.replace(f"bench-{run_id}-", ""): diff(i0.get(k, dict.fromkeys(v, 0)), v)
                     for k, v in i1.items()}
        return {"seconds": push.seconds, "job_seconds": push.job_seconds, "chunks": push.job["chunks_written"],
                "worker_cpu_s": push.worker_cpu_s, "node": diff(s0, s1), "per_index": per_index, "steps": steps}
    finally:
        st.stop()
        cleanup(c["endpoints"], run_id)


def baseline_side(c: Any, docs: Path) -> dict[str, Any]:
    from scopekb_bench import pipeline

    client = c["client"]
    index = f"bench-ab{int(time.time() * 1000) % 10**9}-baseline"
    try:
        s0 = node_stats(client)
        base = pipeline.baseline_bulk(client, c["endpoints"]["SCOPEKB_OPENSEARCH__URL"], index, docs, None,
                                      4 * 1024 * 1024)
        s1 = node_stats(client)
        return {"seconds": base["seconds"], "chunks": base["documents"], "client_cpu_s": base["cpu_seconds"],
                "node": diff(s0, s1)}
    finally:
        client.indices.delete(index=index, params={"ignore_unavailable": "true"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", type=Path, help="another checkout whose code runs a second pipeline side")
    ap.add_argument("--profile", choices=("quick", "full"), default="quick")
    ap.add_argument("--out", type=Path, help="write every round's figures here as JSON")
    ap.add_argument("--docs", type=Path, help="the baseline's documents (JSON lines); written by the first pipeline "
                    "side when the file does not exist, so a later run can start with the baseline")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="one more pipeline side: this checkout's code with these settings in the stack's environment")
    ap.add_argument("--first", choices=("new", "baseline", "base"), help="side of the first round to run first")
    args = ap.parse_args()

    from opensearchpy import OpenSearch
    from scopekb_bench import corpus
    from scopekb_bench.profiles import FULL, QUICK
    from scopekb_bench.services import endpoint_env
    from scopekb_bench.util import log

    endpoints = endpoint_env()
    profile = QUICK if args.profile == "quick" else FULL
    pkg, versions, prefer = profile.large
    built = corpus.release_repo(pkg, list(versions), prefer)
    client = OpenSearch(hosts=[endpoints["SCOPEKB_OPENSEARCH__URL"]], timeout=120)
    c = {"endpoints": endpoints, "client": client}
    variants = {v.split(":", 1)[0]: dict(kv.split("=", 1) for kv in v.split(":", 1)[1].split(","))
                for v in args.variant}
    sides = ["new", "baseline"] + (["base"] if args.base else []) + list(variants)
    base_path = (os.pathsep.join(str(args.base / d) for d in ("shared", "services", "workers", "cli", "bench"))
                 if args.base else None)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ingest-ab-") as tmp:
        work = Path(tmp)
        bare = built.clone_bare(work / "large.git")
        docs = args.docs or work / "docs.jsonl"
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else list(reversed(sides))
            if r == 0 and args.first:
                order = [args.first, *[s for s in order if s != args.first]]
            if not docs.exists():  # the baseline needs the pipeline's documents: the first round starts with them
                order = ["new", *[s for s in order if s != "new"]]
            for side in order:
                load = os.getloadavg()[0]
                wd = work / f"r{r}-{side}"
                wd.mkdir()
                if side == "baseline":
                    out = baseline_side(c, docs)
                else:
                    out = pipeline_side(c, f"kw{side}{r}", base_path if side == "base" else None, bare,
                                        built.releases[0], pkg, wd, work / "logs",
                                        docs if not docs.exists() else None, variants.get(side))
                out |= {"round": r, "side": side, "load": load}
                rows.append(out)
                n = out["node"]
                log(f"round {r} {side}: {out['chunks']} chunks in {out['seconds']:.2f} s (load {load:.1f}); "
                    f"OpenSearch cpu {n['cpu_ms'] / 1000:.2f} s, index {n['index_ops']:.0f} ops "
                    f"{n['index_ms']:.0f} ms, refresh {n['refreshes']:.0f} ({n['ext_refreshes']:.0f} ext) "
                    f"{n['refresh_ms']:.0f} ms, merges {n['merges']:.0f} {n['merge_ms']:.0f} ms, searches "
                    f"{n['searches']:.0f}, gets {n['gets']:.0f}, write tasks {n['write_tasks']:.0f}, "
                    f"segments {n['segments']:+.0f}, gc {n['gc_young_ms'] + n['gc_old_ms']:.0f} ms"
                    + (f"; steps {json.dumps(_rounded(out['steps']))}" if "steps" in out else ""))
                if "per_index" in out:
                    for idx, v in sorted(out["per_index"].items()):
                        if any(v.values()):
                            log(f"    {idx}: " + ", ".join(f"{k} {x:.0f}" for k, x in v.items() if x))
    print(f"\n{'side':<10}{'median s':>10}{'ratio':>8}{'os cpu s':>10}{'refreshes':>10}{'merges':>8}{'gets':>6}"
          f"{'searches':>9}")
    med_base = statistics.median(x["seconds"] for x in rows if x["side"] == "baseline")
    for side in sides:
        xs = [x for x in rows if x["side"] == side]
        m = statistics.median(x["seconds"] for x in xs)
        print(f"{side:<10}{m:>10.2f}{med_base / m:>8.3f}"
              f"{statistics.median(x['node']['cpu_ms'] for x in xs) / 1000:>10.2f}"
              f"{statistics.median(x['node']['refreshes'] for x in xs):>10.0f}"
              f"{statistics.median(x['node']['merges'] for x in xs):>8.0f}"
              f"{statistics.median(x['node']['gets'] for x in xs):>6.0f}"
              f"{statistics.median(x['node']['searches'] for x in xs):>9.0f}")
    per_round = [(r, {x["side"]: x["seconds"] for x in rows if x["round"] == r}) for r in range(args.rounds)]
    for r, s in per_round:
        print(f"round {r}: " + ", ".join(f"{k} {s['baseline'] / v:.3f}" for k, v in s.items() if k != "baseline"))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
