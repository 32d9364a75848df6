"""Embedding cache keyed by (model id, sha256 of the exact text embedded).

Shared across branches, sources and scopes: a chunk whose text is unchanged is never embedded twice for the
same model (DESIGN §4.6). Keys hold no scope, so a cache entry reveals nothing but a vector for a text hash.

Implementations:

- :class:`OpenSearchEmbeddingCache`: the system index ``<system_prefix>-embcache``. Vectors are stored as
  base64 of little-endian float32 in a ``binary`` field (not indexed, no doc values: 2,048 characters for a
  384-d vector, about a third of the JSON float array, and bit-exact). Not a k-NN index. Document ``_id`` is
  ``sha256(model + "\\0" + text_sha)``; reads are ``mget`` in batches.
- :class:`SQLiteEmbeddingCache`: one file, for embedded mode.
- :class:`MemoryEmbeddingCache`: this process only (tests, one-shot runs).
"""

from __future__ import annotations

import base64
import hashlib
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from scopekb.embedding.base import Vector
from scopekb.logging import get_logger
from scopekb.stores.opensearch import opensearch_errors

log = get_logger(__name__)


@runtime_checkable
class EmbeddingCache(Protocol):
    """Vectors by (model id, text sha256 hex)."""

    def get_many(self, model: str, shas: Sequence[str]) -> dict[str, Vector]:
        """Cached vectors for those of ``shas`` that are present (missing ones are simply absent).

        Raises:
            Exception: the backing store failed (callers treat that as all misses).
        """
        ...

    def put_many(self, model: str, vectors: Mapping[str, Vector]) -> None:
        """Store ``{sha: vector}`` for ``model``; existing entries are overwritten (same text, same vector).

        Raises:
            Exception: the backing store failed.
        """
        ...


def text_sha(text: str) -> str:
    """sha256 hex of ``text`` encoded as UTF-8 (the cache key; equals ``content_sha`` when the chunk text is
    embedded as is)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def cache_doc_id(model: str, sha: str) -> str:
    """OpenSearch ``_id`` of one cache entry: sha256 hex of ``model + "\\0" + sha``."""
    return hashlib.sha256(f"{model}\0{sha}".encode()).hexdigest()


def pack_vector(vector: Sequence[float] | np.ndarray) -> bytes:
    """Little-endian float32 bytes of a vector (4 bytes per dimension)."""
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack_vector(raw: bytes) -> Vector:
    """Inverse of :func:`pack_vector` as a list of floats.

    Raises:
        ValueError: ``raw`` is not a whole number of float32 values.
    """
    if len(raw) % 4:
        raise ValueError(f"packed vector of {len(raw)} bytes is not float32")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32).tolist()


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class MemoryEmbeddingCache:
    """In-process cache; ``max_entries`` bounds it (oldest insertions are dropped first). Thread-safe."""

    def __init__(self, max_entries: int | None = None) -> None:
        self._data: dict[tuple[str, str], bytes] = {}
        self._max = max_entries
        self._lock = threading.Lock()

    def get_many(self, model: str, shas: Sequence[str]) -> dict[str, Vector]:
        with self._lock:
            found = {s: self._data.get((model, s)) for s in shas}
        return {s: unpack_vector(raw) for s, raw in found.items() if raw is not None}

    def put_many(self, model: str, vectors: Mapping[str, Vector]) -> None:
        with self._lock:
            for sha, vec in vectors.items():
                self._data.pop((model, sha), None)
                self._data[(model, sha)] = pack_vector(vec)
            if self._max is not None:
                while len(self._data) > self._max:
                    self._data.pop(next(iter(self._data)))

    def __len__(self) -> int:
        return len(self._data)


class SQLiteEmbeddingCache:
    """Cache in one SQLite file (WAL; safe for several threads and processes on one machine).

    Table ``embeddings(model TEXT, sha TEXT, dim INTEGER, vector BLOB, created_at REAL, PRIMARY KEY(model, sha))``
    with vectors as little-endian float32 bytes.

    Args:
        path: database file (parent directories are created); ``":memory:"`` for a private in-memory database.
        batch: keys per ``SELECT ... IN (...)`` (SQLite allows 32,766 parameters since 3.32).
    """

    def __init__(self, path: str | Path, batch: int = 500) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._batch = max(1, min(batch, 30_000))
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0, isolation_level=None)
        with self._lock:
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS embeddings (model TEXT NOT NULL, sha TEXT NOT NULL, dim INTEGER NOT NULL,"
                " vector BLOB NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (model, sha)) WITHOUT ROWID")

    def get_many(self, model: str, shas: Sequence[str]) -> dict[str, Vector]:
        out: dict[str, Vector] = {}
        unique = list(dict.fromkeys(shas))
        with self._lock:
            for part in _chunks(unique, self._batch):
                marks = ",".join("?" * len(part))
                rows = self._conn.execute(
                    f"SELECT sha, vector FROM embeddings WHERE model = ? AND sha IN ({marks})",
                    [model, *part]).fetchall()
                for sha, raw in rows:
                    out[sha] = unpack_vector(raw)
        return out

    def put_many(self, model: str, vectors: Mapping[str, Vector]) -> None:
        now = time.time()
        rows = [(model, sha, len(vec), pack_vector(vec), now) for sha, vec in vectors.items()]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?, ?, ?)", rows)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()


#: Mapping of the cache system index: strict, nothing searchable but model/sha (for deletes by model).
EMBCACHE_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {
        "model": {"type": "keyword"},
        "sha": {"type": "keyword"},
        "dim": {"type": "integer", "index": False},
        "vector": {"type": "binary"},
        "created_at": {"type": "date", "format": "epoch_millis", "index": False},
    },
}


def embcache_index_name(system_prefix: str) -> str:
    """Name of the cache system index: ``<system_prefix>-embcache``."""
    return f"{system_prefix}-embcache"


@opensearch_errors
class OpenSearchEmbeddingCache:
    """Cache in an OpenSearch system index (see the module docstring).

    Args:
        client: an ``opensearchpy.OpenSearch`` client.
        index: index name, usually :func:`embcache_index_name` of ``settings.opensearch.system_prefix``.
        batch: ids per ``mget`` and documents per bulk request.
        replicas, shards: used when the index is created.
        ensure: create the index now if it does not exist (else call :meth:`ensure_index` yourself).

    Raises:
        scopekb.errors.Transient: OpenSearch could not be reached or failed while ensuring (Refused: it refused).
    """

    def __init__(self, client: Any, index: str, *, batch: int = 1000, replicas: int = 0, shards: int = 1,
                 ensure: bool = True) -> None:
        self.client = client
        self.index = index
        self.batch = max(1, batch)
        self.replicas = replicas
        self.shards = shards
        if ensure:
            self.ensure_index()

    def ensure_index(self) -> None:
        """Create the index with its mapping if it does not exist (a concurrent creator is not an error)."""
        from opensearchpy.exceptions import RequestError

        if self.client.indices.exists(index=self.index):
            return
        body = {"settings": {"index": {"number_of_shards": self.shards, "number_of_replicas": self.replicas,
                                       "refresh_interval": "30s"}},
                "mappings": EMBCACHE_MAPPING}
        try:
            self.client.indices.create(index=self.index, body=body)
            log.info("embedding_cache_index_created", index=self.index)
        except RequestError as e:
            if "resource_already_exists_exception" not in str(e):
                raise

    def get_many(self, model: str, shas: Sequence[str]) -> dict[str, Vector]:
        """``mget`` by id in batches of ``batch``; a document whose model/sha fields disagree is ignored."""
        out: dict[str, Vector] = {}
        unique = list(dict.fromkeys(shas))
        for part in _chunks(unique, self.batch):
            ids = {cache_doc_id(model, s): s for s in part}
            resp = self.client.mget(index=self.index, body={"ids": list(ids)},
                                    params={"_source_includes": "model,sha,vector", "realtime": "true"})
            for doc in resp.get("docs", []):
                if not doc.get("found"):
                    continue
                src = doc.get("_source") or {}
                sha = ids.get(doc.get("_id", ""))
                if sha is None or src.get("model") != model or src.get("sha") != sha:
                    continue
                try:
                    out[sha] = unpack_vector(base64.b64decode(src["vector"]))
                except (KeyError, ValueError, TypeError):
                    log.warning("embedding_cache_bad_entry", index=self.index, id=doc.get("_id"))
        return out

    def put_many(self, model: str, vectors: Mapping[str, Vector]) -> None:
        """Bulk-index entries in batches of ``batch``; no refresh (``mget`` is real-time).

        Raises:
            RuntimeError: some items were refused (the first reasons are in the message).
        """
        from opensearchpy import helpers

        now_ms = int(time.time() * 1000)
        items = list(vectors.items())
        for part in _chunks(items, self.batch):
            actions: Iterable[dict[str, Any]] = (
                {"_op_type": "index", "_index": self.index, "_id": cache_doc_id(model, sha),
                 "_source": {"model": model, "sha": sha, "dim": len(vec),
                             "vector": base64.b64encode(pack_vector(vec)).decode("ascii"), "created_at": now_ms}}
                for sha, vec in part)
            _, errors = helpers.bulk(self.client, actions, raise_on_error=False, raise_on_exception=True,
                                     max_retries=3, initial_backoff=1)
            if errors:
                raise RuntimeError(f"embedding cache bulk refused {len(errors)} items: {str(errors[:3])[:500]}")

    def delete_model(self, model: str) -> int:
        """Drop every entry of ``model`` (after a model is retired); returns the number deleted."""
        resp = self.client.delete_by_query(index=self.index, body={"query": {"term": {"model": model}}},
                                           params={"conflicts": "proceed", "refresh": "true"})
        return int(resp.get("deleted", 0))
