"""The MaxScore top-k keyword path of the SQLite store (issue 20, ``scopekb.stores.sqlite.topk``) returns what
FTS5's single ``ORDER BY bm25()`` query returns: same rows, same order (tie-breaks included), same scores to the
last bit, on a generated corpus with Zipf-like word frequencies, two agents and several page sizes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from scopekb.stores.base import ScopeFilter, SearchFilter
from scopekb.stores.sqlite import SqliteChunkStore, topk
from scopekb.stores.sqlite.chunks import BM25_WEIGHTS, _filter_sql
from scopekb.stores.sqlite.text import keyword_terms
from tests.unit.test_sqlite_store import doc

WORDS = [f"w{i}" for i in range(80)]
ZIPF = [1.0 / (i + 1) ** 1.1 for i in range(len(WORDS))]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, ZIPF, k=n))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> SqliteChunkStore:
    rng = random.Random(20)
    s = SqliteChunkStore(Path(tmp_path_factory.mktemp("topk")) / "chunks.sqlite3")
    s.ensure_index()
    docs: list[dict[str, Any]] = []
    for i in range(900):
        agent = "a" if i % 5 else "b"
        body = _text(rng, rng.randint(1, 60))
        if i % 7 == 0:  # exact duplicates: equal scores, order decided by the tie-break
            body = "w3 w40 w41 w3"
        docs.append(doc(agent, f"src/{_text(rng, 1)}/f{i % 40}.py", body, i=i % 13,
                        symbol=_text(rng, 1) if i % 3 == 0 else None,
                        signature=_text(rng, 3) if i % 4 == 0 else None))
    s.bulk_write(docs)
    yield s
    s.close()


def _reference(s: SqliteChunkStore, terms: list[str], flt: SearchFilter, k: int) -> list[tuple[int, str, float]]:
    where, args = _filter_sql(flt)
    w = ", ".join(str(float(x)) for x in BM25_WEIGHTS)
    with s._db.read() as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(
            f"SELECT c.rowid, c.id, -bm25(chunks_fts, {w}) AS score FROM chunks_fts JOIN chunks c"
            f" ON c.rowid = chunks_fts.rowid WHERE chunks_fts MATCH ? AND {where}"
            " ORDER BY score DESC, c.content_sha, c.chunk_index, c.id LIMIT ?",
            [" OR ".join(f'"{t}"' for t in terms), *args, k])]


class _Recording:
    """A connection that records the MATCH strings of the FTS5 queries run through it."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.matches = conn, []

    def execute(self, sql: str, params: Any = ()) -> Any:
        if "MATCH ?" in sql:
            self.matches.append(params[0])
        return self.conn.execute(sql, params)


def test_top_k_equals_the_single_fts5_query(store: SqliteChunkStore) -> None:
    rng = random.Random(7)
    used = second = skipped = 0
    for _ in range(80):
        terms = list(dict.fromkeys(rng.sample(WORDS, rng.randint(1, 8)) + rng.sample(["nothere", "w0", "w1"], 1)))
        flt = SearchFilter(scope=ScopeFilter(rng.choice("ab"), None))
        for k in (1, 3, 10, 40):
            want = _reference(store, terms, flt, k)
            where, args = _filter_sql(flt)
            with store._db.read() as conn:
                rec = _Recording(conn)
                got = topk.top_k(rec, terms, tuple(float(x) for x in BM25_WEIGHTS), where, args, k)
            if got is None:  # every word common: the store runs the single query
                continue
            used += 1
            second += any(m.startswith("((") for m in rec.matches)  # a second attempt (words read before NOT)
            skipped += sum(" NOT " in m for m in rec.matches) < 2 * sum(m.startswith("((") for m in rec.matches)
            assert got == want, (terms, k)
    assert used > 100  # the scheme itself answered most of them
    assert second > 20 and skipped > 5  # second attempts ran, some without their NOT query


@pytest.mark.parametrize("offset", [0, 4])
def test_keyword_search_pages_are_unchanged(store: SqliteChunkStore, offset: int) -> None:
    rng = random.Random(offset)
    for _ in range(40):
        terms = rng.sample(WORDS, rng.randint(1, 6))
        flt = SearchFilter(scope=ScopeFilter("a", None))
        # the store searches the distinct keyword_terms of the text: 3+ terms add identifier parts (w12 -> w, 12)
        want = _reference(store, list(dict.fromkeys(keyword_terms(" ".join(terms)))), flt, 10 + offset)[offset:]
        got = store.keyword_search(" ".join(terms), flt, 10, offset=offset)
        assert [(i, s) for i, s, _ in got] == [(i, s) for _, i, s in want]
        assert all(d["path"].startswith("src/") for _, _, d in got)


def test_bm25_in_python_equals_fts5_to_the_last_bit(store: SqliteChunkStore) -> None:
    terms = ["w0", "w2", "w9", "w33", "w70"]
    w = tuple(float(x) for x in BM25_WEIGHTS)
    with store._db.read() as conn:
        rows, tokens = topk.totals(conn, 4)
        assert rows == 900
        df = topk._vocab(conn, terms)
        idfs = [topk.idf(rows, df[t]) for t in terms]
        fts = conn.execute(f"SELECT rowid, -bm25(chunks_fts, {', '.join(map(str, w))}), symbol, signature,"
                           " content, path FROM chunks_fts WHERE chunks_fts MATCH ?",
                           [" OR ".join(f'"{t}"' for t in terms)]).fetchall()
    assert len(fts) > 100
    for r in fts:
        assert topk.bm25(r[2:6], terms, idfs, w, tokens / rows) == r[1]


def test_unfiltered_first_equals_the_single_query_or_gives_way(store: SqliteChunkStore) -> None:
    rng = random.Random(3)
    answered = 0
    w = tuple(float(x) for x in BM25_WEIGHTS)
    for _ in range(60):
        terms = rng.sample(WORDS[:6], rng.randint(1, 4))  # common words: the case top_k gives up on
        flt = SearchFilter(scope=ScopeFilter(rng.choice("ab"), None))  # "b" holds 1 row in 5
        where, args = _filter_sql(flt)
        for k in (1, 10, 40):
            with store._db.read() as conn:
                got = topk.top_k_unfiltered_first(conn, " OR ".join(f'"{t}"' for t in terms), w, where, args, k)
            if got is not None:
                answered += 1
                assert got == _reference(store, terms, flt, k), (terms, k)
    assert answered > 60
