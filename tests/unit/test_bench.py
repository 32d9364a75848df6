"""The benchmark's own claims (issue 18): the documented figures are the committed run's, ``--check`` fails on
broken deterministic outcomes, and the "re-embedded ÷ changed" denominator comes from an independent reference
path that can disagree with the pipeline."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from scopekb_bench import docs, main, reference  # noqa: E402 - bench/ is not an installed package
from scopekb_bench.util import Results  # noqa: E402

from scopekb.chunking import chunk_document  # noqa: E402
from scopekb.settings import ChunkingSettings  # noqa: E402

RESULTS = REPO / "bench" / "report" / "results.json"
DOC = REPO / "docs" / "benchmarks.md"


def test_benchmarks_doc_tables_are_generated_from_the_committed_results() -> None:
    data = json.loads(RESULTS.read_text())
    doc = DOC.read_text()
    assert set(docs.blocks(doc)) == set(docs.SECTIONS)
    assert docs.render(doc, data) == doc, "docs/benchmarks.md is stale: run bench/run --docs and commit it"


def test_every_run_the_doc_and_report_quote_is_the_committed_one() -> None:
    meta = json.loads(RESULTS.read_text())["meta"]
    run_id = meta["run_id"]
    sets_run = {meta["sets_run"]["run_id"]} if meta.get("sets_run") else set()  # a merged `--phases sets` run
    for path, allowed in ((DOC, {run_id} | sets_run), (REPO / "bench" / "report" / "report.md", {run_id})):
        quoted = set(re.findall(r"[Rr]un `([0-9a-f]{10,})`", path.read_text()))
        assert run_id in quoted and quoted <= allowed, (path.name, quoted, allowed)


def test_committed_run_is_a_full_run_that_passes_its_checks() -> None:
    data = json.loads(RESULTS.read_text())
    assert data["meta"]["profile"] == "full" and not data["errors"], data["errors"]
    res = Results()
    for m in data["metrics"]:
        res.add(**{k: v for k, v in m.items() if k != "ratio"})
    assert main.check(res, since_committed=False) == []


def _results(**overrides: tuple[float, float]) -> Results:
    """Every expected metric with a passing value, then ``overrides`` (``id -> (value, baseline)``)."""
    res = Results()
    for mid in main.EXPECTED:
        value, baseline = overrides.get(mid, (1.0, 1.0))
        res.add("x", mid, mid, value, baseline, "u", "b")
    for mid in ("incremental.keyword.unchanged_resync_writes", "incremental.local_model.unchanged_resync_writes"):
        value, baseline = overrides.get(mid, (0.0, 100.0))
        res.add("x", mid, mid, value, baseline, "u", "b")
    return res


def test_check_passes_when_outcomes_hold() -> None:
    assert main.check(_results()) == []


@pytest.mark.parametrize(("mid", "value", "baseline"), [
    ("incremental.local_model.one_file_reembedded_per_changed", 3, 1),   # re-embedded more than changed
    ("incremental.local_model.release_reembedded_per_changed", 30, 37),  # missed changes
    ("quality.hybrid.ndcg10", 0.40, 0.45),                               # hybrid below keyword
    ("quality.ann_recall_at_10", 0.90, 1.0),                             # ANN far from exact
    ("incremental.keyword.unchanged_resync_writes", 181, 99070),         # a no-op push wrote chunks
    ("incremental.local_model.unchanged_resync_writes", 1, 1594),
    ("quality.mcp_answer_tokens.p50", 2150, 2000),                       # MCP answers over the goal
])
def test_check_fails_on_a_broken_deterministic_outcome(mid: str, value: float, baseline: float) -> None:
    problems = main.check(_results(**{mid: (value, baseline)}))
    assert len(problems) == 1 and mid in problems[0] and "outcome broken" in problems[0], problems


def test_check_takes_a_quality_set_scoring_zero_on_keyword_but_no_other_zero_baseline() -> None:
    """A clean-clone CI run failed --check on "non-finite metric sets.history.keyword.ndcg10: 0.0 / 0.0": keyword
    found none of the quick profile's 3 history queries, so the ratio to keyword was 0 / 0. The figures are
    finite; any other metric with a zero baseline still fails."""
    res = _results()
    hist = next((m for m in main.EXPECTED if m.startswith("sets.")), "sets.history.keyword.ndcg10")
    res.add("quality sets", hist, hist, 0.0, 0.0, "score", "keyword on the same queries")
    assert main.check(res) == []
    other = next(m for m in main.EXPECTED if m.startswith("ingest."))
    res.add("ingest", other, other, 5.0, 0.0, "u", "b")
    problems = main.check(res)
    assert len(problems) == 1 and other in problems[0] and "non-finite" in problems[0], problems


def test_check_never_looks_at_speed() -> None:
    slow = {m: (1.0, 1e9) for m in main.EXPECTED if m.startswith(("ingest.", "query.", "webhook.", "git."))}
    assert main.check(_results(**slow)) == []


# ---- the independent denominator --------------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str | None], msg: str) -> str:
    for path, text in files.items():
        p = repo / path
        if text is None:
            p.unlink()
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", msg)
    return _git(repo, "rev-parse", "HEAD")


CODE = "\n\n".join(f"def f{i}(x):\n    y = x * {i}\n    return y + {i}\n" for i in range(60))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q", "-b", "main")
    return tmp_path


def test_reference_counts_new_embedding_inputs_of_a_rename(repo: Path) -> None:
    """A renamed file has no new chunk *contents* (the old denominator said 0, so any re-embedding looked like
    an excess), but every embedding input changes, because the header names the path."""
    from scopekb_bench.pipeline import changed_chunks

    old = _commit(repo, {"pkg/a.py": CODE, "README.md": "# r\n\ntext\n"}, "one")
    new = _commit(repo, {"pkg/a.py": None, "pkg/b.py": CODE}, "rename")
    n = len(chunk_document("pkg/b.py", CODE, "python", ChunkingSettings()))
    ref = reference.new_embedding_inputs(repo, old, new, None)
    assert n > 1 and ref["new_inputs"] == n, (ref, n)
    assert changed_chunks(repo, old, new, None)["contents"] == 0  # the old, content-based denominator


def test_reference_is_zero_for_the_same_tree_and_counts_one_edited_function(repo: Path) -> None:
    old = _commit(repo, {"a.py": CODE, "blob.bin": "\x00\x01", "empty.py": ""}, "one")
    assert reference.new_embedding_inputs(repo, old, old, None)["new_inputs"] == 0
    new = _commit(repo, {"a.py": CODE.replace("return y + 7\n", "return y + 7 + 1\n")}, "edit")
    ref = reference.new_embedding_inputs(repo, old, new, None)
    assert 1 <= ref["new_inputs"] <= 2, ref  # the edited function's chunk (and its neighbour if they share one)
    assert ref["inputs_new"] == ref["inputs_old"]


def test_a_sets_run_replaces_only_the_sets_part_of_the_committed_run(tmp_path: Path) -> None:
    from scopekb_bench import report

    committed = {"meta": {"run_id": "full1", "profile": "full"},
                 "metrics": [{"id": "query.keyword.p50", "value": 1},
                             {"id": "sets.history.keyword.ndcg10", "value": 0.1}],
                 "series": {"quality": {"n": 1}, "quality_sets": {"history": {}}}}
    (tmp_path / "results.json").write_text(json.dumps(committed))
    run = {"meta": {"run_id": "sets2", "profile": "full"},
           "metrics": [{"id": "sets.history.keyword.ndcg10", "value": 0.4}, {"id": "query.keyword.p50", "value": 9}],
           "series": {"quality_sets": {"history": {"queries": 5}}}}
    report.publish_sets(tmp_path, run)
    out = json.loads((tmp_path / "results.json").read_text())
    assert out["meta"]["run_id"] == "full1" and out["meta"]["sets_run"]["run_id"] == "sets2"
    assert {m["id"]: m["value"] for m in out["metrics"]} == {"query.keyword.p50": 1, "sets.history.keyword.ndcg10": 0.4}
    assert out["series"] == {"quality": {"n": 1}, "quality_sets": {"history": {"queries": 5}}}


def test_bare_webhook_baseline_is_served_with_the_ingesters_server_settings() -> None:
    from scopekb_bench.webhook import bare_server_args

    from scopekb.http.server import uvicorn_options
    from scopekb.settings import HttpSettings

    http = HttpSettings(limit_concurrency=7, keep_alive_timeout_s=3, max_header_bytes=8192, backlog=99)
    opts = uvicorn_options(http)
    args = bare_server_args(http)
    given = dict(zip(args[::2], args[1::2], strict=True))
    # h11, never whatever uvicorn's "auto" finds installed (httptools), since the ingester's protocol is h11's
    assert given == {"--http": "h11", "--timeout-keep-alive": str(opts["timeout_keep_alive"]),
                     "--limit-concurrency": "7", "--backlog": "99", "--h11-max-incomplete-event-size": "8192"}


def test_job_poll_interval_grows_with_the_wait_and_is_capped() -> None:
    """Issue 20: the bench polls a job at 0.1 s at first, then at 1/20 of the time waited up to 0.5 s (polling every
    0.1 s through a long full index loaded OpenSearch on the pipeline's side of the ingest ratio only)."""
    from scopekb_bench.stack import poll_interval

    assert poll_interval(0.0) == 0.1
    assert poll_interval(1.0) == 0.1
    assert poll_interval(4.0) == 0.2
    assert poll_interval(60.0) == 0.5
    for waited in (0.5, 3.0, 7.0, 30.0, 600.0):
        assert poll_interval(waited) <= max(0.1, waited / 20) + 1e-12


def test_publish_replaces_the_run_and_keeps_the_reports_of_single_issues(tmp_path: Path) -> None:
    """``bench/run --publish`` replaced bench/report/ whole, deleting the committed issue reports beside it."""
    from scopekb_bench.report import publish

    out, dest = tmp_path / "out", tmp_path / "report"
    out.mkdir()
    (dest / "issue20").mkdir(parents=True)
    (dest / "issue20" / "report-x.md").write_text("kept")
    (dest / "issue19-x.json").write_text("{}")
    (dest / "gone.png").write_bytes(b"old plot")
    (dest / "report.md").write_text("old")
    (out / "report.md").write_text("new")
    (out / "ratios.png").write_bytes(b"plot")
    publish(out, dest, {"metrics": [], "series": {}, "meta": {}})
    assert (dest / "report.md").read_text() == "new" and (dest / "ratios.png").exists()
    assert (dest / "issue20" / "report-x.md").read_text() == "kept" and (dest / "issue19-x.json").exists()
    assert not (dest / "gone.png").exists()
    assert json.loads((dest / "results.json").read_text())["metrics"] == []
