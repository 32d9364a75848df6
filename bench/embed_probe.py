#!/usr/bin/env python3
"""Offline probe of what the embedder sees (issue 21, third round; development tool, not part of ``bench/run``).

Chunks a quality set's docstring-free files as the indexer does (``chunk_document`` with the MiniLM counter),
embeds each chunk's text of every header *variant* with the local model (vectors cached by text in
``.services/cache/rank-exp/embcache.sqlite3``, the cache of ``bench/rank_experiments.py``), ranks every chunk by
exact cosine for every query (as the SQLite store does), and reports vector NDCG@10; hybrid and RRF are fused from
that vector list and the keyword list stored by ``rank_experiments.py search --variant base`` for the same set
(same chunk ids), each with the paired gain over the ``full`` header. The held-aside set is read only with
``--held-aside``.

Usage (``a+b``: two vectors per chunk, max-sim; ``v@split``: identifier-split queries, with ``--qsplit``)::

    bench/embed_probe.py --set tuning --variants full,lean
    bench/embed_probe.py --set tuning-large --qsplit --variants full,full+head,full@split,wsplit
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import re
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


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _words(text: str) -> str:
    """Identifiers of ``text`` written as their camelCase / snake_case parts (``parseHeader`` → ``parse Header``,
    ``max_age`` → ``max age``); other characters unchanged."""
    def one(m: re.Match) -> str:
        t = m.group(0)
        if "_" not in t.strip("_") and not re.search(r"[a-z][A-Z]|[A-Z][A-Z][a-z]", t):
            return t
        return " ".join(p for p in re.split(r"_+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", t) if p)
    return _IDENT.sub(one, text)


def fullsig(p: str, c, cfg, n) -> str:  # noqa: ANN001
    """``full``, and for a later part of a definition cut in parts its signature as the first content line (the
    embedder of part 2..n otherwise never sees the definition's name line)."""
    if c.signature and int(c.metadata.get("part", 1) or 1) > 1:
        c = c.model_copy(update={"content": c.signature + "\n" + c.content}) if hasattr(c, "model_copy") else \
            dataclasses.replace(c, content=c.signature + "\n" + c.content)
    return embedding_text(p, "python", c, cfg.model_copy(update={"embed_header": "full"}), n)


def head(p: str, c, cfg, n) -> str:  # noqa: ANN001
    """Symbol path and kind, the signature, then the first 8 lines of the chunk (the head only)."""
    lines = c.content.splitlines()
    sig = [c.signature] if c.signature and (not lines or c.signature.strip() not in lines[0]) else []
    return (f"{c.symbol} ({c.kind})\n" if c.symbol else "") + "\n".join(sig + lines[:8])


VARIANTS = {
    "fullsig": fullsig,
    "head": head,
    "wsplit": lambda p, c, cfg, n: _words(
        embedding_text(p, "python", c, cfg.model_copy(update={"embed_header": "full"}), n)),
    "sym": sym,
    "full": lambda p, c, cfg, n: embedding_text(p, "python", c, cfg.model_copy(update={"embed_header": "full"}), n),
    "words": lambda p, c, cfg, n: embedding_text(p, "python", c, cfg.model_copy(update={"embed_header": "words"}), n),
    "lean": lean,
    "nohdr": lambda p, c, cfg, n: c.content,
}


def set_chunks(qs_def: bench_sets.QualitySet):  # noqa: ANN201
    """The chunks of a quality set's docstring-free files as the indexer cuts them (``chunk_document`` with the
    MiniLM counter): ``(chunks [(path, chunk)], chunk ids "path#index", {id: hit fields}, chunking settings,
    counter)``."""
    repo = bench_sets._package_repo(qs_def)
    files = [(str(p.relative_to(repo)), p.read_text()) for p in sorted(repo.rglob("*.py")) if ".git" not in p.parts]
    stripped, _ = evalsets.docstring_set(files)
    cfg = Settings().chunking
    counter = counter_for_model("all-MiniLM-L6-v2", cfg)
    chunks = [(p, c) for p, t in sorted(stripped.items()) for c in chunk_document(p, t, "python", cfg, counter)]
    ids = [f"{p}#{c.chunk_index}" for p, c in chunks]
    hits = {i: {"path": p, "start_line": c.start_line, "end_line": c.end_line}
            for i, (p, c) in zip(ids, chunks, strict=True)}
    return chunks, ids, hits, cfg, counter


def with_vector_lists(base: evaluation.EvalSet, sims: np.ndarray, ids: list[str], hits: dict
                      ) -> evaluation.EvalSet:
    """``base`` (stored keyword lists) with each query's vector list replaced by the best 200 chunks of ``sims``
    (``(queries, chunks)`` cosines, chunk ``j`` named ``ids[j]``), scored ``(1 + cosine) / 2`` as the stores do."""
    lists = []
    for qi, ls in enumerate(base.lists):
        order = np.argsort(-sims[qi], kind="stable")[:200]
        lists.append(evaluation.Lists(keyword=ls.keyword, hits={**ls.hits, **hits},
                                      vector=[(ids[j], float((1 + sims[qi, j]) / 2)) for j in order]))
    return evaluation.EvalSet(base.kind, base.queries, lists)


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
    ap.add_argument("--qsplit", action="store_true", help="also embed the queries with identifiers split, for "
                    "variants written view@split")
    ap.add_argument("--prefill", action="store_true", help="only embed and cache the variants' chunk texts")
    a = ap.parse_args()
    qs_def = rx._set(a.set)
    if qs_def.held_aside and not a.held_aside:
        sys.exit("the held-aside set is read only with --held-aside")
    chunks, ids, hits, cfg, counter = set_chunks(qs_def)
    emb = LocalEmbedder()
    cache = SQLiteEmbeddingCache(rx.OUT / "embcache.sqlite3")
    if a.prefill:  # only embed (and cache) every variant's chunk texts, e.g. while the base search still runs
        for v in a.variants.split(","):
            for part in v.partition("@")[0].split("+"):
                _vectors([VARIANTS[part](p, c, cfg, counter) for p, c in chunks], emb, cache)
            print(f"{qs_def.id}: {v} cached", flush=True)
        return
    base = pickle.loads((rx.OUT / "base" / f"{qs_def.id}.pkl").read_bytes())["sets"][0]
    queries = base.queries  # the harness's sample (all queries of tuning-large, 150 of the others)
    qv = np.array([emb.embed_query(q.query[:4096]) for q in queries])
    qv_split = np.array([emb.embed_query(_words(q.query[:4096])) for q in queries]) if a.qsplit else None
    fusions = (("vector", 0.0, 40), ("minmax", 0.3, 40), ("minmax", 0.5, 100), ("minmax", 0.4, 200), ("rrf", 0.0, 40))
    ref: dict[tuple, list[float]] = {}
    for v in a.variants.split(","):
        # ``a+b``: two vectors per chunk (views a and b), a chunk's score the larger cosine (max-sim);
        # ``v@q``: view v searched with the identifier-split query vectors (``--qsplit``)
        view, _, qside = v.partition("@")
        qmat = qv_split if qside == "split" else qv
        sims = None
        for part in view.split("+"):
            texts = [VARIANTS[part](p, c, cfg, counter) for p, c in chunks]
            shas, got = _vectors(texts, emb, cache)
            s_ = qmat @ np.array([got[s] for s in shas], dtype=np.float32).T
            sims = s_ if sims is None else np.maximum(sims, s_)
        es = with_vector_lists(base, sims, ids, hits)
        for how, w, d in fusions:
            s = rx.per_query(es, how, w, d)
            ref.setdefault((how, w, d), s)
            m, lo, hi = evalsets.bootstrap_ci(s)
            g, glo, ghi = evalsets.paired_gain(s, ref[(how, w, d)])
            print(f"| {qs_def.id} | {v} | {how} {w:.1f} depth {d} | {m:.3f} ({lo:.3f}–{hi:.3f}) "
                  f"| {g:+.3f} ({glo:+.3f} … {ghi:+.3f}) |", flush=True)


if __name__ == "__main__":
    main()
