"""Score normalisation and fusion: every mode returns scores in [0, 1], higher is better (DESIGN §5).

Pure functions over ``(id, raw_score)`` lists; no store access. Edge cases guarded: empty lists, a single hit,
all-equal scores, NaN or negative raw scores.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

RRF_K = 60  # Reciprocal Rank Fusion constant (Cormack et al. 2009; the Turso seed uses k = 60).


def _finite(x: float) -> float:
    return x if math.isfinite(x) and x > 0 else 0.0


def normalise_by_max(scored: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Divide each raw score by the list's maximum: the best hit gets 1.0, order is kept.

    Used for BM25, whose raw scores are unbounded. An empty list stays empty; all-zero scores become 0.0.
    """
    vals = [(i, _finite(s)) for i, s in scored]
    top = max((s for _, s in vals), default=0.0)
    if top <= 0:
        return [(i, 0.0) for i, _ in vals]
    return [(i, min(1.0, s / top)) for i, s in vals]


def min_max(scored: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Min-max normalise to [0, 1]. A single hit or all-equal scores map to 1.0 (nothing ranks below them)."""
    vals = {i: _finite(s) for i, s in scored}
    if not vals:
        return {}
    lo, hi = min(vals.values()), max(vals.values())
    if hi - lo <= 1e-12:
        return {i: 1.0 for i in vals}
    return {i: (s - lo) / (hi - lo) for i, s in vals.items()}


def weighted_fusion(keyword: Sequence[tuple[str, float]], vector: Sequence[tuple[str, float]],
                    keyword_weight: float = 0.3, vector_weight: float = 0.7) -> list[tuple[str, float]]:
    """Hybrid score: min-max each list, ``kw × keyword + vw × vector``, re-normalised by the batch maximum.

    Source: the aimon seed (0.3 / 0.7 after min-max, then re-normalised). A hit missing from one list scores 0
    there. Returns ``(id, score)`` sorted by score descending, then id for a stable order.
    """
    kn, vn = min_max(keyword), min_max(vector)
    ids = set(kn) | set(vn)
    combined = {i: keyword_weight * kn.get(i, 0.0) + vector_weight * vn.get(i, 0.0) for i in ids}
    top = max(combined.values(), default=0.0)
    out = [(i, (s / top) if top > 0 else 0.0) for i, s in combined.items()]
    out.sort(key=lambda t: (-t[1], t[0]))
    return out


def rrf_fusion(*ranked: Sequence[tuple[str, float]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Reciprocal Rank Fusion: ``Σ 1 / (k + rank)`` over lists (rank 1-based), re-normalised by the maximum."""
    acc: dict[str, float] = {}
    for lst in ranked:
        for rank, (i, _) in enumerate(lst, start=1):
            acc[i] = acc.get(i, 0.0) + 1.0 / (k + rank)
    top = max(acc.values(), default=0.0)
    out = [(i, (s / top) if top > 0 else 0.0) for i, s in acc.items()]
    out.sort(key=lambda t: (-t[1], t[0]))
    return out


_NAME_QUERY = re.compile(r"[\w.:$/#-]*[^\W\d_][\w.:$/#-]*")


def is_name_query(query: str) -> bool:
    """True for a query that is one word with no space: a name to look up (``resultcallback``,
    ``get_terminal_size``, ``Context.invoke``, ``fmt::format``), not a description. Letters, digits and
    ``_ . : $ / # -`` only, at least one letter, at most 200 characters; surrounding whitespace is ignored."""
    q = query.strip()
    return 0 < len(q) <= 200 and _NAME_QUERY.fullmatch(q) is not None
