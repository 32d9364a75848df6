"""Embedded-mode stores on SQLite: the chunk index (FTS5 BM25 + exact cosine kNN) and small records.

Same contract as the OpenSearch stores (DESIGN §7): :class:`SqliteChunkStore` implements
:class:`scopekb.stores.base.ChunkStore` and :class:`SqliteRecordStore` implements
:class:`scopekb.stores.base.RecordStore`. Both may share one database file.

Keyword search mirrors the OpenSearch analyzers of :mod:`scopekb.fields` by tokenising in Python: at index time
identifiers are split into parts (camelCase, snake_case, digits) and the original identifier is kept; at query time
identifiers stay whole. The FTS5 table receives the tokens as one space-separated string (``ascii`` tokenizer with
``_`` as a token character, so FTS5 never re-splits a token), and ranks with ``bm25()`` weighted like
:data:`scopekb.fields.KEYWORD_FIELDS`. Vector search is exact cosine over the filtered rows with numpy.

Concurrency: one connection per thread, WAL journal, writes serialised by a process-wide lock plus
``BEGIN IMMEDIATE`` (other processes wait on ``busy_timeout``). The path must be a file, not ``:memory:``.

The package is split by concern: :mod:`.text` (tokenisation, glob matching), :mod:`.db` (connections),
:mod:`.chunks` (:class:`SqliteChunkStore`) and :mod:`.records` (:class:`SqliteRecordStore`).
"""

from __future__ import annotations

from scopekb.stores.sqlite.chunks import SCHEMA_VERSION, SqliteChunkStore, SqliteVersionMismatch
from scopekb.stores.sqlite.records import SqliteRecordStore
from scopekb.stores.sqlite.text import fts_text, index_tokens, query_tokens

__all__ = [
    "SCHEMA_VERSION",
    "SqliteChunkStore",
    "SqliteRecordStore",
    "SqliteVersionMismatch",
    "fts_text",
    "index_tokens",
    "query_tokens",
]
