"""The store contract every chunk store implements (OpenSearch in production, SQLite in embedded mode).

Filters are store-neutral (:class:`SearchFilter`); each store translates them. Every read takes a scope.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class StoreVersionMismatch(RuntimeError):
    """The live index was built for another mapping version or embedding dimension than this process's."""


class IndexPlacementError(RuntimeError):
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


@dataclass
class BulkReport:
    """Outcome of a bulk write: ``written`` documents, per-item ``errors`` as (doc id, path, reason), and
    ``retried``: item re-sends the store made itself (OpenSearch answered 429 for them), summed over rounds."""

    written: int = 0
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    retried: int = 0


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

    def live_index(self) -> str | None: ...

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

    def indexed_blobs(self, source_id: str, agent_name: str, context_id: str) -> dict[str, str]: ...

    def source_stats(self, source_id: str) -> dict[str, int]: ...

    def refresh(self) -> None: ...

    def keyword_search(self, query: str, flt: SearchFilter, size: int, offset: int = 0) -> list[RawHit]: ...

    def vector_search(self, vector: Sequence[float], flt: SearchFilter, k: int) -> list[RawHit]: ...
