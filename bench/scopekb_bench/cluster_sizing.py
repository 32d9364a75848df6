"""Sizing measurements on an OpenSearch cluster: disk, heap and query latency of the chunk index per chunk.

    python -m scopekb_bench.cluster_sizing --url URL[,URL...] [--chunks 30000] [--shards 3] [--replicas 1]

Chunks are this repository's own Python and Markdown files, cut by scopekb's chunker (real code chunks, real
sizes), copied under numbered paths until ``--chunks`` chunks exist; each gets a seeded random unit vector of
``--dimension`` (default 384, MiniLM's size; 0 for a keyword-only index). They are bulk-written into a fresh
index with scopekb's chunk mapping and settings, force-merged to one segment per shard (what a settled index
looks like), and measured:

- disk: primary and total store bytes (``_cat/indices``) per chunk;
- heap: the cluster's used heap (sum over nodes; after a full GC of each node when ``--services-dir`` names the
  ``scripts/services`` state folder) before and after, per chunk;
  the lucene engine's HNSW graphs live in memory-mapped files, not the heap: their page-cache need is
  reported as the vector data size (``knn_vector`` bytes = 4 x dimension per copy) plus the graph links;
- BM25 and kNN latency (p50/p95 over ``--queries`` searches through opensearch-py, filtered to one scope).

Prints one JSON object and the figures extrapolated to one million chunks (linear: a measurement at tens of
thousands of chunks says nothing about caches that stop fitting; docs/deploy.md says so too).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch, helpers

from scopekb import fields as F

ROOT = Path(__file__).resolve().parents[2]


def real_chunks(limit: int) -> list[dict[str, Any]]:
    """Chunks of this repository's ``.py`` and ``.md`` files (path, language, content, lines), by scopekb's
    chunker without an embedder (its token estimate)."""
    from scopekb.chunking import chunk_document
    from scopekb.filetypes import language_for
    from scopekb.settings import ChunkingSettings

    cfg = ChunkingSettings()
    out: list[dict[str, Any]] = []
    for path in sorted([*ROOT.glob("shared/**/*.py"), *ROOT.glob("services/**/*.py"), *ROOT.glob("docs/*.md"),
                        *ROOT.glob("tests/**/*.py")]):
        rel = str(path.relative_to(ROOT))
        language = language_for(rel)
        for ch in chunk_document(rel, path.read_text(errors="replace"), language, cfg):
            out.append({"path": rel, "content": ch.content, "start_line": ch.start_line, "end_line": ch.end_line,
                        "language": language, "symbol": ch.symbol})
            if len(out) >= limit:
                return out
    return out


def documents(n: int, dimension: int, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` chunk documents: the real chunks repeated under numbered copies of their paths, spread over 20
    scopes, with seeded random unit vectors."""
    base = real_chunks(n)
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        c = base[i % len(base)]
        copy = i // len(base)
        path = f"copy{copy:03d}/{c['path']}"
        content = c["content"] if copy == 0 else f"# copy {copy}\n{c['content']}"
        src: dict[str, Any] = {
            F.AGENT_NAME: f"agent-{i % 20}", F.CONTEXT_ID: "main", F.SOURCE_ID: f"src-{i % 20}",
            F.REPO: "scopekb", F.REF: "main", F.COMMIT: "0" * 40, F.PATH: path, F.LANGUAGE: c["language"],
            F.SYMBOL: c["symbol"], F.CONTENT: content, F.CHUNK_INDEX: i, F.START_LINE: c["start_line"],
            F.END_LINE: c["end_line"], F.CONTENT_SHA: hashlib.sha1(content.encode()).hexdigest(),
            F.BLOB_SHA: "1" * 40, F.INDEXED_AT: "2026-11-30T00:00:00Z",
        }
        if dimension:
            v = [rng.gauss(0, 1) for _ in range(dimension)]
            norm = sum(x * x for x in v) ** 0.5
            src[F.EMBEDDING] = [x / norm for x in v]
            src[F.EMBEDDING_MODEL] = "sizing"
        docs.append({"_id": hashlib.sha1(f"{path}:{i}".encode()).hexdigest(), "_source": src})
    return docs


def collect_garbage(state_dir: str | None) -> None:
    """Run a full GC in every OpenSearch node started by ``scripts/services`` in ``state_dir`` (``jcmd <pid>
    GC.run``, pids from its pid files), so heap readings show live data rather than garbage."""
    if not state_dir:
        return
    import shutil
    import subprocess

    jcmd = shutil.which("jcmd") or "/usr/lib/jvm/java-17-openjdk-amd64/bin/jcmd"
    for pid_file in sorted(Path(state_dir, "run").glob("opensearch*.pid")):
        pid = pid_file.read_text().split()[0]
        subprocess.run([jcmd, pid, "GC.run"], capture_output=True, timeout=60)


def heap_used(client: OpenSearch) -> int:
    """Sum of the nodes' used heap in bytes."""
    stats = client.nodes.stats(metric="jvm")["nodes"]
    return sum(int(n["jvm"]["mem"]["heap_used_in_bytes"]) for n in stats.values())


def settled_heap(client: OpenSearch, state_dir: str | None, samples: int = 3) -> int:
    """The smallest of a few heap readings a second apart, each after a full GC when the node pids are known
    (closest to live data)."""
    out = []
    for _ in range(samples):
        collect_garbage(state_dir)
        out.append(heap_used(client))
        time.sleep(1)
    return min(out)


def percentiles(values: list[float]) -> tuple[float, float]:
    s = sorted(values)
    return round(1000 * statistics.median(s), 1), round(1000 * s[int(0.95 * (len(s) - 1))], 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="node URL(s), comma-separated")
    ap.add_argument("--chunks", type=int, default=30000)
    ap.add_argument("--dimension", type=int, default=384)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--services-dir", help="scripts/services state folder of the cluster: full GCs before heap "
                    "readings (jcmd), else heap figures include garbage")
    args = ap.parse_args(argv)

    client = OpenSearch(hosts=args.url.split(","), timeout=300)
    health = client.cluster.health()
    index = f"sizing-{int(time.time())}"
    dim = args.dimension or None
    docs = documents(args.chunks, args.dimension)
    heap_before = settled_heap(client, args.services_dir)
    client.indices.create(index=index, body={"settings": F.chunk_index_settings(args.shards, args.replicas,
                                                                                 knn=bool(dim)),
                                             "mappings": F.chunk_mapping(dim)})
    try:
        client.cluster.health(index=index, wait_for_status="green", params={"timeout": "60s", "request_timeout": 70})
        t0 = time.perf_counter()
        ok, errors = helpers.bulk(client, ({"_index": index, **d} for d in docs), chunk_size=500,
                                  max_chunk_bytes=4 * 1024 * 1024, raise_on_error=False, stats_only=True)
        client.indices.refresh(index=index)
        bulk_s = time.perf_counter() - t0
        client.indices.forcemerge(index=index, params={"max_num_segments": 1, "request_timeout": 600})
        client.indices.refresh(index=index)
        rng = random.Random(11)
        words = ["value", "registry", "compute", "search", "index", "settings", "scope", "chunk", "bulk", "alias"]
        bm25, knn = [], []
        for q in range(args.queries):
            flt = [{"term": {F.AGENT_NAME: f"agent-{q % 20}"}}, {"term": {F.CONTEXT_ID: "main"}}]
            body = {"size": 10, "query": {"bool": {"filter": flt, "must": [{"multi_match": {
                "query": " ".join(rng.sample(words, 2)), "fields": F.KEYWORD_FIELDS}}]}},
                "_source": {"excludes": [F.EMBEDDING]}}
            t = time.perf_counter()
            client.search(index=index, body=body)
            bm25.append(time.perf_counter() - t)
            if dim:
                v = [rng.gauss(0, 1) for _ in range(args.dimension)]
                body = {"size": 10, "query": {"knn": {F.EMBEDDING: {"vector": v, "k": 10, "filter": {"bool": {
                    "filter": flt}}, "method_parameters": {"ef_search": 100}}}}, "_source": {"excludes": [F.EMBEDDING]}}
                t = time.perf_counter()
                client.search(index=index, body=body)
                knn.append(time.perf_counter() - t)
        heap_after = settled_heap(client, args.services_dir)
        cat = client.cat.indices(index=index, params={"format": "json", "bytes": "b"})[0]
        n = int(cat["docs.count"])
        pri, total = int(cat["pri.store.size"]), int(cat["store.size"])
        seg = client.indices.stats(index=index, metric="segments")["_all"]["total"]["segments"]
        avg_content = statistics.mean(len(d["_source"][F.CONTENT]) for d in docs)
        per_m = 1_000_000 / n
        result = {
            "nodes": health["number_of_nodes"], "data_nodes": health["number_of_data_nodes"],
            "shards": args.shards, "replicas": args.replicas, "dimension": args.dimension, "chunks": n,
            "bulk_errors": errors, "bulk_written": ok, "bulk_chunks_per_s": round(n / bulk_s),
            "avg_content_chars": round(avg_content),
            "primary_bytes_per_chunk": round(pri / n), "total_bytes_per_chunk": round(total / n),
            "segments_memory_bytes": seg.get("memory_in_bytes", 0),
            "heap_delta_bytes": heap_after - heap_before, "heap_before_bytes": heap_before,
            "heap_after_bytes": heap_after, "heap_after_full_gc": bool(args.services_dir),
            "bm25_p50_ms": percentiles(bm25)[0], "bm25_p95_ms": percentiles(bm25)[1],
            "knn_p50_ms": percentiles(knn)[0] if knn else None, "knn_p95_ms": percentiles(knn)[1] if knn else None,
            "per_million_chunks": {
                "primary_gb": round(pri * per_m / 1e9, 2), "total_gb": round(total * per_m / 1e9, 2),
                "heap_delta_mb": round((heap_after - heap_before) * per_m / 1e6),
                # lucene HNSW: float32 vectors + about 2*m links of 4 bytes on the base layer, per copy
                "hnsw_page_cache_gb": round((4 * args.dimension + 2 * 16 * 4) * (1 + args.replicas) / 1e3, 2)
                if dim else 0.0,
            },
        }
        print(json.dumps(result, indent=2))
    finally:
        client.indices.delete(index=index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
