"""Per-source status, the aimon seed's IndexStatus: READY / INDEXING / EMPTY / ERROR with counts and lag."""

from __future__ import annotations

from typing import Any

from scopekb.models import Source
from scopekb.stores.base import ChunkStore, RecordStore


def source_status(records: RecordStore, chunks: ChunkStore, src: Source) -> dict[str, Any]:
    """State, documents, chunks, indexed commit and lag of one source.

    ``status`` is INDEXING while its newest job runs, ERROR when that job failed, EMPTY without chunks, else
    READY. ``behind_last_push`` is true when the newest job's target commit is not the indexed one (a sync is
    pending, running, or ended partial and will be retried). ``last_job`` is the newest job record, or None.
    """
    stats = chunks.source_stats(src.id)
    state = records.get("state", src.id) or {}
    jobs = records.list_jobs(source_id=src.id, size=1)
    last = jobs[0] if jobs else None
    if last is not None and not last.finished:
        status = "INDEXING"
    elif last is not None and last.state.value == "failed":
        status = "ERROR"
    elif stats["chunks"] == 0:
        status = "EMPTY"
    else:
        status = "READY"
    behind = bool(last is not None and last.to_commit and last.to_commit != state.get("commit"))
    return {"status": status, "indexed_commit": state.get("commit"), "indexed_at": state.get("indexed_at"),
            "behind_last_push": behind, **stats, "last_job": last.model_dump(mode="json") if last else None}
