"""Name lookups against hybrid weights (a development tool; docs/search.md, "Hybrid weights").

Queries are the names of definitions that occur once in a repository's Python files (``ast``; at least six
characters, no dunder), the relevant chunk the one holding the definition's line. Each query is searched 40 deep by
keyword and by vector in an existing embedded index, and NDCG@10 is printed for keyword, vector, min-max fusion at
0.3/0.7, 0.5/0.5, 0.7/0.3, and RRF. ``--words`` searches ``snake_case`` names as their words instead.

    SCOPEKB_HOME=/tmp/x scopekb index /path/to/repo --agent me --context main
    SCOPEKB_HOME=/tmp/x python bench/name_probe.py /path/to/repo --agent me --context main --seed 7
"""

from __future__ import annotations

import argparse
import ast
import math
import random
from pathlib import Path

from scopekb import scoring
from scopekb.runtime import build_embedded_runtime
from scopekb.settings import get_settings
from scopekb.stores.base import ScopeFilter, SearchFilter


def names(root: Path, words: bool) -> list[tuple[str, tuple[str, int]]]:
    """``(query, (path, line))`` of every definition whose name occurs once in ``root``'s ``*.py`` files."""
    defs: dict[str, list[tuple[str, int]]] = {}
    for p in sorted(root.rglob("*.py")):
        if any(part.startswith(".") or part in ("tests", "node_modules") for part in p.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs.setdefault(n.name, []).append((str(p.relative_to(root)), n.lineno))
    out = [(k, v[0]) for k, v in defs.items() if len(v) == 1 and len(k) >= 6 and not k.startswith("__")]
    if words:
        out = [(k.strip("_").replace("_", " "), v) for k, v in out if k.strip("_").count("_") >= 1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--agent", required=True)
    ap.add_argument("--context", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sample", type=int, default=250)
    ap.add_argument("--words", action="store_true")
    a = ap.parse_args()
    qs = names(a.root, a.words)
    random.Random(a.seed).shuffle(qs)
    qs = qs[:a.sample]
    rt = build_embedded_runtime(get_settings())
    flt = SearchFilter(scope=ScopeFilter(a.agent, (a.context,)))
    res: dict[str, list[float]] = {}
    for q, (path, line) in qs:
        kw = rt.chunks.keyword_search(q, flt, 40)
        vh = rt.chunks.vector_search(rt.embed_query(q), flt, 40)
        docs = {i: d for i, _, d in kw + vh}
        kl, vl = [(i, s) for i, s, _ in kw], [(i, s) for i, s, _ in vh]
        for label, ranked in (("keyword", kl), ("vector", vl),
                              ("hybrid 0.3/0.7", scoring.weighted_fusion(kl, vl, .3, .7)),
                              ("hybrid 0.5/0.5", scoring.weighted_fusion(kl, vl, .5, .5)),
                              ("hybrid 0.7/0.3", scoring.weighted_fusion(kl, vl, .7, .3)),
                              ("rrf", scoring.rrf_fusion(kl, vl))):
            gain = next((1 / math.log2(r + 1) for r, (i, _) in enumerate(ranked[:10], 1)
                         if docs[i]["path"] == path and docs[i]["start_line"] <= line <= docs[i]["end_line"]), 0.0)
            res.setdefault(label, []).append(gain)
    print(f"{len(qs)} queries (seed {a.seed}{', as words' if a.words else ''})")
    for label, gains in res.items():
        print(f"{label:15s} NDCG@10 {sum(gains) / max(len(gains), 1):.3f}")


if __name__ == "__main__":
    main()
