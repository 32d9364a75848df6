"""Evaluation sets mined without labels (issue 21): history queries, docstring pairs, metrics, per-context choice."""

from __future__ import annotations

import math

import pytest

from scopekb import evalsets, tuning
from scopekb.evalsets import CommitInfo, Target
from scopekb.evaluation import EvalSet, Lists, per_query, ranked
from scopekb.search import run_search
from scopekb.settings import QuerySettings

PARENT = '''import os


def load_config(path):
    with open(path) as fh:
        text = fh.read()
    return text.split()


class Store:
    def put(self, key, value):
        self.data[key] = value
        return True
'''

DIFF = """diff --git a/pkg/config.py b/pkg/config.py
--- a/pkg/config.py
+++ b/pkg/config.py
@@ -6 +6 @@ def load_config(path):
-        text = fh.read()
+        text = fh.read().strip()
@@ -12,0 +13 @@ class Store:
+        self.count += 1
"""


def test_changed_old_lines_replacements_and_insertions() -> None:
    assert evalsets.changed_old_lines(DIFF) == {"pkg/config.py": [(6, 6), (12, 12)]}


def test_added_and_deleted_files_are_left_out() -> None:
    diff = ("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,3 @@\n+x\n"
            "--- a/gone.py\n+++ /dev/null\n@@ -1,3 +0,0 @@\n-x\n")
    assert evalsets.changed_old_lines(diff) == {}


def test_history_query_targets_the_enclosing_definitions_in_the_parent() -> None:
    c = CommitInfo("b" * 40, "a" * 40, "Strip whitespace from loaded config values",
                   "The loader kept trailing newlines.\n\nSigned-off-by: x")
    q = evalsets.history_query(c, DIFF, lambda commit, path: PARENT if commit == "a" * 40 else None)
    assert q is not None and q.at == "a" * 40
    assert q.query == "Strip whitespace from loaded config values The loader kept trailing newlines."
    assert q.targets == [Target("pkg/config.py", 4, 7), Target("pkg/config.py", 11, 13)]


@pytest.mark.parametrize("subject, merge, parent", [
    ("Merge branch 'x'", False, "a" * 40),      # noise subject
    ("Release 1.2.3 today", False, "a" * 40),
    ("Fix the loader bug", True, "a" * 40),     # a merge commit
    ("Fix the loader bug", False, None),        # a root commit
    ("Fix it", False, "a" * 40),                # fewer than three words
])
def test_history_query_refuses_what_does_not_qualify(subject: str, merge: bool, parent: str | None) -> None:
    c = CommitInfo("b" * 40, parent, subject, "", merge=merge)
    assert evalsets.history_query(c, DIFF, lambda *_: PARENT) is None


def test_history_query_refuses_module_level_changes_tests_and_too_many_targets() -> None:
    c = CommitInfo("b" * 40, "a" * 40, "Change the imports of config")
    module_level = "--- a/pkg/config.py\n+++ b/pkg/config.py\n@@ -1 +1 @@\n-import os\n+import sys\n"
    assert evalsets.history_query(c, module_level, lambda *_: PARENT) is None
    tests = DIFF.replace("pkg/config.py", "tests/test_config.py")
    assert evalsets.history_query(c, tests, lambda *_: PARENT) is None
    assert evalsets.history_query(c, DIFF, lambda *_: PARENT, max_targets=1) is None
    unparsable = evalsets.history_query(c, DIFF, lambda *_: "def broken(:\n")
    assert unparsable is None


def test_docstring_set_strips_docstrings_and_targets_the_function() -> None:
    src = '"""Module doc."""\n\n\ndef parse_header(line):\n    """Split an HTTP header line into name and value."""\n' \
          '    name, _, value = line.partition(":")\n    return name.strip(), value.strip()\n'
    stripped, qs = evalsets.docstring_set([("pkg/http.py", src), ("tests/test_http.py", src)])
    assert list(stripped) == ["pkg/http.py"] and '"""' not in stripped["pkg/http.py"]
    assert len(qs) == 1 and qs[0].query == "Split an HTTP header line into name and value."
    t = qs[0].targets[0]
    lines = stripped["pkg/http.py"].split("\n")
    assert lines[t.start - 1].startswith("def parse_header") and t.end == len(lines) - 1


def _hit(path: str, a: int, b: int) -> dict[str, object]:
    return {"path": path, "start_line": a, "end_line": b}


def test_rank_metrics_credit_each_target_once() -> None:
    targets = [Target("a.py", 10, 20), Target("b.py", 1, 5)]
    hits = [_hit("c.py", 1, 9), _hit("a.py", 12, 14), _hit("a.py", 15, 19), _hit("b.py", 4, 8)]
    m = evalsets.rank_metrics(hits, targets)
    ideal = 1 + 1 / math.log2(3)
    assert m["ndcg10"] == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / ideal)
    assert m["mrr10"] == 0.5 and m["hit1"] == 0.0 and m["hit10"] == 1.0
    assert evalsets.rank_metrics([], targets) == {"ndcg10": 0.0, "mrr10": 0.0, "hit1": 0.0, "hit10": 0.0}


def test_bootstrap_interval_contains_the_mean_and_is_degenerate_for_constants() -> None:
    mean, lo, hi = evalsets.bootstrap_ci([0.0, 1.0] * 50)
    assert lo < mean == 0.5 < hi
    assert evalsets.bootstrap_ci([0.25] * 10) == (0.25, 0.25, 0.25)
    assert all(math.isnan(x) for x in evalsets.bootstrap_ci([]))


def _planted_keyword_set(n: int = 60) -> EvalSet:
    """Every query's target is first by keyword and last among ten by vector (a set where keyword wins)."""
    queries, lists = [], []
    for i in range(n):
        target = f"t{i}.py"
        others = [f"o{i}_{j}.py" for j in range(9)]
        hits = {f"{p}#0": _hit(p, 1, 10) for p in [target, *others]}
        kw = [(f"{target}#0", 9.0)] + [(f"{p}#0", 8.0 - j * 0.1) for j, p in enumerate(others)]
        vec = [(f"{p}#0", 0.9 - j * 0.001) for j, p in enumerate(others)] + [(f"{target}#0", 0.5)]
        queries.append(evalsets.EvalQuery("docstring", f"query {i} words here", [Target(target, 1, 10)]))
        lists.append(Lists(keyword=kw, vector=vec, hits=hits))
    return EvalSet("docstring", queries, lists)


def test_planted_keyword_set_makes_the_choice_follow_keyword() -> None:
    es = _planted_keyword_set()
    assert [q["hit1"] for q in per_query(es, "keyword")] == [1.0] * 60
    assert ranked(es.lists[0], "hybrid")[0]["path"] != "t0.py"  # the default 0.3/0.7 loses here
    choice = tuning.choose([es], QuerySettings())
    assert choice["applied"] and choice["fusion"] == "weighted"
    assert choice["keyword_weight"] > choice["vector_weight"]
    assert choice["ci95"][0] > 0 and choice["ndcg10"] == pytest.approx(1.0)


def test_no_choice_is_applied_when_the_gain_is_not_significant() -> None:
    es = _planted_keyword_set(1)  # one query: the interval of a gain cannot exclude 0 with any confidence
    es.lists[0].vector = list(es.lists[0].keyword)  # both lists agree: every candidate ties with the default
    choice = tuning.choose([es], QuerySettings())
    assert not choice["applied"] and choice["keyword_weight"] == 0.3
    assert "not applied" in tuning.describe(choice) or tuning.describe(choice).startswith("default")


class _Records:
    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], dict] = {}

    def put(self, kind: str, rec_id: str, doc: dict, wait: bool = True) -> None:
        self.docs[(kind, rec_id)] = doc

    def get(self, kind: str, rec_id: str) -> dict | None:
        return self.docs.get((kind, rec_id))

    def list_sources(self, **_terms: object) -> list:
        return []  # no sources: no pinned refs


class _Store:
    """A fake chunk store (pure ranking logic): keyword ranks the target first, vector last."""

    dimension = 4

    def index_dimension(self) -> int:  # the live index holds vectors of this dimension
        return self.dimension

    def __init__(self, es: EvalSet) -> None:
        self.ls = es.lists[0]

    def _raw(self, lst: list[tuple[str, float]]) -> list[tuple[str, float, dict]]:
        from scopekb import fields as F

        out = []
        for i, s in lst:
            h = self.ls.hits[i]
            out.append((i, s, {F.PATH: h["path"], F.START_LINE: 1, F.END_LINE: 10, F.CONTENT: "x",
                               F.CHUNK_INDEX: 0, F.AGENT_NAME: "a", F.CONTEXT_ID: "c"}))
        return out

    def keyword_search(self, query, flt, size, offset=0):  # noqa: ANN001, ANN201
        return self._raw(self.ls.keyword)[:size]

    def vector_search(self, vector, flt, k):  # noqa: ANN001, ANN201
        return self._raw(self.ls.vector)[:k]


def test_recorded_choice_changes_the_hybrid_ranking_of_that_context_only() -> None:
    from scopekb.models import SearchMode, SearchRequest, Source
    from scopekb.stores.base import ScopeFilter

    es = _planted_keyword_set()
    records = _Records()
    src = Source(agent_name="a", context_id="c", repo_url="https://example.org/r.git", webhooks=False, id="src_1")
    choice = tuning.choose([es], QuerySettings())
    tuning.record_choice(records, src, choice, "f" * 40)  # type: ignore[arg-type]
    req = SearchRequest(query="query 0 words here", mode=SearchMode.hybrid, max_results=3)
    store = _Store(es)
    tuned = run_search(store, req, ScopeFilter("a", ("c",)), QuerySettings(), embed=lambda q: [1.0, 0, 0, 0],
                       records=records)  # type: ignore[arg-type]
    other = run_search(store, req, ScopeFilter("a", ("d",)), QuerySettings(), embed=lambda q: [1.0, 0, 0, 0],
                       records=records)  # type: ignore[arg-type]
    assert tuned.hits[0].path == "t0.py"
    assert other.hits[0].path != "t0.py"
    assert tuning.describe(tuning.get_choice(records, "a", "c")).startswith("weighted")  # type: ignore[arg-type]
