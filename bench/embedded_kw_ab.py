#!/usr/bin/env python3
"""Interleaved A/B of the embedded keyword search (issue 20; a development tool, not part of ``bench/run``).

``bench/run``'s ``embedded`` phase indexes django in embedded mode and times ``run_search`` (keyword, 10 hits) on
the SQLite store against the same call on the OpenSearch store, for 150 docstring queries
(:func:`scopekb_bench.embedded.docstring_queries`). This tool does the same on one cached embedded index of the
same repository and commit, but times two checkouts of scopekb on it - ``--base`` (default ``main``, its
``shared/`` unpacked by ``git archive``) and this working tree - plus ``run_search`` on an OpenSearch index of the
same documents (bulk-written from the SQLite store's documents, kept between runs) as the baseline. Each side runs
in its own worker process (``run_search`` timed inside the worker, so the pipe is not counted); queries go to the
sides one by one in a rotating order, so the machine's load hits every side alike. The two SQLite sides must
return the same hits with the same scores (checked on every query; a difference is printed and fails the run).

Usage::

    bench/embedded_kw_ab.py [--base main] [--queries 150] [--rounds 3] [--opensearch URL] [--no-opensearch]

The index is built once under ``.services/cache/embedded-kw-ab/`` (a full embedded sync, about two minutes).
Prints, per side, the median and range over rounds of the per-round p50 and p95 (ms) and the ratios to
OpenSearch and to the base, and the load average at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCOPE_AGENT, SCOPE_CONTEXT = "bench", "large"
ALIAS = "ekwab-kw-chunks"


# ---- worker (runs with one checkout's shared/ on sys.path) ---------------------------------------------------

def worker(spec: str) -> int:
    """Answer JSON lines ``{"q": query}`` on stdin with ``{"t": seconds of run_search, "hits": [[path, start,
    end, score]]}``. ``spec``: ``sqlite:<path>`` or ``opensearch:<url>``."""
    from scopekb.models import SearchMode, SearchRequest
    from scopekb.search import run_search
    from scopekb.settings import QuerySettings
    from scopekb.stores.base import ScopeFilter

    kind, _, arg = spec.partition(":")
    if kind == "sqlite":
        from scopekb.stores.sqlite import SqliteChunkStore
        store: Any = SqliteChunkStore(Path(arg), dimension=None)
    else:
        from opensearchpy import OpenSearch

        from scopekb.stores.opensearch import OpenSearchChunkStore
        store = OpenSearchChunkStore(OpenSearch(hosts=[arg], timeout=60), alias=ALIAS, dimension=None)
    scope, cfg = ScopeFilter(SCOPE_AGENT, (SCOPE_CONTEXT,)), QuerySettings()
    for line in sys.stdin:
        q = json.loads(line)["q"]
        req = SearchRequest(query=q, mode=SearchMode.keyword, max_results=10)
        t = time.perf_counter()
        resp = run_search(store, req, scope, cfg)
        dt = time.perf_counter() - t
        hits = [[h.path, h.start_line, h.end_line, h.score] for h in resp.hits]
        sys.stdout.write(json.dumps({"t": dt, "hits": hits}) + "\n")
        sys.stdout.flush()
    return 0


class Side:
    """One worker process: ``ask(query)`` -> (seconds, hits)."""

    def __init__(self, name: str, shared: Path, spec: str) -> None:
        self.name = name
        env = dict(os.environ, PYTHONPATH=str(shared), HF_HUB_OFFLINE="1")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", spec], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def ask(self, q: str) -> tuple[float, list[list[Any]]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"q": q}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} ended")
        d = json.loads(line)
        return d["t"], d["hits"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ---- setup ---------------------------------------------------------------------------------------------------

def build_index(data: Path) -> tuple[Path, list[str]]:
    """The cached embedded index of django 4.2.13 (as bench/run's ``embedded`` phase builds it) and the bench's
    query set."""
    sys.path[:0] = [str(ROOT / "shared"), str(ROOT / "bench")]
    from scopekb_bench.corpus import release_repo
    from scopekb_bench.embedded import docstring_queries
    from scopekb_bench.profiles import FULL

    from scopekb.indexing import run_sync
    from scopekb.models import Source
    from scopekb.runtime import build_embedded_runtime
    from scopekb.settings import Settings

    pkg, versions, prefer = FULL.large
    built = release_repo(pkg, list(versions), prefer)
    commit = built.releases[0]
    db = data / "embedded" / "index.sqlite3"
    done = data / "done.json"
    if not done.is_file():
        import shutil
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        bare = built.clone_bare(data / "repo.git")
        subprocess.run(["git", "-C", str(bare), "update-ref", "refs/heads/main", commit], check=True)
        settings = Settings(profile="embedded", data_dir=data / "embedded", embedding={"provider": "none"},
                            log_level="WARNING", log_format="console")
        rt = build_embedded_runtime(settings)
        rt.chunks.ensure_index()
        src = Source(id="src_benchembedded", agent_name=SCOPE_AGENT, context_id=SCOPE_CONTEXT, repo_url=str(bare),
                     ref="main", repo_name="bench/embedded")
        rt.records.put_source(src)
        t0 = time.perf_counter()
        job = run_sync(rt.sync_deps(), "bench-embedded", [src.id], trigger="bench")
        print(f"embedded index: {job.chunks_written} chunks in {time.perf_counter() - t0:.1f} s ({job.state.value})",
              flush=True)
        done.write_text(json.dumps({"commit": commit, "chunks": job.chunks_written}))
    queries = docstring_queries(Path(built.path), commit, FULL.query_n)
    return db, queries


def fill_opensearch(url: str, db: Path) -> None:
    """The SQLite store's documents bulk-written into ``ALIAS`` on ``url`` (skipped when it already holds them)."""
    from opensearchpy import OpenSearch

    from scopekb.stores.opensearch import OpenSearchChunkStore
    from scopekb.stores.sqlite import SqliteChunkStore

    src = SqliteChunkStore(db, dimension=None)
    n = src.count()
    client = OpenSearch(hosts=[url], timeout=300)
    store = OpenSearchChunkStore(client, alias=ALIAS, dimension=None)
    try:
        have = int(client.count(index=ALIAS)["count"])
    except Exception:  # noqa: BLE001 - missing index
        have = -1
    if have == n:
        return
    if have >= 0:
        client.indices.delete(index=store.version_name, params={"ignore_unavailable": "true"})
    store.ensure_index()
    docs = src.stored_documents()
    t0 = time.perf_counter()
    for i in range(0, len(docs), 5000):
        store.bulk_write(docs[i:i + 5000])
    store.refresh()
    print(f"opensearch: {len(docs)} documents in {time.perf_counter() - t0:.1f} s", flush=True)
    src.close()


def base_checkout(rev: str, dest: Path) -> Path:
    """``shared/`` of ``rev`` unpacked into ``dest`` (no worktree)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "shared"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "shared"


def pct(v: list[float], p: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--base", default="main", help="git revision of the base side (default main)")
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--opensearch", default=os.environ.get("SCOPEKB_OPENSEARCH__URL", ""))
    ap.add_argument("--no-opensearch", action="store_true")
    ap.add_argument("--data", type=Path, default=ROOT / ".services" / "cache" / "embedded-kw-ab")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)

    db, queries = build_index(args.data)
    queries = queries[:args.queries]
    tmp = Path(tempfile.mkdtemp(prefix="ekwab-"))
    base_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True,
                              text=True, check=True).stdout.strip()
    sides = [Side(f"base {base_rev}", base_checkout(args.base, tmp), f"sqlite:{db}"),
             Side("this tree", ROOT / "shared", f"sqlite:{db}")]
    if args.opensearch and not args.no_opensearch:
        fill_opensearch(args.opensearch, db)
        sides.append(Side("opensearch", ROOT / "shared", f"opensearch:{args.opensearch}"))
    print(f"{len(queries)} queries × {args.rounds} rounds, sides: {', '.join(s.name for s in sides)}", flush=True)
    for q in queries[:5]:  # warm-up
        for s in sides:
            s.ask(q)
    per_round: dict[str, list[tuple[float, float]]] = {s.name: [] for s in sides}
    ratio_q: dict[str, list[float]] = {s.name: [] for s in sides}
    bad = 0
    for r in range(args.rounds):
        lat: dict[str, list[float]] = {s.name: [] for s in sides}
        for i, q in enumerate(queries):
            k = (i + r) % len(sides)
            got = {}
            for s in sides[k:] + sides[:k]:
                t, hits = s.ask(q)
                lat[s.name].append(t)
                got[s.name] = hits
            if got[sides[0].name] != got[sides[1].name]:
                bad += 1
                if bad <= 3:
                    print(f"DIFFERENT HITS for {q!r}:\n  base {got[sides[0].name]}\n  this {got[sides[1].name]}")
            if len(sides) > 2:
                for s in sides[:2]:
                    ratio_q[s.name].append(lat[s.name][-1] / lat[sides[2].name][-1])
        for s in sides:
            per_round[s.name].append((statistics.median(lat[s.name]), pct(lat[s.name], 95)))
        print(f"round {r + 1}: " + ", ".join(f"{n} p50 {statistics.median(v) * 1000:.2f} ms" for n, v in lat.items()),
              flush=True)
    for s in sides:
        s.close()

    def fmt(vals: list[float]) -> str:
        return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"

    print("\nside | p50 ms median (range over rounds) | p95 ms | p50 ÷ OpenSearch p50 | p50 ÷ base p50")
    os_name = sides[2].name if len(sides) > 2 else None
    for s in sides:
        p50 = [a * 1000 for a, _ in per_round[s.name]]
        p95 = [b * 1000 for _, b in per_round[s.name]]
        vs_os = fmt([a / o for (a, _), (o, _) in zip(per_round[s.name], per_round[os_name], strict=True)]) \
            if os_name else "-"
        vs_base = fmt([a / o for (a, _), (o, _) in zip(per_round[s.name], per_round[sides[0].name], strict=True)])
        print(f"{s.name} | {fmt(p50)} | {fmt(p95)} | {vs_os} | {vs_base}")
    if os_name:
        for s in sides[:2]:
            print(f"{s.name}: median of per-query ratios to OpenSearch {statistics.median(ratio_q[s.name]):.2f}")
    print(f"hit lists different between base and this tree: {bad} of {len(queries) * args.rounds}")
    print(f"load average at the end: {os.getloadavg()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
