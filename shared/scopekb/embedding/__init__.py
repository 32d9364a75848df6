"""Embedding providers, the embedding cache and cached embedding (DESIGN §4.6, issue #7).

Typical use by the indexer::

    embedder = make_embedder(settings.embedding)            # None: keyword-only
    cache = make_embedding_cache(settings, opensearch_client)
    vectors, stats, errors = embed_with_cache(embedder, cache, [chunk.text for chunk in chunks])

and by the query service: ``embedder.embed_query(query)``.

The ``local`` provider imports torch lazily (in :mod:`scopekb.embedding.local`); importing this package does not.
"""

from scopekb.embedding.base import (
    Embedder,
    EmbeddingConfigError,
    EmbeddingError,
    EmbeddingUnavailable,
    EmbedResult,
    Vector,
    is_blank,
)
from scopekb.embedding.cache import (
    EmbeddingCache,
    MemoryEmbeddingCache,
    OpenSearchEmbeddingCache,
    SQLiteEmbeddingCache,
    cache_doc_id,
    embcache_index_name,
    text_sha,
)
from scopekb.embedding.factory import make_embedder, make_embedding_cache
from scopekb.embedding.pipeline import CachedEmbeddings, EmbedStats, embed_with_cache

__all__ = [
    "CachedEmbeddings",
    "EmbedResult",
    "EmbedStats",
    "Embedder",
    "EmbeddingCache",
    "EmbeddingConfigError",
    "EmbeddingError",
    "EmbeddingUnavailable",
    "MemoryEmbeddingCache",
    "OpenSearchEmbeddingCache",
    "SQLiteEmbeddingCache",
    "Vector",
    "cache_doc_id",
    "embcache_index_name",
    "embed_with_cache",
    "is_blank",
    "make_embedder",
    "make_embedding_cache",
    "text_sha",
]
