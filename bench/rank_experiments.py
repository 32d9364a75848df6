#!/usr/bin/env python3
"""Ranking experiments of issue 21 on the bench's quality sets (development tool, not part of ``bench/run``).

Two steps:

``search`` — index one set of :data:`scopekb_bench.sets.SETS` (or ``corpus``: requests/click/itsdangerous/flask
of the first quality set, docstring → function with scopekb's own miner) with ``scopekb eval``'s code
(:func:`scopekb.evaluation.build_and_search`) on the distributed stores started by ``scripts/services``, with the
local model and the settings given as ``SCOPEKB_*`` environment overrides (the *variant*), searching each query
``--depth`` deep, and pickle the keyword/vector lists under ``.services/cache/rank-exp/<variant>/<set>.pkl``.
Vectors are cached by (model, embedding text) in ``.services/cache/rank-exp/embcache.sqlite3``.

``compare`` — read those pickles and score fusion variants (min-max weights, z-score, RRF, candidate depth) of
each variant against a baseline variant, per set: NDCG@10 with its 95% bootstrap interval and the paired gain's
interval. Choices are made on tuning sets only; ``held-aside`` is read only with ``--held-aside``.

``search --query-variants split,stop,...`` also searches every query by keyword with each query rewrite of
:data:`QUERY_VARIANTS` while the index is live, and stores each as its own variant ``<variant>+<rewrite>`` (same
vector lists, that keyword list), so ``compare`` scores the rewrite's keyword and hybrid against the baseline.

``boosts`` — keyword (and hybrid) NDCG@10 of each keyword field boost candidate searched by ``search --boosts``.

Sets: those of :data:`scopekb_bench.sets.SETS`, ``corpus`` and ``tuning-large`` (:data:`TUNING_LARGE`, 310
queries: the tuning set of issue 21's fourth round).

Usage::

    bench/rank_experiments.py search --set tuning --variant base [--env KEY=VALUE ...] [--query-variants split]
    bench/rank_experiments.py compare --base base --variants base,hdr2 --sets tuning,corpus
    bench/rank_experiments.py search --set tuning-large --variant base --profile embedded --sample 1000 \
        --depth 200 --boosts
    bench/rank_experiments.py boosts --base base --sets tuning-large
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scopekb_bench import sets as bench_sets  # noqa: E402
from scopekb_bench.util import REPO  # noqa: E402

from scopekb import evalsets, evaluation, scoring  # noqa: E402
from scopekb.models import Source  # noqa: E402

OUT = REPO / ".services" / "cache" / "rank-exp"
CORPUS = bench_sets.QualitySet(
    "corpus", "docstring", (("requests", "2.32.3", "src/requests"), ("click", "8.1.7", "src/click"),
                            ("itsdangerous", "2.1.2", "src/itsdangerous"), ("flask", "3.0.3", "src/flask")),
    False, "requests + click + itsdangerous + flask: docstring → function (tuning)")
#: The larger tuning set of issue 21's fourth round: four released libraries the bench uses nowhere else (not the
#: held-aside werkzeug/jinja2, not the first quality set's), docstring → function, every query (≈ 310).
TUNING_LARGE = bench_sets.QualitySet(
    "tuning-large", "docstring",
    (("attrs", "25.3.0", "src"), ("marshmallow", "3.26.1", "src/marshmallow"),
     ("more-itertools", "10.7.0", "more_itertools"), ("packaging", "25.0", "src/packaging")),
    False, "attrs + marshmallow + more-itertools + packaging: docstring → function (tuning, all queries)")


def _set(name: str) -> bench_sets.QualitySet:
    if name == "corpus":
        return CORPUS
    if name == "tuning-large":
        return TUNING_LARGE
    return next(s for s in bench_sets.SETS if s.id == name)


# ---- query rewrites for keyword search (issue 21 experiment a) ------------------------------------------------

#: Lucene's English stop words (``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET``).
STOP = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then there "
                 "these they this to was will with".split())


def _split(query: str) -> str:
    """The query plus the camelCase / snake_case / digit parts of its identifiers (the index analyzer's parts)."""
    from scopekb.stores.sqlite.text import _WORD, _analyse

    extra = [p for t in _WORD.findall(query) for p in _analyse(t)[1:]]
    return query + (" " + " ".join(extra) if extra else "")


def _stop(query: str) -> str:
    from scopekb.stores.sqlite.text import _WORD

    kept = [t for t in _WORD.findall(query) if t.lower() not in STOP]
    return " ".join(kept) if kept else query


_VOWELS = set("aeiouy")


def base_forms(word: str) -> list[str]:
    """Candidate uninflected forms of an English word by suffix rules (``parsed`` → parse, pars; ``headers`` →
    header; ``returns`` → return; ``encoding`` → encod, encode; ``entries`` → entry); ``[]`` when none applies."""
    w = word.lower()
    if not w.isalpha() or len(w) < 4:
        return []
    out: list[str] = []
    if w.endswith("ies") and len(w) > 4:
        out.append(w[:-3] + "y")
    elif w.endswith(("sses", "shes", "ches", "xes", "zes")):
        out += [w[:-2], w[:-1]]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        out.append(w[:-1])
    elif w.endswith("ied") and len(w) > 4:
        out.append(w[:-3] + "y")
    elif w.endswith("ed") and len(w) > 3:
        out += _stem_forms(w[:-2])
    elif w.endswith("ing") and len(w) > 5:
        out += _stem_forms(w[:-3])
    return [b for b in out if len(b) >= 3 and b != w]


def _stem_forms(stem: str) -> list[str]:
    """What a word ending in ``-ed``/``-ing`` may come from, given the word without that ending: the stem, then the
    stem with a doubled final consonant undone (``stopp`` → stop) or with an ``e`` added (``encod`` → encode)."""
    if stem[-1] == stem[-2] and stem[-1] not in _VOWELS and stem[-1] not in "lsz":
        return [stem, stem[:-1]]
    return [stem, stem + "e"] if stem[-1] not in _VOWELS else [stem]


def _inflect(query: str) -> str:
    from scopekb.stores.sqlite.text import _WORD, STOP_WORDS

    extra = [b for t in _WORD.findall(query) if t.lower() not in STOP_WORDS for b in base_forms(t)]
    return query + (" " + " ".join(extra) if extra else "")


QUERY_VARIANTS = {"split": _split, "stop": _stop, "split_stop": lambda q: _stop(_split(q)), "inflect": _inflect}


def sqlite_cross_fields(store, query: str, flt, size: int, tie: float = 0.3,
                        terms=None) -> list[tuple[str, float, dict]]:
    """Experiment (c): SQLite keyword scored like OpenSearch's ``cross_fields`` — per query term, FTS5 ``bm25()``
    of each column alone (× its boost), the best column plus ``tie`` × the others; summed over terms. (FTS5 still
    normalises by the whole row's length, where Lucene normalises each field by its own.)"""
    from scopekb.stores.sqlite.chunks import BM25_WEIGHTS, _filter_sql
    from scopekb.stores.sqlite.text import query_tokens

    where, args = _filter_sql(flt)
    acc: dict[int, float] = {}
    with store._db.read() as conn:
        for t in dict.fromkeys((terms or query_tokens)(query)):
            rows = conn.execute(
                "SELECT c.rowid, -bm25(chunks_fts, 1, 0, 0, 0), -bm25(chunks_fts, 0, 1, 0, 0),"
                " -bm25(chunks_fts, 0, 0, 1, 0), -bm25(chunks_fts, 0, 0, 0, 1) FROM chunks_fts"
                f" JOIN chunks c ON c.rowid = chunks_fts.rowid WHERE chunks_fts MATCH ? AND {where}",
                [f'"{t}"', *args]).fetchall()
            for rid, *cols in rows:
                sc = [w * max(0.0, x) for w, x in zip(BM25_WEIGHTS, cols, strict=True)]
                best = max(sc)
                acc[rid] = acc.get(rid, 0.0) + best + tie * (sum(sc) - best)
        top = sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
        out = []
        for rid, score in top:
            doc = json.loads(conn.execute("SELECT doc FROM chunk_docs WHERE rowid = ?", [rid]).fetchone()[0])
            out.append((doc.get("_id", str(rid)), score, doc))
    return out


def legacy_terms(store, query: str, flt, size: int) -> list[tuple[str, float, dict]]:
    """Keyword search with the query terms before issue 21's change: every identifier whole, stop words kept
    (``query_tokens`` in place of ``keyword_terms``): the "before" of experiment (a)."""
    from scopekb.stores import opensearch
    from scopekb.stores.sqlite import chunks, text

    with mock.patch.object(chunks, "keyword_terms", text.query_tokens), \
            mock.patch.object(opensearch, "keyword_terms", text.query_tokens):
        return store.keyword_search(query, flt, size)


#: Keyword scoring variants (experiment c): name -> (store, query, filter, size) -> raw hits.
def sqlite_cross_fields_terms(store, query: str, flt, size: int) -> list[tuple[str, float, dict]]:
    """``xf`` with today's query terms (:func:`scopekb.stores.sqlite.text.keyword_terms`: stop words dropped,
    identifier parts added) in place of ``query_tokens``."""
    from scopekb.stores.sqlite.text import keyword_terms

    return sqlite_cross_fields(store, query, flt, size, terms=keyword_terms)


SCORING_VARIANTS = {"xf": sqlite_cross_fields, "xfk": sqlite_cross_fields_terms, "legacy": legacy_terms}


def search(args: argparse.Namespace) -> None:
    from scopekb.runtime import build_runtime
    from scopekb.settings import Settings

    qs = _set(args.set)
    if qs.held_aside and not args.held_aside:
        sys.exit("the held-aside set is searched only with --held-aside (never tune on it)")
    out = OUT / args.variant / f"{qs.id}.pkl"
    out.parent.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    data = Path(tempfile.mkdtemp(prefix="rankexp-"))
    env = {k: v for k, v in os.environ.items()}
    env.update({"SCOPEKB_OPENSEARCH__ALIAS": f"rankexp-{run}-chunks",
                "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"rankexp-{run}-sys", "SCOPEKB_S3__BUCKET": f"rankexp-{run}",
                "SCOPEKB_GIT__CACHE_DIR": str(data / "git"), "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true",
                "SCOPEKB_DATA_DIR": str(data), "SCOPEKB_EMBEDDING__PROVIDER": "local" if not args.keyword else "none",
                "SCOPEKB_EMBEDDING__CACHE": "sqlite", "SCOPEKB_EMBEDDING__CACHE_PATH": str(OUT / "embcache.sqlite3"),
                "SCOPEKB_PROFILE": args.profile, "SCOPEKB_LOG_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false",
                "SCOPEKB_QUERY__CANDIDATE_FACTOR": str(max(1, args.depth // 10))})
    for kv in args.env or []:
        k, _, v = kv.partition("=")
        env[k] = v
    t0 = time.monotonic()
    rewrites = [v for v in (args.query_variants or "").split(",") if v]
    real_lists = evaluation._search_lists
    depth = max(1, args.depth // 10) * 10

    def lists_with_rewrites(rt, scope, query, depth_, boosts=()):
        from scopekb.stores.base import SearchFilter

        out = real_lists(rt, scope, query, depth_, boosts)
        for name in rewrites:
            lst = []
            if name in SCORING_VARIANTS:
                raw = SCORING_VARIANTS[name](rt.chunks, query[:4096], SearchFilter(scope=scope), depth)
            else:
                raw = rt.chunks.keyword_search(QUERY_VARIANTS[name](query)[:4096], SearchFilter(scope=scope), depth)
            for _id, score, doc in raw:
                hid = f"{doc['path']}#{doc['chunk_index']}"
                out.hits.setdefault(hid, {"path": doc["path"], "start_line": doc["start_line"],
                                          "end_line": doc["end_line"]})
                lst.append((hid, score))
            out.keyword_by_boosts[("rewrite", name)] = lst
        return out

    with mock.patch.dict(os.environ, env, clear=True), \
            mock.patch.object(evaluation, "_search_lists", lists_with_rewrites):
        rt = build_runtime(Settings(), name=f"rankexp-{run}")
        try:
            repo = bench_sets._package_repo(qs)
            src = Source(agent_name="bench", context_id=qs.id, repo_url=str(repo), ref="main", webhooks=False,
                         id=Source.new_id())
            from scopekb.tuning import BOOST_CANDIDATES

            head, got = evaluation.build_and_search(rt, src, sample=args.sample, kinds=(qs.kind,),
                                                    boosts=BOOST_CANDIDATES if args.boosts else ())
        finally:
            try:
                if args.profile == "distributed":
                    rt.chunks.client.indices.delete(index=f"rankexp-{run}-*", ignore_unavailable=True)
            except Exception as e:  # noqa: BLE001
                print("cleanup:", e, file=sys.stderr)
            shutil.rmtree(data, ignore_errors=True)
    with out.open("wb") as f:
        pickle.dump({"set": qs.id, "env": args.env, "sets": got, "seconds": time.monotonic() - t0}, f)
    for name in rewrites:
        es0 = got[0]
        lists = [evaluation.Lists(keyword=ls.keyword_by_boosts[("rewrite", name)], vector=ls.vector, hits=ls.hits)
                 for ls in es0.lists]
        p = OUT / f"{args.variant}+{name}" / f"{qs.id}.pkl"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(pickle.dumps({"set": qs.id, "env": args.env, "rewrite": name,
                                    "sets": [evaluation.EvalSet(es0.kind, es0.queries, lists)]}))
    es = got[0]
    print(json.dumps({m: round(evalsets.summarise(evaluation.per_query(es, m))["ndcg10"]["mean"], 4)
                      for m in evaluation.MODES}), f"{len(es.queries)} queries, {time.monotonic() - t0:.0f} s")


# ---- fusion variants over stored lists -------------------------------------------------------------------------

def zscore(scored):
    vals = [s for _, s in scored]
    if not vals:
        return {}
    mu = sum(vals) / len(vals)
    sd = (sum((v - mu) ** 2 for v in vals) / len(vals)) ** 0.5
    if sd <= 1e-12:
        return {i: 0.0 for i, _ in scored}
    return {i: (s - mu) / sd for i, s in scored}


def fuse(ls: evaluation.Lists, how: str, kw: float, depth: int) -> list[str]:
    k, v = ls.keyword[:depth], ls.vector[:depth]
    if how == "keyword":
        return [i for i, _ in k]
    if how == "vector":
        return [i for i, _ in v]
    if how == "rrf":
        return [i for i, _ in scoring.rrf_fusion(k, v)]
    if how == "minmax":
        return [i for i, _ in scoring.weighted_fusion(k, v, kw, 1 - kw)]
    if how.startswith("rrf") and how[3:].isdigit():  # RRF with another k (``rrf10``, ``rrf30``)
        return [i for i, _ in scoring.rrf_fusion(k, v, k=int(how[3:]))]
    if how == "wrrf":  # weighted RRF (k = 60): kw / (60 + keyword rank) + (1 − kw) / (60 + vector rank)
        sc: dict[str, float] = {}
        for lst, wt in ((k, kw), (v, 1 - kw)):
            for r, (i, _) in enumerate(lst, start=1):
                sc[i] = sc.get(i, 0.0) + wt / (60 + r)
        return sorted(sc, key=lambda i: (-sc[i], i))
    if how in ("dbsf", "mnz", "floor20"):
        def norm(lst):
            if how == "dbsf":  # distribution-based: (s − (μ − 3σ)) / 6σ, clipped to [0, 1]
                vals = [x for _, x in lst]
                if not vals:
                    return {}
                mu = sum(vals) / len(vals)
                sd = (sum((x - mu) ** 2 for x in vals) / len(vals)) ** 0.5 or 1.0
                return {i: min(1.0, max(0.0, (x - mu + 3 * sd) / (6 * sd))) for i, x in lst}
            if how == "floor20":  # min-max with the 20th candidate's score as the floor (clipped at 0)
                if not lst:
                    return {}
                hi, lo = lst[0][1], lst[min(19, len(lst) - 1)][1]
                return {i: max(0.0, (x - lo) / (hi - lo)) if hi > lo else 1.0 for i, x in lst}
            return scoring.min_max(lst)
        kn, vn = norm(k), norm(v)
        sc = {i: (kw * kn.get(i, 0.0) + (1 - kw) * vn.get(i, 0.0))
              * ((i in kn) + (i in vn) if how == "mnz" else 1) for i in set(kn) | set(vn)}
        return sorted(sc, key=lambda i: (-sc[i], i))
    if how == "zscore":
        kn, vn = zscore(k), zscore(v)
        lo_k = min(kn.values(), default=0.0)
        lo_v = min(vn.values(), default=0.0)
        ids = set(kn) | set(vn)
        sc = {i: kw * kn.get(i, lo_k) + (1 - kw) * vn.get(i, lo_v) for i in ids}
        return sorted(sc, key=lambda i: (-sc[i], i))
    raise ValueError(how)


def per_query(es: evaluation.EvalSet, how: str, kw: float, depth: int) -> list[float]:
    return [evalsets.rank_metrics([ls.hits[i] for i in fuse(ls, how, kw, depth)[:10]], q.targets)["ndcg10"]
            for q, ls in zip(es.queries, es.lists, strict=True)]


FUSIONS = ([("keyword", 0.0), ("vector", 0.0), ("rrf", 0.0), ("rrf10", 0.0), ("rrf30", 0.0)]
           + [(how, w / 10) for how in ("minmax", "zscore", "dbsf", "mnz", "floor20", "wrrf") for w in range(1, 10)])


def compare(args: argparse.Namespace) -> None:
    sets = args.sets.split(",")
    if "held-aside" in sets and not args.held_aside:
        sys.exit("the held-aside set is read only with --held-aside")
    depths = [int(d) for d in args.depths.split(",")]
    for name in sets:
        base_p = OUT / args.base / f"{name}.pkl"
        base = pickle.loads(base_p.read_bytes())["sets"][0]
        ref = per_query(base, "minmax", 0.3, 40)
        m, lo, hi = evalsets.bootstrap_ci(ref)
        print(f"\n## {name}: {len(ref)} queries; baseline {args.base} hybrid min-max 0.3/0.7 depth 40: "
              f"{m:.3f} ({lo:.3f}–{hi:.3f})")
        print("| variant | fusion | depth | NDCG@10 | 95% CI | gain vs baseline (95% CI) |")
        print("|---|---|---:|---:|---|---|")
        for var in args.variants.split(","):
            p = OUT / var / f"{name}.pkl"
            if not p.exists():
                continue
            es = pickle.loads(p.read_bytes())["sets"][0]
            rows = []
            for how, w in FUSIONS:
                for d in depths:
                    if how in ("keyword", "vector") and d != depths[0]:
                        continue
                    s = per_query(es, how, w, d)
                    rows.append((sum(s) / len(s), how, w, d, s))
            rows.sort(key=lambda r: -r[0])
            wanted = {tuple(x.split(":")) for x in (args.show or "").split(",") if x}
            show = [r for r in rows if r[1] in ("keyword", "vector") or (r[1] == "minmax" and r[2] == 0.3
                                                                         and r[3] == 40)
                    or (r[1], f"{r[2]:.1f}", str(r[3])) in wanted] + rows[:args.top]
            seen = set()
            for mean, how, w, d, s in show:
                key = (how, w, d)
                if key in seen:
                    continue
                seen.add(key)
                _, lo, hi = evalsets.bootstrap_ci(s)
                g, glo, ghi = evalsets.paired_gain(s, ref)
                label = how if how in ("keyword", "vector", "rrf") else f"{how} {w:.1f}/{1 - w:.1f}"
                print(f"| {var} | {label} | {d} | {mean:.3f} | {lo:.3f}–{hi:.3f} "
                      f"| {g:+.3f} ({glo:+.3f} … {ghi:+.3f}) |")


def boosts(args: argparse.Namespace) -> None:
    """Keyword field boost candidates (``search --boosts``): keyword and hybrid NDCG@10 of each, paired gains
    against the default boosts' keyword and hybrid (min-max 0.3/0.7 at depth 40, and ``--fusion`` if given)."""
    sets = args.sets.split(",")
    if "held-aside" in sets and not args.held_aside:
        sys.exit("the held-aside set is read only with --held-aside")
    how, w, d = args.fusion.split(":")
    for name in sets:
        es = pickle.loads((OUT / args.base / f"{name}.pkl").read_bytes())["sets"][0]
        cands = list(es.lists[0].keyword_by_boosts)
        print(f"\n## {name}: {len(es.queries)} queries; boosts (symbol, signature, content, path)")
        print(f"| boosts | keyword NDCG@10 | gain (95% CI) | hybrid {how} {w} depth {d} | gain (95% CI) |")
        print("|---|---:|---|---:|---|")
        ref_k = ref_h = None
        for b in cands:
            alt = evaluation.EvalSet(es.kind, es.queries, [
                evaluation.Lists(keyword=ls.keyword_by_boosts[b], vector=ls.vector, hits=ls.hits) for ls in es.lists])
            k = per_query(alt, "keyword", 0.0, 200)
            h = per_query(alt, how, float(w), int(d))
            ref_k, ref_h = ref_k or k, ref_h or h
            gk, gklo, gkhi = evalsets.paired_gain(k, ref_k)
            gh, ghlo, ghhi = evalsets.paired_gain(h, ref_h)
            print(f"| {'/'.join(f'{x:g}' for x in b)} | {sum(k) / len(k):.3f} | {gk:+.3f} ({gklo:+.3f} … {gkhi:+.3f}) "
                  f"| {sum(h) / len(h):.3f} | {gh:+.3f} ({ghlo:+.3f} … {ghhi:+.3f}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search")
    s.add_argument("--set", required=True)
    s.add_argument("--variant", required=True)
    s.add_argument("--env", action="append", help="SCOPEKB_X=value settings override of the variant")
    s.add_argument("--sample", type=int, default=150)
    s.add_argument("--depth", type=int, default=100)
    s.add_argument("--keyword", action="store_true", help="keyword-only (no model)")
    s.add_argument("--profile", default="distributed", choices=("distributed", "embedded"))
    s.add_argument("--held-aside", action="store_true")
    s.add_argument("--query-variants", help="comma-separated query rewrites of QUERY_VARIANTS (keyword lists)")
    s.add_argument("--boosts", action="store_true", help="also search each query with every keyword field boost "
                   "candidate of scopekb.tuning.BOOST_CANDIDATES (Lists.keyword_by_boosts)")
    c = sub.add_parser("compare")
    c.add_argument("--base", default="base")
    c.add_argument("--variants", default="base")
    c.add_argument("--sets", default="tuning,corpus")
    c.add_argument("--depths", default="20,40,100")
    c.add_argument("--top", type=int, default=4)
    c.add_argument("--show", help="rows always shown, e.g. minmax:0.5:100,rrf:0.0:40 (fusion:weight:depth)")
    c.add_argument("--held-aside", action="store_true")
    b = sub.add_parser("boosts")
    b.add_argument("--base", default="base")
    b.add_argument("--sets", default="tuning-large")
    b.add_argument("--fusion", default="minmax:0.3:40")
    b.add_argument("--held-aside", action="store_true")
    a = ap.parse_args()
    {"search": search, "compare": compare, "boosts": boosts}[a.cmd](a)


if __name__ == "__main__":
    main()
