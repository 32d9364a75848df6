"""Build the configured embedder and embedding cache from settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopekb.embedding.base import Embedder
from scopekb.embedding.cache import (
    EmbeddingCache,
    MemoryEmbeddingCache,
    OpenSearchEmbeddingCache,
    SQLiteEmbeddingCache,
    embcache_index_name,
)
from scopekb.settings import EmbeddingSettings, Settings


def make_embedder(settings: EmbeddingSettings, **overrides: Any) -> Embedder | None:
    """The embedder named by ``settings.provider``, or None for ``none`` (keyword-only).

    Args:
        settings: ``get_settings().embedding``.
        overrides: keyword arguments for :class:`OpenAIEmbedder` (e.g. ``count_tokens``, ``sleep``); ignored by
            the other providers.

    Raises:
        EmbeddingConfigError: optional dependencies missing, model not loadable, or the OpenAI client cannot be
            built (no API key).
        ValueError: unknown provider.
    """
    if settings.provider == "none":
        return None
    if settings.provider == "local":
        from scopekb.embedding.local import LocalEmbedder

        return LocalEmbedder.from_settings(settings)
    if settings.provider == "openai":
        from scopekb.embedding.openai_provider import OpenAIEmbedder

        return OpenAIEmbedder.from_settings(settings, **overrides)
    raise ValueError(f"unknown embedding provider {settings.provider!r}")


def make_embedding_cache(settings: Settings, opensearch_client: Any | None = None) -> EmbeddingCache | None:
    """The cache named by ``settings.embedding.cache``.

    Args:
        settings: the full settings (the OpenSearch cache needs ``opensearch.system_prefix``, the SQLite one
            ``data_dir``).
        opensearch_client: required for ``opensearch``; the index is created if missing.

    Returns:
        None for ``none``.

    Raises:
        ValueError: ``opensearch`` without a client.
        scopekb.errors.Transient: the cache index cannot be ensured (OpenSearch unavailable).
    """
    emb = settings.embedding
    if emb.cache == "none":
        return None
    if emb.cache == "memory":
        return MemoryEmbeddingCache()
    if emb.cache == "sqlite":
        path = emb.cache_path or Path(settings.data_dir) / "embcache.sqlite3"
        return SQLiteEmbeddingCache(path, batch=min(emb.cache_batch, 30_000))
    if opensearch_client is None:
        raise ValueError("embedding.cache=opensearch needs an OpenSearch client")
    return OpenSearchEmbeddingCache(opensearch_client, embcache_index_name(settings.opensearch.system_prefix),
                                    batch=emb.cache_batch, replicas=settings.opensearch.replicas)
