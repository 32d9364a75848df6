"""Jobs, dead letters and the index status (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from scopekb import ops
from scopekb_query.deps import ADMIN, Rt

router = APIRouter(tags=["jobs"], dependencies=ADMIN)
#: Most jobs ``GET /v1/jobs`` returns.
MAX_JOBS = 200


@router.get("/v1/jobs/{job_id}")
def get_job(job_id: str, rt: Rt) -> dict[str, Any]:
    """A sync job record; a queued job not yet picked up by a worker is reported from its queued marker."""
    return ops.get_job(rt, job_id).model_dump(mode="json")


@router.get("/v1/jobs")
def list_jobs(rt: Rt, source_id: str | None = None,
              limit: Annotated[int, Query(ge=1, le=MAX_JOBS)] = 20) -> list[dict[str, Any]]:
    """The newest jobs (at most ``limit``, 1 to 200: outside that a 422 naming the range), optionally of one
    source."""
    return [j.model_dump(mode="json") for j in rt.records.list_jobs(source_id, size=limit)]


@router.get("/v1/deadletters")
def dead_letters(rt: Rt, include_replayed: bool = False) -> list[dict[str, Any]]:
    """Tasks parked after failing ``worker.max_retries`` times."""
    return [d.model_dump(mode="json") for d in ops.list_dead_letters(rt, include_replayed)]


@router.post("/v1/deadletters/{dl_id}/replay", status_code=202)
def replay_dead_letter(dl_id: str, rt: Rt) -> dict[str, Any]:
    """Enqueue a parked task again; returns the new job id."""
    return {"status": "queued", "job_id": ops.replay_dead_letter(rt, dl_id)}


@router.post("/v1/deadletters/replay", status_code=202)
def replay_all(rt: Rt) -> dict[str, Any]:
    """Replay every parked task that was not replayed yet."""
    return {"status": "queued", "job_ids": ops.replay_all(rt)}


@router.get("/v1/status")
def status(rt: Rt) -> dict[str, Any]:
    """The live index, its chunk count and per-source status (READY / PARTIAL / INDEXING / EMPTY / ERROR, documents,
    chunks, indexed commit)."""
    return ops.index_status(rt)
