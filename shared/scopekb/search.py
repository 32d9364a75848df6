"""Search over a chunk store under the scoring contract of DESIGN §5.

The caller (query service, CLI) resolves the :class:`ScopeFilter` from a credential; this module never widens it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from scopekb import fields as F
from scopekb import rerank, scoring, tuning
from scopekb.embedding.base import EmbeddingConfigError, is_blank
from scopekb.errors import Refused
from scopekb.logging import get_logger
from scopekb.models import (
    LINE_MODES,
    FieldMatch,
    HitReason,
    LineRange,
    SearchHit,
    SearchMode,
    SearchRequest,
    SearchResponse,
    SearchScope,
)
from scopekb.patterns import PatternRefused, compile_globs
from scopekb.refs import RefIndex, ref_states
from scopekb.render import field, more_match_note, render_text
from scopekb.settings import QuerySettings
from scopekb.stores.base import (
    ChunkStore,
    RawHit,
    RecordStore,
    ScopeFilter,
    SearchFilter,
    StoreVersionMismatch,
    SymbolQuery,
)
from scopekb.stores.sqlite.text import index_terms_in, query_tokens
from scopekb.textsearch import LinePattern

log = get_logger(__name__)

#: Turns a query text into a vector, or None in keyword-only mode.
QueryEmbedder = Callable[[str], Sequence[float]]


__all__ = ["QueryEmbedder", "SearchUnavailable", "best_mode", "forget_pinned", "group_by_file", "render_text",
           "run_search", "vector_problem"]


class SearchUnavailable(Refused, ValueError):
    """The search cannot run as asked (HTTP 400): a mode that needs an embedding model on a keyword-only index, or
    a ``file_patterns`` entry or a regex over a limit of ``query.*`` (the message names it)."""


def best_mode(store: ChunkStore, embed: QueryEmbedder | None) -> SearchMode:
    """The best mode this index supports: ``hybrid`` when a query embedder is configured and the live index holds
    vectors (:func:`vector_problem`), else ``keyword`` (the default of the MCP ``search`` tool and
    the CLI)."""
    return SearchMode.keyword if vector_problem(store, embed, SearchMode.hybrid) else SearchMode.hybrid


#: How long (seconds) what the live index holds (:func:`_live_dimension`) is trusted before it is read again: a
#: ``scopekb reindex`` that adds vectors is seen by a running query service within this time, with no restart.
LIVE_DIMENSION_MAX_AGE_S = 30.0

#: chunk store -> (monotonic time read, dimension the live index holds); weak keys: a store that is gone drops out.
_LIVE_DIM: weakref.WeakKeyDictionary[Any, tuple[float, int | None]] = weakref.WeakKeyDictionary()


def _live_dimension(store: ChunkStore) -> int | None:
    """The embedding dimension the live index holds (:meth:`ChunkStore.index_dimension`: its mapping or SQLite
    meta, not the settings), read once and cached per store object for :data:`LIVE_DIMENSION_MAX_AGE_S`."""
    now = time.monotonic()
    with _PINNED_LOCK:
        got = _LIVE_DIM.get(store)
    if got is not None and now - got[0] < LIVE_DIMENSION_MAX_AGE_S:
        return got[1]
    dim = store.index_dimension()
    with _PINNED_LOCK:
        _LIVE_DIM[store] = (now, dim)
    return dim


def vector_problem(store: ChunkStore, embed: QueryEmbedder | None, mode: SearchMode) -> str | None:
    """Why ``mode`` (``vector``/``hybrid``) cannot run on this index, or None when it can (always None for other
    modes). The one place search decides it, on what the live index holds (:func:`_live_dimension`), not only on
    the configured provider: an index built keyword-only (``scopekb-chunks-v7-kw``, or a SQLite index without
    vectors) answers no kNN even when ``SCOPEKB_EMBEDDING__PROVIDER`` is set now."""
    if mode not in (SearchMode.vector, SearchMode.hybrid):
        return None
    live = _live_dimension(store)
    if (embed is None or not store.dimension) and live:  # README newcomer: this case said "keyword-only" too,
        # right after a reindex had added vectors (a query service started without the provider)
        return (f"mode {mode.value!r} needs an embedding model in the process that searches: the index holds "
                f"vectors ({live} dimensions), but this process was started without one (use mode 'keyword', or "
                "set SCOPEKB_EMBEDDING__PROVIDER as for the index, e.g. local, and restart it; `scopekb status` "
                "names the index's model)")
    if embed is None or not store.dimension:
        return (f"mode {mode.value!r} needs an embedding model; this index is keyword-only (use mode 'keyword', "
                "or set SCOPEKB_EMBEDDING__PROVIDER and run `scopekb reindex` to add vectors)")
    if not live:
        return (f"mode {mode.value!r} needs vectors, but this index is keyword-only: it was built without an "
                "embedding provider (use mode 'keyword', or add vectors with `scopekb reindex` run with the "
                "embedding provider set, e.g. SCOPEKB_EMBEDDING__PROVIDER=local)")
    return None  # vectors of another model: the search answers by keyword with a notice (StoreVersionMismatch)


#: The notice an exact/regex search gives when more chunks match than it returns (worded by :func:`run_search`).
MORE_MATCH = "more chunks match"

#: (id of the record store, agent, contexts) -> (monotonic time read, pinned refs); see :func:`_pinned_refs`.
_PINNED: dict[tuple[int, str, tuple[str, ...] | None], tuple[float, tuple[str, ...]]] = {}
_PINNED_LOCK = threading.Lock()


#: (id of the record store, agent, contexts, source id, repo) -> (monotonic time read, RefIndex);
#: see :func:`_ref_index`.
_REF_INDEX: dict[tuple[Any, ...], tuple[float, RefIndex]] = {}


def forget_pinned() -> None:
    """Drop this process's cached pinned refs and ref heads (:func:`scopekb.ops.pin_commit` calls it after writing
    a pin)."""
    with _PINNED_LOCK:
        _PINNED.clear()
        _REF_INDEX.clear()


def _ref_index(records: Any, scope: ScopeFilter, source_id: str | None, repo: str | None,
               max_age_s: float) -> RefIndex:
    """The scope's indexed refs for naming the ref of hits found without ``ref`` (issue 23), cached like
    :func:`_pinned_refs` for ``max_age_s`` seconds so a search does no record I/O for it (issue 20); a hit may name
    a head up to that old."""
    key = (id(records), scope.agent_name, scope.context_ids, source_id, repo)
    now = time.monotonic()
    with _PINNED_LOCK:
        got = _REF_INDEX.get(key)
        if got is not None and now - got[0] < max_age_s:
            return got[1]
    idx = RefIndex.load(records, scope, source_id, repo)
    with _PINNED_LOCK:
        if len(_REF_INDEX) > 1024:
            _REF_INDEX.clear()
        _REF_INDEX[key] = (now, idx)
    return idx


def scope_refs(records: Any, scope: ScopeFilter, source_id: str | None, repo: str | None, ref: str | None,
               max_age_s: float) -> RefIndex:
    """The scope's indexed refs (narrowed to ``source_id``/``repo``) for :func:`name_ref`: read afresh when the
    request names a ``ref`` (it is resolved against them), else as cached for ``max_age_s`` seconds."""
    return RefIndex.load(records, scope, source_id, repo) if ref else _ref_index(records, scope, source_id, repo,
                                                                                  max_age_s)


def name_ref(refs: RefIndex, ref: str | None, source_id: str | None, chunk_id: str | None,
             stored_refs: list[str] | None, stored_ref: str | None,
             stored_commit: str | None) -> tuple[list[str] | None, str | None, str | None]:
    """``(refs, ref, commit)`` a search hit or a ``read`` names for one chunk (issue 23; one rule for both).

    ``refs``: the chunk's stored refs plus the overlay refs that see it (:meth:`RefIndex.member_refs`). With a
    ``ref`` asked (already resolved to a name), that ref and its indexed commit. Without, the source's default ref
    when the chunk is a member of it, else the first of its other indexed refs by name, with that ref's indexed
    commit (:meth:`RefIndex.attribute`); the stored ``ref``/``commit`` (which may name a deleted branch or an old
    commit) only when no indexed ref holds the chunk."""
    members = refs.member_refs(source_id, chunk_id, stored_refs)
    if ref:
        return members, ref, refs.commit(source_id, ref) or stored_commit
    named = refs.attribute(source_id, members)
    return (members, named[0], named[1]) if named else (members, stored_ref, stored_commit)


def _pinned_refs(records: Any, scope: ScopeFilter, max_age_s: float) -> tuple[str, ...]:
    """The temporary pinned refs (commit ids) of the scope's sources, sorted: a search without ``ref`` leaves out
    chunks that only they hold.

    Read from the sources' ref states (one source list and one state read per source), cached per record store and
    scope for ``max_age_s`` seconds (``query.revocation_bound_s``; issue 20: a search does no record I/O for it).
    A pin written by this process clears the cache at once (:func:`forget_pinned`); one written by another
    process or replica is seen within ``max_age_s`` - its chunks are written by the sync its job starts after the
    pin record is written, so a search can only miss it when that sync finishes within ``max_age_s``.
    """
    key = (id(records), scope.agent_name, scope.context_ids)
    now = time.monotonic()
    with _PINNED_LOCK:
        hit = _PINNED.get(key)
    if hit is not None and now - hit[0] < max_age_s:
        return hit[1]
    out: set[str] = set()
    for src in records.list_sources(agent_name=scope.agent_name):
        if scope.context_ids is None or src.context_id in scope.context_ids:
            out.update(n for n, st in ref_states(records, src).items() if st.get("pinned"))
    pinned = tuple(sorted(out))
    with _PINNED_LOCK:
        if len(_PINNED) > 10_000:
            _PINNED.clear()
        _PINNED[key] = (now, pinned)
    return pinned


def run_search(store: ChunkStore, req: SearchRequest, scope: ScopeFilter, cfg: QuerySettings,
               embed: QueryEmbedder | None = None, records: RecordStore | None = None) -> SearchResponse:
    """Run ``req`` within ``scope`` and return hits with scores in [0, 1], best first.

    ``req.ref`` (issue 23) is a branch or tag name or a commit id: with ``records``, it is resolved against the
    indexed refs of the scope's sources (:class:`scopekb.refs.RefIndex`; a commit that is a ref's indexed head
    means that ref) and every hit names that ref and its indexed commit. Without a ``ref``, a hit names its
    source's default ref and that ref's indexed commit when the chunk is a member of it, else the first of the
    chunk's other refs by name (:meth:`scopekb.refs.RefIndex.attribute`). A hit's ``refs`` lists every ref that
    holds the chunk: its stored ``refs`` plus the overlay refs that see it through their base
    (:meth:`scopekb.refs.RefIndex.member_refs`; without ``ref``, from the scope's refs as cached for
    ``cfg.revocation_bound_s``).

    ``records``: where a context's ranking choice is recorded (:mod:`scopekb.tuning`, ``scopekb eval --tune``);
    a hybrid search of exactly one context with an applied choice uses its weights (and its fusion, unless the
    request names ``fusion``); a keyword or hybrid search of it uses its chosen keyword field boosts. None: the
    settings' weights and the default boosts.

    ``max_results`` is capped at ``cfg.max_results_cap``; hits under ``min_score`` are dropped. No hit is an
    empty, successful response. Each hit carries its reason (:class:`HitReason`: matched terms and fields,
    keyword and vector ranks, fusion or the literal/symbol match). With ``group_by="file"``,
    ``cfg.candidate_factor × max_results`` chunks are found and grouped into at most ``max_results`` files
    (:func:`group_by_file`), no file twice.

    ``exact``/``regex``/``symbol`` are answered by :func:`_line_search` and :func:`_symbol_search`; ``metadata``
    filters apply in every mode.

    Raises:
        SearchUnavailable: ``vector``/``hybrid`` asked for while no embedder is configured or the live index holds
            no vectors of its dimension (:func:`vector_problem`: names ``scopekb reindex``), a file pattern or a
            regex over a limit of ``cfg`` (:mod:`scopekb.patterns`, :mod:`scopekb.textsearch`), or a regex with no
            literal to narrow by over a scope larger than ``cfg.text_scan_max`` chunks.
        scopekb.errors.NotFound: (404) ``req.ref`` is no indexed ref of the scope's sources, nor the head commit
            of one.
    """
    t0 = time.perf_counter()
    try:  # bounded patterns only (issue 16): refused here, before any store sees them
        compile_globs(req.file_patterns, cfg.pattern_limits())
    except PatternRefused as e:
        raise SearchUnavailable(str(e)) from None
    size = min(req.max_results, cfg.max_results_cap)
    refs = scope_refs(records, scope, req.source_id, req.repo, req.ref, cfg.revocation_bound_s) \
        if records is not None else None
    ref = refs.resolve(req.ref) if refs is not None and req.ref else req.ref
    meta = tuple((k, tuple(dict.fromkeys(F.metadata_text(x) for x in (v if isinstance(v, list) else [v]))))
                 for k, v in sorted(req.metadata.items()))
    pinned = _pinned_refs(records, scope, cfg.revocation_bound_s) if not ref and records is not None else ()
    flt = SearchFilter(scope=scope, source_id=req.source_id, repo=req.repo, ref=ref, pinned=pinned,
                       overlays=refs.overlays_for(ref) if refs is not None and ref else (),
                       languages=tuple(req.languages), file_patterns=tuple(req.file_patterns), metadata=meta)
    grouped = req.group_by == "file"
    fetch = max(size * cfg.candidate_factor, size) if grouped else size  # files need several chunks each
    mode = req.mode
    if req.mode in LINE_MODES:
        hits, notice = _line_search(store, req, flt, cfg, fetch, t0)
    elif req.mode == SearchMode.symbol:
        hits, notice = _symbol_search(store, req, flt, cfg, fetch)
    else:
        chosen = tuning.ranking_for(records, scope) if req.mode != SearchMode.vector else None
        hits, notice = _ranked_search(store, req, flt, cfg, fetch, embed, chosen)
        if notice:  # the vector list was unavailable: the answer says keyword, the mode that ran
            mode = SearchMode.keyword
    if grouped:
        hits = group_by_file(hits, size, tuple(dict.fromkeys(query_tokens(req.query))))
    if refs is not None:  # the rule of name_ref: overlay refs in refs; the asked ref, else default/first indexed
        for h in hits:  # set on the hits built above for this answer alone (no copy per hit, issue 20)
            h.refs, h.ref, h.commit = name_ref(refs, ref, h.source_id, h._chunk_id, h.refs, h.ref, h.commit)
    more = notice == MORE_MATCH
    at_cap = req.max_results >= cfg.max_results_cap
    if more:  # counted after grouping: the files (or chunks) returned, not the chunks verified
        notice = more_match_note(len(hits), len(hits), cfg.max_results_cap, grouped, at_cap)
    if not hits and notice is None and records is not None:  # a typo'd context or source is not "no match"
        notice = empty_scope_note(records, scope, req.source_id) or None
    if notice is None and req.max_results > cfg.max_results_cap and len(hits) == cfg.max_results_cap:
        notice = (f"at most {cfg.max_results_cap} results a search (query.max_results_cap); max_results "
                  f"{req.max_results} was lowered to it")
    resp = SearchResponse(query=req.query, mode=mode, hits=hits, notice=notice, group_by=req.group_by,
                          scope=SearchScope(agent_name=scope.agent_name, context_ids=None if scope.context_ids is None
                                            else list(scope.context_ids)),
                          took_ms=round((time.perf_counter() - t0) * 1000, 2))
    if more:
        resp._more_match_cap, resp._more_match_files, resp._more_match_at_cap = cfg.max_results_cap, grouped, at_cap
    return resp


def empty_scope_note(records: RecordStore, scope: ScopeFilter, source_id: str | None,
                     list_contexts: bool = False) -> str:
    """Why a search of ``scope`` can find nothing whatever the query, or ``""`` when the scope holds sources
    (none of its chunks matched): ``agent 'x' has no source 's'``, ``agent 'x' has no sources``, ``context 'c'
    has no sources for agent 'x'``. Names are quoted with :func:`scopekb.render.field` (they are caller input).

    ``list_contexts``: add ``(its contexts: a, b, +N more)`` (the CLI, which reads the stores directly; REST and
    MCP leave it out: a key bound to some contexts must not learn the names of the others). One read of the
    agent's sources; called only for an answer with no hits."""
    agent = scope.agent_name
    srcs = records.list_sources(agent_name=agent)
    if source_id is not None and not any(x.id == source_id for x in srcs):
        return f"agent {field(agent)} has no source {field(source_id)}"
    if not srcs:
        return f"agent {field(agent)} has no sources"
    contexts = sorted({x.context_id for x in srcs})
    missing = [c for c in scope.context_ids or () if c not in contexts]
    if not missing or len(missing) < len(scope.context_ids or ()):
        return ""
    said = f"context {field(missing[0])} has no sources for agent {field(agent)}" if len(missing) == 1 else (
        f"contexts {', '.join(field(c) for c in missing[:10])} have no sources for agent {field(agent)}")
    if list_contexts:
        said += " (its contexts: " + ", ".join(field(c) for c in contexts[:10]) + (
            f" +{len(contexts) - 10} more" if len(contexts) > 10 else "") + ")"
    return said


def _ranked_search(store: ChunkStore, req: SearchRequest, flt: SearchFilter, cfg: QuerySettings, size: int,
                   embed: QueryEmbedder | None, chosen: tuning.Fusion | None = None
                   ) -> tuple[list[SearchHit], str | None]:
    """keyword / vector / hybrid: scores normalised to [0, 1] (DESIGN §5), best first, each hit with its ranks in
    the keyword and vector lists, the fusion and the matched terms per field (:class:`HitReason`). ``chosen``: the
    context's applied ranking choice (:func:`scopekb.tuning.ranking_for`: fusion weights and/or keyword field
    boosts), else the settings' weights and :data:`scopekb.fields.KEYWORD_BOOSTS`."""
    depth = max(size * cfg.candidate_factor, size)
    docs: dict[str, dict[str, Any]] = {}
    notice = None
    problem = vector_problem(store, embed, req.mode)
    if problem:
        raise SearchUnavailable(problem)
    vh: list[RawHit] = []
    kw: list[RawHit] = []
    both = getattr(store, "hybrid_search", None) if req.mode == SearchMode.hybrid else None
    boosts = {"boosts": chosen.boosts} if chosen is not None and chosen.boosts is not None else {}
    kw_done = False
    if req.mode != SearchMode.keyword and is_blank(req.query):  # zero-width or control characters only: its
        # vector would be the model's [CLS] [SEP] and rank arbitrary chunks (hostile review of issue 19)
        notice = "the query has no visible characters to embed; answered by keyword"
    elif req.mode != SearchMode.keyword:
        try:
            if both is not None:  # one round trip for both lists (issue 20)
                kw, vh = both(req.query, embed(req.query), flt, depth, depth, **boosts)
                kw_done = True
            else:
                vh = store.vector_search(embed(req.query), flt, depth if req.mode == SearchMode.hybrid else size)
        except StoreVersionMismatch as e:  # the alias moved to another model mid-flight: answer by keyword
            notice = f"vector search unavailable ({e}); answered by keyword"
        except EmbeddingConfigError as e:  # the query embedder cannot be built or configured (an export folder
            # that cannot be written, a rejected API key): a settings problem, answered by keyword, not a 5xx
            notice = f"vector search unavailable ({e}); answered by keyword"
    kw_norm: dict[str, float] = {}
    rerank_on = chosen is not None and chosen.rerank and cfg.rerank != "off"
    if chosen is not None and chosen.fusion == "default":  # only boosts or reranking were chosen
        chosen = None
    if req.mode == SearchMode.keyword or notice:
        kw = store.keyword_search(req.query, flt, size, **boosts)
        docs.update({i: d for i, _, d in kw})
        ranked = scoring.normalise_by_max([(i, s) for i, s, _ in kw])
        kw_norm = dict(ranked)
        how = "keyword"
    else:
        docs.update({i: d for i, _, d in vh})
        if req.mode == SearchMode.vector:
            ranked = [(i, min(1.0, max(0.0, s))) for i, s, _ in vh]
            how = "vector"
        else:
            if not kw_done:
                kw = store.keyword_search(req.query, flt, depth, **boosts)
            docs.update({i: d for i, _, d in kw})
            kw_list, vec_list = [(i, s) for i, s, _ in kw], [(i, s) for i, s, _ in vh]
            kw_norm = scoring.min_max(kw_list)
            fusion = req.fusion if chosen is None or "fusion" in req.model_fields_set else chosen.fusion
            kw_w, vec_w = (cfg.keyword_weight, cfg.vector_weight) if chosen is None else (
                chosen.keyword_weight, chosen.vector_weight)
            if fusion == "rrf":
                ranked = scoring.rrf_fusion(kw_list, vec_list)
                how = f"rrf k={scoring.RRF_K}"
            else:
                name = scoring.is_name_query(req.query) and kw_w < cfg.name_keyword_weight
                if name:  # a name lookup: the description weights lose to keyword alone (query.name_keyword_weight)
                    kw_w, vec_w = cfg.name_keyword_weight, round(1.0 - cfg.name_keyword_weight, 6)
                ranked = scoring.weighted_fusion(kw_list, vec_list, kw_w, vec_w)
                how = f"weighted {kw_w:g}×keyword + {vec_w:g}×vector" + (
                    " (a one-word query: a name)" if name else
                    " (this context's tuned weights)" if chosen is not None else "")
    if rerank_on and req.mode != SearchMode.vector and len(ranked) > 1:
        ranked, how = _rerank(req.query, ranked, docs, cfg, how)
    ranks = _Ranks(kw={i: n for n, (i, _, _) in enumerate(kw, 1)}, kw_norm=kw_norm,
                   vec={i: n for n, (i, _, _) in enumerate(vh, 1)}, vec_score={i: s for i, s, _ in vh},
                   fusion=how, terms=tuple(dict.fromkeys(query_tokens(req.query))))
    # hits (and their reasons) only for the ``size`` returned: a hybrid search ranks up to 2 × depth candidates
    # (issue 20: shaping all of them cost more than the OpenSearch round trip)
    kept = [(i, score) for i, score in ranked if round(score, 6) >= req.min_score][:size]
    return [_hit(docs[i], score, i, why=ranks.reason(i, docs[i])) for i, score in kept], notice


def _rerank(query: str, ranked: list[tuple[str, float]], docs: dict[str, dict[str, Any]], cfg: QuerySettings,
            how: str) -> tuple[list[tuple[str, float]], str]:
    """The best ``cfg.rerank_depth`` of ``ranked`` reordered by the configured reranker (:mod:`scopekb.rerank`);
    they keep the fused scores' values in descending order, so scores stay in [0, 1] and best first. A failing
    reranker leaves the fused order (logged)."""
    top = [i for i, _ in ranked[:cfg.rerank_depth]]
    try:
        reranker = rerank.for_settings(cfg)
        if reranker is None:
            return ranked, how
        order = rerank.rerank_order(reranker, query, top, [
            rerank.hit_text(str(docs[i].get(F.PATH, "")), docs[i].get(F.SYMBOL), str(docs[i].get(F.CONTENT, "")))
            for i in top])
    except rerank.RerankError as e:
        log.warning("rerank_failed", error=str(e))
        return ranked, how
    scores = [s for _, s in ranked[:len(top)]]
    return list(zip(order, scores, strict=True)) + ranked[len(top):], f"{how}, top {len(top)} reranked ({cfg.rerank})"


def _line_search(store: ChunkStore, req: SearchRequest, flt: SearchFilter, cfg: QuerySettings, size: int,
                 t0: float) -> tuple[list[SearchHit], str | None]:
    """exact / regex: the store's candidates (:mod:`scopekb.textsearch`) verified line by line; every hit scores
    1.0 and lists its matching lines; hits come in path, then line order (like ``git grep``), the first ``size``.

    At most ``cfg.text_scan_max`` candidates are verified and for at most ``cfg.text_timeout_s`` seconds; past
    either the answer says where it stopped. A query with no literal to narrow by (shorter than 3 characters,
    or a regex without one) that would need more than ``text_scan_max`` chunks scanned is refused (400).
    """
    try:
        pattern = LinePattern(req.mode.value, req.query, req.effective_case_sensitive(), cfg.regex_limits())
    except PatternRefused as e:
        raise SearchUnavailable(str(e)) from None
    hits: list[SearchHit] = []
    notice = None
    deadline = t0 + cfg.text_timeout_s
    limit = cfg.text_scan_max
    scanned = 0
    for _id, _score, d in store.literal_candidates(pattern.literals, flt, limit + 1):
        scanned += 1
        if scanned > limit:
            if not pattern.literals.groups:
                raise SearchUnavailable(
                    f"the {req.mode.value} query has no literal of 3 or more characters to narrow the search and "
                    f"more than {limit} chunks would have to be scanned (query.text_scan_max); add a longer "
                    "literal or narrow with file_patterns, languages or source_id")
            notice = (f"stopped after verifying {limit} candidate chunks (query.text_scan_max); narrow the search "
                      "with file_patterns, languages or source_id for the rest")
            break
        if time.perf_counter() > deadline:
            notice = (f"stopped after {cfg.text_timeout_s:g} s (query.text_timeout_s) and {scanned - 1} candidate "
                      "chunks; narrow the search for the rest")
            break
        lines = pattern.lines(d[F.CONTENT], d[F.START_LINE])
        if lines:
            hits.append(_hit(d, 1.0, _id, match_lines=lines, why=HitReason(
                fusion=f"{req.mode.value}: every listed line matches", matched=[FieldMatch(
                    field="content", terms=[req.query])])))
            if len(hits) > size:
                break
    if len(hits) > size:
        hits = hits[:size]
        notice = notice or MORE_MATCH  # worded by run_search with the count of results it returns
    return hits, notice


def _symbol_search(store: ChunkStore, req: SearchRequest, flt: SearchFilter, cfg: QuerySettings,
                   size: int) -> tuple[list[SearchHit], str | None]:
    """symbol: definitions whose name (or, for a dotted query, qualified path) equals or starts with the query.

    Scores: 1.0 an exact match in the query's case, 0.9 an exact match in another case (case-insensitive
    search), ``0.5 + 0.4 × len(query) / len(name)`` a prefix match; a chunk scores its best definition. Best
    first, then path and line. Each hit lists the matching definitions and their header lines.
    """
    q = req.query
    by_path = "." in q.strip(".")
    field = "path" if by_path else "name"
    prefix = req.symbol_match == "prefix"
    cs = req.effective_case_sensitive()
    kinds = set(req.kinds)
    sq = SymbolQuery(text=q, field=field, prefix=prefix, kinds=tuple(req.kinds))
    scored: list[tuple[float, SearchHit]] = []
    cands = store.symbol_candidates(sq, flt, cfg.symbol_scan_max + 1)
    notice = None
    if len(cands) > cfg.symbol_scan_max:
        cands = cands[:cfg.symbol_scan_max]
        notice = (f"more than {cfg.symbol_scan_max} chunks define a matching symbol (query.symbol_scan_max); only "
                  "those first in path order were ranked: use symbol_match 'exact', kinds or file_patterns")
    ql = q.lower()
    for _id, _s, d in cands:
        defs = d.get(F.DEFS)
        if defs is None:
            defs = F.def_fields(None, d.get(F.SYMBOL), d.get(F.KIND), d.get(F.SIGNATURE), d.get(F.START_LINE))[F.DEFS]
        matched: list[tuple[float, dict[str, Any]]] = []
        for df in defs:
            target = str(df.get(field) or "")
            if kinds and str(df.get("kind") or "") not in kinds:
                continue
            if target == q:
                score = 1.0
            elif not cs and target.lower() == ql:
                score = 0.9
            elif prefix and (target.startswith(q) or (not cs and target.lower().startswith(ql))):
                score = 0.5 + 0.4 * len(q) / max(len(target), 1)
            else:
                continue
            matched.append((score, df))
        if not matched:
            continue
        best = max(s for s, _ in matched)
        if round(best, 6) < req.min_score:
            continue
        defs_out = [{k: df.get(k) for k in ("name", "path", "kind", "signature", "line")} for _, df in matched]
        top = max(matched, key=lambda x: x[0])[1]
        hit = _hit(d, best, _id, match_lines=sorted({int(df["line"]) for _, df in matched if df.get("line")}),
                   definitions=defs_out, why=HitReason(
                       fusion=f"symbol: {req.symbol_match} {'case-sensitive' if cs else 'any case'} "
                              f"{'qualified path' if by_path else 'name'}",
                       matched=[FieldMatch(field="symbol", terms=[q])]))
        hit.signature = top.get("signature") or hit.signature
        scored.append((best, hit))
    scored.sort(key=lambda x: (-x[0], x[1].path, x[1].start_line))
    return [h for _, h in scored[:size]], notice


#: Fields whose matched query terms a hit reports, with the stored field each is read from.
REASON_FIELDS = (("symbol", F.SYMBOL), ("signature", F.SIGNATURE), ("path", F.PATH), ("content", F.CONTENT))


def matched_fields(terms: Sequence[str], d: dict[str, Any], content: str | None = None) -> list[FieldMatch]:
    """The query ``terms`` (already query-analysed: :func:`scopekb.stores.sqlite.text.query_tokens`) found in each
    reason field of the stored chunk ``d``, through the index-time analysis both stores share
    (:func:`scopekb.stores.sqlite.text.index_terms_in`: membership in ``index_tokens``, the twin of the OpenSearch
    ``scopekb_code`` analyzer), so the answer is the same on OpenSearch and SQLite. ``content`` overrides ``d``'s
    content (merged chunks)."""
    out: list[FieldMatch] = []
    if not terms:
        return out
    for name, key in REASON_FIELDS:
        value = content if name == "content" and content is not None else d.get(key)
        if not value:
            continue
        found = index_terms_in(value, terms)
        if found:
            out.append(FieldMatch(field=name, terms=found))
    return out


class _Ranks:
    """Positions and normalised scores of each candidate in the keyword and vector lists of one search."""

    def __init__(self, kw: dict[str, int], kw_norm: dict[str, float], vec: dict[str, int],
                 vec_score: dict[str, float], fusion: str, terms: tuple[str, ...]) -> None:
        self.kw, self.kw_norm, self.vec, self.vec_score = kw, kw_norm, vec, vec_score
        self.fusion, self.terms = fusion, terms

    def reason(self, i: str, d: dict[str, Any]) -> HitReason:
        """The reason of candidate ``i`` (stored fields ``d``)."""
        ks, vs = self.kw_norm.get(i), self.vec_score.get(i)
        return HitReason(matched=matched_fields(self.terms, d), keyword_rank=self.kw.get(i),
                         vector_rank=self.vec.get(i), fusion=self.fusion,
                         keyword_score=None if ks is None else round(ks, 6),
                         vector_score=None if vs is None else round(min(1.0, max(0.0, vs)), 6))


def _file_key(h: SearchHit) -> tuple[Any, ...]:
    """What "one file" means for grouping: one version (blob) of a path in one source of one scope."""
    return (h.agent_name, h.context_id, h.source_id, h.repo, h.path, h.blob_sha)


def _lines_of(h: SearchHit) -> list[str] | None:
    """The hit's content as its lines start..end, or None when the content is not exactly those lines."""
    lines = h.content.split("\n")
    want = h.end_line - h.start_line + 1
    if len(lines) > 1 and lines[-1] == "" and len(lines) - 1 == want:
        lines.pop()
    return lines if len(lines) == want else None


def _touches(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] + 1 and b[0] <= a[1] + 1


def _merge_ranges(items: Sequence[tuple[int, int, float]]) -> list[LineRange]:
    """Line ranges merged where they overlap or touch, each with its best score; best first, then by line."""
    out: list[list[float]] = []
    for lo, hi, sc in sorted(items):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
            out[-1][2] = max(out[-1][2], sc)
        else:
            out.append([lo, hi, sc])
    return sorted((LineRange(start_line=int(a), end_line=int(b), score=round(c, 6)) for a, b, c in out),
                  key=lambda r: (-r.score, r.start_line))


def group_by_file(hits: Sequence[SearchHit], size: int, terms: Sequence[str] = ()) -> list[SearchHit]:
    """One hit per file, in the order of each file's first hit, at most ``size`` files.

    Args:
        hits: chunk hits in answer order (best first); a file is one version (``blob_sha``) of a path in one
            source of one scope, so no file appears twice.
        size: files to return.
        terms: query terms (:func:`scopekb.stores.sqlite.text.query_tokens`), to recompute a merged hit's matched
            fields in the ranked modes.

    A file's hit is its first chunk merged with the file's other chunks that overlap or touch it (line by line,
    when every chunk's content is exactly its lines; otherwise the first chunk alone); score and reason are the
    first chunk's, matching lines and definitions the merged chunks' together; ``other_ranges`` lists the file's
    remaining chunks' line ranges, merged where they overlap or touch, best first.
    """
    files: dict[tuple[Any, ...], list[SearchHit]] = {}
    for h in hits:
        key = _file_key(h)
        if key in files or len(files) < size:
            files.setdefault(key, []).append(h)
    out: list[SearchHit] = []
    for items in files.values():
        best = items[0]
        first = _lines_of(best)
        lines = {best.start_line + n: t for n, t in enumerate(first or [])}
        block = (best.start_line, best.end_line)
        group, rest = [best], list(items[1:])
        grew = first is not None
        while grew:
            grew = False
            for h in list(rest):
                hl = _lines_of(h)
                if hl is not None and _touches(block, (h.start_line, h.end_line)):
                    for n, t in enumerate(hl):
                        lines.setdefault(h.start_line + n, t)
                    block = (min(block[0], h.start_line), max(block[1], h.end_line))
                    rest.remove(h)
                    group.append(h)
                    grew = True
        hit = best.model_copy(deep=True)
        hit.chunks = len(group)
        hit.other_ranges = _merge_ranges([(h.start_line, h.end_line, h.score) for h in rest])
        if len(group) > 1:
            hit.start_line, hit.end_line = block
            hit.content = "\n".join(lines[n] for n in range(block[0], block[1] + 1))
            if any(h.match_lines for h in group):
                hit.match_lines = sorted({n for h in group for n in (h.match_lines or [])})
            if any(h.definitions for h in group):
                hit.definitions = [df for h in group for df in (h.definitions or [])]
            why = hit.why
            if why is not None and terms and (why.keyword_rank is not None or why.vector_rank is not None):
                hit.why = why.model_copy(update={"matched": matched_fields(
                    terms, {F.SYMBOL: hit.symbol, F.SIGNATURE: hit.signature, F.PATH: hit.path}, hit.content)})
        out.append(hit)
    return out


def _hit(d: dict[str, Any], score: float, chunk_id: str | None = None, **extra: Any) -> SearchHit:
    hit = SearchHit(
        path=d[F.PATH], start_line=d[F.START_LINE], end_line=d[F.END_LINE], content=d[F.CONTENT],
        score=round(score, 6), chunk_index=d[F.CHUNK_INDEX], language=d.get(F.LANGUAGE), kind=d.get(F.KIND),
        symbol=d.get(F.SYMBOL), signature=d.get(F.SIGNATURE), repo=d.get(F.REPO), ref=d.get(F.REF),
        refs=d.get(F.REFS), commit=d.get(F.COMMIT), blob_sha=d.get(F.BLOB_SHA) or None, source_id=d.get(F.SOURCE_ID),
        agent_name=d[F.AGENT_NAME], context_id=d[F.CONTEXT_ID], indexed_at=d.get(F.INDEXED_AT), **extra)
    hit._chunk_id = chunk_id
    return hit
