"""Baseline for webhook latency: a bare FastAPI endpoint on the same route that reads the body and answers 202.

Served by uvicorn with the ingester's server settings (one worker, log level warning, no access log, h11, the
keep-alive, concurrency, backlog and head-size settings of ``scopekb serve``: :func:`scopekb_bench.webhook.
bare_server_args`), it is what any FastAPI webhook receiver costs before doing anything: no signature check, no
parsing, no Redis.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI(title="bare webhook baseline")


@app.post("/webhooks/{provider}", status_code=202)
async def webhook(provider: str, request: Request) -> JSONResponse:
    """Read the body, answer 202."""
    body = await request.body()
    return JSONResponse({"status": "queued", "provider": provider, "bytes": len(body)}, status_code=202)
