"""Measurements through the real pipeline: a signed push to the ingester until the change is searchable through
the query service, with the worker's CPU and memory and OpenSearch's CPU over the same window; the baseline
``helpers.bulk`` of the same chunk documents; index size; and which chunks a push really changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from opensearchpy import OpenSearch

from scopekb import fields as F
from scopekb.chunking import chunk_document, embedding_text
from scopekb.filetypes import content_skip_reason, decode_text, language_for, path_skip_reason
from scopekb.settings import ChunkingSettings
from scopekb_bench.stack import Stack
from scopekb_bench.util import REPO, RssSampler, log, tree_cpu_seconds


def opensearch_cpu_ms(client: OpenSearch) -> float:
    """OpenSearch's process CPU time in milliseconds, summed over nodes (``_nodes/stats/process``)."""
    stats = client.nodes.stats(metric="process")
    return float(sum(n["process"]["cpu"]["total_in_millis"] for n in stats["nodes"].values()))


@dataclass
class PushResult:
    """One measured push: wall seconds from the POST to searchable, the job record and the costs."""

    seconds: float
    job_seconds: float
    job: dict[str, Any]
    worker_cpu_s: float
    opensearch_cpu_s: float
    worker_peak_rss: int
    extra: dict[str, Any] = field(default_factory=dict)


def search_hits(stack: Stack, key: str, query: str, context: str, mode: str = "keyword",
                max_results: int = 10) -> list[dict[str, Any]]:
    """Hits of one search through the query service with an agent key."""
    r = httpx.post(stack.query_url + "/v1/search", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                   json={"query": query, "mode": mode, "max_results": max_results, "context_id": context})
    r.raise_for_status()
    return r.json()["hits"]


def measured_push(stack: Stack, client: OpenSearch, bare_repo: Path, repo_name: str, before: str, after: str,
                  delivery: str, key: str, context: str, probe: str, probe_in_content: str | None = None,
                  timeout_s: float = 1800) -> PushResult:
    """Move ``main`` to ``after`` in the bare repository, POST the signed push, wait for the job, then poll the
    query service until ``probe`` finds a hit (containing ``probe_in_content`` when given).

    The wall time runs from the POST to that hit: webhook to searchable.
    """
    subprocess.run(["git", "-C", str(bare_repo), "update-ref", "refs/heads/main", after], check=True)
    wpid = stack.pid("worker")
    cpu0, os0 = tree_cpu_seconds(wpid), opensearch_cpu_ms(client)
    with RssSampler([wpid]) as rss:
        t0 = time.perf_counter()
        r = stack.push(repo_name, str(bare_repo), before, after, delivery)
        if r.status_code != 202:
            raise RuntimeError(f"push answered {r.status_code}: {r.text}")
        job_id = r.json()["job_id"]  # the ingester's key for this delivery (ops.delivery_key), not the id sent
        job = stack.wait_job(job_id, timeout_s=timeout_s)
        t_job = time.perf_counter()
        if job["state"] != "done":
            raise RuntimeError(f"job {job_id} ended {job['state']}: {job.get('errors', [])[:5]}")
        deadline = time.monotonic() + 60
        searches = 0
        while True:
            searches += 1
            hits = search_hits(stack, key, probe, context)
            if hits and (probe_in_content is None or any(probe_in_content in h["content"] for h in hits)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{probe!r} not searchable 60 s after job {job_id} finished")
            time.sleep(0.05)
        t1 = time.perf_counter()
    cpu1, os1 = tree_cpu_seconds(wpid), opensearch_cpu_ms(client)
    return PushResult(seconds=t1 - t0, job_seconds=t_job - t0, job=job, worker_cpu_s=cpu1 - cpu0,
                      opensearch_cpu_s=(os1 - os0) / 1000.0, worker_peak_rss=rss.peak,
                      extra={"probe_seconds": t1 - t_job, "probe_searches": searches})


def export_docs(client: OpenSearch, alias: str, dest: Path, agent: str, context: str, page: int = 2000) -> int:
    """Write every document of one scope behind ``alias`` as JSON lines (``_id`` and ``_source``); returns the
    count."""
    n = 0
    flt = [{"term": {F.AGENT_NAME: agent}}, {"term": {F.CONTEXT_ID: context}}]
    with dest.open("w", encoding="utf-8") as fh:
        res = client.search(index=alias, body={"size": page, "query": {"bool": {"filter": flt}}, "sort": ["_doc"]},
                            params={"scroll": "2m"})
        sid = res.get("_scroll_id")
        try:
            while res["hits"]["hits"]:
                for h in res["hits"]["hits"]:
                    fh.write(json.dumps({"_id": h["_id"], "_source": h["_source"]}) + "\n")
                    n += 1
                res = client.scroll(body={"scroll_id": sid, "scroll": "2m"})
                sid = res.get("_scroll_id", sid)
        finally:
            if sid:
                try:
                    client.clear_scroll(body={"scroll_id": [sid]})
                except Exception:  # noqa: BLE001 - expired scrolls are harmless
                    pass
    return n


def baseline_bulk(client: OpenSearch, url: str, index: str, docs: Path, dimension: int | None,
                  max_chunk_bytes: int) -> dict[str, Any]:
    """Run :mod:`scopekb_bench.baseline_bulk` in a child process; adds OpenSearch's CPU seconds over its run and
    ``peak_pss_bytes``, the child's memory sampled exactly as the worker's is in :func:`measured_push` (summed PSS
    of the process tree every 0.2 s, :class:`RssSampler`)."""
    os0 = opensearch_cpu_ms(client)
    proc = subprocess.Popen([sys.executable, "-m", "scopekb_bench.baseline_bulk", "--url", url, "--index", index,
                             "--docs", str(docs), "--dimension", str(dimension or 0),
                             "--max-chunk-bytes", str(max_chunk_bytes)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO / "bench")
    with RssSampler([proc.pid]) as pss:
        stdout, stderr = proc.communicate()
    os1 = opensearch_cpu_ms(client)
    if proc.returncode != 0:
        raise RuntimeError(f"baseline bulk failed: {stderr[-2000:]}")
    out = json.loads(stdout.strip().splitlines()[-1])
    out["opensearch_cpu_s"] = (os1 - os0) / 1000.0  # includes index creation and loading, a slight overcount
    out["peak_pss_bytes"] = pss.peak
    if out["errors"]:
        log(f"baseline bulk: {out['errors']} item errors")
    return out


def index_bytes(client: OpenSearch, index: str) -> int:
    """Primary store size of an index (or of the index behind an alias) in bytes, after a flush."""
    client.indices.flush(index=index)
    stats = client.indices.stats(index=index, metric="store")
    return int(stats["_all"]["primaries"]["store"]["size_in_bytes"])


def live_index(client: OpenSearch, alias: str) -> str:
    """The concrete index behind an alias."""
    return sorted(client.indices.get_alias(name=alias).keys())[-1]


# ---- what a push changed -----------------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True).stdout


def _chunks_of(repo: Path, commit: str, path: str, cfg: ChunkingSettings,
               counter: Any) -> tuple[set[str], set[str], set[tuple[str, int, int, str]]]:
    """(chunk contents, embedding texts, (path, start line, end line, content)) of one file at one commit, chunked
    like the pipeline does."""
    if path_skip_reason(path):
        return set(), set(), set()
    try:
        data = _git(repo, "show", f"{commit}:{path}")
    except subprocess.CalledProcessError:
        return set(), set(), set()
    if content_skip_reason(data) or len(data) > 1024 * 1024:
        return set(), set(), set()
    lang = language_for(path)
    chunks = chunk_document(path, decode_text(data), lang, cfg, counter)
    return ({c.content for c in chunks}, {embedding_text(path, lang, c, cfg, counter) for c in chunks},
            {(path, c.start_line, c.end_line, c.content) for c in chunks})


def changed_chunks(repo: Path, old: str, new: str, counter: Any, cfg: ChunkingSettings | None = None,
                   whole_old_tree: bool = True) -> dict[str, int]:
    """How many chunks a push from ``old`` to ``new`` really changed.

    ``contents``: distinct chunk contents in the changed files at ``new`` that occur nowhere in the tree at
    ``old``; ``embedding_inputs``: the same for the exact texts sent to the embedder (content plus the path and
    symbol header), i.e. what a perfect embedding cache has to compute; ``positioned``: chunks of the changed
    files at ``new`` whose (path, line range, content) the old versions do not have - what a sync whose chunk ids
    name the line range (issue 20) must write at least; ``files``: changed paths. With ``whole_old_tree`` off,
    only the changed files' old versions are compared (cheaper on a large tree; exact for a one-file edit).
    """
    cfg = cfg or ChunkingSettings()
    names = _git(repo, "diff", "--name-only", "--no-renames", old, new).decode().splitlines()
    old_files = _git(repo, "ls-tree", "-r", "--name-only", old).decode().splitlines() if whole_old_tree else names
    old_contents: set[str] = set()
    old_texts: set[str] = set()
    old_pos: set[tuple[str, int, int, str]] = set()
    for p in old_files:
        c, t, pos = _chunks_of(repo, old, p, cfg, counter)
        old_contents |= c
        old_texts |= t
        old_pos |= pos
    new_contents: set[str] = set()
    new_texts: set[str] = set()
    new_pos: set[tuple[str, int, int, str]] = set()
    for p in names:
        c, t, pos = _chunks_of(repo, new, p, cfg, counter)
        new_contents |= c
        new_texts |= t
        new_pos |= pos
    return {"files": len(names), "contents": len(new_contents - old_contents),
            "embedding_inputs": len(new_texts - old_texts), "positioned": len(new_pos - old_pos)}
