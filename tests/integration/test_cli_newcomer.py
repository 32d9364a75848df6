"""``scopekb`` output a newcomer following README.md found rough (review of 2026-12-01), on both profiles:

- ``status`` and ``eval`` fit 80 columns (``--wide`` and ``--json`` for the rest); ``eval`` warns in one line when a
  set has fewer queries than it needs for narrow intervals, with their width.
- ``search`` says in one line above the hits which mode answered (with its fusion) and which index (the embedded
  SQLite file, or the OpenSearch alias and the index behind it); scores that print alike are given more decimals,
  equal ones are marked ``(tie)``; ``--json`` keeps its fields.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import test_cli_search_text
from .test_cli_errors import run
from .test_cli_polish import git_repo, is_distributed

env = test_cli_search_text.env  # the fixture: the CLI's environment on each profile


def test_search_header_names_mode_and_index_and_ties_are_marked(env: dict[str, str], tmp_path: Path) -> None:
    same = "def retry_helper():\n    return 1\n"
    repo = git_repo(tmp_path / "proj", {"a.py": same, "b.py": same, "c.py": "def other():\n    retry_helper()\n"})
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    p = run(["search", "retry_helper", "--mode", "keyword"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    head = p.stdout.splitlines()[0]
    if is_distributed(env):
        alias = env["SCOPEKB_OPENSEARCH__ALIAS"]
        assert head.startswith(f"keyword search, OpenSearch alias {alias} -> {alias}-v"), head
    else:
        assert head.startswith(f"keyword search, embedded index {env['SCOPEKB_HOME']}/index.sqlite3: "), head
    hits = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    assert head.endswith(f": {len(hits)} hits") and len(hits) == 3, p.stdout
    # a.py and b.py are the same text: the same score, shown as a tie; c.py scores lower and reads differently
    scores = {h.split()[1].split(":")[0]: h.split("score ")[1].split("  ")[0] for h in hits}
    assert scores["a.py"] == scores["b.py"] and scores["a.py"].endswith(" (tie)"), scores
    assert scores["c.py"] != scores["a.py"] and "tie" not in scores["c.py"], scores

    p = run(["search", "retry_helper", "--mode", "keyword", "--json"], env, tmp_path)
    d = json.loads(p.stdout)
    assert set(d) == {"query", "mode", "hits", "took_ms", "notice", "group_by", "scope"}, d
    assert d["mode"] == "keyword" and len(d["hits"]) == 3 and isinstance(d["hits"][0]["score"], float), d


def _fits(text: str, width: int = 80) -> None:
    assert all(len(ln.rstrip()) <= width for ln in text.splitlines()), "\n" + text


def test_status_fits_80_columns_and_wide_and_json_keep_the_rest(env: dict[str, str], tmp_path: Path) -> None:
    """``status`` at 80 columns: one row per source (whole id, scope, status, chunks, first ref and commit), no
    folded cell; ``--wide`` adds repository, refs with lag, documents and ranking; ``--json`` has every field."""
    repo = git_repo(tmp_path / "narrow-ctx", {"a.py": "def retry_helper():\n    return 1\n"})
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    rows = json.loads(run(["status", "--json"], env, tmp_path).stdout)
    row = next(r for r in rows if r["scope"] == "local/narrow-ctx")
    assert {"repo", "documents", "ranking", "refs", "indexed_commit"} <= set(row), row
    p = run(["status"], {**env, "COLUMNS": "80"}, tmp_path)
    assert p.returncode == 0, p.stderr
    _fits(p.stdout.split("\n", 1)[1])  # the store line is prose: the terminal wraps it
    line = next(ln for ln in p.stdout.splitlines() if row["source"] in ln)
    assert line.split() == [row["source"], "local/narrow-ctx", "READY", str(row["chunks"]), "main",
                            row["indexed_commit"][:12]], line
    assert "--wide" in p.stdout and "ranking" not in p.stdout.split("--wide")[0], p.stdout
    p = run(["status", "--wide"], {**env, "COLUMNS": "250"}, tmp_path)
    assert "ranking" in p.stdout and str(repo) in p.stdout and row["ranking"] in p.stdout, p.stdout


def test_eval_fits_80_columns_and_warns_on_a_small_sample(env: dict[str, str], tmp_path: Path) -> None:
    """``eval`` at 80 columns prints each metric as mean ± half its 95% interval; a set below the stated
    minimum of queries gets one warning line (stderr) with its interval width; ``--json`` is unchanged."""
    from scopekb_cli.main import MIN_EVAL_QUERIES

    body = "".join(f'def helper_{n}(x):\n    """Return the value plus {n} for the retry counter."""\n'
                   f'    y = x + {n}\n    return y\n\n\n' for n in range(6))
    repo = git_repo(tmp_path / "ev", {"a.py": body}, commits=3)
    p = run(["source", "add", "--agent", "ev", "--context", "ev", "--repo", str(repo), "--no-webhooks"], env,
            tmp_path)
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    p = run(["eval", sid, "--sample", "3", "--set", "docstring"], {**env, "COLUMNS": "80"}, tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr
    _fits(p.stdout)
    row = next(ln for ln in p.stdout.splitlines() if ln.lstrip().startswith("docstring"))
    assert row.split()[:3] == ["docstring", "3", "keyword"] and row.count("±") == 4, row
    warn = [ln for ln in p.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and f"fewer than {MIN_EVAL_QUERIES} queries" in warn[0], p.stderr
    assert "docstring 3 (95% intervals " in warn[0] and "wide on average" in warn[0], warn
    p = run(["eval", sid, "--sample", "3", "--set", "docstring", "--json"], env, tmp_path, timeout=600)
    rep = json.loads(p.stdout)
    assert rep["sets"]["docstring"]["queries"] == 3 and "ci95" in rep["sets"]["docstring"]["modes"]["keyword"]["hit1"]
    assert "warning: fewer than" in p.stderr, p.stderr  # JSON on stdout stays parseable
    p = run(["eval", sid, "--sample", "3", "--set", "docstring", "--wide"], {**env, "COLUMNS": "250"}, tmp_path,
            timeout=600)
    assert p.returncode == 0 and "–" in p.stdout and "±" not in p.stdout, p.stdout
