#!/usr/bin/env python3
"""Build the calibration texts of the static int8 quantization (issue 19; a development tool, not part of
``bench/run``): ``shared/scopekb/embedding/calibration.json``, committed, so every export quantizes with the
same activation ranges and gives the same int8 vectors.

The texts are what the local model reads in production, taken from scopekb's own checkout (never from a bench
quality set, so the quantization is not tuned on what the bench measures): chunks of its Python sources and of
its markdown docs as the indexer embeds them (:func:`scopekb.chunking.embedding_text`, with their context
header), and docstring queries (:func:`scopekb.evalsets.docstring_set`) as agents ask. Each kind is sampled
evenly over its sorted list (every k-th), so the set is a fixed function of the checkout.

Usage::

    bench/calibration_set.py [--chunks 160] [--docs 32] [--queries 64]

After a rebuild, :data:`scopekb.embedding.onnx.CALIBRATION_SHA256` must be set to the file's new digest (a unit
test compares them); that changes the ``onnx-int8`` model id, so int8 indexes need ``scopekb reindex``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "shared"))


def _every(items: list, n: int) -> list:
    if n <= 0 or not items:
        return []
    step = max(1, len(items) // n)
    return items[::step][:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=160)
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--queries", type=int, default=64)
    args = ap.parse_args()

    from scopekb.chunking import chunk_document, embedding_text
    from scopekb.chunking.tokens import counter_for_model
    from scopekb.embedding.onnx import CALIBRATION_FILE
    from scopekb.evalsets import docstring_set
    from scopekb.filetypes import language_for
    from scopekb.settings import ChunkingSettings

    cfg = ChunkingSettings()
    counter = counter_for_model("all-MiniLM-L6-v2", cfg)
    py = sorted(p for p in (REPO / "shared" / "scopekb").rglob("*.py"))
    md = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]

    def chunks_of(files: list[Path]) -> list[str]:
        out = []
        for f in files:
            rel = f.relative_to(REPO).as_posix()
            lang = language_for(rel)
            for c in chunk_document(rel, f.read_text(encoding="utf-8"), lang, cfg, counter):
                out.append(embedding_text(rel, lang, c, cfg, counter))
        return out

    _, queries = docstring_set((f.relative_to(REPO).as_posix(), f.read_text(encoding="utf-8")) for f in py)
    texts = (_every(chunks_of(py), args.chunks) + _every(chunks_of(md), args.docs)
             + _every([q.query for q in queries], args.queries))
    body = json.dumps({"about": "calibration texts of the onnx-int8 static quantization; built by "
                                "bench/calibration_set.py from scopekb's own sources and docs",
                       "texts": texts}, indent=0, ensure_ascii=False) + "\n"
    CALIBRATION_FILE.write_text(body, encoding="utf-8")
    print(f"{CALIBRATION_FILE}: {len(texts)} texts, {len(body.encode()):,} bytes, "
          f"sha256 {hashlib.sha256(body.encode()).hexdigest()}")


if __name__ == "__main__":
    main()
