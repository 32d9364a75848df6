"""Floor of the query service's HTTP hop: an empty FastAPI ``POST /v1/search`` that reads the body and answers
fixed bytes, served by uvicorn with ``scopekb serve``'s server settings (h11, keep-alive, concurrency limit,
backlog, head-size cap: :func:`scopekb_bench.webhook.bare_server_args`). Whatever any FastAPI service on this stack
costs per request before doing any work (used by ``bench/service_ab.py``)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

app = FastAPI(title="bare search baseline")

_BODY = b'{"query":"","mode":"keyword","hits":[]}'


@app.post("/v1/search")
async def search(request: Request) -> Response:
    """Read the body, answer fixed JSON."""
    await request.body()
    return Response(_BODY, media_type="application/json")
