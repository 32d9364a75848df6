"""Embedded mode next to the distributed path (issue 9), on the same large repository, keyword-only.

- Index throughput: :func:`scopekb.indexing.run_sync` in this process on the embedded runtime (SQLite chunk and
  record stores, blobs in a folder, no servers; :func:`scopekb.runtime.build_embedded_runtime`), from a cold mirror
  to a finished job, ÷ the distributed pipeline's chunks/s (webhook to searchable) measured earlier in the run.
- Search latency: :func:`scopekb.search.run_search` (keyword) in this process over the SQLite store ÷ the same call
  over the OpenSearch store the distributed path filled, same queries (first paragraphs of the repository's own
  docstrings), interleaved.
"""

from __future__ import annotations

import ast
import random
import subprocess
import time
from pathlib import Path
from typing import Any

from scopekb.evalsets import first_paragraph
from scopekb.indexing import run_sync
from scopekb.models import SearchMode, SearchRequest, Source
from scopekb.runtime import build_embedded_runtime
from scopekb.search import run_search
from scopekb.settings import QuerySettings, Settings
from scopekb.stores.base import ScopeFilter
from scopekb_bench.corpus import show
from scopekb_bench.util import log, summary


def docstring_queries(repo: Path, commit: str, n: int, seed: int = 3) -> list[str]:
    """First paragraphs (three words or more) of function docstrings in the repository's Python files."""
    names = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", commit], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    rng = random.Random(seed)
    py = [p for p in names if p.endswith(".py") and "test" not in p.lower()]
    rng.shuffle(py)
    out: list[str] = []
    for p in py:
        try:
            tree = ast.parse(show(repo, commit, p))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                q = first_paragraph(doc) if doc else ""
                if len(q.split()) >= 3 and len(q) < 1000:
                    out.append(q)
        if len(out) >= 4 * n:
            break
    rng.shuffle(out)
    return sorted(set(out[:n]), key=out.index)


def measure(workdir: Path, repo: Path, commit: str, os_store: Any, scope: ScopeFilter, n_queries: int
            ) -> dict[str, Any]:
    """Embedded index of ``commit`` (``main`` must point at it), then keyword search latency on both stores."""
    settings = Settings(profile="embedded", data_dir=workdir / "embedded", embedding={"provider": "none"},
                        log_level="WARNING", log_format="console")
    rt = build_embedded_runtime(settings)
    rt.chunks.ensure_index()
    src = Source(id="src_benchembedded", agent_name=scope.agent_name, context_id=(scope.context_ids or ("x",))[0],
                 repo_url=str(repo), ref="main", repo_name="bench/embedded")
    rt.records.put_source(src)
    t0 = time.perf_counter()
    job = run_sync(rt.sync_deps(), "bench-embedded", [src.id], trigger="bench")
    seconds = time.perf_counter() - t0
    log(f"embedded index: {job.chunks_written} chunks in {seconds:.1f} s ({job.state.value})")

    queries = docstring_queries(repo, commit, n_queries)
    cfg = QuerySettings()
    lat: dict[str, list[float]] = {"embedded": [], "distributed": []}
    for q in queries[:3]:  # warm-up
        for store in (rt.chunks, os_store):
            run_search(store, SearchRequest(query=q, mode=SearchMode.keyword, max_results=10), scope, cfg)
    for i, q in enumerate(queries):
        req = SearchRequest(query=q, mode=SearchMode.keyword, max_results=10)
        order = (("embedded", rt.chunks), ("distributed", os_store))
        for name, store in order if i % 2 == 0 else tuple(reversed(order)):
            t = time.perf_counter()
            run_search(store, req, scope, cfg)
            lat[name].append(time.perf_counter() - t)
    return {"chunks": job.chunks_written, "seconds": seconds, "state": job.state.value, "queries": len(queries),
            "latency": {k: summary(v) for k, v in lat.items()}}
