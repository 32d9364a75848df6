"""Per-source status, the aimon seed's IndexStatus: READY / PARTIAL / INDEXING / EMPTY / ERROR with counts and lag."""

from __future__ import annotations

from typing import Any

from scopekb import tuning
from scopekb.models import Source, utcnow
from scopekb.refs import ref_heads
from scopekb.stores.base import ChunkStore, RecordStore


def source_status(records: RecordStore, chunks: ChunkStore, src: Source) -> dict[str, Any]:
    """State, documents, chunks, indexed commit and lag of one source.

    ``status`` is INDEXING while its newest job runs, ERROR when that job failed, EMPTY without chunks,
    PARTIAL when that job ended ``partial`` or a ref's last sync could not store some files (``failed_paths``:
    up to 100 such paths over all refs, each retried by the next sync; the ref's ``failed`` names them too), else
    READY. ``ranking`` says which hybrid fusion the source's context uses (:func:`scopekb.tuning.describe`), and
    ``ranking_choice`` is the recorded choice (None before ``scopekb eval --tune``). ``behind_last_push`` is true
    when the newest job's target commit is not the indexed one (a sync is
    pending, running, or ended partial and will be retried). ``last_job`` is the newest job record, or None.
    """
    stats = chunks.source_stats(src.id)
    state = records.get("state", src.id) or {}
    jobs = records.list_jobs(source_id=src.id, size=1)
    # the newest job is found by a search, which on OpenSearch sees the record as of the last refresh (up to a
    # second old: a job just done still read `running`); a get by id is real-time
    last = (records.get_job(jobs[0].id) or jobs[0]) if jobs else None
    if last is not None and not last.finished:
        status = "INDEXING"
    elif last is not None and last.state.value == "failed":
        status = "ERROR"
    elif stats["chunks"] == 0:
        status = "EMPTY"
    else:
        status = "READY"
    refs = ref_report(state, src, last)
    failed = sorted({p for r in refs for p in r["failed"]})[:100]
    if status == "READY" and (failed or (last is not None and last.state.value == "partial")):
        status = "PARTIAL"
    choice = tuning.get_choice(records, src.agent_name, src.context_id)
    behind = bool(last is not None and last.to_commit and last.to_commit != state.get("commit"))
    return {"status": status, "indexed_commit": state.get("commit"), "indexed_at": state.get("indexed_at"),
            "behind_last_push": behind, "refs": refs, "failed_paths": failed, **stats,
            "last_job": last.model_dump(mode="json") if last else None,
            "ranking": tuning.describe(choice), "ranking_choice": choice}


def ref_report(state: dict[str, Any], src: Source, last: Any) -> list[dict[str, Any]]:
    """Each indexed ref of a source (issue 23): ``{"ref", "commit", "indexed_at", "pinned", "behind",
    "lag_s", "failed"}``, by name; ``failed``: the paths its last sync could not store (the next one retries).
    ``behind``: the newest job saw another commit for that ref than the indexed one;
    ``lag_s``: seconds since that job was created while behind, else 0."""
    seen = dict(getattr(last, "ref_commits", None) or {})
    out = []
    for name, h in sorted(ref_heads(state, src).items()):
        target = seen.get(name)
        behind = bool(target and target != h.get("commit"))
        lag = max(0.0, (utcnow() - last.created_at).total_seconds()) if behind and last is not None else 0.0
        out.append({"ref": name, "commit": h.get("commit"), "indexed_at": h.get("indexed_at"),
                    "pinned": bool(h.get("pinned")), "behind": behind, "lag_s": round(lag, 1),
                    "failed": [p for p in h.get("failed") or () if isinstance(p, str)]})
    return out
