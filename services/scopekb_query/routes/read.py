"""``GET /v1/read``: exact lines of an indexed blob within the caller's scope (:mod:`scopekb.reading`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import ValidationError

from scopekb import ops
from scopekb.auth import resolve_scope
from scopekb.models import ReadRequest, ReadResult
from scopekb.reading import result_bytes
from scopekb.render import validation_message
from scopekb_query.deps import CallerDep, Rt, agent_key_of

router = APIRouter(tags=["read"])


@router.get("/v1/read", response_model=ReadResult,
            responses={404: {"description": "the caller's scope never indexed that blob at that path"},
                       422: {"description": "bad arguments, or start_line past the blob's end: "
                                            "``{\"detail\": \"<one line naming the argument>\"}``"}})
def read(c: CallerDep, rt: Rt,
         path: Annotated[str | None, Query(description="the hit's path")] = None,
         blob_sha: Annotated[str | None, Query(description="the hit's blob_sha")] = None,
         start_line: Annotated[str, Query(description="first line, 1-based (an integer)")] = "1",
         end_line: Annotated[str | None, Query(description="last line, inclusive (an integer); default: the last")
                             ] = None,
         repo: Annotated[str | None, Query(description="only a blob of this repository")] = None,
         ref: Annotated[str | None, Query(description="only the blob as this branch, tag or indexed head commit "
                                                      "holds it (the ref the answer names)")] = None,
         context_id: str | None = None, cross_context: str = "false",
         format: Annotated[str, Query(description="json or raw")] = "json") -> Any:
    """Exactly lines ``start_line..end_line`` of the blob a search hit names, from the blob store, as the blob
    holds them (line ends included). ``?format=raw`` answers the bytes themselves (``application/octet-stream``);
    JSON carries them in ``content`` (valid UTF-8) or ``content_base64``. 404 when the caller's scope holds no
    chunk of ``path`` at ``blob_sha`` (whether or not another scope does).

    Every bad argument is a 422 of one shape, ``{"detail": "<argument>: <reason>"}``.
    \f
    (Not in the OpenAPI text, which ends at the form feed.) Hostile review 2, H8: the arguments are parsed by
    :class:`ReadRequest`, not by FastAPI, whose 422 is a list."""
    key = agent_key_of(c, rt, "reads")
    if format not in ("json", "raw"):
        raise HTTPException(422, "format: Input should be 'json' or 'raw'")
    try:
        args = {"path": path, "blob_sha": blob_sha, "start_line": start_line, "end_line": end_line, "repo": repo,
                "ref": ref, "context_id": context_id, "cross_context": cross_context}
        req = ReadRequest.model_validate({k: v for k, v in args.items() if v is not None})  # absent: "required"
    except ValidationError as e:
        raise HTTPException(422, validation_message(e.errors(include_url=False))) from None
    scope = resolve_scope(key, req.context_id, req.cross_context)  # Refused (401/403/400) -> its status
    res = ops.read(rt, scope, req)  # NotFound 404, Refused 422/409
    if format == "raw":
        return Response(result_bytes(res), media_type="application/octet-stream")
    return res
