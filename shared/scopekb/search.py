"""Search over a chunk store under the scoring contract of DESIGN §5.

The caller (query service, CLI) resolves the :class:`ScopeFilter` from a credential; this module never widens it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from scopekb import fields as F
from scopekb import scoring
from scopekb.errors import Refused
from scopekb.models import SearchHit, SearchMode, SearchRequest, SearchResponse
from scopekb.patterns import PatternRefused, compile_globs
from scopekb.refs import RefIndex
from scopekb.render import render_text
from scopekb.settings import QuerySettings
from scopekb.stores.base import ChunkStore, RawHit, RecordStore, ScopeFilter, SearchFilter, StoreVersionMismatch

#: Turns a query text into a vector, or None in keyword-only mode.
QueryEmbedder = Callable[[str], Sequence[float]]


__all__ = ["QueryEmbedder", "SearchUnavailable", "render_text", "run_search"]


class SearchUnavailable(Refused, ValueError):
    """The search cannot run as asked (HTTP 400): a mode that needs an embedding model on a keyword-only index, or
    a ``file_patterns`` entry over a limit of ``query.*`` (the message names it)."""


def run_search(store: ChunkStore, req: SearchRequest, scope: ScopeFilter, cfg: QuerySettings,
               embed: QueryEmbedder | None = None, records: RecordStore | None = None) -> SearchResponse:
    """Run ``req`` within ``scope`` and return hits with scores in [0, 1], best first.

    ``req.ref`` (issue 23) is a branch or tag name or a commit id: with ``records``, it is resolved against the
    indexed refs of the scope's sources (:class:`scopekb.refs.RefIndex`; a commit that is a ref's indexed head
    means that ref) and every hit names that ref and its indexed commit. Without a ``ref``, a hit names the ref
    and commit it was written for.

    ``max_results`` is capped at ``cfg.max_results_cap``; hits under ``min_score`` are dropped. No hit is an
    empty, successful response.

    Raises:
        SearchUnavailable: ``vector``/``hybrid`` asked for while no embedder is configured, or a file pattern over
            a limit of ``cfg`` (:mod:`scopekb.patterns`).
        scopekb.errors.NotFound: (404) ``req.ref`` is no indexed ref of the scope's sources, nor the head commit
            of one.
    """
    t0 = time.perf_counter()
    try:  # bounded patterns only (issue 16): refused here, before any store sees them
        compile_globs(req.file_patterns, cfg.pattern_limits())
    except PatternRefused as e:
        raise SearchUnavailable(str(e)) from None
    size = min(req.max_results, cfg.max_results_cap)
    refs = RefIndex.load(records, scope, req.source_id, req.repo) if req.ref and records is not None else None
    ref = refs.resolve(req.ref) if refs is not None and req.ref else req.ref
    flt = SearchFilter(scope=scope, source_id=req.source_id, repo=req.repo, ref=ref,
                       languages=tuple(req.languages), file_patterns=tuple(req.file_patterns))
    depth = max(size * cfg.candidate_factor, size)
    docs: dict[str, dict[str, Any]] = {}
    notice = None
    if req.mode != SearchMode.keyword and (embed is None or not store.dimension):
        raise SearchUnavailable(f"mode {req.mode.value!r} needs an embedding model; this index is "
                                "keyword-only (use mode 'keyword')")
    vh: list[RawHit] = []
    if req.mode != SearchMode.keyword:
        try:
            vh = store.vector_search(embed(req.query), flt, depth if req.mode == SearchMode.hybrid else size)
        except StoreVersionMismatch as e:  # the alias moved to another model mid-flight: answer by keyword
            notice = f"vector search unavailable ({e}); answered by keyword"
    if req.mode == SearchMode.keyword or notice:
        kw = store.keyword_search(req.query, flt, size)
        docs.update({i: d for i, _, d in kw})
        ranked = scoring.normalise_by_max([(i, s) for i, s, _ in kw])
    else:
        docs.update({i: d for i, _, d in vh})
        if req.mode == SearchMode.vector:
            ranked = [(i, min(1.0, max(0.0, s))) for i, s, _ in vh]
        else:
            kw = store.keyword_search(req.query, flt, depth)
            docs.update({i: d for i, _, d in kw})
            kw_list, vec_list = [(i, s) for i, s, _ in kw], [(i, s) for i, s, _ in vh]
            if req.fusion == "rrf":
                ranked = scoring.rrf_fusion(kw_list, vec_list)
            else:
                ranked = scoring.weighted_fusion(kw_list, vec_list, cfg.keyword_weight, cfg.vector_weight)
    hits = [_hit(docs[i], score) for i, score in ranked if round(score, 6) >= req.min_score][:size]
    if refs is not None and ref:
        hits = [h.model_copy(update={"ref": ref, "commit": refs.commit(h.source_id, ref) or h.commit})
                for h in hits]
    return SearchResponse(query=req.query, mode=req.mode, hits=hits, notice=notice,
                          took_ms=round((time.perf_counter() - t0) * 1000, 2))


def _hit(d: dict[str, Any], score: float) -> SearchHit:
    return SearchHit(
        path=d[F.PATH], start_line=d[F.START_LINE], end_line=d[F.END_LINE], content=d[F.CONTENT],
        score=round(score, 6), chunk_index=d[F.CHUNK_INDEX], language=d.get(F.LANGUAGE), kind=d.get(F.KIND),
        symbol=d.get(F.SYMBOL), repo=d.get(F.REPO), ref=d.get(F.REF), refs=d.get(F.REFS), commit=d.get(F.COMMIT),
        blob_sha=d.get(F.BLOB_SHA) or None, source_id=d.get(F.SOURCE_ID), agent_name=d[F.AGENT_NAME],
        context_id=d[F.CONTEXT_ID],
        indexed_at=d.get(F.INDEXED_AT))
