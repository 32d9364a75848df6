#!/usr/bin/env python3
"""Search a scopekb index from Python over MCP (streamable HTTP), with the ``mcp`` SDK's client.

Usage: ``SCOPEKB_KEY=<agent key> python examples/mcp_search.py "retry failed uploads" [--url URL] [--mode hybrid]``

``--url`` defaults to ``http://localhost:8000/mcp`` (``scopekb up --port 8000``); the agent key is sent as a bearer
token, exactly as over REST. Prints the ``search`` tool's text answer (each hit's path, lines, score and the
fenced chunk) and exits 1 when the tool reports an error (e.g. a context the key may not search), 2 with one line
on stderr when there is no key, the key is refused, or no MCP service answers at ``--url``.
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


async def search(url: str, key: str, query: str, mode: str) -> tuple[bool, str]:
    """Open one MCP session at ``url``, call the ``search`` tool; returns (is_error, text of the answer)."""
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool("search", {"query": query, "mode": mode})
    text = "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")
    return bool(result.is_error), text


def refusal(url: str, key: str) -> str | None:
    """``HTTP 401: <reason>`` when the server at ``url`` answers and refuses ``key`` (401/403), else None."""
    import httpx

    try:
        r = httpx.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "ping"}, timeout=5,
                       headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"})
    except httpx.HTTPError:
        return None
    if r.status_code not in (401, 403):
        return None
    try:
        detail = str(r.json().get("detail", ""))
    except ValueError:
        detail = ""
    detail = "".join(ch for ch in detail[:200] if ch.isprintable())
    return f"HTTP {r.status_code}" + (f": {detail}" if detail else "")


def main() -> int:
    parser = argparse.ArgumentParser(description="Search a scopekb index over MCP.")
    parser.add_argument("query")
    parser.add_argument("--url", default="http://localhost:8000/mcp")
    parser.add_argument("--mode", default="hybrid", choices=["keyword", "vector", "hybrid"])
    args = parser.parse_args()
    key = os.environ.get("SCOPEKB_KEY")
    if not key:
        print("error: set SCOPEKB_KEY to an agent key (POST /v1/keys with the admin token)", file=sys.stderr)
        return 2
    try:
        is_error, text = anyio.run(search, args.url, key, args.query, args.mode)
    except Exception as e:  # noqa: BLE001 - the SDK raises an ExceptionGroup of transport errors: say it in one line
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        refused = refusal(args.url, key)
        if refused:  # README newcomer: a wrong key was reported as no server answering
            print(f"error: {args.url} refused the key ({refused}); SCOPEKB_KEY must be a live agent key",
                  file=sys.stderr)
            return 2
        print(f"error: no MCP answer from {args.url} ({type(e).__name__}: {e}); is `scopekb up` running there? "
              "(--url names another address)", file=sys.stderr)
        return 2
    # indexed content is untrusted: control characters (ANSI/OSC escapes) are printed escaped, never to the terminal
    print("".join(ch if ch in "\n\t" or ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                  for ch in text))
    return 1 if is_error else 0


if __name__ == "__main__":
    sys.exit(main())
