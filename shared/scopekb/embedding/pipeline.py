"""Embed through the cache: only texts the cache does not know are sent to the embedder, each once.

Used by the indexer for chunks; the counters feed the job record ("embeddings computed vs cached").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from scopekb.embedding.base import Embedder, Vector, is_blank
from scopekb.embedding.cache import EmbeddingCache, text_sha
from scopekb.logging import get_logger

log = get_logger(__name__)


@dataclass
class EmbedStats:
    """Counters of one :func:`embed_with_cache` call.

    Attributes:
        computed: distinct texts embedded by the provider in this call (what was paid for).
        cached: distinct texts served from the cache.
        failed: distinct texts the provider refused (their positions are in ``errors``).
        blank: input positions that were empty or whitespace only (never sent, no vector, not an error).
        duplicates: input positions that repeated an earlier text of the same call (embedded/looked up once).
        tokens: tokens billed or read by the provider for the computed texts.
        requests: provider requests (0 for the local model).
        cache_errors: cache reads or writes that failed (the call went on without the cache for them).
    """

    computed: int = 0
    cached: int = 0
    failed: int = 0
    blank: int = 0
    duplicates: int = 0
    tokens: int = 0
    requests: int = 0
    cache_errors: int = 0

    def add(self, other: EmbedStats) -> None:
        """Accumulate ``other`` into this one (for a job spanning many batches)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class CachedEmbeddings(NamedTuple):
    """Result of :func:`embed_with_cache`; unpacks as ``vectors, stats, errors``.

    Attributes:
        vectors: aligned with the input texts; None for blank or failed texts.
        stats: :class:`EmbedStats`.
        errors: input position -> reason, for every position of a failed text.
    """

    vectors: list[Vector | None]
    stats: EmbedStats
    errors: dict[int, str]


def embed_with_cache(embedder: Embedder, cache: EmbeddingCache | None, texts: Sequence[str]) -> CachedEmbeddings:
    """Vectors for ``texts``, reading and filling ``cache`` under ``embedder.model_id``.

    Identical texts within the call are looked up and embedded once. The cache key is the sha256 of the exact
    text (see :func:`scopekb.embedding.cache.text_sha`). A failing cache is logged and counted in
    ``stats.cache_errors`` and treated as empty (reads) or skipped (writes): embedding still proceeds.
    Refused texts are not cached.

    Args:
        embedder: any :class:`scopekb.embedding.Embedder`.
        cache: an :class:`EmbeddingCache`, or None for no cache.
        texts: texts to embed, exactly as they should be embedded.

    Returns:
        ``CachedEmbeddings(vectors, stats, errors)``.

    Raises:
        EmbeddingUnavailable, EmbeddingConfigError: from the embedder (nothing is returned for the call then;
            vectors computed by earlier calls stay cached).
    """
    texts = list(texts)
    stats = EmbedStats()
    vectors: list[Vector | None] = [None] * len(texts)
    errors: dict[int, str] = {}
    positions: dict[str, list[int]] = {}
    text_of: dict[str, str] = {}
    for i, text in enumerate(texts):
        if is_blank(text):
            stats.blank += 1
            continue
        sha = text_sha(text)
        if sha in positions:
            stats.duplicates += 1
            positions[sha].append(i)
        else:
            positions[sha] = [i]
            text_of[sha] = text
    if not positions:
        return CachedEmbeddings(vectors, stats, errors)

    model = embedder.model_id
    found: dict[str, Vector] = {}
    if cache is not None:
        try:
            found = cache.get_many(model, list(positions))
        except Exception as e:  # noqa: BLE001 - a cache outage must not stop indexing
            stats.cache_errors += 1
            log.warning("embedding_cache_read_failed", model=model, error=f"{type(e).__name__}: {e}"[:300])
    for sha, vec in found.items():
        if sha in positions:
            stats.cached += 1
            for i in positions[sha]:
                vectors[i] = vec

    missing = [sha for sha in positions if sha not in found]
    if missing:
        result = embedder.embed([text_of[sha] for sha in missing])
        stats.tokens += result.total_tokens
        stats.requests += result.requests
        fresh: dict[str, Vector] = {}
        for k, sha in enumerate(missing):
            vec = result.vectors[k]
            if vec is None:
                stats.failed += 1
                reason = result.errors.get(k, "no vector returned")
                for i in positions[sha]:
                    errors[i] = reason
                continue
            stats.computed += 1
            fresh[sha] = vec
            for i in positions[sha]:
                vectors[i] = vec
        if fresh and cache is not None:
            try:
                cache.put_many(model, fresh)
            except Exception as e:  # noqa: BLE001 - the vectors are still returned; next run recomputes
                stats.cache_errors += 1
                log.warning("embedding_cache_write_failed", model=model, entries=len(fresh),
                            error=f"{type(e).__name__}: {e}"[:300])
    return CachedEmbeddings(vectors, stats, errors)
