"""Exact-search and symbol-lookup latency on the large repository, each against ``git grep`` on the same checkout.

Runs after the keyword-only full index (OpenSearch): :func:`scopekb.search.run_search` in this process against the
same chunk store the query service uses (the ``wildcard`` candidate filter plus the line verification; no HTTP),
and ``git grep`` in a checkout of the same commit (one process per query, as an agent's shell would run it).

- exact: substrings of 6-20 characters cut from random lines of the indexed Python files (seeded), searched
  case-sensitively for up to ``max_results`` (the service's cap, 50) chunks; baseline ``git grep -n -F``;
- symbol: names of functions and classes defined in those files (``ast``), searched exactly; baseline
  ``git grep -n -E '(def|class) NAME\\b'``, the grep an agent would write for a definition.
"""

from __future__ import annotations

import ast
import random
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch

from scopekb.models import SearchMode, SearchRequest
from scopekb.search import run_search
from scopekb.settings import QuerySettings
from scopekb.stores.base import ScopeFilter
from scopekb.stores.opensearch import OpenSearchChunkStore


def _checkout(bare: Path, commit: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(bare), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "add", "-A"], check=True)
    return dest


def _samples(tree: Path, n: int, seed: int = 22) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    files = sorted(tree.rglob("*.py"))
    lines: list[str] = []
    names: set[str] = set()
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        lines.extend(x for x in text.split("\n") if len(x.strip()) >= 20)
        try:
            names.update(d.name for d in ast.walk(ast.parse(text))
                         if isinstance(d, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))
        except SyntaxError:
            continue
    subs = []
    while len(subs) < n and lines:
        line = rng.choice(lines).strip()
        size = rng.randint(6, 20)
        start = rng.randrange(0, max(1, len(line) - size))
        subs.append(line[start:start + size])
    return subs, rng.sample(sorted(names), min(n, len(names)))


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(client: OpenSearch, alias: str, agent: str, context: str, bare: Path, commit: str, workdir: Path,
            n: int) -> dict[str, Any]:
    """Seconds per query of scopekb's exact and symbol search and of the ``git grep`` baselines (lists), with
    the sample sizes; ``n`` queries of each kind, scopekb and git grep interleaved."""
    tree = _checkout(bare, commit, workdir / "textsearch-checkout")
    subs, names = _samples(tree, n)
    store = OpenSearchChunkStore(client, alias=alias)
    scope = ScopeFilter(agent, (context,))
    cfg = QuerySettings()
    out: dict[str, Any] = {"exact": [], "grep_f": [], "symbol": [], "grep_def": [], "exact_hits": 0,
                           "symbol_hits": 0, "queries": len(subs), "names": len(names)}

    def grep(*args: str) -> None:
        subprocess.run(["git", "-C", str(tree), "grep", "-n", *args], capture_output=True, check=False)

    for s in subs:
        req = SearchRequest(query=s, mode=SearchMode.exact, max_results=cfg.max_results_cap)
        t0 = time.perf_counter()
        resp = run_search(store, req, scope, cfg)
        out["exact"].append(time.perf_counter() - t0)
        out["exact_hits"] += len(resp.hits)
        out["grep_f"].append(_timed(lambda s=s: grep("-F", "-e", s)))
    for name in names:
        req = SearchRequest(query=name, mode=SearchMode.symbol, max_results=10)
        t0 = time.perf_counter()
        resp = run_search(store, req, scope, cfg)
        out["symbol"].append(time.perf_counter() - t0)
        out["symbol_hits"] += int(bool(resp.hits))
        out["grep_def"].append(_timed(lambda name=name: grep("-E", "-e", f"(def|class) {name}\\b")))
    subprocess.run(["rm", "-rf", str(tree)], check=False)
    return out


def p50(xs: list[float]) -> float:
    """Median seconds (NaN for no sample)."""
    return statistics.median(xs) if xs else float("nan")
