"""Top-k BM25 over the FTS5 chunk index without scoring every match (issue 20): a MaxScore scheme.

An OR query of a docstring's words matches most chunks through its common words ("the", "of", "a"), and FTS5's
``ORDER BY bm25() LIMIT k`` scores every match: on django (99k chunks) the median such query matched 59% of the
chunks and took 182 ms, ``bm25()`` about 70% of it. BM25 is a sum of one term per query word, and a word's term is
below its upper bound ``idf × (k1 + 1)`` in every row. So (Turtle and Flood, "Query evaluation: strategies and
optimizations", 1995, MaxScore):

1. words sorted rarest first; FTS5 scores the rows of one word at a time (``bm25()`` of a one-word query is that
   word's term, with the same global idf), and the partial sums are kept per row;
2. after each word, if at least ``k`` rows have a partial sum above the bounds of all words not yet read, no row
   without any of the words read can reach the top ``k``: stop;
3. the rows whose partial sum plus those bounds can still reach the ``k``-th partial sum are scored exactly, with
   FTS5's ``bm25()`` formula (:func:`bm25`) on their stored tokens, and sorted like the single query
   (score, then content_sha, chunk_index, id).

The result equals ``ORDER BY -bm25(chunks_fts, weights) DESC, content_sha, chunk_index, id LIMIT k`` over the
same filter (``tests/unit/test_sqlite_topk.py`` compares them on a generated corpus, scores to the last bit).
When the words read before the stop would cover more than :data:`SCAN_FRACTION` of the rows (every word common),
:func:`top_k` returns None and the caller runs the single query.
"""

from __future__ import annotations

import heapq
import math
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

#: FTS5's bm25() constants (SQLite ext/fts5/fts5_aux.c: k1 = 1.2, b = 0.75; an idf <= 0 becomes 1e-6).
K1, B, IDF_FLOOR = 1.2, 0.75, 1e-6
#: Give up (return None) when the words read would cover more than this fraction of all rows.
SCAN_FRACTION = 0.25
#: Give up when more than this many rows would need an exact score (each costs a read and a split of its text).
MAX_EXACT = 4000
#: Relative slack on the bound comparisons (partial sums add in another order than FTS5's single sum).
_SLACK = 1e-9
_VOCAB = "temp.scopekb_fts_vocab"
_PART = 500


def _varint(b: bytes, i: int) -> tuple[int, int]:
    """SQLite's varint (big-endian 7-bit groups, the 9th byte whole) at ``b[i]``: ``(value, next offset)``."""
    v = 0
    for _ in range(8):
        c = b[i]
        i += 1
        v = (v << 7) | (c & 0x7F)
        if not c & 0x80:
            return v, i
    return (v << 8) | b[i], i + 1


def totals(conn: sqlite3.Connection, n_cols: int) -> tuple[int, int]:
    """``(rows, tokens in all columns)`` of ``chunks_fts`` as ``bm25()`` reads them (xRowCount and
    xColumnTotalSize(-1)): FTS5's averages record (``chunks_fts_data`` id 1: a varint row count, then one varint
    token total per column; fts5_storage.c ``fts5StorageLoadTotals``). ``(0, 0)`` for an empty table."""
    row = conn.execute("SELECT block FROM chunks_fts_data WHERE id = 1").fetchone()
    if row is None or not row[0]:
        return 0, 0
    b = bytes(row[0])
    n, i = _varint(b, 0)
    tokens = 0
    for _ in range(n_cols):
        if i >= len(b):
            break
        t, i = _varint(b, i)
        tokens += t
    return n, tokens


def idf(rows: int, hits: int) -> float:
    """FTS5 bm25()'s idf of a word in ``hits`` of ``rows`` rows: ``ln((N - n + 0.5) / (n + 0.5))``, at least 1e-6."""
    v = math.log((rows - hits + 0.5) / (hits + 0.5))
    return v if v > 0.0 else IDF_FLOOR


def bm25(columns: Sequence[str | None], terms: Sequence[str], idfs: Sequence[float], weights: Sequence[float],
         avgdl: float) -> float:
    """``-bm25(chunks_fts, *weights)`` of one row from its stored columns (space-separated tokens), computed in the
    order fts5_aux.c's ``fts5Bm25Function`` does (so equal to the last bit): per word the column weight of each
    occurrence summed in column then position order, ``D`` the row's token count in all columns."""
    want = set(terms)
    freq = dict.fromkeys(terms, 0.0)
    d = 0
    for c, text in enumerate(columns):
        toks = text.split(" ") if text else []
        d += len(toks)
        w = weights[c] if c < len(weights) else 1.0
        for t, n in Counter(x for x in toks if x in want).items():
            f = freq[t]
            for _ in range(n):
                f += w
            freq[t] = f
    score = 0.0
    for t, v in zip(terms, idfs, strict=True):
        f = freq[t]
        score += v * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * d / avgdl)))
    return score


def _vocab(conn: sqlite3.Connection, terms: Sequence[str]) -> dict[str, int]:
    conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {_VOCAB} USING fts5vocab(main, chunks_fts, row)")
    got = dict(conn.execute(f"SELECT term, doc FROM {_VOCAB} WHERE term IN ({','.join('?' * len(terms))})",
                            list(terms)).fetchall())
    return {t: int(got.get(t, 0)) for t in terms}


def top_k(conn: sqlite3.Connection, terms: Sequence[str], weights: Sequence[float], where: str, args: Sequence[Any],
          k: int) -> list[tuple[int, str, float]] | None:
    """The first ``k`` rows of the OR query of ``terms`` (distinct words, as FTS5 phrases) within ``where``/``args``
    (SQL over ``chunks c``) by ``-bm25(chunks_fts, *weights)`` descending, then content_sha, chunk_index, id:
    ``[(rowid, chunk id, score)]``. None when the scheme would read more than :data:`SCAN_FRACTION` of the rows or
    score more than :data:`MAX_EXACT` exactly (run the single FTS5 query then). Every weight must be > 0.

    Raises:
        sqlite3.Error: as the queries it runs.
    """
    if k <= 0 or not terms:
        return []
    n_rows, n_tokens = totals(conn, 4)
    if n_rows <= 0 or n_tokens <= 0:
        return None
    avgdl = n_tokens / n_rows
    df = _vocab(conn, terms)
    present = [t for t in terms if df[t] > 0]  # a word in no row adds 0 to every score
    if not present:
        return []
    idfs = {t: idf(n_rows, df[t]) for t in present}
    order = sorted(present, key=lambda t: (df[t], t))
    bound = {t: idfs[t] * (K1 + 1.0) for t in present}  # the most a word adds to a row's score
    rest = [0.0] * (len(order) + 1)  # rest[j]: sum of the bounds of order[j:]
    for j in range(len(order) - 1, -1, -1):
        rest[j] = rest[j + 1] + bound[order[j]]
    w = ", ".join(str(float(x)) for x in weights)
    # The rows holding a word of order[i:j] and none of order[:i], with their whole score, in two FTS5 queries
    # whose phrases are each counted once: those that also hold another word (an AND, so FTS5 advances the other
    # words' doclists to these rows only and bm25() scores these rows only) and those that hold no other word
    # (a NOT). A phrase under NOT or absent from a row adds 0.0 to its bm25(); the phrases are summed in another
    # order than in the single query, so these scores may differ from it in the last bits (the page is rescored
    # exactly below).
    sql = (f"SELECT chunks_fts.rowid, -bm25(chunks_fts, {w}) FROM chunks_fts CROSS JOIN chunks c"
           f" ON c.rowid = chunks_fts.rowid WHERE chunks_fts MATCH ? AND {where}")
    if len(order) < 2:  # one word: nothing to leave out
        return None
    cum = [0]
    for t in order:
        cum.append(cum[-1] + df[t])

    def _or(ws: Sequence[str]) -> str:
        return "(" + " OR ".join('"' + t + '"' for t in ws) + ")"

    part: dict[int, float] = {}

    def attempt(i: int, j: int, kth: float) -> float:
        new = _or(order[i:j])
        if i > 0:
            new = f"({new} NOT {_or(order[:i])})"
        others = [t for t in order if t not in order[i:j]]
        if others:
            part.update(conn.execute(sql, [f"{new} AND {_or(others)}", *args]).fetchall())
            # a row holding only words of order[i:j] scores at most their bounds: when those are below the k-th
            # score already read, none of these rows can reach the page (nor tie it): not read
            if not kth > sum(bound[t] for t in order[i:j]) * (1 + _SLACK) + _SLACK:
                part.update(conn.execute(sql, [f"{new} NOT {_or(others)}", *args]).fetchall())
        else:
            part.update(conn.execute(sql, [new, *args]).fetchall())
        return heapq.nlargest(k, part.values())[-1] if len(part) >= k else -math.inf

    def enough(j: int, kth: float) -> bool:
        return kth > rest[j] * (1 + _SLACK) + _SLACK

    # first the rarest words covering at most 1/64 of the rows; if their k-th row does not beat the others' bounds,
    # that k-th score is a lower bound of the final one, so the rarest words whose others' bounds are below it
    # surely do (if they cover at most SCAN_FRACTION of the rows): read the rows of the words added only
    j = max(1, max(i for i in range(len(order)) if cum[i] <= n_rows / 64))
    kth = attempt(0, j, -math.inf)
    if not enough(j, kth):
        j2 = next((i for i in range(j + 1, len(order)) if enough(i, kth)), len(order))
        if j2 >= len(order) or cum[j2] > SCAN_FRACTION * n_rows:
            return None
        kth = attempt(j, j2, kth)
        j = j2
        if not enough(j, kth):
            return None
    # a row without the rare words scores at most rest[j] < kth: the page is among the rows read; score the ones
    # that can reach the k-th exactly
    cands = [r for r, s in part.items() if s >= kth * (1 - _SLACK) - _SLACK]
    if len(cands) > MAX_EXACT:
        return None
    idf_list = [idfs[t] for t in present]
    scored: list[tuple[float, str, int, str, int]] = []
    for i in range(0, len(cands), _PART):
        ids = cands[i:i + _PART]
        for r in conn.execute(
                "SELECT chunks_fts.rowid, chunks_fts.symbol, chunks_fts.signature, chunks_fts.content,"
                " chunks_fts.path, c.content_sha, c.chunk_index, c.id FROM chunks_fts JOIN chunks c"
                f" ON c.rowid = chunks_fts.rowid WHERE chunks_fts.rowid IN ({','.join('?' * len(ids))})", ids):
            s = bm25(r[1:5], present, idf_list, weights, avgdl)
            scored.append((-s, r[5], r[6], r[7], r[0]))
    scored.sort(key=lambda x: (x[0], x[1] is not None, x[1] or "", x[2] is not None, x[2] or 0, x[3]))
    return [(x[4], x[3], -x[0]) for x in scored[:k]]


def top_k_unfiltered_first(conn: sqlite3.Connection, match: str, weights: Sequence[float], where: str,
                           args: Sequence[Any], k: int) -> list[tuple[int, str, float]] | None:
    """The same page as :func:`top_k` for the FTS5 query ``match`` by scoring in FTS5 alone first: the best
    ``2k + 8`` rows of the whole table by ``-bm25()`` (no join with ``chunks``, about half the cost of the joined
    query on django), then ``where``/``args`` on those rows. Exact when at least ``k`` of them pass the filter and
    the ``k``-th passing score is above the last row read (no unread row can reach or tie it), or when every
    matching row was read; None otherwise (a filter that leaves out most rows: run the joined query)."""
    if k <= 0:
        return []
    w = ", ".join(str(float(x)) for x in weights)
    m = 2 * k + 8
    rows = conn.execute(f"SELECT rowid, -bm25(chunks_fts, {w}) AS s FROM chunks_fts WHERE chunks_fts MATCH ?"
                        " ORDER BY s DESC LIMIT ?", [match, m]).fetchall()
    if not rows:
        return []
    score = dict(rows)
    ids = list(score)
    kept = conn.execute(f"SELECT c.rowid, c.content_sha, c.chunk_index, c.id FROM chunks c WHERE c.rowid IN"
                        f" ({','.join('?' * len(ids))}) AND {where}", [*ids, *args]).fetchall()
    page = sorted(kept, key=lambda r: (-score[r[0]], r[1] is not None, r[1] or "", r[2] is not None, r[2] or 0,
                                       r[3]))[:k]
    if len(rows) == m and (len(page) < k or not score[page[-1][0]] > rows[-1][1]):
        return None
    return [(r[0], r[3], score[r[0]]) for r in page]
