"""``scopekb eval`` on a real repository (scopekb's own history) in both profiles (issue 21).

The sets are mined from the repository without labels: commit subjects → the definitions they changed, evaluated
on the parent commit's index, and docstrings → functions with docstrings removed. Keyword-only (no model) keeps
the test quick; the fusion modes are covered with planted lists in tests/unit/test_evalsets.py. What is checked:
the JSON report's shape and ranges, intervals around the means, that the evaluation leaves nothing in the index
or the records (its transient sources and chunks are removed), `--tune` recording a choice that status shows,
and one-line errors for an unknown source and a bad set name.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.test_cli_errors import assert_one_line_error, base_env, dist_env, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of this repository's history (a real, small Python project with descriptive commits)."""
    dest = tmp_path_factory.mktemp("realrepo") / "scopekb"
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", "-B", "main"], check=True)
    return dest


def _check(env: dict[str, str], tmp: Path, repo: Path, store: str) -> None:
    p = run(["source", "add", "--agent", "ev", "--context", "self", "--repo", str(repo), "--ref", "main",
             "--no-webhooks"], env, tmp)
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    p = run(["eval", sid, "--sample", "2", "--json", "--tune"], env, tmp, timeout=900)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["source"] == sid and rep["store"] == store and rep["model"] is None
    assert set(rep["sets"]) == {"history", "docstring"}
    for kind, s in rep["sets"].items():
        assert 1 <= s["queries"] <= 2, kind
        assert set(s["modes"]) == {"keyword"}  # keyword-only: no fusion modes
        for metric in ("ndcg10", "mrr10", "hit1", "hit10"):
            m = s["modes"]["keyword"][metric]
            assert 0.0 <= m["ci95"][0] <= m["mean"] <= m["ci95"][1] <= 1.0, (kind, metric, m)
    # keyword-only: nothing to choose, so nothing applied; recorded and shown all the same
    assert rep["choice"]["applied"] is False and rep["choice"]["context_id"] == "self"
    kb = rep["choice"]["keyword_boosts"]  # boosts are chosen by keyword alone: measured on the real store
    assert len(kb["boosts"]) == 4 and 0.0 <= kb["default_ndcg10"] <= kb["ndcg10"] <= 1.0
    st = run(["status", "--json"], env, tmp)
    rows = json.loads(st.stdout)
    assert [r["source"] for r in rows] == [sid]  # the transient evaluation sources are gone
    assert rows[0]["ranking"].startswith("default")
    assert rows[0]["chunks"] == 0  # the source itself was never indexed by the evaluation
    table = run(["eval", sid, "--sample", "1", "--set", "history"], env, tmp, timeout=900)
    assert table.returncode == 0, table.stderr
    assert "NDCG@10" in table.stdout and "history" in table.stdout and "docstring" not in table.stdout
    assert_one_line_error(run(["eval", "src_0000000000000000"], env, tmp), "not found")
    assert_one_line_error(run(["eval", sid, "--set", "nope"], env, tmp), "unknown set")


def test_eval_embedded(tmp_path: Path, real_repo: Path) -> None:
    env = base_env(tmp_path)
    env.update(SCOPEKB_DATA_DIR=str(tmp_path / "data"), SCOPEKB_GIT__ALLOW_LOCAL_PATHS="true")
    _check(env, tmp_path, real_repo, "sqlite")


def test_eval_distributed(tmp_path: Path, real_repo: Path, opensearch_client, opensearch_url: str,
                          redis_url: str) -> None:
    run_id = f"ev-{uuid.uuid4().hex[:8]}"
    env = dist_env(tmp_path, opensearch_url, redis_url, run_id)
    env["SCOPEKB_GIT__ALLOW_LOCAL_PATHS"] = "true"
    try:
        _check(env, tmp_path, real_repo, "opensearch")
        res = opensearch_client.search(index=f"{run_id}-chunks", body={"size": 0, "query": {"match_all": {}}})
        assert res["hits"]["total"]["value"] == 0  # every chunk of the evaluation was deleted
    finally:
        opensearch_client.indices.delete(index=f"{run_id}-*", ignore_unavailable=True)

