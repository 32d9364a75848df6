#!/usr/bin/env python3
"""Which ``onnxruntime.quantization.quantize_dynamic`` settings keep the local model's quality (issue 19; a
development tool, not part of ``bench/run``).

For each quantization config it quantizes the fp32 ONNX export of the packaged model (made offline by
:func:`scopekb.embedding.onnx.export_model`, nothing downloaded) into its own directory and measures, against
torch fp32 on the same texts:

- quality: mean cosine of the chunk vectors (every chunk of the sets' docstring-free code, as the indexer embeds
  them: :func:`scopekb.chunking.embedding_text`) and of the query vectors to torch fp32; NDCG@10 of exact cosine
  search (numpy, all chunks of the set are candidates; queries embedded one by one with ``embed_query`` as the
  query service does, since dynamic quantization scales activations per batch) for the docstring → function
  queries of two sets: the bench's first quality set (requests 2.32.3, click 8.1.7, flask 3.0.3, itsdangerous
  2.1.2) and the ``tuning`` set (httpx 0.28.1, starlette 1.10.0). The held-aside set is not read.
- speed, all configs in the same run, interleaved round by round so the shared machine's load hits all alike:
  ``LocalEmbedder.encode`` texts/s on a fixed sample of chunk texts, and single-query ``embed_query`` p50.

Usage::

    bench/quant_experiments.py [--configs base,rr,u8,...] [--rounds 3] [--max-chunks N]
        [--out .services/cache/quant-exp.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

SETS = {
    "corpus": (("requests", "2.32.3", "src/requests"), ("click", "8.1.7", "src/click"),
               ("flask", "3.0.3", "src/flask"), ("itsdangerous", "2.1.2", "src/itsdangerous")),
    "tuning": (("httpx", "0.28.1", "httpx"), ("starlette", "1.10.0", "starlette")),
}

#: name -> quantize_dynamic keyword arguments (weight_type as a QuantType name).
CONFIGS: dict[str, dict[str, Any]] = {
    "base": {},  # what main ships: every supported op type, QInt8 per-tensor weights
    "rr": {"reduce_range": True},
    "pc": {"per_channel": True},
    "u8": {"weight_type": "QUInt8"},
    "mm": {"op_types_to_quantize": ["MatMul"]},
    "mm_rr": {"op_types_to_quantize": ["MatMul"], "reduce_range": True},
    "mm_pc": {"op_types_to_quantize": ["MatMul"], "per_channel": True},
    "mm_pc_rr": {"op_types_to_quantize": ["MatMul"], "per_channel": True, "reduce_range": True},
    "mm_u8": {"op_types_to_quantize": ["MatMul"], "weight_type": "QUInt8"},
    "mm_u8_pc": {"op_types_to_quantize": ["MatMul"], "weight_type": "QUInt8", "per_channel": True},
    "mm_pc_rr_xffn": {"op_types_to_quantize": ["MatMul"], "per_channel": True, "reduce_range": True,
                      "exclude": ["ffn_out"]},
    # fp32 kept for the feed-forward output projections (their GELU inputs have the widest range)
    "xffn": {"op_types_to_quantize": ["MatMul"], "exclude": ["ffn_out"]},
    "pc_xffn": {"op_types_to_quantize": ["MatMul"], "per_channel": True, "exclude": ["ffn_out"]},
    "u8_xffn": {"op_types_to_quantize": ["MatMul"], "weight_type": "QUInt8", "exclude": ["ffn_out"]},
    # fp32 kept for every MatMul of the last layer
    "xlast": {"op_types_to_quantize": ["MatMul"], "exclude": ["last_layer"]},
    "pc_xlast": {"op_types_to_quantize": ["MatMul"], "per_channel": True, "exclude": ["last_layer"]},
    "pc_xffn_xlast": {"op_types_to_quantize": ["MatMul"], "per_channel": True,
                      "exclude": ["ffn_out", "last_layer"]},
    "u8_pc": {"weight_type": "QUInt8", "per_channel": True},
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def set_files(name: str) -> dict[str, str]:
    """``{path: text}`` of the set's package sources (sdists fetched with pip into .services/cache/sdists)."""
    from scopekb.realrepo import fetch_sdist

    out: dict[str, str] = {}
    for pkg, version, folder in SETS[name]:
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(fetch_sdist(pkg, version, REPO / ".services" / "cache" / "sdists")) as t:
                t.extractall(tmp, filter="data")
            tops = [p for p in Path(tmp).iterdir() if p.is_dir()]
            root = tops[0] if len(tops) == 1 else Path(tmp)
            for f in sorted((root / folder).rglob("*.py")):
                out[f"{pkg}/{f.relative_to(root / folder).as_posix()}"] = f.read_text(encoding="utf-8",
                                                                                      errors="replace")
    return out


def build_set(name: str, counter: Any) -> dict[str, Any]:
    """Chunks (path, lines, embedding text) of the docstring-free code and the docstring queries of one set."""
    from scopekb.chunking import chunk_document, embedding_text
    from scopekb.evalsets import docstring_set
    from scopekb.filetypes import language_for
    from scopekb.settings import ChunkingSettings

    stripped, queries = docstring_set(sorted(set_files(name).items()))
    cfg = ChunkingSettings()
    chunks = []
    for path in sorted(stripped):
        lang = language_for(path)
        for c in chunk_document(path, stripped[path], lang, cfg, counter):
            chunks.append({"path": path, "start_line": c.start_line, "end_line": c.end_line,
                           "text": embedding_text(path, lang, c, cfg, counter)})
    return {"chunks": chunks, "queries": queries}


def ndcg(doc_vecs: np.ndarray, chunks: list[dict[str, Any]], q_vecs: np.ndarray, queries: list[Any]
         ) -> list[float]:
    """Per-query NDCG@10 of exact cosine search over all chunks (rows are L2-normalised)."""
    from scopekb.evalsets import rank_metrics

    sims = q_vecs @ doc_vecs.T
    out = []
    for qi, q in enumerate(queries):
        top = np.argsort(-sims[qi])[:10]
        out.append(rank_metrics([chunks[i] for i in top], q.targets)["ndcg10"])
    return out


def ffn_out_nodes(model_file: Path) -> list[str]:
    """Names of the MatMul nodes of each layer's feed-forward output projection (``output/dense`` not under
    ``attention``), the layer whose inputs (GELU outputs) have the widest range."""
    import onnx

    m = onnx.load(str(model_file), load_external_data=False)
    return [n.name for n in m.graph.node if n.op_type == "MatMul" and "/output/dense/" in n.name
            and "attention" not in n.name]


def last_layer_nodes(model_file: Path) -> list[str]:
    """Names of the MatMul nodes of the encoder's last layer (``/encoder/layer.<max>/``)."""
    import onnx

    m = onnx.load(str(model_file), load_external_data=False)
    layer = {n.name: int(g.group(1)) for n in m.graph.node if n.op_type == "MatMul"
             for g in [re.search(r"/encoder/layer\.(\d+)/", n.name)] if g}
    top = max(layer.values())
    return [name for name, i in layer.items() if i == top]


EXCLUDERS = {"ffn_out": ffn_out_nodes, "last_layer": last_layer_nodes}


def quantize(fp32: Path, dest_root: Path, name: str, key_dir: Path) -> Path:
    """Quantize ``fp32`` with config ``name`` into the export layout under ``dest_root``, in the slot of the fp32
    ``onnx`` backend: the runner runs any model file with the export's inputs and outputs, and an ``onnx-int8``
    export is only accepted with the product's own settings (:data:`scopekb.embedding.onnx.INT8_QUANTIZATION`;
    another one would be rebuilt with those). Load it with ``LocalEmbedder(backend="onnx", auto_export=False)``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from scopekb.embedding.onnx import FORMAT, MANIFEST, MODEL_FILE, OPSET

    where = dest_root / key_dir.parent.name / "fp32"
    if (where / MANIFEST).is_file():
        return dest_root
    where.mkdir(parents=True, exist_ok=True)
    kw = dict(CONFIGS[name])
    if "weight_type" in kw:
        kw["weight_type"] = getattr(QuantType, kw["weight_type"])
    excl = kw.pop("exclude", [])
    if excl:
        kw["nodes_to_exclude"] = sorted({n for e in excl for n in EXCLUDERS[e](fp32)})
    t0 = time.perf_counter()
    quantize_dynamic(str(fp32), str(where / MODEL_FILE), **kw)
    log(f"{name}: quantized in {time.perf_counter() - t0:.1f} s, {(where / MODEL_FILE).stat().st_size:,} bytes")
    (where / MANIFEST).write_text(json.dumps({"format": FORMAT, "backend": "onnx", "opset": OPSET,
                                              "bytes": (where / MODEL_FILE).stat().st_size, "config": name,
                                              "quantization": CONFIGS[name]}))
    return dest_root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--product", action="store_true",
                    help="also measure the product's onnx-int8 backend as shipped (static quantization, "
                         "scopekb.embedding.onnx.INT8_QUANTIZATION), exported into the experiment's folder")
    ap.add_argument("--sets", default=",".join(SETS), help="quality sets to measure (default: both)")
    ap.add_argument("--onnx-quality", action="store_true", help="also measure fp32 ONNX's quality (slow)")
    ap.add_argument("--max-chunks", type=int, default=0,
                    help="screening: every k-th chunk of each set, at most this many (0: all); no NDCG then")
    ap.add_argument("--speed-texts", type=int, default=64)
    ap.add_argument("--speed-queries", type=int, default=30)
    ap.add_argument("--out", default=str(REPO / ".services" / "cache" / "quant-exp.json"))
    args = ap.parse_args()

    from scopekb.embedding.local import LocalEmbedder, packaged_model_path
    from scopekb.embedding.onnx import export_model

    work = REPO / ".services" / "cache" / "quant-exp"
    work.mkdir(parents=True, exist_ok=True)
    fp32_dir, built = export_model(packaged_model_path(), "onnx", work / "base-export")
    log(f"fp32 export {'built' if built else 'reused'}: {fp32_dir}")

    from scopekb.chunking.tokens import counter_for_model
    from scopekb.settings import ChunkingSettings

    torch_emb = LocalEmbedder(backend="torch")
    counter = counter_for_model("all-MiniLM-L6-v2", ChunkingSettings())
    sets = {n: build_set(n, counter) for n in args.sets.split(",")}
    sub = ""
    if args.max_chunks:
        sub = f"-sub{args.max_chunks}"
        for s in sets.values():
            step = max(1, len(s["chunks"]) // args.max_chunks)
            s["all_chunks"] = s["chunks"]
            s["chunks"] = s["chunks"][::step][:args.max_chunks]
    for n, s in sets.items():
        log(f"set {n}: {len(s['chunks'])} chunks, {len(s['queries'])} queries")

    def vectors(emb: Any, tag: str) -> dict[str, dict[str, np.ndarray]]:
        out = {}
        for n, s in sets.items():
            f = work / f"vec-{tag}-{n}{sub}.npz"
            if f.is_file():
                z = np.load(f)
                out[n] = {"docs": z["docs"], "queries": z["queries"]}
                continue
            t0 = time.perf_counter()
            docs = emb.encode([c["text"] for c in s["chunks"]])
            qs = np.array([emb.embed_query(q.query) for q in s["queries"]], dtype=np.float32)
            np.savez(f, docs=docs, queries=qs)
            log(f"{tag} {n}: encoded in {time.perf_counter() - t0:.1f} s")
            out[n] = {"docs": docs, "queries": qs}
        return out

    ref = vectors(torch_emb, "torch")
    embs: dict[str, Any] = {"torch": torch_emb,
                            "onnx": LocalEmbedder(backend="onnx", export_dir=work / "base-export")}
    if args.product:
        export_model(packaged_model_path(), "onnx-int8", work / "base-export")
        embs["product-int8"] = LocalEmbedder(backend="onnx-int8", export_dir=work / "base-export",
                                             auto_export=False)
    for name in filter(None, args.configs.split(",")):
        root = quantize(fp32_dir / "model.onnx", work / f"cfg-{name}", name, fp32_dir)
        embs[name] = LocalEmbedder(backend="onnx", export_dir=root, auto_export=False)

    results: dict[str, Any] = {}
    for tag, emb in embs.items():
        row: dict[str, Any] = {}
        results[tag] = row
        if tag == "onnx" and not args.onnx_quality:
            continue  # fp32: the same vectors as torch to float rounding (tests/integration/test_embedding_backends)
        v = ref if tag == "torch" else vectors(emb, f"q-{tag}" if tag != "onnx" else "onnx")
        for n in sets:
            row[f"{n}_doc_cos"] = float((v[n]["docs"] * ref[n]["docs"]).sum(axis=1).mean())
            row[f"{n}_doc_cos_min"] = float((v[n]["docs"] * ref[n]["docs"]).sum(axis=1).min())
            row[f"{n}_query_cos"] = float((v[n]["queries"] * ref[n]["queries"]).sum(axis=1).mean())
            if sub:
                continue
            row[f"{n}_ndcg10"] = statistics.fmean(ndcg(v[n]["docs"], sets[n]["chunks"], v[n]["queries"],
                                                       sets[n]["queries"]))
        log(f"{tag}: " + ", ".join(f"{k} {x:.4f}" for k, x in row.items()))

    # speed: same texts and queries for every config, interleaved by round
    rnd = random.Random(5)
    pool = sorted({c["text"] for c in sets["corpus"].get("all_chunks", sets["corpus"]["chunks"])})
    rnd.shuffle(pool)
    texts = pool[:args.speed_texts]
    queries = [q.query for q in sets["corpus"]["queries"]]
    rnd.shuffle(queries)
    queries = queries[:args.speed_queries]
    enc_s: dict[str, float] = {t: 0.0 for t in embs}
    qtimes: dict[str, list[float]] = {t: [] for t in embs}
    for emb in embs.values():  # warm-up
        emb.encode(texts[:8])
        emb.embed_query(queries[0])
    for r in range(args.rounds):
        order = list(embs) if r % 2 == 0 else list(reversed(embs))
        for tag in order:
            emb = embs[tag]
            t0 = time.perf_counter()
            emb.encode(texts)
            enc_s[tag] += time.perf_counter() - t0
            for q in queries:
                t0 = time.perf_counter()
                emb.embed_query(q)
                qtimes[tag].append(time.perf_counter() - t0)
        log(f"speed round {r + 1} done, load {os.getloadavg()[0]:.1f}")
    for tag in embs:
        results[tag]["texts_per_s"] = len(texts) * args.rounds / enc_s[tag]
        results[tag]["query_p50_ms"] = statistics.median(qtimes[tag]) * 1000
        results[tag]["speed_vs_torch"] = enc_s["torch"] / enc_s[tag]
    out = {"configs": {k: CONFIGS.get(k, {}) for k in embs}, "results": results, "load": os.getloadavg(),
           "max_chunks": args.max_chunks,
           "sets": {n: {"chunks": len(s["chunks"]), "queries": len(s["queries"])} for n, s in sets.items()},
           "speed_texts": len(texts), "speed_queries": len(queries), "rounds": args.rounds}
    Path(args.out).write_text(json.dumps(out, indent=1))
    cols = [f"{n}_{m}" for n in sets for m in ("doc_cos", "query_cos", "ndcg10")[:2 if sub else 3]]
    cols += ["texts_per_s", "speed_vs_torch", "query_p50_ms"]
    print("| config | " + " | ".join(cols) + " |")
    for tag, row in results.items():
        print(f"| {tag} | " + " | ".join("" if c not in row else f"{row[c]:.4f}" if "cos" in c else f"{row[c]:.3f}"
                                         for c in cols) + " |")


if __name__ == "__main__":
    main()
