"""``scopekb search`` text output for people and agents reading a terminal (issue 22), on both profiles: each hit's
header names where it comes from (context, repository, ref, commit) and its blob, so the same lines indexed from
two sources are told apart, and ``exact``/``regex``/``symbol`` hits list every matching line with its number and
text instead of the chunk's first lines. Indexed text stays data: control characters are shown escaped."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_cli_errors import base_env, dist_env, run

#: The same file in two folders (two sources, two contexts): identical lines, identical blob.
LIB = ("import os\nneedle_alpha = 1\nunrelated = 0\nneedle_alpha += 2  # again\n# \x1b[31mneedle_alpha\x1b[0m red\n"
       + "filler = 0\n" * 5 + "def needle_alpha_fn():\n    return 3\n")


@pytest.fixture(params=["embedded", "distributed"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The CLI's environment on each profile (distributed: indices, system prefix and queue of the run's own,
    removed afterwards). Also used by test_cli_polish.py."""
    if request.param == "embedded":
        yield base_env(tmp_path)
        return
    run_id = f"clitext-{uuid.uuid4().hex[:8]}"
    e = dist_env(tmp_path, request.getfixturevalue("opensearch_url"), request.getfixturevalue("redis_url"), run_id)
    client, redis = request.getfixturevalue("opensearch_client"), request.getfixturevalue("redis_client")
    yield {**e, "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true"}
    client.indices.delete(index=f"{run_id}-*", ignore_unavailable=True)
    redis.delete(f"{run_id}-queue")


def test_exact_search_shows_origin_blob_and_numbered_matching_lines(env: dict[str, str], tmp_path: Path) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lib.py").write_text(LIB)
        p = run(["index", str(tmp_path / name)], env, tmp_path)
        assert p.returncode == 0, p.stderr
    p = run(["search", "needle_alpha", "--mode", "exact", "--max-results", "10"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "\x1b" not in out, out
    heads = [ln for ln in out.splitlines() if ln.startswith("[")]
    assert len(heads) == 4, out  # two chunks of lib.py (the function is its own) in each context
    contexts = sorted(re.search(r"context '([^']+)'", h).group(1) for h in heads)  # type: ignore[union-attr]
    assert contexts == ["one", "one", "two", "two"], heads
    blobs = {re.search(r"blob ([0-9a-f]{40})\b", h).group(1) for h in heads}  # type: ignore[union-attr]
    assert len(blobs) == 1, heads  # the same bytes: the same blob, told apart by the context
    assert all(re.search(r"ref '[^']+', commit [0-9a-f]{12}\b", h) for h in heads), heads
    body = [ln.strip() for ln in out.splitlines() if not ln.startswith("[")]
    for want in ("2: needle_alpha = 1", "4: needle_alpha += 2  # again", "5: # \\x1b[31mneedle_alpha\\x1b[0m red",
                 "11: def needle_alpha_fn():"):
        assert body.count(want) == 2, (want, out)
    assert not any(ln.endswith(("import os", "unrelated = 0", "filler = 0")) for ln in body), out

    p = run(["search", "needle_alpha_fn", "--mode", "symbol", "--context", "one"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    heads = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    assert len(heads) == 1 and "context 'one'" in heads[0], p.stdout
    assert "11: def needle_alpha_fn():" in p.stdout and "return 3" not in p.stdout, p.stdout
