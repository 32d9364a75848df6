"""``scopekb`` output a newcomer following README.md found rough (review of 2026-12-01), on both profiles:

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

