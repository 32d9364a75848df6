#!/usr/bin/env python3
"""Interleaved A/B of two local-model backends on the same texts (issue 19; a development tool, not part of
``bench/run``): texts/s per block and single-query latency, the two backends alternating block by block (and
query by query), so a shared machine's load hits both alike. ``bench/run``'s ``embedder`` phase measures each
backend in its own time window, which on this machine lets a load swing decide the order of two backends within
~30% of each other.

Texts: scopekb's own ``shared/scopekb/**/*.py`` cut into 900-character pieces (deterministic shuffle); queries: the
first line of 80 of them. Both backends are :class:`scopekb.embedding.local.LocalEmbedder` as a sync and the query
service build them (``embed`` for batches, ``embed_query`` for one query).

Usage::

    bench/backend_ab.py [--a onnx] [--b onnx-int8] [--rounds 4] [--texts 384] [--block 64]

Prints the median and quartiles of (b texts/s ÷ a texts/s) over blocks, each side's median texts/s, query p50 and
p90 (ms), and the load average at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared")]

from scopekb.embedding.local import LocalEmbedder  # noqa: E402
from scopekb.settings import EmbeddingSettings  # noqa: E402


def texts_and_queries(n: int) -> tuple[list[str], list[str]]:
    """``n`` 900-character pieces of scopekb's own source and up to 80 one-line queries taken from them."""
    texts: list[str] = []
    for p in sorted((ROOT / "shared" / "scopekb").rglob("*.py")):
        t = p.read_text(encoding="utf-8")
        texts.extend(t[i:i + 900] for i in range(0, len(t), 900))
    random.Random(1).shuffle(texts)
    texts = [t for t in texts if t.strip()][:n]
    queries = [q for q in (t.strip().split("\n")[0][:80] for t in texts[:160]) if q.strip()][:80]
    return texts, queries


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default="onnx")
    ap.add_argument("--b", default="onnx-int8")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--texts", type=int, default=384)
    ap.add_argument("--block", type=int, default=64)
    args = ap.parse_args()
    texts, queries = texts_and_queries(args.texts)
    embs = {b: LocalEmbedder.from_settings(EmbeddingSettings(provider="local", local_backend=b))
            for b in (args.a, args.b)}
    for e in embs.values():  # warm-up
        e.embed(texts[:32])
        e.embed_query("warm up")
    rate: dict[str, list[float]] = {b: [] for b in embs}
    for r in range(args.rounds):
        order = list(embs) if r % 2 == 0 else list(reversed(list(embs)))
        for i in range(0, len(texts), args.block):
            for b in order:
                t0 = time.perf_counter()
                embs[b].embed(texts[i:i + args.block])
                rate[b].append(len(texts[i:i + args.block]) / (time.perf_counter() - t0))
    lat: dict[str, list[float]] = {b: [] for b in embs}
    for q in queries * 2:
        for b in embs:
            t0 = time.perf_counter()
            embs[b].embed_query(q)
            lat[b].append(time.perf_counter() - t0)
    ratios = [y / x for x, y in zip(rate[args.a], rate[args.b], strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    print(f"{len(ratios)} blocks of {args.block}: {args.b} ÷ {args.a} texts/s median {statistics.median(ratios):.3f} "
          f"(quartiles {q1:.3f}-{q3:.3f})")
    for b in embs:
        s = sorted(lat[b])
        print(f"{b}: median {statistics.median(rate[b]):.1f} texts/s; query p50 {1000 * statistics.median(s):.2f} ms, "
              f"p90 {1000 * s[int(0.9 * len(s))]:.2f} ms ({len(s)} queries)")
    print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
