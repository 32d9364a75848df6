"""Where the bytes of a chunk index go, and what mapping choices save (issue 19: index bytes ÷ source bytes).

Copies every chunk document of an existing chunk index (read through ``_source``, which with derived source gives
the vectors back) into one fresh index per variant of the mapping/settings, each force-merged to one segment and
flushed, and reports per variant: the primary store bytes, those bytes ÷ ``--text-bytes`` (the bytes of the text
files indexed), the segment files by extension (``include_segment_file_sizes``) and, with ``--disk-usage``, the
per-field bytes of OpenSearch's ``_disk_usage?run_expensive_tasks=true``. The variants are copies of the same
documents made in the same run, so their ratios compare like with like. The variant indices are deleted at the end.

    .venv/bin/python bench/index_bytes.py --url URL --alias ALIAS --text-bytes N [--variants v7,v8] [--disk-usage]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[1:1] = [str(REPO / "bench"), str(REPO / "shared"), str(REPO)]


def read_docs(client: Any, alias: str) -> list[tuple[str, dict[str, Any]]]:
    """Every document of ``alias`` as ``(id, _source)``, vectors included (derived source puts them back)."""
    from opensearchpy import helpers

    return [(h["_id"], h["_source"]) for h in helpers.scan(client, index=alias, query={"query": {"match_all": {}}},
                                                           size=500, preserve_order=False)]


def hash_vector(text: str, dim: int) -> list[float]:
    """A unit vector seeded by the sha256 of ``text`` (stand-in vectors for a keyword-only corpus)."""
    import hashlib

    import numpy as np

    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))
    v = rng.standard_normal(dim)
    return (v / np.linalg.norm(v)).astype(np.float32).tolist()


def to_bytes(src: dict[str, Any]) -> dict[str, Any]:
    """``src`` with its vector as int8 values (each vector scaled by 127 / its largest absolute value)."""
    v = src.get("embedding")
    if v:
        m = max(abs(x) for x in v) or 1.0
        src["embedding"] = [round(x * 127 / m) for x in v]
    return src


def variant_body(name: str, dimension: int | None) -> dict[str, Any]:
    """Settings and mapping of one variant: ``current`` is what this checkout's :mod:`scopekb.fields` builds (float32
    vectors); other names join parts with ``+``, each a change applied in order to that mapping:

    - ``v8``: back to mapping version 8 (``content.wc`` a ``wildcard`` field, positions on ``content`` and
      ``path.text``, ``symbol.keyword``/``signature.keyword``, doc values on every field but the vector);
      ``v7``: no change (kept so older variant names still parse; with ``v8+nocodec`` it is version 7);
    - ``nocodec``: the default codec; ``codec``: ``best_compression``;
    - ``wcnodv`` (after ``v8``): ``content.wc`` without doc values; ``nowc``: no sub-field of ``content`` at all;
    - ``tri``/``trilc``: the 3-gram sub-field (docs only, no norms; ``trilc`` lower-cased) in place of it;
    - ``nopos``: ``content`` without positions; ``pathfreqs``: ``path.text`` without positions;
    - ``nokwsub``: no ``symbol.keyword``/``signature.keyword``; ``dvlean``: doc values only on fields sorted or
      aggregated on;
    - ``novec``: no vector; ``byte``: ``data_type: byte`` with int8 values; ``bytedv``: the same with the vector's
      doc values; ``noderived``: derived source off, the vector in ``_source``."""
    from scopekb import fields as F

    settings = F.chunk_index_settings(1, 0, knn=bool(dimension) and name != "novec")
    mapping = F.chunk_mapping(None if name == "novec" else dimension, "m")
    if name == "current":
        return {"settings": settings, "mappings": mapping}
    props = mapping["properties"]
    for part in name.split("+"):
        if part in ("v7", "novec"):
            continue
        if part == "codec":
            settings["index"]["codec"] = "best_compression"
        elif part == "v8":  # mapping version 8: content.wc a wildcard field, positions, keyword sub-fields,
            # doc values on every field that has them by default
            props[F.CONTENT] = {k: v for k, v in props[F.CONTENT].items() if k != "index_options"}
            props[F.CONTENT]["fields"] = {"wc": {"type": "wildcard"}}
            props[F.PATH]["fields"]["text"].pop("index_options", None)
            sub = {"fields": {"keyword": {"type": "keyword", "ignore_above": 512}}}
            props[F.SYMBOL] = {**props[F.SYMBOL], **sub}
            props[F.SIGNATURE] = {**props[F.SIGNATURE], **sub}
            for f, p in props.items():
                if p.get("doc_values") is False and f != F.EMBEDDING:
                    props[f] = {k: v for k, v in p.items() if k != "doc_values"}
        elif part == "wcnodv":
            props[F.CONTENT]["fields"]["wc"]["doc_values"] = False
        elif part == "byte":
            props[F.EMBEDDING]["data_type"] = "byte"
        elif part == "bytedv":
            props[F.EMBEDDING]["data_type"] = "byte"
            props[F.EMBEDDING]["doc_values"] = True
        elif part == "noderived":
            settings["index"]["knn.derived_source.enabled"] = False
        elif part == "nocodec":
            settings["index"].pop("codec", None)
        elif part == "nowc":
            props[F.CONTENT].pop("fields", None)
        elif part in ("tri", "trilc"):  # content.wc as a text field of 3-grams: postings only (no freqs,
            # positions or norms); "trilc" lower-cases the grams
            an = settings["index"]["analysis"] = copy.deepcopy(settings["index"]["analysis"])
            an.setdefault("tokenizer", {})["ib_tri"] = {"type": "ngram", "min_gram": 3, "max_gram": 3}
            an["analyzer"]["ib_tri"] = {"type": "custom", "tokenizer": "ib_tri",
                                        **({"filter": ["lowercase"]} if part == "trilc" else {})}
            props[F.CONTENT]["fields"] = {"tri": {"type": "text", "analyzer": "ib_tri", "index_options": "docs",
                                                 "norms": False}}
        elif part == "nopos":
            props[F.CONTENT]["index_options"] = "freqs"
        elif part == "dvlean":  # doc values only where sorts and aggregations need them
            for f in (F.REPO, F.REF, F.REFS, F.COMMIT, F.LANGUAGE, F.KIND, F.EMBEDDING_MODEL, F.DEF_NAMES,
                      F.DEF_PATHS, F.DEF_KINDS, F.START_LINE, F.END_LINE):
                props[f] = {**props[f], "doc_values": False}
        elif part == "pathfreqs":
            props[F.PATH]["fields"]["text"]["index_options"] = "freqs"
        elif part == "nokwsub":
            props[F.SYMBOL].pop("fields", None)
            props[F.SIGNATURE].pop("fields", None)
        else:
            raise SystemExit(f"unknown variant part {part!r}")
    return {"settings": settings, "mappings": mapping}


def measure(client: Any, docs: list[tuple[str, dict[str, Any]]], name: str, body: dict[str, Any],
            text_bytes: int, disk_usage: bool, transform: Any = None) -> dict[str, Any]:
    """Index ``docs`` into a fresh index with ``body``, merge to one segment, flush; its bytes and their parts."""
    from opensearchpy import helpers

    index = f"ibytes-{name.replace('+', '-')}-{int(time.time())}"
    has_vec = "embedding" in body["mappings"]["properties"]
    client.indices.create(index=index, body=body)
    try:
        def actions() -> Any:
            for i, d in docs:
                src = copy.copy(d)
                if not has_vec:
                    src.pop("embedding", None)
                elif transform is not None:
                    src = transform(src)
                yield {"_index": index, "_id": i, "_source": src}

        helpers.bulk(client, actions(), chunk_size=500, request_timeout=300)
        client.indices.refresh(index=index)
        deadline = time.monotonic() + 180
        while True:  # the merge may finish after the call returns; the merged-away files go at the next flush
            client.indices.forcemerge(index=index, params={"max_num_segments": 1, "request_timeout": 600})
            client.indices.refresh(index=index)
            client.indices.flush(index=index, params={"force": "true"})
            n = client.indices.stats(index=index, metric="segments")["_all"]["primaries"]["segments"]["count"]
            if n <= 1 or time.monotonic() > deadline:
                break
            time.sleep(3)
        st = client.indices.stats(index=index, metric="store,docs,segments",
                                  params={"include_segment_file_sizes": "true"})["_all"]["primaries"]
        out: dict[str, Any] = {"variant": name, "docs": st["docs"]["count"], "segments": st["segments"]["count"],
                               "store_bytes": st["store"]["size_in_bytes"],
                               "index_over_source": round(st["store"]["size_in_bytes"] / max(1, text_bytes), 3),
                               "files": {k: v["size_in_bytes"] for k, v in
                                         sorted(st["segments"].get("file_sizes", {}).items(),
                                                key=lambda kv: -kv[1]["size_in_bytes"])}}
        if disk_usage:
            du = client.transport.perform_request("POST", f"/{index}/_disk_usage",
                                                  params={"run_expensive_tasks": "true"})[index]
            out["disk_usage_total"] = du.get("store_size_in_bytes")
            out["fields"] = {f: {k: v for k, v in x.items() if k.endswith("_in_bytes") and v}
                             for f, x in sorted(du.get("fields", {}).items(),
                                                key=lambda kv: -kv[1].get("total_in_bytes", 0))}
        return out
    finally:
        client.indices.delete(index=index, params={"ignore_unavailable": "true"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--alias", required=True)
    ap.add_argument("--text-bytes", type=int, required=True, help="bytes of the text files indexed")
    ap.add_argument("--variants", default="v7,current")
    ap.add_argument("--disk-usage", action="store_true")
    ap.add_argument("--hash-vectors", action="store_true", help="give a keyword-only index's documents seeded 384-d "
                    "unit vectors")
    a = ap.parse_args()
    from opensearchpy import OpenSearch

    client = OpenSearch(a.url, timeout=300)
    docs = read_docs(client, a.alias)
    dim = next((len(d["embedding"]) for _, d in docs if d.get("embedding")), None)
    if dim is None and a.hash_vectors:  # a keyword-only index: seeded unit vectors (their bytes do not depend on
        dim = 384                        # their values: float32 or int8 per dimension, the graph by its links)
        for _, d in docs:
            d["embedding"] = hash_vector(d.get("content", ""), dim)
    text = sum(len(d.get("content", "").encode()) for _, d in docs)
    res = {"alias": a.alias, "docs": len(docs), "dimension": dim, "text_bytes": a.text_bytes,
           "content_bytes": text, "variants": []}
    for v in a.variants.split(","):
        res["variants"].append(measure(client, docs, v, variant_body(v, dim), a.text_bytes, a.disk_usage,
                                       to_bytes if {"byte", "bytedv"} & set(v.split("+")) else None))
        print(json.dumps(res["variants"][-1]), file=sys.stderr, flush=True)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
