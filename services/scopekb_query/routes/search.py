"""``POST /v1/search``: scoped BM25 / kNN / hybrid search with an agent key."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic_core import PydanticSerializationError

from scopekb import ops
from scopekb.auth import resolve_scope
from scopekb.http.unicode import SafeJSONResponse
from scopekb.models import SearchRequest, SearchResponse
from scopekb.refs import CommitNotIndexed
from scopekb.runtime import Runtime
from scopekb.search import render_text, run_search
from scopekb.searchlimit import Abandoned
from scopekb_query.deps import Caller, CallerDep, Rt, agent_key_of

router = APIRouter(tags=["search"])
#: nginx's status for "the client closed the request" (logged and counted, never received).
CLIENT_CLOSED_REQUEST = 499


@router.post("/v1/search", response_model=SearchResponse)
async def search(req: SearchRequest, request: Request, c: CallerDep, rt: Rt,
                 format: Literal["json", "text"] = "json") -> Any:
    """Search within the caller's scope. ``?format=text`` returns the agent text rendering (packed into
    ``max_tokens`` of the embedding model's tokenizer when given); any other format than ``json`` or ``text`` is a
    422 naming the choices. ``group_by: "file"`` gives one result per file. ``ref`` = a full commit id that no ref
    has indexed pins that commit: 202 ``{"status": "pinning", "job_id", ...}``; search again when
    ``GET /v1/jobs/{job_id}`` is done (404 for a commit of no repository of the scope, 429 over
    ``git.max_pins_per_source``).
    \f
    (Not in the OpenAPI text, which ends at the form feed.) The search itself runs in a worker thread, at most
    ``rt.search_limiter.total`` at once
    (:func:`scopekb.searchlimit.search_threads`); the others wait on the event loop (issue 20), and one whose client
    disconnected while it waited is not run (status 499 in the access log and metrics)."""
    try:
        return await rt.search_limiter.run(_search, req, request, c, rt, format, gone=request.is_disconnected)
    except Abandoned:  # the client went away while the search waited: nothing was run, nobody reads this
        return Response(status_code=CLIENT_CLOSED_REQUEST)


def _search(req: SearchRequest, request: Request, c: Caller, rt: Runtime, format: str) -> Any:
    """The blocking body of :func:`search` (in a worker thread)."""
    request.scope["scopekb_mode"] = req.mode.value
    key = agent_key_of(c, rt, "searches")  # checked again: the request may have waited for its thread
    scope = resolve_scope(key, req.context_id, req.cross_context)  # Refused (401/403/400) -> its status
    try:
        resp = run_search(rt.chunks, req, scope, rt.settings.query,  # SearchUnavailable is Refused: 400
                          embed=rt.embed_query if rt.embedder is not None else None, records=rt.records)
    except CommitNotIndexed as e:  # a commit no ref has indexed: pin it (issue 23); 202 with the job to wait for
        pin = ops.pin_commit(rt, scope, e.commit, req.source_id, req.repo)
        if pin["status"] != "indexed":
            return JSONResponse(pin, status_code=202)
        # an annotated tag's id whose commit is indexed: search at that commit
        resp = run_search(rt.chunks, req.model_copy(update={"ref": pin["ref"]}), scope, rt.settings.query,
                          embed=rt.embed_query if rt.embedder is not None else None, records=rt.records)
    if format == "text":
        return PlainTextResponse(render_text(resp, req.max_tokens, rt.counter))
    return json_answer(resp)


def json_answer(resp: SearchResponse) -> Response:
    """``resp`` as JSON, serialised once by pydantic's encoder (issue 20: FastAPI would validate the returned
    model against ``response_model`` again, turn it into plain data and ``json.dumps`` that; the same bytes
    either way). Text pydantic cannot encode (a lone surrogate) is answered the default way
    (:class:`scopekb.http.unicode.SafeJSONResponse`)."""
    try:
        return Response(resp.model_dump_json(), media_type="application/json")
    except PydanticSerializationError:
        return SafeJSONResponse(resp.model_dump(mode="json"))
