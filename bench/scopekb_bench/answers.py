"""Answers for agents (issue 22) on the docstring→function quality set, through the real query service.

- **Grouped NDCG@10**: each query sent as ``hybrid`` with ``group_by="file"`` and ``max_results=10``: one result per
  file. A file result is relevant when it is the function's file and its shown lines or one of its listed other
  matching ranges overlap the function's lines (what an agent reading the answer is pointed to). Reported beside
  the ungrouped hybrid NDCG@10 of :mod:`scopekb_bench.quality` on the same queries.
- **MCP answer size**: the same queries as bare MCP ``search(query=...)`` calls (the official ``mcp`` SDK client over
  streamable HTTP, the tool's defaults: best mode, one result per file, the default token budget), each answer's
  tokens counted with the embedding model's tokenizer; the median is compared with 2,000 tokens.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import httpx
import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from scopekb_bench.quality import scores

#: The acceptance bound on the median MCP ``search`` answer at the default budget (issue 22), in tokens.
ANSWER_TOKENS_GOAL = 2000


def grouped_rank_of(hits: list[dict[str, Any]], pair: dict[str, Any], k: int = 10) -> int | None:
    """1-based rank of the first file result pointing at the pair's function (block or listed range), or None."""
    for i, h in enumerate(hits[:k], 1):
        if h["path"] != pair["path"]:
            continue
        spans = [(h["start_line"], h["end_line"])] + [(r["start_line"], r["end_line"]) for r in h["other_ranges"]]
        if any(lo <= pair["end_line"] and hi >= pair["start_line"] for lo, hi in spans):
            return i
    return None


async def _grouped(query_url: str, key: str, context: str, pairs: list[dict[str, Any]],
                   concurrency: int) -> list[list[dict[str, Any]]]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=query_url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=120) as client:
        async def one(q: str) -> list[dict[str, Any]]:
            async with sem:
                r = await client.post("/v1/search", json={"query": q, "mode": "hybrid", "max_results": 10,
                                                          "context_id": context, "group_by": "file"})
                r.raise_for_status()
                return r.json()["hits"]

        return await asyncio.gather(*(one(p["query"]) for p in pairs))


async def _mcp_answers(query_url: str, key: str, queries: list[str]) -> list[str]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120) as hc:
        async with streamable_http_client(query_url + "/mcp", http_client=hc) as (rs, ws):
            async with ClientSession(rs, ws) as session:
                await session.initialize()
                out = []
                for q in queries:
                    res = await session.call_tool("search", {"query": q})
                    if res.is_error:
                        raise RuntimeError(f"MCP search failed: {res.content!r}"[:500])
                    out.append("\n".join(c.text for c in res.content if getattr(c, "type", None) == "text"))
                return out


def evaluate(query_url: str, key: str, context: str, pairs: list[dict[str, Any]], counter: Any,
             concurrency: int = 4) -> dict[str, Any]:
    """Grouped NDCG@10 / MRR@10 over ``pairs`` and the token counts of bare MCP ``search`` answers.

    Returns ``{"n", "grouped": {"ndcg10", "mrr10", ...}, "per_query_ndcg10": [...], "answer_tokens": [...],
    "answer_tokens_p50", "answer_tokens_max", "counter"}``.
    """
    grouped = asyncio.run(_grouped(query_url, key, context, pairs, concurrency))
    per_query = [scores(grouped_rank_of(hits, p)) for p, hits in zip(pairs, grouped, strict=True)]
    answers = asyncio.run(_mcp_answers(query_url, key, [p["query"] for p in pairs]))
    tokens = [int(counter.count(a)) for a in answers]
    return {"n": len(pairs),
            "grouped": {k: statistics.fmean(s[k] for s in per_query) for k in per_query[0]} if per_query else {},
            "per_query_ndcg10": [s["ndcg10"] for s in per_query],
            "answer_tokens": tokens, "answer_tokens_p50": statistics.median(tokens) if tokens else 0.0,
            "answer_tokens_max": max(tokens, default=0), "counter": getattr(counter, "name", "?")}
