"""The store contracts: :class:`ChunkStore` (chunk documents; OpenSearch in production, SQLite in embedded mode)
and :class:`RecordStore` (small records: sources, jobs, sync state, keys, dead letters).

Filters are store-neutral (:class:`SearchFilter`); each store translates them. Every chunk read takes a scope.
Adapters translate their library's errors into :mod:`scopekb.errors` (``Transient`` for an unavailable backend,
``Refused`` for a request the backend will not run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from scopekb.errors import ScopekbError
from scopekb.models import Job, Source, utcnow
from scopekb.textsearch import LiteralQuery


class StoreBusy(ScopekbError):
    """``scopekb reindex`` could not take the store: syncs were still running when its wait ran out."""


class StoreVersionMismatch(RuntimeError):
    """The live index was built for another mapping version or embedding dimension than this process's."""


#: What the model id of ``onnx-int8`` vectors carries (:func:`scopekb.embedding.onnx.int8_id_suffix`).
_INT8_MARK = "+int8"


def no_model_fix(dimension: int, model: str | None) -> str:
    """The fix named when an index holds vectors (``dimension``, of ``model``) and this process has no embedding
    model (hostile review: "Run `scopekb reindex`" was named, and a reindex without a provider drops every vector)."""
    return (f"The index holds {dimension}-dimension vectors of {model or 'an unrecorded model'} and this process has "
            "no embedding model: set SCOPEKB_EMBEDDING__PROVIDER (e.g. local) as for the index and run it again "
            "(`scopekb reindex` without a provider would drop the vectors).")


def model_mismatch_fix(have: str | None, want: str | None) -> str:
    """The fix named when an index holds vectors of model ``have`` and this process embeds with ``want``: always
    ``scopekb reindex``; when the two are the same local model (ids ``local:…``) and differ only in the int8 backend
    (a changed ``embedding.local_backend``), or the index's model is another named local model (a changed
    ``embedding.local_model``), also the setting that keeps the index as it is. Example: ``"Run
    `scopekb reindex` (re-embeds every chunk), or set SCOPEKB_EMBEDDING__LOCAL_BACKEND=onnx to keep this index's
    vectors."``"""
    base = "Run `scopekb reindex` (re-embeds every chunk)"
    if not have or not want:
        return base + "."
    have_base, _, have_q = have.partition(_INT8_MARK)
    want_base, _, want_q = want.partition(_INT8_MARK)
    named, wanted = _named_local_model(have), _named_local_model(want)
    if named is not None and wanted is not None and named != wanted:  # another named local model (issue 21)
        backend = ("" if (_INT8_MARK in have) == (_INT8_MARK in want)
                   else f" and SCOPEKB_EMBEDDING__LOCAL_BACKEND={'onnx-int8' if _INT8_MARK in have else 'onnx'}")
        return f"{base}, or set SCOPEKB_EMBEDDING__LOCAL_MODEL={named}{backend} to keep this index's vectors."
    if (not have.startswith("local:") or have_base != want_base
            or (_INT8_MARK in have) == (_INT8_MARK in want)):
        return base + "."
    keep = "onnx-int8" if _INT8_MARK in have else "onnx"
    return f"{base}, or set SCOPEKB_EMBEDDING__LOCAL_BACKEND={keep} to keep this index's vectors."


def _named_local_model(model_id: str | None) -> str | None:
    """The ``embedding.local_model`` name of a local model id (``local:<name>@…``), or None."""
    from scopekb.embedding.catalog import LOCAL_MODELS

    name = (model_id or "").removeprefix("local:").partition("@")[0]
    return name if (model_id or "").startswith("local:") and name in LOCAL_MODELS else None


class IndexPlacementError(ScopekbError):
    """The cluster cannot place the chunk index's shard copies (too few data nodes for the replicas asked for,
    or shards it holds are unassigned); the message says which numbers and what to change."""


@dataclass(frozen=True)
class ScopeFilter:
    """The scope a read may see: one agent and either some of its contexts or all of them.

    ``context_ids=None`` means every context of ``agent_name`` (``cross_context``); it never widens to another
    agent. An empty tuple matches nothing.
    """

    agent_name: str
    context_ids: tuple[str, ...] | None


@dataclass(frozen=True)
class RefOverlay:
    """How a ref indexed from a nearby ref holds that ref's chunks without a membership write (issue 23).

    The members of ref ``R`` of source ``source_id`` are the chunks whose ``refs`` name ``R`` plus the chunks of
    the same source whose ``refs`` name ``base`` and whose id is not in ``hidden``. Adding a branch that differs
    from ``base`` by one file thus writes membership for that file's chunks only; :mod:`scopekb.overlays` keeps
    ``hidden`` and the explicit memberships right as ``base`` and ``R`` move.
    """

    source_id: str
    base: str
    hidden: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SearchFilter:
    """Everything a search is restricted to: the scope (always) plus optional narrowing filters.

    ``file_patterns`` are path globs (``*`` and ``**`` match across ``/``; a pattern without ``/`` matches the
    file name in any folder); ``languages`` are :func:`scopekb.filetypes.language_for` names.
    """

    scope: ScopeFilter
    source_id: str | None = None
    repo: str | None = None
    ref: str | None = None
    languages: tuple[str, ...] = ()
    file_patterns: tuple[str, ...] = ()
    #: ``(key, values)`` pairs: the chunk's metadata at ``key`` (nested keys joined by ``.``) equals one of
    #: ``values`` (as text, :func:`scopekb.models.metadata_text`); every pair must match.
    metadata: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Temporary pinned refs (full commit ids, :func:`scopekb.ops.pin_commit`): without ``ref``, a chunk whose refs
    #: are only pins is left out, so a search with no ``ref`` covers the tracked branches and tags alone.
    pinned: tuple[str, ...] = ()
    #: With ``ref``: the sources where ``ref`` is an overlay of another ref (:class:`RefOverlay`).
    overlays: tuple[RefOverlay, ...] = ()


@dataclass(frozen=True)
class SymbolQuery:
    """A definition lookup (``symbol`` mode) for :meth:`ChunkStore.symbol_candidates`.

    ``text`` is compared lower-cased with the definitions' names (``field="name"``) or qualified paths
    (``field="path"``, e.g. ``client.get``), equal or (``prefix``) as a prefix; ``kinds`` (lower-case) keeps
    definitions of those kinds. Stores match case-insensitively; the caller verifies case and kind per definition.
    """

    text: str
    field: str = "name"
    prefix: bool = False
    kinds: tuple[str, ...] = ()


@dataclass
class BulkReport:
    """Outcome of a bulk write: ``written`` documents, per-item ``errors`` as (doc id, path, reason), and
    ``retried``: item re-sends the store made itself (OpenSearch answered 429 for them), summed over rounds."""

    written: int = 0
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    retried: int = 0


#: How :meth:`ChunkStore.problem` begins when no node of the backend answered (an outage), as opposed to a
#: backend that answered and said why it cannot serve (``cluster red: ...``).
UNANSWERED_PROBLEMS = ("unreachable", "health check failed")
#: How :meth:`ChunkStore.problem` begins when a node took the connection but no node answered in time (a cluster
#: under heavy load, a long garbage-collection pause), as opposed to every node refusing it (``unreachable:
#: ConnectionError``, an outage). Unanswered too, but a worker whose write just failed waits for it (issue 24).
SLOW_PROBLEM = "unreachable: ConnectionTimeout"


def newest_blob_per_path(rows: Iterable[tuple[str, str, Any]]) -> dict[str, str]:
    """path -> blob id of the path's most recent write, from ``(path, blob id, write time)`` rows (any comparable
    time); ``""`` when two blob ids share the latest time (the path is then treated as changed; issue 20)."""
    latest: dict[str, tuple[Any, str]] = {}
    for path, sha, t in rows:
        prev = latest.get(path)
        if prev is None or t > prev[0]:
            latest[path] = (t, sha)
        elif t == prev[0] and sha != prev[1]:
            latest[path] = (t, "")
    return {p: sha for p, (_, sha) in latest.items()}


def answered_problem(problem: str | None) -> str | None:
    """``problem`` when the backend answered and said why it cannot serve, None otherwise (also for an outage)."""
    return None if problem is None or problem.startswith(UNANSWERED_PROBLEMS) else problem


def slow_problem(problem: str | None) -> bool:
    """True when ``problem`` says the backend took the connection but did not answer in time (:data:`SLOW_PROBLEM`),
    not that it refused it or answered."""
    return problem is not None and problem.startswith(SLOW_PROBLEM)


#: A search hit from a store: (document id, raw score, stored fields without the vector).
RawHit = tuple[str, float, dict[str, Any]]


class ChunkStore(Protocol):
    """Chunk documents tagged with their scope. Implementations: OpenSearch, SQLite.

    Attributes:
        kind: the backend's name as readiness reports it (``opensearch``, ``sqlite``).
        dimension: embedding dimension, None for a keyword-only index.
    """

    kind: str
    dimension: int | None

    def ensure_index(self) -> str: ...

    def check_placement(self) -> dict[str, Any]: ...

    def problem(self, recovering: bool = False) -> str | None: ...

    def cluster_health(self) -> dict[str, Any]: ...

    def live_index(self) -> str | None: ...

    def index_dimension(self) -> int | None:
        """The embedding dimension the live index was built with (None: keyword-only), read from the index itself
        rather than from this process's settings; this store's ``dimension`` while no index exists."""
        ...

    def sync_guard(self) -> AbstractContextManager[None]:
        """Held by a sync (or an embedding part) while it reads and writes this store; waits while a rebuild
        (:meth:`rebuild_guard`) of another process holds the store. OpenSearch: nothing (the distributed profile's
        syncs wait for ``scopekb reindex`` through the coordination store)."""
        ...

    def rebuild_guard(self, wait_s: float) -> AbstractContextManager[None]:
        """Held by ``scopekb reindex`` for the whole rebuild: waits up to ``wait_s`` seconds for running syncs of
        any process to finish, then keeps new ones waiting until it is released.

        Raises:
            StoreBusy: syncs still running after ``wait_s``.
        """
        ...

    def index_model(self) -> str | None:
        """The embedding model id the live index's vectors come from (None: keyword-only), read from the index
        itself as :meth:`index_dimension`; this store's ``model`` while no index exists."""
        ...

    def generation(self) -> str | None:
        """An id of the live index that changes whenever the index is made anew (deleted and created again, a
        lost or replaced ``index.sqlite3``), or None when no index exists; a rebuild by ``scopekb reindex`` keeps
        it (the same chunks). A sync records it in each ref's state; a ref whose state names another generation is
        compared with the index again, since its commit says nothing about what this index holds
        (:func:`scopekb.indexing.run_sync`). OpenSearch: ``_meta.generation`` of the index
        behind the alias (one request); SQLite: a random id in the file's ``scopekb_meta``, both written when the
        index is created."""
        ...

    def health(self) -> None: ...

    def count(self) -> int: ...

    def bulk_write(self, docs: Iterable[dict[str, Any]], refresh: bool = False) -> BulkReport: ...

    def delete_path(self, scope_agent: str, scope_context: str, source_id: str, path: str,
                    keep_ids: Sequence[str] = ()) -> int: ...

    def delete_paths(self, scope_agent: str, scope_context: str, source_id: str, paths: Sequence[str],
                     keep_ids: Sequence[str] = ()) -> int: ...

    def delete_source(self, source_id: str, paths: Sequence[str] | None = None) -> int: ...

    def indexed_paths(self, source_id: str, agent_name: str | None = None,
                      context_id: str | None = None) -> set[str]: ...

    def indexed_blobs(self, source_id: str, agent_name: str, context_id: str,
                      ref: str | None = None, overlay: RefOverlay | None = None) -> dict[str, str]: ...

    def chunk_versions(self, agent_name: str, context_id: str, source_id: str, paths: Sequence[str],
                       ref: str | None = None,
                       overlay: RefOverlay | None = None) -> dict[str, dict[str, tuple[str, str]]]: ...

    def delete_ids(self, ids: Sequence[str]) -> int: ...

    def source_stats(self, source_id: str) -> dict[str, int]: ...

    def find_blob(self, flt: SearchFilter, path: str, blob_sha: str) -> dict[str, Any] | None:
        """Stored fields (no content, no vector) of one chunk of ``path`` at ``blob_sha`` within ``flt`` (its scope
        always; its ``repo``, ``source_id``, ``ref`` with ``overlays`` when set), with the chunk's id under
        ``"_id"``, or None when there is none: the scope check of ``read``."""
        ...

    def refresh(self) -> None: ...

    def chunk_refs(self, ids: Sequence[str]) -> dict[str, list[str]]:
        """``id -> refs`` (issue 23 ref membership) of the chunks among ``ids`` that exist."""
        ...

    def set_refs(self, refs_by_id: dict[str, list[str]]) -> BulkReport:
        """Replace the ``refs`` of existing chunks without sending their content or vectors again."""
        ...

    def set_vectors(self, vectors_by_id: dict[str, tuple[Sequence[float], str]], model: str) -> BulkReport:
        """Add vectors to existing chunks (the embedding stage, issue 19): ``id -> (vector, blob sha)`` sets
        ``embedding``, ``embedding_model = model`` and ``blob_sha`` (written empty by the sync stage, so a chunk
        whose vector never came is re-indexed by the next sync) without sending the content again. Chunks that no
        longer exist (deleted or replaced by a later sync meanwhile) are skipped, not errors; ``written`` counts
        the chunks updated, ``errors`` the ones the store refused (``(id, "?", "status: reason")``)."""
        ...

    def remove_ref(self, scope_agent: str, scope_context: str, source_id: str, ref: str,
                   paths: Sequence[str] | None = None, keep_ids: Sequence[str] = (),
                   ids: Sequence[str] | None = None) -> tuple[int, int]:
        """Take ``ref`` out of the chunks of one scope and source (of ``paths``/with ``ids`` when given) except
        ``keep_ids``; delete the chunks left with no ref. Returns ``(unlinked, deleted)``."""
        ...

    def copy_ref(self, scope_agent: str, scope_context: str, source_id: str, from_ref: str, to_ref: str,
                 exclude_paths: Sequence[str] = (), exclude_ids: Sequence[str] = ()) -> int:
        """Add ``to_ref`` to every chunk whose ``refs`` name ``from_ref`` (one scope and source) outside
        ``exclude_paths`` and ``exclude_ids``; returns the chunks that joined."""
        ...

    def keyword_search(self, query: str, flt: SearchFilter, size: int, offset: int = 0,
                       boosts: tuple[float, ...] | None = None) -> list[RawHit]:
        """BM25 within ``flt``, ``(id, raw score, stored fields)`` best first; ``boosts``: field boosts (symbol,
        signature, content, path) instead of :data:`scopekb.fields.KEYWORD_BOOSTS`."""
        ...

    def vector_search(self, vector: Sequence[float], flt: SearchFilter, k: int) -> list[RawHit]: ...

    def literal_candidates(self, lq: LiteralQuery, flt: SearchFilter, limit: int) -> Iterator[RawHit]:
        """Chunks within ``flt`` whose content may match ``lq`` (a superset of the exact answer), in the order
        path, chunk index, then a store tie-break; at most ``limit``. Raw scores are 1.0."""
        ...

    def symbol_candidates(self, sq: SymbolQuery, flt: SearchFilter, limit: int) -> list[RawHit]:
        """Chunks within ``flt`` defining a symbol that matches ``sq`` case-insensitively, at most ``limit``, in
        the order path, chunk index. Raw scores are 1.0; the stored ``defs`` field lists the definitions."""
        ...


class RecordStore(Protocol):
    """Small durable records by kind (``sources``, ``jobs``, ``state``, ``keys``, ``deadletters``).

    Implementations (:class:`scopekb.stores.records.OpenSearchRecordStore`,
    :class:`scopekb.stores.sqlite.SqliteRecordStore`) subclass this protocol explicitly and implement the generic
    ``ensure``/``put``/``get``/``delete``/``find``; the typed helpers below are written once over them. Failures of
    the backend are raised as :class:`scopekb.errors.Transient`.
    """

    def ensure(self, kind: str) -> None:
        """Create the storage for ``kind`` if missing (idempotent)."""
        ...

    def put(self, kind: str, rec_id: str, doc: dict[str, Any], wait: bool = True) -> None:
        """Create or replace a record; ``wait`` makes it visible to the next read from any process."""
        ...

    def get(self, kind: str, rec_id: str) -> dict[str, Any] | None:
        """A record by id, or None."""
        ...

    def delete(self, kind: str, rec_id: str) -> bool:
        """Delete a record; True when it existed."""
        ...

    def update(self, kind: str, rec_id: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None],
               wait: bool = True) -> dict[str, Any] | None:
        """Atomic read-modify-write of one record: ``change`` gets the current record (None when absent; a copy it
        may modify) and returns the record to write, or None to write nothing. No write of another process or
        thread between the read and the write is lost: OpenSearch writes with ``if_seq_no``/``if_primary_term``
        and calls ``change`` again on a version conflict (at most 50 times), SQLite runs it inside one
        ``BEGIN IMMEDIATE`` transaction. Returns what was written (or the current record when nothing was).
        An exception ``change`` raises propagates and nothing is written.

        Raises:
            scopekb.errors.Transient: the store is unavailable, or 50 conflicting writes in a row.
        """
        ...

    def find(self, kind: str, size: int = 1000, sort: str | None = None, **terms: Any) -> list[dict[str, Any]]:
        """Records whose keyword fields equal ``terms`` (all must match; a list field matches when it contains
        the value), newest ``sort`` first, at most ``size``."""
        ...

    # ---- typed helpers ---------------------------------------------------------------------------------------

    def put_source(self, src: Source) -> None:
        d = src.model_dump(mode="json")
        for k in ("webhook_secret", "webhook_secret_previous"):
            secret = getattr(src, k)
            d[k] = secret.get_secret_value() if secret else None
        self.put("sources", src.id, d)

    def get_source(self, source_id: str) -> Source | None:
        d = self.get("sources", source_id)
        return Source.model_validate(d) if d else None

    def list_sources(self, **terms: Any) -> list[Source]:
        return [Source.model_validate(d) for d in self.find("sources", sort="created_at", **terms)]

    def put_job(self, job: Job) -> None:
        """Store a job record. Reads by id are real-time, so this does not wait for a refresh."""
        self.put("jobs", job.id, job.model_dump(mode="json"), wait=False)

    def get_job(self, job_id: str) -> Job | None:
        d = self.get("jobs", job_id)
        return Job.model_validate(d) if d else None

    def list_jobs(self, source_id: str | None = None, size: int = 20) -> list[Job]:
        return [Job.model_validate(d) for d in self.find("jobs", size=size, sort="created_at",
                                                         source_ids=source_id)]

    def indexed_commit(self, source_id: str) -> str | None:
        """The last commit fully indexed for a source (its sync state), or None before the first sync."""
        d = self.get("state", source_id)
        return d.get("commit") if d else None

    def set_indexed_commit(self, source_id: str, commit: str | None, when: datetime | None = None) -> None:
        """Advance a source's sync state; call only after every batch of the sync succeeded."""
        self.put("state", source_id, {"source_id": source_id, "commit": commit,
                                      "indexed_at": (when or utcnow()).isoformat()}, wait=False)
