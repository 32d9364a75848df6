"""Embedder efficiency per local backend (torch, onnx, onnx-int8): pipeline embeddings/s ÷ the bare encode of the
same backend on the same chunk texts, the backends' quality retention, and single-query embedding latency.

The texts are exactly what the indexer sends (:func:`scopekb.chunking.embedding_text` of the evaluation corpus's
chunks, with the local model's token counter). The pipeline side is :func:`scopekb.embedding.embed_with_cache`
with :class:`~scopekb.embedding.local.LocalEmbedder` of that backend and a cold OpenSearch embedding cache
(``mget`` misses, embed, bulk-put), as in a sync. The baseline is the backend's bare engine with
sentence-transformers' own batching: ``SentenceTransformer.encode(texts, batch_size=32)`` for torch; for the ONNX
backends the same recipe on the ONNX Runtime session (texts sorted by length, 32 per batch, the tokenizer's own
padding and truncation, one ``session.run``, mean pooling, normalisation). Both sides run block by block,
interleaved (see :func:`measure`), so a shared machine's load hits both alike.

Quality retention: mean cosine of each backend's vectors to torch fp32 on the same texts, and NDCG@10 of exact
cosine retrieval (numpy, no ANN) of the docstring→function pairs over a candidate set of chunks (the chunks of the
pairs' files plus others of the corpus), per backend.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from opensearchpy import OpenSearch

from scopekb.chunking import chunk_document, embedding_text
from scopekb.embedding import OpenSearchEmbeddingCache, embed_with_cache
from scopekb.embedding.local import LocalEmbedder, l2_normalise
from scopekb.filetypes import decode_text, language_for
from scopekb.settings import ChunkingSettings
from scopekb_bench.quality import scores
from scopekb_bench.util import log

BACKENDS = ("torch", "onnx", "onnx-int8")


def corpus_chunks(files: dict[str, bytes], counter: Any) -> list[dict[str, Any]]:
    """Every chunk of the given files: ``{path, start_line, end_line, text}`` (text = the embedding text)."""
    cfg = ChunkingSettings()
    out: list[dict[str, Any]] = []
    for path in sorted(files):
        lang = language_for(path)
        for c in chunk_document(path, decode_text(files[path]), lang, cfg, counter):
            out.append({"path": path, "start_line": c.start_line, "end_line": c.end_line,
                        "text": embedding_text(path, lang, c, cfg, counter)})
    return out


def corpus_texts(chunks: list[dict[str, Any]], n: int, seed: int = 5) -> list[str]:
    """A deterministic sample of ``n`` distinct embedding texts."""
    texts = sorted({c["text"] for c in chunks})
    random.Random(seed).shuffle(texts)
    return texts[:n]


def bare_encoder(emb: LocalEmbedder) -> Callable[[list[str]], np.ndarray]:
    """The backend's bare engine with sentence-transformers' batching (see the module docstring)."""
    if emb.backend == "torch":
        model = emb.model
        return lambda texts: model.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True,
                                          show_progress_bar=False)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(emb.model_path) / "tokenizer.json"))
    tok.enable_truncation(emb.max_input_tokens)
    tok.enable_padding(pad_id=0)
    runner = emb._runner  # the ONNX Runtime session of the same export

    def encode(texts: list[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), emb.dimension), dtype=np.float32)
        for s in range(0, len(order), 32):
            part = order[s:s + 32]
            encs = tok.encode_batch([texts[i] for i in part])
            ids = np.array([e.ids for e in encs], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
            out[part] = l2_normalise(runner(ids, mask))
        return out

    return encode


class _Renamed:
    """The same embedder under another model id, so every round starts with a cold cache (the cache is keyed by
    model id and text)."""

    def __init__(self, inner: Any, model_id: str) -> None:
        self._inner = inner
        self.model_id = model_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def measure(embedder: Any, bare: Callable[[list[str]], Any], client: OpenSearch, run_id: str, texts: list[str],
            rounds: int = 2, block: int = 32) -> dict[str, Any]:
    """Seconds for the bare encode and for the pipeline on ``texts``, paired block by block.

    The texts are cut into blocks of ``block``; each block is embedded by both sides back to back (the order
    alternating), so load from other processes on a shared machine hits both alike. Totals are summed per round.
    """
    bare(texts[:block])  # warm-up
    embedder.encode(texts[:block])
    cache = OpenSearchEmbeddingCache(client, f"bench-{run_id}-embcache")
    blocks = [texts[i:i + block] for i in range(0, len(texts), block)]
    bare_s: list[float] = []
    pipe: list[float] = []
    computed: list[int] = []
    for r in range(rounds):
        renamed = _Renamed(embedder, f"{embedder.model_id}#bench-{getattr(embedder, 'backend', '')}-round{r}")
        tb = tp = 0.0
        done = 0
        for j, b in enumerate(blocks):
            for side in (("bare", "pipe") if (j + r) % 2 == 0 else ("pipe", "bare")):
                t0 = time.perf_counter()
                if side == "bare":
                    bare(b)
                    tb += time.perf_counter() - t0
                else:
                    _vectors, stats, errors = embed_with_cache(renamed, cache, b)
                    tp += time.perf_counter() - t0
                    done += stats.computed
                    if errors:
                        log(f"embedder: {len(errors)} texts refused")
        bare_s.append(tb)
        pipe.append(tp)
        computed.append(done)
        log(f"embedder {getattr(embedder, 'backend', '')} round {r + 1}: bare {len(texts) / tb:.1f}/s, "
            f"pipeline {done / tp:.1f}/s")
    return {"texts": len(texts), "computed": computed, "bare_seconds": bare_s, "pipeline_seconds": pipe,
            "block": block, "rounds": rounds}


def query_latency(emb: LocalEmbedder, queries: Sequence[str]) -> dict[str, float]:
    """Seconds of :meth:`LocalEmbedder.embed_query` per query (after one warm-up): p50, p95, mean."""
    emb.embed_query(queries[0])
    times = []
    for q in queries:
        t0 = time.perf_counter()
        emb.embed_query(q)
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"p50": statistics.median(times), "p95": times[int(0.95 * (len(times) - 1))],
            "mean": statistics.fmean(times), "n": len(times)}


def candidates(chunks: list[dict[str, Any]], pairs: list[dict[str, Any]], n: int, seed: int = 9
               ) -> list[dict[str, Any]]:
    """The chunks of the pairs' files plus other chunks of the corpus, ``n`` in all (at least the former)."""
    files = {p["path"] for p in pairs}
    own = [c for c in chunks if c["path"] in files]
    rest = [c for c in chunks if c["path"] not in files]
    random.Random(seed).shuffle(rest)
    return own + rest[:max(0, n - len(own))]


def ndcg10(doc_vecs: np.ndarray, docs: list[dict[str, Any]], query_vecs: np.ndarray,
           pairs: list[dict[str, Any]]) -> float:
    """Mean NDCG@10 of exact cosine retrieval (rows are L2-normalised, so the dot product is the cosine)."""
    from scopekb_bench.quality import rank_of

    sims = query_vecs @ doc_vecs.T
    total = 0.0
    for qi, p in enumerate(pairs):
        top = np.argsort(-sims[qi])[:10]
        total += scores(rank_of([docs[i] for i in top], p))["ndcg10"]
    return total / max(len(pairs), 1)
