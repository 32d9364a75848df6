"""Per-context ranking choice (issue 21): hybrid weights or RRF chosen from the context's own evaluation sets.

:func:`choose` scores every candidate fusion on the sets of :mod:`scopekb.evaluation` (all queries pooled) and
keeps the best by mean NDCG@10; it is *applied* only when its paired gain over the default (``query.keyword_weight``
/ ``query.vector_weight``, weighted) has a 95% bootstrap interval above 0. :func:`record_choice` stores the outcome
as a ``ranking`` record keyed by the scope, whether applied or not (status shows both); :func:`ranking_for` reads
it for a search of exactly one context (cached for :data:`CACHE_S` seconds per process).

A request that names ``fusion`` explicitly keeps it; only the weights and the default fusion follow the choice.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from scopekb import evalsets
from scopekb import fields as F
from scopekb.models import Source, utcnow
from scopekb.settings import QuerySettings
from scopekb.stores.base import RecordStore, ScopeFilter

KIND = "ranking"
#: A recorded choice is re-read at most this often per process (a new ``scopekb eval --tune`` shows within it).
CACHE_S = 30.0


@dataclass(frozen=True)
class Fusion:
    """A candidate: ``fusion`` ``weighted`` with its two weights, or ``rrf`` (weights unused); ``default``: the
    settings' fusion and weights. ``boosts``: the keyword field boosts (symbol, signature, content, path) chosen
    for the context, None for :data:`scopekb.fields.KEYWORD_BOOSTS`."""

    fusion: str
    keyword_weight: float
    vector_weight: float
    boosts: tuple[float, ...] | None = None
    #: rerank the fused hits with ``query.rerank`` (chosen by :func:`choose_rerank`)
    rerank: bool = False

    @property
    def name(self) -> str:
        return "rrf" if self.fusion == "rrf" else f"weighted {self.keyword_weight:.1f}/{self.vector_weight:.1f}"


#: Candidates: keyword weight 0.0 … 1.0 by 0.1 (vector weight the rest), and RRF (k = 60).
CANDIDATES = tuple(Fusion("weighted", round(w / 10, 1), round(1 - w / 10, 1)) for w in range(11)) \
    + (Fusion("rrf", 0.0, 0.0),)

#: Keyword field boost candidates (symbol, signature, content, path); the first is the default
#: (:data:`scopekb.fields.KEYWORD_BOOSTS`). Evaluated by ``scopekb eval --tune`` (each query searched once more per
#: candidate) and chosen by keyword NDCG@10 like the fusion: applied only when the gain's 95% interval is above 0.
BOOST_CANDIDATES: tuple[tuple[float, float, float, float], ...] = (
    F.KEYWORD_BOOSTS, (1.0, 1.0, 1.0, 1.0), (2.0, 1.5, 1.0, 1.0), (10.0, 5.0, 1.0, 2.0), (5.0, 3.0, 1.0, 0.0),
    (1.0, 1.0, 2.0, 1.0), (3.0, 2.0, 1.0, 4.0))


def _scores(sets: list[Any], f: Fusion) -> list[float]:
    from scopekb.evaluation import per_query

    mode = "rrf" if f.fusion == "rrf" else "hybrid"
    return [q["ndcg10"] for es in sets for q in per_query(es, mode, f.keyword_weight, f.vector_weight)]


def choose(sets: list[Any], cfg: QuerySettings) -> dict[str, Any]:
    """The best candidate fusion on ``sets`` (a list of :class:`scopekb.evaluation.EvalSet`) against the default.

    Returns ``{"fusion", "keyword_weight", "vector_weight", "applied", "gain", "ci95", "ndcg10", "default_ndcg10",
    "queries", "default": {...}}``; ``applied`` is True only when the gain's 95% paired bootstrap interval lies
    above 0. Keyword-only sets (no vector lists) choose nothing: ``applied`` False and the default kept.
    """
    default = Fusion("weighted", cfg.keyword_weight, cfg.vector_weight)
    n = sum(len(es.queries) for es in sets)
    base = _scores(sets, default)
    out: dict[str, Any] = {"fusion": default.fusion, "keyword_weight": default.keyword_weight,
                           "vector_weight": default.vector_weight, "applied": False, "gain": 0.0, "ci95": [0.0, 0.0],
                           "ndcg10": float(sum(base) / n) if n else 0.0, "queries": n,
                           "default": {"fusion": default.fusion, "keyword_weight": default.keyword_weight,
                                       "vector_weight": default.vector_weight}}
    out["default_ndcg10"] = out["ndcg10"]
    if not n or not any(ls.vector for es in sets for ls in es.lists):
        out["reason"] = "keyword-only index: nothing to choose"
        return out
    best, best_scores = default, base
    for f in CANDIDATES:
        s = _scores(sets, f)
        if sum(s) > sum(best_scores) + 1e-9:
            best, best_scores = f, s
    mean, lo, hi = evalsets.paired_gain(best_scores, base)
    out.update(fusion=best.fusion, keyword_weight=best.keyword_weight, vector_weight=best.vector_weight,
               gain=mean, ci95=[lo, hi], ndcg10=float(sum(best_scores) / n), applied=bool(lo > 0))
    if not out["applied"]:
        out["reason"] = ("the best candidate's gain over the default is not significant (95% interval includes 0)"
                         if best != default else "the default is the best candidate")
    return out


def choose_rerank(sets: list[Any], cfg: QuerySettings, reranker: Any) -> dict[str, Any]:
    """Whether reranking the best ``cfg.rerank_depth`` hits of the default fusion (hybrid 0.3/0.7 with vectors, else
    keyword) with ``reranker`` (:mod:`scopekb.rerank`) beats the fused order on ``sets`` by NDCG@10; hit texts come
    from ``Lists.hits[id]["text"]``.

    Returns ``{"provider", "applied", "gain", "ci95", "ndcg10", "default_ndcg10"}`` (or ``applied`` False with a
    ``reason`` when the reranker fails); applied only when the paired gain's 95% interval lies above 0.
    """
    from scopekb import rerank as rr
    from scopekb.evaluation import ranked

    base, new = [], []
    try:
        for es in sets:
            mode = "hybrid" if any(ls.vector for ls in es.lists) else "keyword"
            for q, ls in zip(es.queries, es.lists, strict=True):
                top = ranked(ls, mode, cfg.keyword_weight, cfg.vector_weight, k=cfg.rerank_depth)
                base.append(evalsets.rank_metrics(top, q.targets)["ndcg10"])
                texts = [h.get("text", "") for h in top]
                order = rr.rerank_order(reranker, q.query, [str(n) for n in range(len(top))], texts)
                new.append(evalsets.rank_metrics([top[int(n)] for n in order], q.targets)["ndcg10"])
    except rr.RerankError as e:
        return {"provider": cfg.rerank, "applied": False, "gain": 0.0, "ci95": [0.0, 0.0], "reason": str(e)}
    if not base:
        return {"provider": cfg.rerank, "applied": False, "gain": 0.0, "ci95": [0.0, 0.0], "reason": "no query"}
    mean, lo, hi = evalsets.paired_gain(new, base)
    out = {"provider": cfg.rerank, "applied": bool(lo > 0), "gain": mean, "ci95": [lo, hi],
           "ndcg10": float(sum(new) / len(new)), "default_ndcg10": float(sum(base) / len(base))}
    if not out["applied"]:
        out["reason"] = "reranking does not win on this context's sets (95% interval of the gain includes 0)"
    return out


def _boost_scores(sets: list[Any], boosts: tuple[float, ...]) -> list[float] | None:
    out = []
    for es in sets:
        for q, ls in zip(es.queries, es.lists, strict=True):
            lst = ls.keyword_by_boosts.get(tuple(boosts))
            if lst is None:
                return None
            out.append(evalsets.rank_metrics([ls.hits[i] for i, _ in lst[:10]], q.targets)["ndcg10"])
    return out


def choose_boosts(sets: list[Any]) -> dict[str, Any]:
    """The best keyword field boosts of :data:`BOOST_CANDIDATES` on ``sets`` by keyword NDCG@10 (each query's
    list per candidate in ``Lists.keyword_by_boosts``; a candidate some query lacks is skipped).

    Returns ``{"boosts", "applied", "gain", "ci95", "ndcg10", "default_ndcg10"}`` (boosts as a list in the order
    symbol, signature, content, path); ``applied`` only when the paired bootstrap gain over the default boosts has
    a 95% interval above 0.
    """
    default = tuple(F.KEYWORD_BOOSTS)
    base = _boost_scores(sets, default)
    out: dict[str, Any] = {"boosts": list(default), "applied": False, "gain": 0.0, "ci95": [0.0, 0.0]}
    if not base:
        out.update(ndcg10=0.0, default_ndcg10=0.0, reason="no keyword lists per boost candidate")
        return out
    out["ndcg10"] = out["default_ndcg10"] = float(sum(base) / len(base))
    best, best_scores = default, base
    for b in BOOST_CANDIDATES:
        s = _boost_scores(sets, b)
        if s is not None and sum(s) > sum(best_scores) + 1e-9:
            best, best_scores = tuple(b), s
    mean, lo, hi = evalsets.paired_gain(best_scores, base)
    out.update(boosts=list(best), gain=mean, ci95=[lo, hi], ndcg10=float(sum(best_scores) / len(base)),
               applied=bool(lo > 0))
    if not out["applied"]:
        out["reason"] = ("the best boosts' gain over the default is not significant (95% interval includes 0)"
                         if best != default else "the default boosts are the best candidate")
    return out


def record_id(agent_name: str, context_id: str) -> str:
    """The ``ranking`` record id of a scope (sha256 of agent NUL context, 32 hex characters)."""
    return hashlib.sha256(f"{agent_name}\0{context_id}".encode()).hexdigest()[:32]


def record_choice(records: RecordStore, source: Source, choice: dict[str, Any], commit: str) -> dict[str, Any]:
    """Store ``choice`` (from :func:`choose`) for the source's scope, with the commit and time it was measured.
    Returns the stored record."""
    doc = {**choice, "agent_name": source.agent_name, "context_id": source.context_id, "source_id": source.id,
           "commit": commit, "measured_at": utcnow().isoformat()}
    records.put(KIND, record_id(source.agent_name, source.context_id), doc)
    _CACHE.clear()
    return doc


def get_choice(records: RecordStore, agent_name: str, context_id: str) -> dict[str, Any] | None:
    """The recorded choice of a scope (applied or not), or None."""
    return records.get(KIND, record_id(agent_name, context_id))


_CACHE: dict[str, tuple[float, Fusion | None]] = {}
_LOCK = threading.Lock()


def ranking_for(records: RecordStore | None, scope: ScopeFilter) -> Fusion | None:
    """The applied fusion of a search over exactly one context, or None (the settings' default then holds).

    A failing record store never fails the search: it counts as no choice.
    """
    if records is None or scope.context_ids is None or len(scope.context_ids) != 1:
        return None
    rid = record_id(scope.agent_name, scope.context_ids[0])
    now = time.monotonic()
    with _LOCK:
        hit = _CACHE.get(rid)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
    try:
        doc = records.get(KIND, rid)
    except Exception:  # noqa: BLE001 - the default ranking is always a valid answer
        doc = None
    f = None
    boosts = None
    kb = doc.get("keyword_boosts") if doc else None
    if isinstance(kb, dict) and kb.get("applied"):
        try:
            boosts = tuple(float(x) for x in kb["boosts"])
            F.keyword_fields(boosts)
        except (KeyError, TypeError, ValueError):
            boosts = None
    rr = doc.get("rerank") if doc else None
    rerank = bool(isinstance(rr, dict) and rr.get("applied"))
    if doc and doc.get("applied") and doc.get("fusion") in ("weighted", "rrf"):
        f = Fusion(str(doc["fusion"]), float(doc.get("keyword_weight", 0.3)), float(doc.get("vector_weight", 0.7)),
                   boosts, rerank)
    elif boosts is not None or rerank:
        f = Fusion("default", 0.0, 0.0, boosts, rerank)
    with _LOCK:
        if len(_CACHE) > 10_000:
            _CACHE.clear()
        _CACHE[rid] = (now, f)
    return f


def describe(choice: dict[str, Any] | None) -> str:
    """One line for status and the CLI: what is used for the context and why."""
    if not choice:
        return "default (not evaluated)"
    f = Fusion(choice["fusion"], choice["keyword_weight"], choice["vector_weight"])
    lo, hi = choice.get("ci95", [0.0, 0.0])
    gain = f"NDCG@10 {choice.get('gain', 0.0):+.3f} ({lo:+.3f} … {hi:+.3f}) on {choice.get('queries', 0)} queries"
    kb = choice.get("keyword_boosts")
    extra = ""
    if isinstance(kb, dict) and kb.get("applied"):
        blo, bhi = kb.get("ci95", [0.0, 0.0])
        extra = (f"; keyword boosts {'/'.join(f'{x:g}' for x in kb['boosts'])} applied (symbol/signature/content/"
                 f"path, keyword NDCG@10 {kb.get('gain', 0.0):+.3f} ({blo:+.3f} … {bhi:+.3f}))")
    rr = choice.get("rerank")
    if isinstance(rr, dict) and rr.get("applied"):
        rlo, rhi = rr.get("ci95", [0.0, 0.0])
        extra += (f"; reranking applied ({rr.get('provider')}: NDCG@10 {rr.get('gain', 0.0):+.3f} "
                  f"({rlo:+.3f} … {rhi:+.3f}))")
    if choice.get("applied"):
        return f"{f.name} (chosen: {gain}){extra}"
    return f"default weights (best {f.name}: {gain}; not applied){extra}"  # newcomer: "not applied" is the weights
