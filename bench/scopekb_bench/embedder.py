"""Embedder efficiency: pipeline embeddings/s ÷ bare ``SentenceTransformer.encode`` on the same chunk texts.

The texts are exactly what the indexer sends (:func:`scopekb.chunking.embedding_text` of the evaluation corpus's
chunks, with the local model's token counter). The pipeline side is :func:`scopekb.embedding.embed_with_cache`
with the local embedder and a cold OpenSearch embedding cache (``mget`` misses, embed, bulk-put), as in a sync;
the baseline is ``model.encode(texts, batch_size=32)`` on the same loaded model. Both sides run block by block,
interleaved (see :func:`measure`), so a shared machine's load hits both alike.
"""

from __future__ import annotations

import random
import time
from typing import Any

from opensearchpy import OpenSearch

from scopekb.chunking import chunk_document, embedding_text
from scopekb.embedding import OpenSearchEmbeddingCache, embed_with_cache
from scopekb.filetypes import decode_text, language_for
from scopekb.settings import ChunkingSettings
from scopekb_bench.util import log


def corpus_texts(files: dict[str, bytes], counter: Any, n: int, seed: int = 5) -> list[str]:
    """A deterministic sample of ``n`` distinct embedding texts from the given files."""
    cfg = ChunkingSettings()
    texts: list[str] = []
    for path in sorted(files):
        lang = language_for(path)
        for c in chunk_document(path, decode_text(files[path]), lang, cfg, counter):
            texts.append(embedding_text(path, lang, c, cfg, counter))
    texts = sorted(set(texts))
    random.Random(seed).shuffle(texts)
    return texts[:n]


class _Renamed:
    """The same embedder under another model id, so every round starts with a cold cache (the cache is keyed by
    model id and text)."""

    def __init__(self, inner: Any, model_id: str) -> None:
        self._inner = inner
        self.model_id = model_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def measure(embedder: Any, client: OpenSearch, run_id: str, texts: list[str], rounds: int = 2,
            block: int = 32) -> dict[str, Any]:
    """Seconds for the bare encode and for the pipeline on ``texts``, paired block by block.

    The texts are cut into blocks of ``block``; each block is embedded by both sides back to back (the order
    alternating), so load from other processes on a shared machine hits both alike. Totals are summed per round.
    """
    model = embedder.model
    model.encode(texts[:block], batch_size=32)  # warm-up
    cache = OpenSearchEmbeddingCache(client, f"bench-{run_id}-embcache")
    blocks = [texts[i:i + block] for i in range(0, len(texts), block)]
    bare: list[float] = []
    pipe: list[float] = []
    computed: list[int] = []
    for r in range(rounds):
        renamed = _Renamed(embedder, f"{embedder.model_id}#bench-round{r}")
        tb = tp = 0.0
        done = 0
        for j, b in enumerate(blocks):
            for side in (("bare", "pipe") if (j + r) % 2 == 0 else ("pipe", "bare")):
                t0 = time.perf_counter()
                if side == "bare":
                    model.encode(b, batch_size=32)
                    tb += time.perf_counter() - t0
                else:
                    _vectors, stats, errors = embed_with_cache(renamed, cache, b)
                    tp += time.perf_counter() - t0
                    done += stats.computed
                    if errors:
                        log(f"embedder: {len(errors)} texts refused")
        bare.append(tb)
        pipe.append(tp)
        computed.append(done)
        log(f"embedder round {r + 1}: bare {len(texts) / tb:.1f}/s, pipeline {done / tp:.1f}/s")
    return {"texts": len(texts), "computed": computed, "bare_seconds": bare, "pipeline_seconds": pipe,
            "block": block, "rounds": rounds}
