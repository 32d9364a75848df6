#!/usr/bin/env python3
"""NDCG@10 of int8 vectors against float32 on the bench's quality sets, on both stores' search (issue 19; a
development tool, not part of ``bench/run``).

The chunks and docstring → function queries are those of :mod:`quant_experiments` (``corpus``: requests 2.32.3,
click 8.1.7, flask 3.0.3, itsdangerous 2.1.2; ``tuning``: httpx 0.28.1, starlette 1.10.0; the held-aside set is not
read), embedded once with the local model (torch fp32; chunks with ``encode``, queries one by one with
``embed_query``, as the indexer and the query service do). int8 is :func:`scopekb.fields.int8_vector` (each vector
× 127 / its largest absolute value, rounded), applied to chunk and query vectors alike. Per set it reports:

- ``exact``: exact cosine search over all chunks in numpy, float32 vs int8 (what the embedded store's exact search
  ranks by);
- ``opensearch``: kNN on two real OpenSearch indices built from the chunk mapping of this checkout
  (:func:`scopekb.fields.chunk_mapping`; lucene HNSW, ``ef_search`` 100 as the store asks), one float32 and one
  with the ``int8`` encoder, queried as :class:`scopekb.stores.opensearch.OpenSearchChunkStore` does;

each as mean NDCG@10 with its 95% bootstrap interval and the paired int8 − float32 difference with its interval.

Usage::

    bench/int8_quality.py --url http://127.0.0.1:9200 [--sets corpus,tuning] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))


def _unit(m: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(m, axis=1, keepdims=True)
    n[n == 0] = 1.0
    return m / n


def _int8(m: np.ndarray) -> np.ndarray:
    from scopekb.fields import int8_vector

    return np.array([int8_vector(v) for v in m], dtype=np.float32)


def exact_ndcg(docs: np.ndarray, chunks: list[dict[str, Any]], qs: np.ndarray, queries: list[Any]) -> list[float]:
    """Per-query NDCG@10 of exact cosine search over all chunks."""
    from quant_experiments import ndcg

    return ndcg(_unit(docs), chunks, _unit(qs), queries)


def opensearch_ndcg(client: Any, name: str, encoder: str, docs: np.ndarray, chunks: list[dict[str, Any]],
                    qs: np.ndarray, queries: list[Any]) -> list[float]:
    """Per-query NDCG@10 of kNN (k 10) on a fresh index of ``chunks`` with ``encoder``; the index is deleted."""
    from opensearchpy import helpers

    from scopekb import fields as F
    from scopekb.evalsets import rank_metrics

    index = f"int8q-{name}-{encoder}-{int(time.time())}"
    client.indices.create(index=index, body={
        "settings": F.chunk_index_settings(1, 0, knn=True, encoder=encoder),
        "mappings": F.chunk_mapping(docs.shape[1], "m", encoder)})
    try:
        helpers.bulk(client, ({"_index": index, "_id": str(i), "_source": {
            F.PATH: c["path"], F.START_LINE: c["start_line"], F.END_LINE: c["end_line"],
            F.EMBEDDING: F.stored_vector(docs[i].tolist(), encoder)}} for i, c in enumerate(chunks)),
            chunk_size=200, request_timeout=300)
        client.indices.refresh(index=index)
        out = []
        for qi, q in enumerate(queries):
            res = client.search(index=index, body={"size": 10, "query": {"knn": {F.EMBEDDING: {
                "vector": F.stored_vector(qs[qi].tolist(), encoder), "k": 10,
                "method_parameters": {"ef_search": 100}}}}, "_source": {"excludes": [F.EMBEDDING]}})
            hits = [{"path": h["_source"][F.PATH], "start_line": h["_source"][F.START_LINE],
                     "end_line": h["_source"][F.END_LINE]} for h in res["hits"]["hits"]]
            out.append(rank_metrics(hits, q.targets)["ndcg10"])
        return out
    finally:
        client.indices.delete(index=index, params={"ignore_unavailable": "true"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="OpenSearch URL")
    ap.add_argument("--sets", default="corpus,tuning")
    ap.add_argument("--out", default=str(REPO / ".services" / "cache" / "int8-quality.json"))
    a = ap.parse_args()
    from opensearchpy import OpenSearch
    from quant_experiments import build_set, log

    from scopekb.chunking.tokens import counter_for_model
    from scopekb.embedding.local import LocalEmbedder
    from scopekb.evalsets import bootstrap_ci, paired_gain
    from scopekb.settings import ChunkingSettings

    client = OpenSearch(a.url, timeout=300)
    backend = "torch"  # fp32; the onnx backend gives the same vectors to float rounding (test_embedding_backends)
    emb = LocalEmbedder(backend=backend)
    counter = counter_for_model("all-MiniLM-L6-v2", ChunkingSettings())
    work = REPO / ".services" / "cache" / "int8-quality"
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"script": "bench/int8_quality.py", "backend": backend,
                           "load_avg_start": os.getloadavg()[0], "sets": {}}
    for n in a.sets.split(","):
        s = build_set(n, counter)
        f = work / f"vec-{backend}-{n}.npz"
        if f.is_file():
            z = np.load(f)
            docs, qs = z["docs"], z["queries"]
        else:
            t0 = time.perf_counter()
            docs = np.asarray(emb.encode([c["text"] for c in s["chunks"]]), dtype=np.float32)
            qs = np.array([emb.embed_query(q.query) for q in s["queries"]], dtype=np.float32)
            np.savez(f, docs=docs, queries=qs)
            log(f"{n}: {len(docs)} chunks, {len(qs)} queries embedded in {time.perf_counter() - t0:.0f} s")
        row: dict[str, Any] = {"chunks": len(docs), "queries": len(qs)}
        per = {"exact": (exact_ndcg(docs, s["chunks"], qs, s["queries"]),
                         exact_ndcg(_int8(docs), s["chunks"], _int8(qs), s["queries"])),
               "opensearch": (opensearch_ndcg(client, n, "none", docs, s["chunks"], qs, s["queries"]),
                              opensearch_ndcg(client, n, "int8", docs, s["chunks"], qs, s["queries"]))}
        for how, (f32, i8) in per.items():
            row[how] = {"float32": bootstrap_ci(f32), "int8": bootstrap_ci(i8),
                        "int8_minus_float32": paired_gain(i8, f32),
                        "queries_changed": sum(1 for x, y in zip(f32, i8, strict=True) if abs(x - y) > 1e-9)}
            log(f"{n} {how}: " + json.dumps(row[how]))
        res["sets"][n] = row
    res["load_avg_end"] = os.getloadavg()[0]
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
