"""Jobs, dead letters and the index status (admin; a job of its own scope also to an agent key)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from scopekb import ops
from scopekb.auth import resolve_scope
from scopekb.errors import NotFound
from scopekb_query.deps import ADMIN, CallerDep, Rt, admin_only, agent_key_of

router = APIRouter(tags=["jobs"], dependencies=ADMIN)
#: ``GET /v1/jobs/{job_id}`` also answers agent keys, for the jobs of their own scope.
job_router = APIRouter(tags=["jobs"])
#: Most jobs ``GET /v1/jobs`` returns.
MAX_JOBS = 200


@job_router.get("/v1/jobs/{job_id}")
async def get_job(job_id: str, rt: Rt, c: CallerDep) -> dict[str, Any]:
    """A sync job record; a queued job not yet picked up by a worker is reported from its queued marker. The admin
    sees every job; an agent key the jobs whose sources are all within its scope (the pin job a search answered
    with 202, a sync of its sources), and 404 for any other, as for an unknown id."""
    if c.key is None:
        await admin_only(c, rt)
    return await run_in_threadpool(_job_for, rt, c, job_id)  # record reads block


def _job_for(rt: Rt, c: CallerDep, job_id: str) -> dict[str, Any]:
    job = ops.get_job(rt, job_id)
    if c.key is not None:  # hostile review: agents were told to poll this route for their pin jobs and got 403
        scope = resolve_scope(agent_key_of(c, rt, "job reads"), None, True)  # the key's agent and contexts
        sources = [rt.records.get_source(i) for i in job.source_ids]
        if not sources or any(s is None or s.agent_name != scope.agent_name or (
                scope.context_ids is not None and s.context_id not in scope.context_ids) for s in sources):
            raise NotFound("job not found")
    return job.model_dump(mode="json")


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
