"""Sources: register, list, show, remove, sync now, upload a document (admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from scopekb import ops
from scopekb.models import SourceCreate
from scopekb_query.deps import ADMIN, Rt

router = APIRouter(prefix="/v1/sources", tags=["sources"], dependencies=ADMIN)


@router.post("", status_code=201)
def add_source(body: SourceCreate, rt: Rt) -> dict[str, Any]:
    """Register a git repository + ref, or an object-store prefix, for a scope. Clone URLs are validated
    (https/ssh; no private, loopback or metadata hosts unless allowlisted): 422 with the reason. A webhook-driven
    source registered without ``webhook_secret`` gets one generated, returned here once and never again."""
    return ops.registration_view(body, ops.register_source(rt, body))


@router.get("")
def list_sources(rt: Rt, agent_name: str | None = None) -> list[dict[str, Any]]:
    """Registered sources, optionally of one agent."""
    return [s.public() for s in rt.records.list_sources(agent_name=agent_name)]


@router.get("/{source_id}")
def get_source(source_id: str, rt: Rt) -> dict[str, Any]:
    """One source with its status (READY / PARTIAL / INDEXING / EMPTY / ERROR, counts, indexed commit, last job)."""
    return ops.source_report(rt, ops.get_source(rt, source_id))


@router.delete("/{source_id}")
def delete_source(source_id: str, rt: Rt) -> dict[str, Any]:
    """Unregister a source and delete its chunks and sync state."""
    return {"deleted": True, "chunks_deleted": ops.remove_source(rt, source_id)}


@router.post("/{source_id}/sync", status_code=202)
def sync_now(source_id: str, rt: Rt) -> dict[str, Any]:
    """Enqueue a sync of the source to its ref's current commit (or its prefix's current listing)."""
    return {"status": "queued", "job_id": ops.sync_source(rt, source_id, "manual")}


@router.post("/{source_id}/documents", status_code=202)
async def upload_document(source_id: str, name: str, request: Request, rt: Rt) -> dict[str, Any]:
    """Store a document (raw request body) under an object-store source's prefix and index it.

    ``name`` is the document's path below the prefix (e.g. ``runbooks/restart.md``).
    """
    data = await request.body()
    return ops.upload_document(rt, source_id, name, data, request.headers.get("content-type"))
