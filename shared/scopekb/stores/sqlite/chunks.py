"""The embedded chunk index on SQLite: FTS5 BM25 keyword search and exact cosine kNN with numpy.

Same contract as :class:`scopekb.stores.opensearch.OpenSearchChunkStore` (:class:`scopekb.stores.base.ChunkStore`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from scopekb import fields as F
from scopekb.logging import get_logger
from scopekb.stores.base import (
    BulkReport,
    RawHit,
    RefOverlay,
    SearchFilter,
    StoreBusy,
    StoreVersionMismatch,
    SymbolQuery,
    model_mismatch_fix,
    newest_blob_per_path,
    no_model_fix,
)
from scopekb.stores.sqlite import topk
from scopekb.stores.sqlite.db import Connections, table_exists
from scopekb.stores.sqlite.text import fts_text, keyword_terms
from scopekb.textsearch import MIN_LITERAL, LiteralQuery

log = get_logger("scopekb.stores.sqlite")

#: Bumped whenever the tables or the tokenisation change; a database of another version is refused.
#: 2: trigram table ``chunks_tri`` (exact/regex candidates), ``chunk_defs`` (symbols), ``chunk_meta`` (metadata).
SCHEMA_VERSION = 2

#: bm25() column weights in FTS column order (symbol, signature, content, path), as in ``F.KEYWORD_FIELDS``.
BM25_WEIGHTS = F.KEYWORD_BOOSTS

_KEYWORD = frozenset({F.AGENT_NAME, F.CONTEXT_ID, F.SOURCE_ID, F.REPO, F.REF, F.COMMIT, F.PATH, F.LANGUAGE, F.KIND,
                      F.CONTENT_SHA, F.BLOB_SHA, F.EMBEDDING_MODEL})
_TEXT = frozenset({F.SYMBOL, F.SIGNATURE, F.CONTENT})
_INT = frozenset({F.CHUNK_INDEX, F.START_LINE, F.END_LINE})
_KNOWN = _KEYWORD | _TEXT | _INT | {F.METADATA, F.INDEXED_AT, F.EMBEDDING, F.REFS, F.DEFS, F.DEF_NAMES, F.DEF_PATHS,
                                     F.DEF_KINDS}
#: The highest code point: ``x >= p AND x < p || _TOP`` is "x starts with p" on an index (BINARY collation).
_TOP = chr(0x10FFFF)

_DIRECT_READ_MAX = 4096  # filtered kNN over at most this many rows reads their vectors directly, else via the cache
#: An index of at most this many vectors is held in the cache whatever the filter (at 384 float32 dimensions about
#: 6 MiB, what one direct read of :data:`_DIRECT_READ_MAX` rows builds anyway). Issue 20: on the quick evaluation
#: corpus (442 chunks) every hybrid search read and unpacked all 442 vectors from SQLite, 1.4 of its 6.2 ms of CPU
#: besides the model.
_SMALL_INDEX_MAX = _DIRECT_READ_MAX

_CHUNK_DDL = (
    "CREATE TABLE IF NOT EXISTS scopekb_meta (key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID",
    # One slim row per chunk: the filter and tie-break columns, and two digests so a re-write of an unchanged
    # document is skipped (digest) or keeps its FTS row (fts_key). Ranking and filtering read only these rows.
    "CREATE TABLE IF NOT EXISTS chunks ("
    " rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
    " agent_name TEXT, context_id TEXT, source_id TEXT, repo TEXT, ref TEXT, path TEXT, language TEXT,"
    " content_sha TEXT, chunk_index INTEGER, has_vec INTEGER NOT NULL DEFAULT 0,"
    " digest TEXT NOT NULL, fts_key TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS chunks_scope ON chunks (agent_name, context_id, source_id, path)",
    "CREATE INDEX IF NOT EXISTS chunks_source ON chunks (source_id, path)",
    # The stored fields as JSON (without the vector), read only for the hits returned.
    "CREATE TABLE IF NOT EXISTS chunk_docs (rowid INTEGER PRIMARY KEY, doc TEXT NOT NULL)",
    # Vectors apart from the rows so filtering never reads them: ``dimension`` values, little-endian float32 or, with
    # the int8 encoder, signed bytes (scopekb.fields.int8_vector).
    "CREATE TABLE IF NOT EXISTS chunk_vectors (rowid INTEGER PRIMARY KEY, embedding BLOB NOT NULL)",
    # Pre-tokenised text; FTS5 only splits on spaces. detail=full (the default) although bm25 needs no positions:
    # with detail=column, bm25() is about ten times slower on common terms.
    # Ref membership (issue 23): one row per (ref, chunk); a chunk shared by several refs is stored once.
    "CREATE TABLE IF NOT EXISTS chunk_refs (ref TEXT NOT NULL, chunk INTEGER NOT NULL, PRIMARY KEY (ref, chunk))"
    " WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS chunk_refs_chunk ON chunk_refs (chunk)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5("
    " symbol, signature, content, path, tokenize = \"ascii tokenchars '_'\")",
    # Exact/regex candidates: content by 3-grams, ASCII case folded (a superset; lines are verified in Python).
    # (detail=full: substring MATCH is a phrase query, which detail=none/column refuse)
    "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_tri USING fts5(content, tokenize = 'trigram case_sensitive 0')",
    # Definitions for symbol search: name and qualified path lower-cased, kind.
    "CREATE TABLE IF NOT EXISTS chunk_defs (rowid INTEGER NOT NULL, name TEXT, path TEXT, kind TEXT)",
    "CREATE INDEX IF NOT EXISTS chunk_defs_name ON chunk_defs (name)",
    "CREATE INDEX IF NOT EXISTS chunk_defs_path ON chunk_defs (path)",
    "CREATE INDEX IF NOT EXISTS chunk_defs_rowid ON chunk_defs (rowid)",
    # Metadata leaves at their dotted keys, values as text (like OpenSearch's flat_object).
    "CREATE TABLE IF NOT EXISTS chunk_meta (rowid INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS chunk_meta_kv ON chunk_meta (key, value)",
    "CREATE INDEX IF NOT EXISTS chunk_meta_rowid ON chunk_meta (rowid)",
)


class SqliteVersionMismatch(StoreVersionMismatch):
    """The SQLite index was built with another schema version, embedding dimension or model."""


class _Rejected(ValueError):
    """A document the index refuses (the reason goes into :class:`BulkReport` errors)."""


class SqliteChunkStore:
    """Chunk documents in one SQLite file with the semantics of :class:`OpenSearchChunkStore`.

    Args:
        path: database file; created with its parent folders on :meth:`ensure_index`. May be shared with a
            :class:`SqliteRecordStore`.
        dimension: embedding dimension, or None for a keyword-only index (vector search then returns ``[]``).
        model: embedding model id recorded with the index; a database built for another dimension, or (when
            ``model`` is given and vectors are stored) another model, is refused by :meth:`ensure_index`.
        encoder: how vectors are stored, as ``opensearch.knn_encoder`` says for the OpenSearch store: ``int8``
            stores each vector as ``dimension`` signed bytes (:func:`scopekb.fields.int8_vector`: × 127 / its
            largest absolute value, rounded; a quarter of float32's bytes) and converts each query vector the same
            way; anything else (``none``, ``sq``) stores float32. Recorded with the index; a database built with
            the other storage is refused by :meth:`ensure_index` (a reindex converts it).

    Documents are dicts with ``_id`` and the fields of :mod:`scopekb.fields`; ``embedding`` is a list of
    ``dimension`` finite floats (not all zero) or absent/None. Reads before :meth:`ensure_index` on a missing
    database return empty results; writes call :meth:`ensure_index` first.

    Differences from OpenSearch, none of which the store contract relies on: writes are visible at once (no refresh
    interval); keyword fields must be scalars (OpenSearch also takes arrays); BM25 statistics and the combination
    of fields differ (FTS5 sums the weighted columns where ``multi_match`` takes the best field plus 0.3 × the
    others), so rankings may differ while the scores keep their meaning (raw > 0, best first).
    """

    kind = "sqlite"

    def __init__(self, path: Path | str, dimension: int | None = None, model: str | None = None,
                 encoder: str = "none") -> None:
        self.path = Path(path)
        self.dimension = dimension or None
        self.model = model
        #: ``int8`` or ``none`` (float32): how vectors are stored
        self.encoder = "int8" if encoder == "int8" else "none"
        self._vec_dtype = "i1" if self.encoder == "int8" else "<f4"
        self._vec_bytes = (self.dimension or 0) * (1 if self.encoder == "int8" else 4)
        self._db = Connections(self.path)
        self._ready = False
        self._cache_lock = threading.Lock()
        # (generation, rowids sorted, row-normalised float32 matrix) of every stored vector
        self._vec_cache: tuple[int, np.ndarray, np.ndarray] | None = None
        # (generation, vectors stored) of the last count, so the count is made once per generation
        self._vec_count: tuple[int, int] | None = None

    # ---- index lifecycle -------------------------------------------------------------------------------------

    @property
    def version_name(self) -> str:
        """A name for this index version (file, schema, dimension and model), like the OpenSearch index name."""
        return self._name(str(SCHEMA_VERSION), self.dimension, self.model, self.encoder)

    def _name(self, schema: str, dimension: int | None, model: str | None, encoder: str) -> str:
        tag = hashlib.sha256(((model or "") + ("|int8" if encoder == "int8" else "")).encode()).hexdigest()[:8]
        kind = f"{dimension}-{tag}" if dimension else "kw"
        return f"sqlite:{self.path}#chunks-s{schema}-{kind}"

    def problem(self, recovering: bool = False) -> str | None:
        """Nothing to report beyond :meth:`health` (a local file): always None."""
        return None

    def cluster_health(self) -> dict[str, Any]:
        """One local file: always one green "node" (the same shape as OpenSearch's, for ``GET /v1/status``), and
        ``summary``: the line ``scopekb status`` prints (``SQLite file <path> (embedded profile)``)."""
        return {"store": "sqlite", "status": "green", "nodes": 1, "data_nodes": 1, "unassigned_shards": 0,
                "problem": None, "summary": f"SQLite file {self.path} (embedded profile), readable"}

    def check_placement(self) -> dict[str, Any]:
        """One SQLite file holds everything: nothing to place (the same call as OpenSearch's for ``init``)."""
        return {"store": "sqlite", "status": "green"}

    def ensure_index(self, generation: str | None = None) -> str:
        """Create the tables idempotently and record schema version, dimension, model and :meth:`generation`
        (``generation``, else a random one; a rebuild keeps the file's) on first use.

        Returns :attr:`version_name`.

        Raises:
            SqliteVersionMismatch: the database was built with another schema version, dimension or model
                (a reindex is needed, e.g. :meth:`drop` then a full sync).
        """
        with self._db.write() as conn:
            for ddl in _CHUNK_DDL:
                conn.execute(ddl)
            meta = dict(conn.execute("SELECT key, value FROM scopekb_meta").fetchall())
            if not meta.get("schema_version"):
                want = {"schema_version": str(SCHEMA_VERSION), "mapping_version": str(F.MAPPING_VERSION),
                        "dimension": str(self.dimension or ""), "model": self.model or "",
                        # a random start (not 0): a process that cached this file's vectors before another process
                        # dropped and rebuilt it must not find its cached generation again (hostile pass, issue 20)
                        "vec_gen": str(secrets.randbits(48)),
                        "generation": generation or secrets.token_hex(8), "encoder": self.encoder}
                want["refs_migrated"] = "1"
                conn.executemany("INSERT OR REPLACE INTO scopekb_meta VALUES (?, ?)", list(want.items()))
                log.info("chunk_index_created", index=str(self.path), dimension=self.dimension)
            else:
                have_dim = int(meta["dimension"]) if meta.get("dimension") else None
                have_model = meta.get("model") or None
                # a vector index also belongs to its model (same dimension, other model: other vector space);
                # model None asks for no model check
                model_differs = bool(self.dimension) and self.model is not None and have_model != self.model
                if meta["schema_version"] != str(SCHEMA_VERSION) or have_dim != self.dimension or model_differs:
                    raise SqliteVersionMismatch(
                        f"SQLite index {str(self.path)!r} has schema version {meta['schema_version']}, dimension "
                        f"{have_dim} and model {have_model!r}; this process wants version {SCHEMA_VERSION}, "
                        f"dimension {self.dimension} and model {self.model!r}. "
                        + (model_mismatch_fix(have_model, self.model) if model_differs and have_dim == self.dimension
                           and meta["schema_version"] == str(SCHEMA_VERSION)
                           else no_model_fix(have_dim, have_model) if have_dim and not self.dimension
                           and meta["schema_version"] == str(SCHEMA_VERSION) else "Run `scopekb reindex`."))
                have_enc = meta.get("encoder") or "none"  # files made before the encoder was recorded: float32
                if self.dimension and have_enc != self.encoder:
                    raise SqliteVersionMismatch(
                        f"SQLite index {str(self.path)!r} stores {have_enc} vectors; this process wants "
                        f"{self.encoder} (opensearch.knn_encoder). Run `scopekb reindex`.")
                if not meta.get("generation"):  # a file made before generations were recorded
                    conn.execute("INSERT OR IGNORE INTO scopekb_meta VALUES ('generation', ?)",
                                 (secrets.token_hex(8),))
                if not meta.get("refs_migrated"):  # an index made before issue 23: each chunk is on its one ref
                    conn.execute("INSERT OR IGNORE INTO chunk_refs (ref, chunk) SELECT ref, rowid FROM chunks"
                                 " WHERE ref IS NOT NULL")
                    conn.execute("INSERT OR REPLACE INTO scopekb_meta VALUES ('refs_migrated', '1')")
        self._ready = True
        return self.version_name

    def stored_documents(self) -> list[dict[str, Any]]:
        """Every chunk document as written (``_id``, stored fields, ``refs`` from the membership table and the
        vector when one is stored), whatever schema version built the file; ``[]`` without chunk tables. For a
        rebuild (:func:`scopekb.reindex.reindex`), so everything is read into memory."""
        with self._db.read() as conn:
            if not (table_exists(conn, "chunks") and table_exists(conn, "chunk_docs")):
                return []
            refs: dict[int, list[str]] = {}
            if table_exists(conn, "chunk_refs"):
                for ref, chunk in conn.execute("SELECT ref, chunk FROM chunk_refs"):
                    refs.setdefault(int(chunk), []).append(ref)
            vec_sql = ("LEFT JOIN chunk_vectors v ON v.rowid = c.rowid" if table_exists(conn, "chunk_vectors")
                       else "LEFT JOIN (SELECT NULL AS rowid, NULL AS embedding) v ON 0")
            out = []
            for rowid, cid, doc, vec in conn.execute(
                    f"SELECT c.rowid, c.id, d.doc, v.embedding FROM chunks c JOIN chunk_docs d ON d.rowid = c.rowid "
                    f"{vec_sql} ORDER BY c.rowid"):
                d = {"_id": cid, **json.loads(doc)}
                if rowid in refs:
                    d[F.REFS] = sorted(refs[rowid])
                if vec is not None:  # int8 values as floats (the same cosine)
                    d[F.EMBEDDING] = np.frombuffer(vec, dtype="i1" if len(vec) == (self.dimension or 0) else "<f4"
                                                   ).astype(float).tolist()
                out.append(d)
        return out

    def backup(self, dest: Path) -> None:
        """A consistent copy of the whole database file at ``dest`` (``VACUUM INTO``; replaced if present)."""
        dest.unlink(missing_ok=True)
        with self._db.write_lock:
            self._db.get().execute("VACUUM INTO ?", (str(dest),))

    def drop(self) -> None:
        """Delete every chunk table (a reindex then starts from :meth:`ensure_index`); other tables are kept."""
        with self._db.write() as conn:
            for t in ("chunks_fts", "chunks_tri", "chunk_defs", "chunk_meta", "chunk_vectors", "chunk_docs", "chunks",
                      "scopekb_meta"):
                conn.execute(f"DROP TABLE IF EXISTS {t}")
        self._ready = False
        with self._cache_lock:
            self._vec_cache = None
            self._vec_count = None

    def live_index(self) -> str | None:
        """The name of the index the file holds (:attr:`version_name` of the schema, dimension, model and encoder it
        was built with, from ``scopekb_meta``: another model's index is named as such, as the OpenSearch alias's
        target would be) once the tables exist, else None. A reindex's summary read this store's own name for the
        index it replaced (README newcomer)."""
        with self._db.read() as conn:
            if not (self._ready or (table_exists(conn, "chunks") and table_exists(conn, "chunks_fts"))):
                return None
            meta = (dict(conn.execute("SELECT key, value FROM scopekb_meta").fetchall())
                    if table_exists(conn, "scopekb_meta") else {})
        if not meta.get("schema_version"):
            return self.version_name
        dim = meta.get("dimension")
        return self._name(meta["schema_version"], int(dim) if dim and dim.isdigit() else None,
                          meta.get("model") or None, meta.get("encoder") or "none")

    def generation(self) -> str | None:
        """The random id written into ``scopekb_meta`` when this file's tables were created (:meth:`ensure_index`;
        a lost or replaced file has another, one rebuilt by ``scopekb reindex`` keeps it), None before they exist."""
        with self._db.read() as conn:
            if not table_exists(conn, "scopekb_meta"):
                return None
            row = conn.execute("SELECT value FROM scopekb_meta WHERE key = 'generation'").fetchone()
        return str(row[0]) if row and row[0] else None

    def index_dimension(self) -> int | None:
        """The embedding dimension the database was built with (``scopekb_meta``): what the index holds, whatever
        this store was configured with; None for a keyword-only index. A database not built yet: this store's own
        :attr:`dimension` (the index it would create)."""
        with self._db.read() as conn:
            if not table_exists(conn, "scopekb_meta"):
                return self.dimension
            row = conn.execute("SELECT value FROM scopekb_meta WHERE key = 'dimension'").fetchone()
        if row is None:
            return self.dimension
        return int(row[0]) if row[0] else None

    @property
    def lock_path(self) -> Path:
        """The file whose ``flock`` orders syncs and rebuilds of this database across processes."""
        return self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def sync_guard(self) -> Iterator[None]:
        """A shared ``flock`` on :attr:`lock_path` for the block: any number of syncs (and embedding parts), in any
        process, at once; none while a rebuild (:meth:`rebuild_guard`, ``scopekb reindex`` in another process)
        holds it - the sync waits for it to end (hostile review: ``scopekb index`` beside ``scopekb reindex``
        wrote into tables the rebuild then dropped, and recorded its commit as indexed)."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("sync_waits_for_rebuild", lock=str(self.lock_path))
                fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def rebuild_guard(self, wait_s: float) -> Iterator[None]:
        """An exclusive ``flock`` on :attr:`lock_path` for the block (``scopekb reindex``): taken once no sync of
        any process holds it, polled for up to ``wait_s`` seconds; while held, new syncs wait.

        Raises:
            StoreBusy: syncs still hold it after ``wait_s``.
        """
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + max(0.0, wait_s)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreBusy(f"syncs still running after {wait_s:g}s; try again later") from None
                    time.sleep(0.2)
            yield
        finally:
            os.close(fd)

    def index_model(self) -> str | None:
        """The embedding model id the database's vectors come from (``scopekb_meta``; None for a keyword-only
        index); this store's own :attr:`model` while the database is not built yet."""
        with self._db.read() as conn:
            if not table_exists(conn, "scopekb_meta"):
                return self.model if self.dimension else None
            meta = dict(conn.execute("SELECT key, value FROM scopekb_meta WHERE key IN ('dimension', 'model')"))
        if "dimension" not in meta:
            return self.model if self.dimension else None
        return (meta.get("model") or None) if meta["dimension"] else None

    def health(self) -> None:
        """Raise when the database cannot be read (readiness)."""
        with self._db.read() as conn:
            conn.execute("SELECT 1").fetchone()

    def refresh(self) -> None:
        """No-op: a committed write is visible to the next read in every thread and process."""

    def close(self) -> None:
        """Close every connection this store opened (it reopens on next use)."""
        self._db.close()

    def _readable(self, conn: sqlite3.Connection) -> bool:
        """Whether the chunk tables exist (reads of a missing index are empty).

        Raises:
            SqliteVersionMismatch: they were built with another schema version (a reindex is needed).
        """
        if self._ready:
            return True
        if not (table_exists(conn, "chunks") and table_exists(conn, "chunks_fts")):
            return False
        row = conn.execute("SELECT value FROM scopekb_meta WHERE key = 'schema_version'").fetchone() \
            if table_exists(conn, "scopekb_meta") else None
        if row is not None and row[0] != str(SCHEMA_VERSION):
            raise SqliteVersionMismatch(f"SQLite index {str(self.path)!r} has schema version {row[0]}; this process "
                                        f"wants version {SCHEMA_VERSION}. Run `scopekb reindex`.")
        return True

    # ---- writes ----------------------------------------------------------------------------------------------

    def bulk_write(self, docs: Iterable[dict[str, Any]], refresh: bool = False) -> BulkReport:
        """Upsert chunk documents by ``_id`` in one transaction.

        A document equal to the stored one is skipped; one whose searchable text (symbol, signature, content,
        path) is unchanged keeps its full-text row. Invalid documents are rejected one by one with a reason
        (unknown field, wrong vector dimension, non-finite or zero vector, a value of the wrong type) and the rest
        is written. ``refresh`` is accepted for interface parity (writes are visible at once).

        Returns:
            :class:`BulkReport` with ``written`` (documents stored or already identical) and ``errors`` as
            ``(doc id, path, reason)``.
        """
        if not self._ready:
            self.ensure_index()
        report = BulkReport()
        prepared: list[dict[str, Any]] = []
        for d in docs:
            try:
                prepared.append(self._prepare(d))
            except _Rejected as e:
                report.errors.append((str(d.get("_id", "")), str(d.get(F.PATH, "?")), f"400: {e}"))
        if not prepared:
            return report
        vec_changed = False
        with self._db.write() as conn:
            existing: dict[str, tuple[int, str, str, int]] = {}
            ids = list(dict.fromkeys(p["id"] for p in prepared))
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                rows = conn.execute(
                    f"SELECT id, rowid, digest, fts_key, has_vec FROM chunks WHERE id IN ({','.join('?' * len(part))})",
                    part).fetchall()
                existing.update({r[0]: (r[1], r[2], r[3], r[4]) for r in rows})
            for p in prepared:
                old = existing.get(p["id"])
                if old is not None and old[1] == p["digest"]:
                    report.written += 1
                    continue
                cols = (p[F.AGENT_NAME], p[F.CONTEXT_ID], p[F.SOURCE_ID], p[F.REPO], p[F.REF], p[F.PATH],
                        p[F.LANGUAGE], p[F.CONTENT_SHA], p[F.CHUNK_INDEX], 1 if p["vec"] is not None else 0,
                        p["digest"], p["fts_key"])
                if old is None:
                    cur = conn.execute(
                        "INSERT INTO chunks (agent_name, context_id, source_id, repo, ref, path, language, content_sha,"
                        " chunk_index, has_vec, digest, fts_key, id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (*cols, p["id"]))
                    rowid = int(cur.lastrowid or 0)
                    conn.execute("INSERT INTO chunk_docs (rowid, doc) VALUES (?, ?)", (rowid, p["doc"]))
                    self._insert_fts(conn, rowid, p)
                    self._insert_aux(conn, rowid, p)
                else:
                    rowid = old[0]
                    conn.execute(
                        "UPDATE chunks SET agent_name=?, context_id=?, source_id=?, repo=?, ref=?, path=?, language=?,"
                        " content_sha=?, chunk_index=?, has_vec=?, digest=?, fts_key=? WHERE rowid=?",
                        (*cols, rowid))
                    conn.execute("INSERT OR REPLACE INTO chunk_docs (rowid, doc) VALUES (?, ?)", (rowid, p["doc"]))
                    if old[2] != p["fts_key"]:
                        conn.execute("DELETE FROM chunks_fts WHERE rowid = ?", (rowid,))
                        conn.execute("DELETE FROM chunks_tri WHERE rowid = ?", (rowid,))
                        self._insert_fts(conn, rowid, p)
                    conn.execute("DELETE FROM chunk_defs WHERE rowid = ?", (rowid,))
                    conn.execute("DELETE FROM chunk_meta WHERE rowid = ?", (rowid,))
                    self._insert_aux(conn, rowid, p, tri=old[2] != p["fts_key"])
                conn.execute("DELETE FROM chunk_refs WHERE chunk = ?", (rowid,))
                conn.executemany("INSERT OR IGNORE INTO chunk_refs (ref, chunk) VALUES (?, ?)",
                                 [(r, rowid) for r in p["refs"]])
                if p["vec"] is not None:
                    conn.execute("INSERT OR REPLACE INTO chunk_vectors (rowid, embedding) VALUES (?, ?)",
                                 (rowid, p["vec"]))
                    vec_changed = True
                elif old is not None and old[3]:
                    conn.execute("DELETE FROM chunk_vectors WHERE rowid = ?", (rowid,))
                    vec_changed = True
                existing[p["id"]] = (rowid, p["digest"], p["fts_key"], 1 if p["vec"] is not None else 0)
                report.written += 1
            if vec_changed:
                self._bump_vec_gen(conn)
        return report

    @staticmethod
    def _insert_fts(conn: sqlite3.Connection, rowid: int, p: dict[str, Any]) -> None:
        conn.execute("INSERT INTO chunks_fts (rowid, symbol, signature, content, path) VALUES (?, ?, ?, ?, ?)",
                     (rowid, fts_text(p["text"][0]), fts_text(p["text"][1]), fts_text(p["text"][2]),
                      fts_text(p["text"][3])))

    @staticmethod
    def _insert_aux(conn: sqlite3.Connection, rowid: int, p: dict[str, Any], tri: bool = True) -> None:
        """The trigram row (when ``tri``), definition rows and metadata rows of one chunk."""
        if tri:
            conn.execute("INSERT INTO chunks_tri (rowid, content) VALUES (?, ?)", (rowid, p["text"][2] or ""))
        if p["defs"]:
            conn.executemany("INSERT INTO chunk_defs (rowid, name, path, kind) VALUES (?, ?, ?, ?)",
                             [(rowid, *d) for d in p["defs"]])
        if p["meta"]:
            conn.executemany("INSERT INTO chunk_meta (rowid, key, value) VALUES (?, ?, ?)",
                             [(rowid, k, v) for k, v in p["meta"]])

    @staticmethod
    def _bump_vec_gen(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE scopekb_meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) WHERE key = 'vec_gen'")

    def _prepare(self, d: dict[str, Any]) -> dict[str, Any]:
        """Validate one document like the strict OpenSearch mapping and compute its row values."""
        doc_id = d.get("_id")
        if not isinstance(doc_id, str) or not doc_id:
            raise _Rejected("document has no _id")
        unknown = sorted(k for k in d if k != "_id" and k not in _KNOWN)
        if unknown:
            raise _Rejected(f"strict mapping: unknown field(s) {', '.join(unknown)}")
        out: dict[str, Any] = {"id": doc_id}
        for k in _KEYWORD:
            v = d.get(k)
            if v is not None and not isinstance(v, str | int | float | bool):
                raise _Rejected(f"field {k} must be a string, got {type(v).__name__}")
            out[k] = None if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
        texts = []
        for k in (F.SYMBOL, F.SIGNATURE, F.CONTENT):
            v = d.get(k)
            if v is not None and not isinstance(v, str | int | float):
                raise _Rejected(f"field {k} must be text, got {type(v).__name__}")
            texts.append(v)
        texts.append(out[F.PATH])
        for k in _INT:
            v = d.get(k)
            if v is None:
                out[k] = None
                continue
            try:
                if isinstance(v, bool):
                    raise TypeError
                out[k] = int(v)  # like OpenSearch's coercion: "3" -> 3, 3.7 -> 3
            except (TypeError, ValueError):
                raise _Rejected(f"field {k} must be an integer, got {v!r}") from None
        refs = d.get(F.REFS)
        if refs is None:
            refs = [out[F.REF]] if out[F.REF] is not None else []
        elif isinstance(refs, str):
            refs = [refs]
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise _Rejected(f"field {F.REFS} must be a list of strings")
        out["refs"] = sorted(set(refs))
        meta = d.get(F.METADATA)
        if meta is not None and not isinstance(meta, dict):
            raise _Rejected(f"field {F.METADATA} must be an object, got {type(meta).__name__}")
        out["meta"] = F.flatten_metadata(meta) if meta else []
        defs = d.get(F.DEFS)
        if defs is not None and not (isinstance(defs, list) and all(isinstance(x, dict) for x in defs)):
            raise _Rejected(f"field {F.DEFS} must be a list of objects")
        if F.DEF_NAMES not in d:  # a document without the derived fields: derive them (as the writer does)
            defs = F.def_fields(defs, d.get(F.SYMBOL), d.get(F.KIND), d.get(F.SIGNATURE), d.get(F.START_LINE))[F.DEFS]
        out["defs"] = list(dict.fromkeys(
            (str(x.get("name") or "").lower(), str(x.get("path") or "").lower(), str(x.get("kind") or ""))
            for x in defs or [] if x.get("name")))
        when = d.get(F.INDEXED_AT)
        if when is not None:
            try:
                if isinstance(when, bool) or not isinstance(when, str | int):
                    raise TypeError
                if isinstance(when, str):
                    datetime.fromisoformat(when)
            except (TypeError, ValueError):
                raise _Rejected(f"field {F.INDEXED_AT} must be an ISO date-time or epoch millis, got {when!r}") \
                    from None
        vec = d.get(F.EMBEDDING)
        out["vec"] = None if vec is None else self._vector_blob(vec)
        stored = {k: v for k, v in d.items() if k not in ("_id", F.EMBEDDING)}
        try:
            out["doc"] = json.dumps(stored, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise _Rejected(f"document is not JSON: {e}") from None
        out["text"] = texts
        fk = hashlib.sha1(usedforsecurity=False)
        for t in texts:
            fk.update(b"\x00" if t is None else b"\x01" + str(t).encode("utf-8", "surrogatepass") + b"\x02")
        out["fts_key"] = fk.hexdigest()
        h = hashlib.sha1(out["doc"].encode("utf-8", "surrogatepass"), usedforsecurity=False)
        if out["vec"] is not None:
            h.update(out["vec"])
        out["digest"] = h.hexdigest()
        return out

    def _vector_blob(self, vec: Any) -> bytes:
        if not self.dimension:
            raise _Rejected(f"strict mapping: unknown field {F.EMBEDDING} (this index is keyword-only)")
        try:
            arr = np.asarray(vec, dtype="<f4")
        except (TypeError, ValueError):
            raise _Rejected(f"field {F.EMBEDDING} must be a list of numbers") from None
        if arr.ndim != 1 or arr.shape[0] != self.dimension:
            given = arr.shape[0] if arr.ndim == 1 else "a nested list"
            raise _Rejected(f"Vector dimension mismatch. Expected: {self.dimension}, Given: {given}")
        if not np.all(np.isfinite(arr)):
            raise _Rejected(f"field {F.EMBEDDING} has a NaN or infinite value")
        if not np.any(arr):
            raise _Rejected(f"field {F.EMBEDDING} is a zero vector (no cosine similarity)")
        if self.encoder == "int8":
            return np.asarray(F.int8_vector(arr.tolist()), dtype="i1").tobytes()
        return arr.tobytes()

    def delete_path(self, scope_agent: str, scope_context: str, source_id: str, path: str,
                    keep_ids: Sequence[str] = ()) -> int:
        """Delete a document's chunks for one scope and source, except ``keep_ids``. Returns chunks deleted."""
        where = "agent_name = ? AND context_id = ? AND source_id = ? AND path = ?"
        args: list[Any] = [scope_agent, scope_context, source_id, path]
        return self._delete(where, args, keep_ids)

    def delete_paths(self, scope_agent: str, scope_context: str, source_id: str, paths: Sequence[str],
                     keep_ids: Sequence[str] = ()) -> int:
        """Delete the chunks of several paths of one scope and source, except ``keep_ids``."""
        keep = set(keep_ids)
        return sum(self.delete_path(scope_agent, scope_context, source_id, p, [i for i in keep if i])
                   for p in paths)

    def delete_source(self, source_id: str, paths: Sequence[str] | None = None) -> int:
        """Delete every chunk of a source (all its scopes), or only those of ``paths``. Returns chunks deleted."""
        if paths is None:
            return self._delete("source_id = ?", [source_id])
        total = 0
        paths = list(paths)
        for i in range(0, len(paths), 500):
            part = paths[i:i + 500]
            total += self._delete(f"source_id = ? AND path IN ({','.join('?' * len(part))})", [source_id, *part])
        return total

    def _delete(self, where: str, args: list[Any], keep_ids: Sequence[str] = ()) -> int:
        with self._db.write() as conn:
            if not self._readable(conn):
                return 0
            rows = conn.execute(f"SELECT rowid, id, has_vec FROM chunks WHERE {where}", args).fetchall()
            keep = set(keep_ids)
            gone = [(r[0],) for r in rows if r[1] not in keep]
            if not gone:
                return 0
            self._drop_rows(conn, gone, any(r[2] for r in rows if r[1] not in keep))
            return len(gone)

    def _drop_rows(self, conn: sqlite3.Connection, gone: list[tuple[int]], vectors: bool) -> None:
        """Delete chunk rows and everything keyed by their rowid (a rowid is reused by the next insert, so no
        table may keep a row of a deleted chunk)."""
        conn.executemany("DELETE FROM chunks WHERE rowid = ?", gone)
        conn.executemany("DELETE FROM chunk_refs WHERE chunk = ?", gone)
        for table in ("chunk_docs", "chunks_fts", "chunks_tri", "chunk_defs", "chunk_meta"):
            conn.executemany(f"DELETE FROM {table} WHERE rowid = ?", gone)
        if vectors:
            conn.executemany("DELETE FROM chunk_vectors WHERE rowid = ?", gone)
            self._bump_vec_gen(conn)

    # ---- ref membership (issue 23) ---------------------------------------------------------------------------

    def chunk_refs(self, ids: Sequence[str]) -> dict[str, list[str]]:
        """``id -> refs`` of the chunks among ``ids`` that exist."""
        out: dict[str, list[str]] = {}
        ids = list(dict.fromkeys(ids))
        with self._db.read() as conn:
            if not self._readable(conn):
                return out
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                for cid, ref in conn.execute(
                        "SELECT c.id, r.ref FROM chunks c LEFT JOIN chunk_refs r ON r.chunk = c.rowid"
                        f" WHERE c.id IN ({','.join('?' * len(part))})", part):
                    refs = out.setdefault(cid, [])
                    if ref is not None:
                        refs.append(ref)
        return out

    def set_refs(self, refs_by_id: dict[str, list[str]]) -> BulkReport:
        """Replace the ``refs`` of existing chunks (content and vectors untouched)."""
        report = BulkReport()
        with self._db.write() as conn:
            for cid, refs in refs_by_id.items():
                row = conn.execute("SELECT rowid FROM chunks WHERE id = ?", (cid,)).fetchone()
                if row is None:
                    report.errors.append((cid, "?", "404: no such chunk"))
                    continue
                self._put_refs(conn, int(row[0]), sorted(set(refs)))
                report.written += 1
        return report

    def set_vectors(self, vectors_by_id: dict[str, tuple[Sequence[float], str]], model: str) -> BulkReport:
        """:meth:`ChunkStore.set_vectors`: the vector row, ``has_vec`` and the stored document's ``blob_sha`` and
        ``embedding_model``; a chunk that is gone is skipped, a vector of the wrong dimension is an error."""
        report = BulkReport()
        with self._db.write() as conn:
            for cid, (vec, blob) in vectors_by_id.items():
                try:
                    data = self._vector_blob(vec)
                except _Rejected as e:
                    report.errors.append((cid, "?", f"400: {e}"))
                    continue
                row = conn.execute("SELECT rowid FROM chunks WHERE id = ?", (cid,)).fetchone()
                if row is None:
                    continue
                rowid = int(row[0])
                conn.execute("INSERT OR REPLACE INTO chunk_vectors (rowid, embedding) VALUES (?, ?)", (rowid, data))
                conn.execute("UPDATE chunks SET has_vec = 1, digest = '' WHERE rowid = ?", (rowid,))
                conn.execute(f"UPDATE chunk_docs SET doc = json_set(doc, '$.{F.BLOB_SHA}', ?, "
                             f"'$.{F.EMBEDDING_MODEL}', ?) WHERE rowid = ?", (blob, model, rowid))
                report.written += 1
            if report.written:
                self._bump_vec_gen(conn)
        return report

    @staticmethod
    def _put_refs(conn: sqlite3.Connection, rowid: int, refs: list[str]) -> None:
        conn.execute("DELETE FROM chunk_refs WHERE chunk = ?", (rowid,))
        conn.executemany("INSERT INTO chunk_refs (ref, chunk) VALUES (?, ?)", [(r, rowid) for r in refs])
        conn.execute("UPDATE chunk_docs SET doc = json_set(doc, '$.refs', json(?)) WHERE rowid = ?",
                     (json.dumps(refs), rowid))
        conn.execute("UPDATE chunks SET digest = '' WHERE rowid = ?", (rowid,))  # the stored doc changed

    def remove_ref(self, scope_agent: str, scope_context: str, source_id: str, ref: str,
                   paths: Sequence[str] | None = None, keep_ids: Sequence[str] = (),
                   ids: Sequence[str] | None = None) -> tuple[int, int]:
        """Take ``ref`` out of the membership of the chunks of one scope and source (only those with ``ids``, or
        else of ``paths``, when given), except ``keep_ids``; a chunk left with no ref is deleted. Returns
        ``(unlinked, deleted)``."""
        keep = set(keep_ids)
        unlinked: list[int] = []
        orphans: list[tuple[int]] = []
        with self._db.write() as conn:
            if not self._readable(conn):
                return 0, 0
            base = ("SELECT c.rowid, c.id, c.has_vec FROM chunk_refs r JOIN chunks c ON c.rowid = r.chunk"
                    " WHERE r.ref = ? AND c.agent_name = ? AND c.context_id = ? AND c.source_id = ?")
            args: list[Any] = [ref, scope_agent, scope_context, source_id]
            rows: list[tuple[int, str, int]] = []
            if ids is not None:
                ilist = list(ids)
                for i in range(0, len(ilist), 500):
                    part = ilist[i:i + 500]
                    rows += conn.execute(f"{base} AND c.id IN ({','.join('?' * len(part))})",
                                         [*args, *part]).fetchall()
            elif paths is None:
                rows = conn.execute(base, args).fetchall()
            else:
                plist = list(paths)
                for i in range(0, len(plist), 500):
                    part = plist[i:i + 500]
                    rows += conn.execute(f"{base} AND c.path IN ({','.join('?' * len(part))})",
                                         [*args, *part]).fetchall()
            for rowid, cid, _has_vec in rows:
                if cid in keep:
                    continue
                conn.execute("DELETE FROM chunk_refs WHERE ref = ? AND chunk = ?", (ref, rowid))
                left = [r[0] for r in conn.execute("SELECT ref FROM chunk_refs WHERE chunk = ?", (rowid,))]
                if left:
                    self._put_refs(conn, rowid, sorted(left))
                    unlinked.append(rowid)
                else:
                    orphans.append((rowid,))
            if orphans:
                vec = conn.execute(f"SELECT COUNT(*) FROM chunks WHERE has_vec = 1 AND rowid IN "
                                   f"({','.join(str(o[0]) for o in orphans)})").fetchone()[0]
                self._drop_rows(conn, orphans, bool(vec))
        return len(unlinked) + len(orphans), len(orphans)

    def copy_ref(self, scope_agent: str, scope_context: str, source_id: str, from_ref: str, to_ref: str,
                 exclude_paths: Sequence[str] = (), exclude_ids: Sequence[str] = ()) -> int:
        """Make every chunk of ``from_ref`` (one scope and source) a member of ``to_ref`` too, except the chunks
        of ``exclude_paths`` and ``exclude_ids``. Returns the chunks that joined ``to_ref``."""
        with self._db.write() as conn:
            if not self._readable(conn):
                return 0
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS skip_paths (path TEXT PRIMARY KEY)")
            conn.execute("DELETE FROM skip_paths")
            conn.executemany("INSERT OR IGNORE INTO skip_paths VALUES (?)", [(p,) for p in exclude_paths])
            rows = [r[0] for r in conn.execute(
                "SELECT c.rowid FROM chunk_refs r JOIN chunks c ON c.rowid = r.chunk WHERE r.ref = ? AND"
                " c.agent_name = ? AND c.context_id = ? AND c.source_id = ? AND c.path NOT IN (SELECT path FROM"
                " skip_paths) AND c.rowid NOT IN (SELECT chunk FROM chunk_refs WHERE ref = ?)"
                " AND c.id NOT IN (SELECT value FROM json_each(?))",
                (from_ref, scope_agent, scope_context, source_id, to_ref, json.dumps(list(exclude_ids))))]
            for rowid in rows:
                left = [r[0] for r in conn.execute("SELECT ref FROM chunk_refs WHERE chunk = ?", (rowid,))]
                self._put_refs(conn, rowid, sorted({*left, to_ref}))
            conn.execute("DELETE FROM skip_paths")
        return len(rows)

    # ---- reads -----------------------------------------------------------------------------------------------

    def indexed_paths(self, source_id: str, agent_name: str | None = None,
                      context_id: str | None = None) -> set[str]:
        """Every path that has chunks for a source (optionally one scope)."""
        where, args = ["source_id = ?"], [source_id]
        if agent_name is not None:
            where.append("agent_name = ?")
            args.append(agent_name)
        if context_id is not None:
            where.append("context_id = ?")
            args.append(context_id)
        with self._db.read() as conn:
            if not self._readable(conn):
                return set()
            rows = conn.execute(f"SELECT DISTINCT path FROM chunks WHERE {' AND '.join(where)}", args).fetchall()
        return {r[0] for r in rows if r[0] is not None}

    def indexed_blobs(self, source_id: str, agent_name: str, context_id: str,
                      ref: str | None = None, overlay: RefOverlay | None = None) -> dict[str, str]:
        """path → blob id of the path's most recent write (``""`` when two blob ids share the latest write time);
        see :meth:`scopekb.stores.opensearch.OpenSearchChunkStore.indexed_blobs`. Times compared at millisecond
        precision, as OpenSearch's ``max`` of a date does."""
        member, margs = _member_sql(ref, [overlay] if overlay else []) if ref else ("1", [])
        with self._db.read() as conn:
            if not self._readable(conn):
                return {}
            rows = conn.execute(
                "SELECT c.path, json_extract(d.doc, '$.blob_sha'), MAX(substr(json_extract(d.doc, '$.indexed_at'),"
                " 1, 23)) FROM chunks c JOIN chunk_docs d ON d.rowid = c.rowid"
                f" WHERE c.source_id = ? AND c.agent_name = ? AND c.context_id = ? AND {member} GROUP BY 1, 2",
                (source_id, agent_name, context_id, *margs)).fetchall()
        return newest_blob_per_path((path, sha or "", t or "") for path, sha, t in rows)

    def chunk_versions(self, agent_name: str, context_id: str, source_id: str, paths: Sequence[str],
                       ref: str | None = None,
                       overlay: RefOverlay | None = None) -> dict[str, dict[str, tuple[str, str]]]:
        """path → {chunk id: (blob id, indexed_at)} of what one scope of a source holds for ``paths``."""
        out: dict[str, dict[str, tuple[str, str]]] = {}
        paths = list(paths)
        member, margs = _member_sql(ref, [overlay] if overlay else []) if ref else ("1", [])
        with self._db.read() as conn:
            if not self._readable(conn):
                return out
            for i in range(0, len(paths), 500):
                part = paths[i:i + 500]
                rows = conn.execute(
                    "SELECT c.path, c.id, json_extract(d.doc, '$.blob_sha'), json_extract(d.doc, '$.indexed_at')"
                    " FROM chunks c JOIN chunk_docs d ON d.rowid = c.rowid WHERE c.agent_name = ? AND"
                    f" c.context_id = ? AND c.source_id = ? AND c.path IN ({','.join('?' * len(part))}) AND {member}",
                    [agent_name, context_id, source_id, *part, *margs]).fetchall()
                for path, cid, sha, t in rows:
                    out.setdefault(path, {})[cid] = (sha or "", t or "")
        return out

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete chunks by id (ids not stored are ignored). Returns chunks deleted."""
        ids = list(ids)
        total = 0
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            total += self._delete(f"id IN ({','.join('?' * len(part))})", part)
        return total

    def source_stats(self, source_id: str) -> dict[str, int]:
        """``{"documents": distinct paths, "chunks": chunk count}`` for one source."""
        with self._db.read() as conn:
            if not self._readable(conn):
                return {"documents": 0, "chunks": 0}
            docs, chunks = conn.execute("SELECT COUNT(DISTINCT path), COUNT(*) FROM chunks WHERE source_id = ?",
                                        (source_id,)).fetchone()
        return {"documents": int(docs), "chunks": int(chunks)}

    def find_blob(self, flt: SearchFilter, path: str, blob_sha: str) -> dict[str, Any] | None:
        """Stored fields (without content and vector) of one chunk of ``path`` at ``blob_sha`` within ``flt`` (its
        scope, and its repo/source/ref when set), plus its id under ``"_id"``, or None. Among several (refs,
        sources, contexts), the most recently indexed one."""
        where, args = _filter_sql(flt)
        with self._db.read() as conn:
            if not self._readable(conn):
                return None
            row = conn.execute(
                "SELECT d.doc, c.id FROM chunks c JOIN chunk_docs d ON d.rowid = c.rowid"
                f" WHERE {where} AND c.path = ? AND json_extract(d.doc, '$.blob_sha') = ?"
                " ORDER BY json_extract(d.doc, '$.indexed_at') DESC, c.source_id LIMIT 1",
                [*args, path, blob_sha]).fetchone()
        if row is None:
            return None
        doc = json.loads(row[0])
        doc.pop(F.CONTENT, None)
        doc["_id"] = row[1]
        return dict(doc)

    def count(self, flt: SearchFilter | None = None) -> int:
        """Number of chunks matching ``flt`` (all chunks when None)."""
        where, args = _filter_sql(flt) if flt is not None else ("1", [])
        with self._db.read() as conn:
            if not self._readable(conn):
                return 0
            return int(conn.execute(f"SELECT COUNT(*) FROM chunks c WHERE {where}", args).fetchone()[0])

    def keyword_search(self, query: str, flt: SearchFilter, size: int, offset: int = 0,
                       boosts: tuple[float, ...] | None = None) -> list[RawHit]:
        """BM25 (FTS5) over symbol×5, signature×3, content×1 and path×2 within ``flt`` (``boosts``: other column
        weights in that order; validated as :func:`scopekb.fields.keyword_fields` does).

        Query identifiers are kept whole and any of them may match (OR); English stop words are left out
        (:func:`scopekb.stores.sqlite.text.keyword_terms`). Returns ``(doc id, raw score > 0, stored
        fields)`` best first; ties are broken by content_sha, chunk_index, then id, so pages are stable. A query
        with no identifier in it matches nothing.
        """
        terms = list(dict.fromkeys(keyword_terms(query)))
        if not terms or size <= 0:
            return []
        match = " OR ".join(f'"{t}"' for t in terms)
        where, args = _filter_sql(flt)
        if boosts is not None:
            F.keyword_fields(boosts)  # validates
            if not all(boosts):  # a field with boost 0 is left out, as on OpenSearch: match the others only
                cols = [c for c, w in zip(("symbol", "signature", "content", "path"), boosts, strict=True) if w]
                match = "{" + " ".join(cols) + "} : (" + match + ")"
        wts = tuple(float(w) for w in (BM25_WEIGHTS if boosts is None else boosts))
        weights = ", ".join(str(w) for w in wts)
        with self._db.read() as conn:
            if not self._readable(conn):
                return []
            # rarest words first, stopping when no other row can reach the page (topk.py); every weight must be
            # > 0 there (a 0 boost leaves its column out of the match)
            top = topk.top_k(conn, terms, wts, where, args, size + max(0, offset)) if all(wts) else None
            if top is None:  # every word common: FTS5 scores every match, best rows first, then the filter
                top = topk.top_k_unfiltered_first(conn, match, wts, where, args, size + max(0, offset))
            if top is not None:
                page = top[max(0, offset):]
                marks = ",".join("?" * len(page))
                got = dict(conn.execute(f"SELECT rowid, doc FROM chunk_docs WHERE rowid IN ({marks})",
                                        [r for r, _, _ in page]).fetchall()) if page else {}
                return [(i, s, json.loads(got[r])) for r, i, s in page]
            # every match scored by FTS5: rank on the slim rows first, then read the stored fields of the page only
            sql = ("SELECT t.id, t.score, d.doc FROM ("
                   f"SELECT c.rowid AS rid, c.id AS id, -bm25(chunks_fts, {weights}) AS score, c.content_sha AS cs,"
                   " c.chunk_index AS ci FROM chunks_fts JOIN chunks c ON c.rowid = chunks_fts.rowid"
                   f" WHERE chunks_fts MATCH ? AND {where} ORDER BY score DESC, cs, ci, id LIMIT ? OFFSET ?"
                   ") t JOIN chunk_docs d ON d.rowid = t.rid ORDER BY t.score DESC, t.cs, t.ci, t.id")
            rows = conn.execute(sql, [match, *args, size, max(0, offset)]).fetchall()
        return [(r[0], float(r[1]), json.loads(r[2])) for r in rows]

    def literal_candidates(self, lq: LiteralQuery, flt: SearchFilter, limit: int) -> Iterator[RawHit]:
        """Chunks within ``flt`` whose content holds every literal of one group of ``lq`` by the trigram table
        (``MATCH`` of quoted phrases; literals shorter than 3 characters cannot use it: then every chunk of
        ``flt`` is a candidate; a literal holding NUL is matched by its NUL-free pieces), in path / chunk index /
        rowid order, at most ``limit``; documents are read in batches of 200."""
        where, args = _filter_sql(flt)
        # FTS5 reads its query as a C string, so a literal holding NUL is matched by its NUL-free pieces of 3+
        # characters (a looser candidate filter; the verifying pass still checks every line)
        groups = [[p for x in g for p in x.split("\0") if len(p) >= MIN_LITERAL] for g in lq.groups]
        if lq.groups and all(len(x) >= MIN_LITERAL for g in lq.groups for x in g) and all(groups):
            match = " OR ".join("(" + " AND ".join('"' + x.replace('"', '""') + '"' for x in g) + ")"
                                for g in groups)
            sql = (f"SELECT c.rowid FROM chunks_tri t JOIN chunks c ON c.rowid = t.rowid WHERE chunks_tri MATCH ?"
                   f" AND {where} ORDER BY c.path, c.chunk_index, c.rowid LIMIT ?")
            params: list[Any] = [match, *args, limit]
        else:
            sql = f"SELECT c.rowid FROM chunks c WHERE {where} ORDER BY c.path, c.chunk_index, c.rowid LIMIT ?"
            params = [*args, limit]
        with self._db.read() as conn:
            if not self._readable(conn):
                return
            rowids = [r[0] for r in conn.execute(sql, params)]
        yield from self._docs_in_order(rowids)

    def symbol_candidates(self, sq: SymbolQuery, flt: SearchFilter, limit: int) -> list[RawHit]:
        """Chunks within ``flt`` with a definition whose lower-cased name (or path) equals or starts with
        ``sq.text`` lower-cased (an index range), of a kind in ``sq.kinds`` when given; at most ``limit`` in path /
        chunk index order."""
        where, args = _filter_sql(flt)
        col = "s.path" if sq.field == "path" else "s.name"
        text = sq.text.lower()
        cond, cargs = (f"{col} >= ? AND {col} < ?", [text, text + _TOP]) if sq.prefix else (f"{col} = ?", [text])
        if sq.kinds:
            cond += f" AND s.kind IN ({','.join('?' * len(sq.kinds))})"
            cargs.extend(sq.kinds)
        sql = (f"SELECT c.rowid FROM chunks c WHERE c.rowid IN (SELECT s.rowid FROM chunk_defs s WHERE {cond})"
               f" AND {where} ORDER BY c.path, c.chunk_index, c.rowid LIMIT ?")
        with self._db.read() as conn:
            if not self._readable(conn):
                return []
            rowids = [r[0] for r in conn.execute(sql, [*cargs, *args, limit])]
        return list(self._docs_in_order(rowids))

    def _docs_in_order(self, rowids: list[int]) -> Iterator[RawHit]:
        for i in range(0, len(rowids), 200):
            part = rowids[i:i + 200]
            with self._db.read() as conn:
                got = {r[0]: (r[1], r[2]) for r in conn.execute(
                    "SELECT c.rowid, c.id, d.doc FROM chunks c JOIN chunk_docs d ON d.rowid = c.rowid"
                    f" WHERE c.rowid IN ({','.join('?' * len(part))})", part)}
            for rid in part:
                if rid in got:  # deleted since the candidates were listed
                    yield got[rid][0], 1.0, json.loads(got[rid][1])

    def vector_search(self, vector: Sequence[float], flt: SearchFilter, k: int) -> list[RawHit]:
        """Exact cosine kNN within ``flt``: the ``k`` nearest matching chunks (all of them when fewer match).

        Scores are ``(1 + cos) / 2`` in [0, 1] like the lucene ``cosinesimil`` space; ties are broken by insertion
        order. Keyword-only index: ``[]``.

        Raises:
            ValueError: ``vector`` does not have :attr:`dimension` finite values, or is all zeros.
            SqliteVersionMismatch: the database was rebuilt for another dimension or model since this store
                object was made (search.run_search then answers by keyword).
        """
        if not self.dimension or k <= 0:
            return []
        q = np.asarray(vector, dtype=np.float32)
        if self.encoder == "int8" and q.ndim == 1 and np.all(np.isfinite(q)):  # as the stored vectors
            q = np.asarray(F.int8_vector(q.tolist()), dtype=np.float32)
        if q.ndim != 1 or q.shape[0] != self.dimension:
            raise ValueError(f"query vector has dimension {q.shape[0] if q.ndim == 1 else q.shape}; the index has "
                             f"{self.dimension}")
        norm = float(np.linalg.norm(q))
        if not math.isfinite(norm) or norm == 0.0:
            raise ValueError("query vector must be finite and not all zeros")
        q = q / norm
        where, args = _filter_sql(flt)
        with self._db.read() as conn:
            if not self._readable(conn):
                return []
            rowids = np.sort(np.fromiter((r[0] for r in conn.execute(
                f"SELECT c.rowid FROM chunks c WHERE c.has_vec = 1 AND {where}", args)), dtype=np.int64))
            if rowids.size == 0:
                return []
            meta = dict(conn.execute(
                "SELECT key, value FROM scopekb_meta WHERE key IN ('vec_gen', 'dimension', 'model')").fetchall())
            if meta.get("dimension") != str(self.dimension) or (
                    self.model is not None and (meta.get("model") or None) != self.model):
                have = meta.get("model") or None
                fix = (model_mismatch_fix(have, self.model) if meta.get("dimension") == str(self.dimension)
                       else "Run `scopekb reindex` (re-embeds every chunk).")
                raise SqliteVersionMismatch(
                    f"the SQLite index {str(self.path)!r} holds vectors of dimension {meta.get('dimension') or None}"
                    f" and model {have!r}; this process embeds with dimension {self.dimension} and model "
                    f"{self.model!r}. {fix}")
            gen = int(meta["vec_gen"])
            cache = self._vec_cache
            if ((cache is None or cache[0] != gen) and rowids.size <= _DIRECT_READ_MAX
                    and self._stored_vectors(conn, gen) > _SMALL_INDEX_MAX):
                rowids, mat = self._read_vectors(conn, rowids)
                sims = mat @ q
            else:
                if cache is None or cache[0] != gen:
                    cache = self._load_cache(conn, gen)
                if cache[1].size == 0:
                    return []
                # score every cached vector (one matrix-vector product), then pick the filtered rows' scores
                pos = np.minimum(np.searchsorted(cache[1], rowids), cache[1].size - 1)
                present = cache[1][pos] == rowids
                rowids, sims = rowids[present], (cache[2] @ q)[pos[present]]
            if rowids.size == 0:
                return []
            scores = np.clip((1.0 + sims.astype(np.float64)) / 2.0, 0.0, 1.0)
            n = min(k, scores.size)
            if n < scores.size:
                top = np.argpartition(-scores, n - 1)[:n]
                # include every row tied with the k-th score so the stable tie-break below decides, not argpartition
                kth = scores[top].min()
                top = np.flatnonzero(scores >= kth)
            else:
                top = np.arange(scores.size)
            order = top[np.lexsort((rowids[top], -scores[top]))][:n]
            chosen = rowids[order]
            docs = {r[0]: (r[1], r[2]) for r in conn.execute(
                "SELECT c.rowid, c.id, d.doc FROM chunks c JOIN chunk_docs d ON d.rowid = c.rowid"
                f" WHERE c.rowid IN ({','.join('?' * len(chosen))})", [int(x) for x in chosen])}
        return [(docs[int(rid)][0], float(scores[i]), json.loads(docs[int(rid)][1]))
                for rid, i in zip(chosen, order, strict=True)]

    def _read_vectors(self, conn: sqlite3.Connection, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids that have a vector of this dimension, their unit vectors as an (n, dimension) matrix)``."""
        dim = self.dimension or 0
        found: dict[int, bytes] = {}
        ids = rowids.tolist()
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            found.update(conn.execute(
                "SELECT rowid, embedding FROM chunk_vectors WHERE length(embedding) = ? AND rowid IN "
                f"({','.join('?' * len(part))})", [self._vec_bytes, *part]).fetchall())
        keep = [r for r in ids if r in found]
        return np.asarray(keep, dtype=np.int64), _unit_rows(b"".join(found[r] for r in keep), len(keep), dim,
                                                            self._vec_dtype)

    def _stored_vectors(self, conn: sqlite3.Connection, gen: int) -> int:
        """Rows of ``chunk_vectors`` at vector generation ``gen`` (counted once per generation)."""
        known = self._vec_count
        if known is not None and known[0] == gen:
            return known[1]
        n = int(conn.execute("SELECT count(*) FROM chunk_vectors").fetchone()[0])
        self._vec_count = (gen, n)
        return n

    def _load_cache(self, conn: sqlite3.Connection, gen: int) -> tuple[int, np.ndarray, np.ndarray]:
        with self._cache_lock:
            cache = self._vec_cache
            if cache is not None and cache[0] == gen:
                return cache
            dim = self.dimension or 0
            rows = conn.execute("SELECT rowid, embedding FROM chunk_vectors WHERE length(embedding) = ?"
                                " ORDER BY rowid", (self._vec_bytes,)).fetchall()
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            mat = _unit_rows(b"".join(r[1] for r in rows), len(rows), dim, self._vec_dtype)
            del rows
            self._vec_cache = cache = (gen, ids, mat)
            return cache


def _unit_rows(buf: bytes, n: int, dim: int, dtype: str = "<f4") -> np.ndarray:
    """``n`` vectors of ``dim`` values packed in ``buf`` (``dtype``: little-endian float32 ``<f4`` or int8 ``i1``)
    as unit rows of an (n, dim) float32 matrix."""
    mat = np.frombuffer(buf, dtype=dtype).reshape(n, dim).astype(np.float32)
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return mat / norms


def _member_sql(ref: str, overlays: Sequence[RefOverlay] = ()) -> tuple[str, list[Any]]:
    """SQL over table alias ``c`` for the chunks of ``ref`` (members, plus each :class:`RefOverlay`'s base chunks
    of its source that it does not hide) and its parameters."""
    parts = ["c.rowid IN (SELECT chunk FROM chunk_refs WHERE ref = ?)"]
    args: list[Any] = [ref]
    for ov in overlays:
        parts.append("(c.source_id = ? AND c.rowid IN (SELECT chunk FROM chunk_refs WHERE ref = ?)"
                     " AND c.id NOT IN (SELECT value FROM json_each(?)))")
        args.extend([ov.source_id, ov.base, json.dumps(sorted(ov.hidden))])
    return "(" + " OR ".join(parts) + ")", args


def _filter_sql(flt: SearchFilter) -> tuple[str, list[Any]]:
    """SQL ``WHERE`` text over table alias ``c`` and its parameters for every filter of a search."""
    where = ["c.agent_name = ?"]
    args: list[Any] = [flt.scope.agent_name]
    if flt.scope.context_ids is not None:
        if not flt.scope.context_ids:
            return "0", []
        where.append(f"c.context_id IN ({','.join('?' * len(flt.scope.context_ids))})")
        args.extend(flt.scope.context_ids)
    if flt.source_id:
        where.append("c.source_id = ?")
        args.append(flt.source_id)
    if flt.repo:
        where.append("c.repo = ?")
        args.append(flt.repo)
    if flt.ref:
        member, margs = _member_sql(flt.ref.removeprefix("refs/heads/"), flt.overlays)
        where.append(member)
        args.extend(margs)
    elif flt.pinned:  # leave out chunks whose refs are only pins
        marks = ",".join("?" * len(flt.pinned))
        where.append(f"(c.rowid NOT IN (SELECT chunk FROM chunk_refs WHERE ref IN ({marks})) OR c.rowid IN "
                     f"(SELECT chunk FROM chunk_refs WHERE ref NOT IN ({marks})))")
        args.extend([*flt.pinned, *flt.pinned])
    if flt.languages:
        where.append(f"c.language IN ({','.join('?' * len(flt.languages))})")
        args.extend(flt.languages)
    if flt.file_patterns:
        where.append("(" + " OR ".join("scopekb_glob(c.path, ?)" for _ in flt.file_patterns) + ")")
        args.extend(flt.file_patterns)
    for key, values in flt.metadata:
        where.append("c.rowid IN (SELECT m.rowid FROM chunk_meta m WHERE m.key = ? AND m.value IN"
                     f" ({','.join('?' * len(values))}))")
        args.extend([key, *values])
    return " AND ".join(where), args
