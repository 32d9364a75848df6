"""``POST /v1/search``: scoped BM25 / kNN / hybrid search with an agent key."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import PlainTextResponse

from scopekb.auth import resolve_scope
from scopekb.models import SearchRequest, SearchResponse
from scopekb.search import render_text, run_search
from scopekb_query.deps import CallerDep, Rt

router = APIRouter(tags=["search"])


@router.post("/v1/search", response_model=SearchResponse)
def search(req: SearchRequest, request: Request, c: CallerDep, rt: Rt,
           format: Literal["json", "text"] = "json") -> Any:
    """Search within the caller's scope. ``?format=text`` returns the agent text rendering; any other format
    than ``json`` or ``text`` is a 422 naming the choices."""
    request.scope["scopekb_mode"] = req.mode.value
    if c.key is None:
        raise HTTPException(403, "searches need an agent key, not the admin token")
    scope = resolve_scope(c.key, req.context_id, req.cross_context)  # Refused (401/403/400) -> its status
    resp = run_search(rt.chunks, req, scope, rt.settings.query,  # SearchUnavailable is Refused: 400
                      embed=rt.embed_query if rt.embedder is not None else None, records=rt.records)
    if format == "text":
        return PlainTextResponse(render_text(resp))
    return resp
