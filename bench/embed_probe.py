#!/usr/bin/env python3
"""Offline probe of what the embedder sees (issue 21, third round; development tool, not part of ``bench/run``).

Chunks a quality set's docstring-free files as the indexer does (``chunk_document`` with the MiniLM counter),
embeds each chunk's text of every header *variant* with the local model (vectors cached by text in
``.services/cache/rank-exp/embcache.sqlite3``, the cache of ``bench/rank_experiments.py``), ranks every chunk by
exact cosine for every query (as the SQLite store does), and reports vector NDCG@10; hybrid and RRF are fused from
that vector list and the keyword list stored by ``rank_experiments.py search --variant base`` for the same set
(same chunk ids), each with the paired gain over the ``full`` header. The held-aside set is read only with
``--held-aside``.

Usage::

    bench/embed_probe.py --set tuning --variants full,lean
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rank_experiments as rx  # noqa: E402
from scopekb_bench import sets as bench_sets  # noqa: E402

from scopekb import evalsets, evaluation  # noqa: E402
from scopekb.chunking import chunk_document, counter_for_model, embedding_text  # noqa: E402
from scopekb.embedding.cache import SQLiteEmbeddingCache, text_sha  # noqa: E402
from scopekb.embedding.local import LocalEmbedder  # noqa: E402
from scopekb.settings import Settings  # noqa: E402


def lean(path: str, c, cfg, counter) -> str:  # noqa: ANN001
    """The ``lean`` header: symbol and kind, ``in`` the enclosing definition, ``file`` path (no limit check)."""
    h = [f"{c.symbol} ({c.kind})"] if c.symbol else []
    if c.metadata.get("context"):
        h.append(f"in {c.metadata['context']}")
    h.append(f"file {path}")
    return "\n".join(h) + "\n\n" + c.content


def sym(path: str, c, cfg, counter) -> str:  # noqa: ANN001
    """The ``sym`` view (fourth round): the symbol path and kind, then the chunk (its signature and docstring-free
    body); no file path, no enclosing definition."""
    return (f"{c.symbol} ({c.kind})\n\n" if c.symbol else "") + c.content


VARIANTS = {
    "sym": sym,
    "full": lambda p, c, cfg, n: embedding_text(p, "python", c, cfg.model_copy(update={"embed_header": "full"}), n),
    "words": lambda p, c, cfg, n: embedding_text(p, "python", c, cfg.model_copy(update={"embed_header": "words"}), n),
    "lean": lean,
    "nohdr": lambda p, c, cfg, n: c.content,
}


def _vectors(texts: list[str], emb: LocalEmbedder, cache: SQLiteEmbeddingCache) -> tuple[list[str], dict]:
    """``(sha of each text, {sha: vector})``, embedding (64 a batch) and caching the texts the cache lacks."""
    shas = [text_sha(t) for t in texts]
    got = cache.get_many(emb.model_id, list(dict.fromkeys(shas)))
    miss = [i for i, s in enumerate(shas) if s not in got]
    for k in range(0, len(miss), 64):
        part = miss[k:k + 64]
        vecs = emb.embed([texts[i] for i in part]).vectors
        new = {shas[i]: vec for i, vec in zip(part, vecs, strict=True) if vec is not None}
        cache.put_many(emb.model_id, new)
        got.update(new)
    return shas, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", required=True)
    ap.add_argument("--variants", default="full,lean")
    ap.add_argument("--held-aside", action="store_true")
    ap.add_argument("--prefill", action="store_true", help="only embed and cache the variants' chunk texts")
    a = ap.parse_args()
    qs_def = rx._set(a.set)
    if qs_def.held_aside and not a.held_aside:
        sys.exit("the held-aside set is read only with --held-aside")
    repo = bench_sets._package_repo(qs_def)
    files = [(str(p.relative_to(repo)), p.read_text()) for p in sorted(repo.rglob("*.py")) if ".git" not in p.parts]
    stripped, _ = evalsets.docstring_set(files)
    cfg = Settings().chunking
    counter = counter_for_model("all-MiniLM-L6-v2", cfg)
    chunks = [(p, c) for p, t in sorted(stripped.items()) for c in chunk_document(p, t, "python", cfg, counter)]
    ids = [f"{p}#{c.chunk_index}" for p, c in chunks]
    hits = {i: {"path": p, "start_line": c.start_line, "end_line": c.end_line}
            for i, (p, c) in zip(ids, chunks, strict=True)}
    emb = LocalEmbedder()
    cache = SQLiteEmbeddingCache(rx.OUT / "embcache.sqlite3")
    if a.prefill:  # only embed (and cache) every variant's chunk texts, e.g. while the base search still runs
        for v in a.variants.split(","):
            _vectors([VARIANTS[v](p, c, cfg, counter) for p, c in chunks], emb, cache)
            print(f"{qs_def.id}: {v} cached", flush=True)
        return
    base = pickle.loads((rx.OUT / "base" / f"{qs_def.id}.pkl").read_bytes())["sets"][0]
    queries = base.queries  # the harness's sample (all queries of tuning-large, 150 of the others)
    qv = np.array([emb.embed_query(q.query[:4096]) for q in queries])
    fusions = (("vector", 0.0, 40), ("minmax", 0.3, 40), ("minmax", 0.5, 100), ("minmax", 0.4, 200), ("rrf", 0.0, 40))
    ref: dict[tuple, list[float]] = {}
    for v in a.variants.split(","):
        texts = [VARIANTS[v](p, c, cfg, counter) for p, c in chunks]
        shas, got = _vectors(texts, emb, cache)
        sims = qv @ np.array([got[s] for s in shas], dtype=np.float32).T
        lists = []
        for qi, ls in enumerate(base.lists):
            order = np.argsort(-sims[qi], kind="stable")[:200]
            lists.append(evaluation.Lists(keyword=ls.keyword, hits={**ls.hits, **hits},
                                          vector=[(ids[j], float((1 + sims[qi, j]) / 2)) for j in order]))
        es = evaluation.EvalSet(base.kind, queries, lists)
        for how, w, d in fusions:
            s = rx.per_query(es, how, w, d)
            ref.setdefault((how, w, d), s)
            m, lo, hi = evalsets.bootstrap_ci(s)
            g, glo, ghi = evalsets.paired_gain(s, ref[(how, w, d)])
            print(f"| {qs_def.id} | {v} | {how} {w:.1f} depth {d} | {m:.3f} ({lo:.3f}–{hi:.3f}) "
                  f"| {g:+.3f} ({glo:+.3f} … {ghi:+.3f}) |", flush=True)


if __name__ == "__main__":
    main()
