"""Rebuild the chunk index for a new mapping version or embedding model, then swap the alias atomically.

The pypi/warehouse pattern (DESIGN §3, §12): create the new index with refresh off and no replicas, fill it with
bulk requests, restore the settings, point the alias at it in one ``update_aliases`` call, drop the old index.
Searches keep answering from the old index until the swap. Vectors come through the embedding cache, so an
unchanged model re-embeds nothing; a new model embeds each distinct chunk text once. The embedded (SQLite) index is
rebuilt in its file: every vector is computed first, while the old tables answer, and searches go without answers
only while the tables are written again (:func:`_rebuild_sqlite`).

Syncs are held off while a reindex runs (a Redis key that the sync task checks), so no write lands in the old
index after it has been copied.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from opensearchpy import OpenSearch, helpers
from opensearchpy.exceptions import TransportError

from scopekb import fields as F
from scopekb.chunking import TokenCounter, embedding_text
from scopekb.embedding import Embedder, EmbeddingCache, embed_with_cache
from scopekb.logging import get_logger
from scopekb.models import Chunk
from scopekb.settings import ChunkingSettings
from scopekb.stores.opensearch import OpenSearchChunkStore, translate_opensearch
from scopekb.stores.sqlite import SqliteChunkStore

log = get_logger(__name__)

@dataclass
class ReindexReport:
    """What a reindex did: old and new index names, chunks copied, embeddings computed vs cached, seconds."""

    old_index: str | None
    new_index: str
    chunks: int = 0
    embeddings_computed: int = 0
    embeddings_cached: int = 0
    embedding_failures: int = 0
    seconds: float = 0.0


def _scroll(client: OpenSearch, index: str, batch: int) -> Iterator[list[dict[str, Any]]]:
    buf: list[dict[str, Any]] = []
    for hit in helpers.scan(client, index=index, size=batch, preserve_order=False,
                            query={"query": {"match_all": {}}, "_source": {"excludes": [F.EMBEDDING]}}):
        buf.append({"_id": hit["_id"], **hit["_source"]})
        if len(buf) >= batch:
            yield buf
            buf = []
    if buf:
        yield buf


def reindex(target: OpenSearchChunkStore | SqliteChunkStore, embedder: Embedder | None,
            cache: EmbeddingCache | None, chunking: ChunkingSettings, counter: TokenCounter | None = None,
            batch: int = 500, progress: Callable[[int], None] | None = None) -> ReindexReport:
    """See :func:`_reindex` (OpenSearch) and :func:`_rebuild_sqlite` (the embedded store); opensearch-py errors
    are raised as :mod:`scopekb.errors` (``Transient`` / ``Refused``)."""
    if isinstance(target, SqliteChunkStore):
        return _rebuild_sqlite(target, embedder, cache, chunking, counter, batch, progress)
    try:
        return _reindex(target, embedder, cache, chunking, counter, batch, progress)
    except TransportError as e:
        raise translate_opensearch(e) from e


def _reindex(target: OpenSearchChunkStore, embedder: Embedder | None, cache: EmbeddingCache | None,
             chunking: ChunkingSettings, counter: TokenCounter | None = None, batch: int = 500,
             progress: Callable[[int], None] | None = None) -> ReindexReport:
    """Copy every chunk from the live index behind ``target.alias`` into a fresh index built for ``target``'s
    dimension and model (re-embedding through the cache), then swap the alias and delete the old index.

    Args:
        target: a store configured with the NEW dimension/model (its ``ensure_index`` would refuse the old one).
        embedder: the new model, or None for a keyword-only index.
        progress: called with the number of chunks copied so far.

    Raises:
        opensearchpy.exceptions.TransportError (:func:`reindex` raises it translated): the cluster refused a
            step; the alias still points at the old index, and the half-built new index is deleted.
    """
    client = target.client
    t0 = time.monotonic()
    old = target.live_index()
    new = f"{target.version_name}-{int(time.time())}"
    body = {"settings": F.chunk_index_settings(target.shards, 0, knn=bool(target.dimension),
                                                     encoder=target.encoder),
            "mappings": F.chunk_mapping(target.dimension, target.model, target.encoder)}
    body["settings"]["index"]["refresh_interval"] = "-1"
    # the same chunks under the same generation: sync states recorded against the old index stay trusted
    body["mappings"]["_meta"]["generation"] = (target.generation() if old is not None else None) or secrets.token_hex(8)
    client.indices.create(index=new, body=body)
    client.cluster.health(index=new, wait_for_status="yellow", params={"request_timeout": 35})
    report = ReindexReport(old_index=old, new_index=new)
    log.info("reindex_started", old_index=old, new_index=new, dimension=target.dimension, model=target.model)
    try:
        if old is not None:
            for docs in _scroll(client, old, batch):
                _embed_docs(docs, embedder, cache, chunking, counter, report)
                actions = ({"_op_type": "index", "_index": new, "_id": d["_id"], "_source": target.stored_source(d)}
                           for d in docs)
                ok, errors = helpers.bulk(client, actions, max_chunk_bytes=target.bulk_max_bytes, raise_on_error=False,
                                          max_retries=5, initial_backoff=1)
                if errors:
                    raise RuntimeError(f"{len(errors)} chunks refused by the new index: {str(errors[0])[:300]}")
                report.chunks += ok
                if progress:
                    progress(report.chunks)
        client.indices.put_settings(index=new, body={"index": {"refresh_interval": None,
                                                               "number_of_replicas": target.replicas}})
        client.indices.refresh(index=new)
        actions: list[dict[str, Any]] = [{"add": {"index": new, "alias": target.alias}}]
        if old is not None:
            actions.insert(0, {"remove": {"index": old, "alias": target.alias}})
        client.indices.update_aliases(body={"actions": actions})  # atomic: readers see old, then new
    except Exception:
        client.indices.delete(index=new, ignore_unavailable=True)
        raise
    if old is not None:
        client.indices.delete(index=old, ignore_unavailable=True)
    report.seconds = round(time.monotonic() - t0, 3)
    log.info("reindex_finished", **report.__dict__)
    return report


def _rebuild_sqlite(target: SqliteChunkStore, embedder: Embedder | None, cache: EmbeddingCache | None,
                    chunking: ChunkingSettings, counter: TokenCounter | None, batch: int,
                    progress: Callable[[int], None] | None) -> ReindexReport:
    """Rebuild an embedded (SQLite) chunk index for this process's schema version and model: read every stored
    chunk, drop the chunk tables, create them anew and write the chunks back (vectors through the embedding cache,
    as for OpenSearch; without an embedder the stored vectors are kept, since the store refuses a file of another
    model before this; definitions of chunks written before schema 2 derived from their top-level symbol).

    The database file is first copied next to itself (``<file>.pre-reindex``) and the copy deleted after success;
    when a step fails the error names the copy, from which the index can be restored.

    With an embedder and a cache, every vector is computed into the cache first, while the old tables still answer
    searches (a README newcomer saw an empty index for a minute and a partial one for five while a reindex
    embedded batch by batch after the drop); only then are the tables dropped and written again from the cache,
    so searches go without answers for the writing alone (seconds for thousands of chunks). ``progress`` counts
    chunks embedded in that first pass, then chunks written.
    """
    t0 = time.monotonic()
    old_index = target.live_index() or None
    generation = target.generation()  # kept: the rebuilt file holds the same chunks (scopekb.indexing's check)
    docs = target.stored_documents()
    embeds = embedder is not None or not target.dimension  # else: the stored vectors of the same model stay
    report = ReindexReport(old_index=old_index, new_index=target.version_name)
    first_pass = embeds and embedder is not None and cache is not None
    if first_pass:
        for i in range(0, len(docs), batch):  # copies: the vectors go to the cache, not into memory
            _embed_docs([dict(d) for d in docs[i:i + batch]], embedder, cache, chunking, counter, report)
            if progress:
                progress(min(i + batch, len(docs)))
        report.embedding_failures = 0  # a failure is tried again, and counted, below
    backup = target.path.with_name(target.path.name + ".pre-reindex")
    target.backup(backup)
    log.info("reindex_started", old_index=str(target.path), chunks=len(docs), backup=str(backup))
    second = ReindexReport(old_index=old_index, new_index=target.version_name)
    try:
        target.drop()
        target.ensure_index(generation=generation)
        for i in range(0, len(docs), batch):
            part = docs[i:i + batch]
            if embeds:
                _embed_docs(part, embedder, cache, chunking, counter, second)
            res = target.bulk_write(part)
            if res.errors:
                raise RuntimeError(f"{len(res.errors)} chunks refused by the new index: {str(res.errors[0])[:300]}")
            report.chunks += res.written
            if progress:
                progress(report.chunks)
    except Exception as e:
        raise RuntimeError(f"reindex failed ({e}); the database before it is kept at {backup}") from e
    report.embeddings_computed += second.embeddings_computed  # with a first pass: what the cache missed
    report.embedding_failures = second.embedding_failures
    if not first_pass:
        report.embeddings_cached = second.embeddings_cached
    backup.unlink(missing_ok=True)
    report.seconds = round(time.monotonic() - t0, 3)
    log.info("reindex_finished", **report.__dict__)
    return report


def _embed_docs(docs: list[dict[str, Any]], embedder: Embedder | None, cache: EmbeddingCache | None,
                chunking: ChunkingSettings, counter: TokenCounter | None, report: ReindexReport) -> None:
    for d in docs:
        d.pop(F.EMBEDDING, None)
        d.pop(F.EMBEDDING_MODEL, None)
        if F.DEF_NAMES not in d:  # written before mapping version 4: its top-level symbol becomes its definition
            d.update(F.def_fields(d.get(F.DEFS), d.get(F.SYMBOL), d.get(F.KIND), d.get(F.SIGNATURE),
                                  d.get(F.START_LINE)))
    if embedder is None:
        return
    texts = []
    for d in docs:
        c = Chunk(content=d[F.CONTENT], start_line=d[F.START_LINE], end_line=d[F.END_LINE],
                  chunk_index=d[F.CHUNK_INDEX], kind=d.get(F.KIND) or "lines", symbol=d.get(F.SYMBOL),
                  signature=d.get(F.SIGNATURE), metadata=d.get(F.METADATA) or {})
        texts.append(embedding_text(d[F.PATH], d.get(F.LANGUAGE) or "text", c, chunking, counter))
    vectors, stats, _errors = embed_with_cache(embedder, cache, texts)
    report.embeddings_computed += stats.computed
    report.embeddings_cached += stats.cached
    report.embedding_failures += stats.failed
    for d, v in zip(docs, vectors, strict=True):
        if v is not None:
            d[F.EMBEDDING] = list(v)
            d[F.EMBEDDING_MODEL] = embedder.model_id
