"""Baseline for ingest: ``opensearch-py`` ``helpers.bulk`` of given chunk documents into a fresh index created with
scopekb's chunk index settings and mapping. Run as a child process so its CPU time and peak RSS are its own.

    python -m scopekb_bench.baseline_bulk --url URL --index NAME --docs FILE.jsonl [--dimension 384]

``FILE.jsonl`` holds one ``{"_id": ..., "_source": {...}}`` per line (exported from the pipeline's index). The
documents are streamed from the file into ``helpers.bulk`` (500 actions and at most ``--max-chunk-bytes`` a
request, like the pipeline's store), never all held in memory, as the pipeline streams batches of files; then a
refresh, so the chunks are searchable. The timed part is the read + bulk + refresh. Prints one JSON object:
seconds, documents, errors, CPU seconds of the timed part and the process's peak RSS (``VmHWM``, for reference;
the benchmark's memory figure is the parent's PSS sampling of this process, as for the worker).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from opensearchpy import OpenSearch, helpers

from scopekb import fields as F


def peak_rss() -> int:
    """This process's peak resident set size in bytes (``VmHWM``; ``ru_maxrss`` would include the parent's peak
    from before ``exec``)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    """Create the index, bulk the documents, refresh; print the measurements as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--docs", required=True)
    ap.add_argument("--dimension", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=0)
    ap.add_argument("--max-chunk-bytes", type=int, default=4 * 1024 * 1024)
    args = ap.parse_args(argv)

    client = OpenSearch(hosts=[args.url], timeout=120)
    dim = args.dimension or None
    client.indices.create(index=args.index, body={
        "settings": F.chunk_index_settings(args.shards, args.replicas, knn=bool(dim)),
        "mappings": F.chunk_mapping(dim)})
    client.cluster.health(index=args.index, wait_for_status="yellow", params={"request_timeout": 60})

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    with open(args.docs, encoding="utf-8") as fh:
        actions = ({"_op_type": "index", "_index": args.index, "_id": d["_id"], "_source": d["_source"]}
                   for d in map(json.loads, fh))
        ok, errors = helpers.bulk(client, actions, chunk_size=500, max_chunk_bytes=args.max_chunk_bytes,
                                  raise_on_error=False, stats_only=True)
    client.indices.refresh(index=args.index)
    seconds = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "documents": ok, "errors": errors,
                      "cpu_seconds": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                      "peak_rss_bytes": peak_rss()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
