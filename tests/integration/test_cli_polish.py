"""CLI leftovers of the hostile review 2 (H7, H8) and the README newcomer run, on both profiles: what each command
says is what it did, in CLI terms, with no library warnings around it.

- ``scopekb reconcile`` (H7): embedded, no worker reads the CLI process's in-memory queue, so the verifying syncs
  run in that process and their outcome is printed; distributed, they are enqueued for the workers and the line
  says so.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_cli_errors import base_env, dist_env, run


@pytest.fixture(params=["embedded", "distributed"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "embedded":
        yield base_env(tmp_path)
        return
    run_id = f"clipol-{uuid.uuid4().hex[:8]}"
    e = dist_env(tmp_path, request.getfixturevalue("opensearch_url"), request.getfixturevalue("redis_url"), run_id)
    client, redis = request.getfixturevalue("opensearch_client"), request.getfixturevalue("redis_client")
    yield {**e, "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true"}
    client.indices.delete(index=f"{run_id}-*", ignore_unavailable=True)
    redis.delete(f"{run_id}-queue")


def git_repo(where: Path, files: dict[str, str], commits: int = 1) -> Path:
    """A git repository at ``where`` with ``files``, in ``commits`` commits (later ones append a line)."""
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(where)], check=True)
    for n in range(commits):
        for name, text in files.items():
            (where / name).write_text(text + "\n# edit\n" * n)
        subprocess.run(["git", "-C", str(where), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(where), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "--quiet",
                        "-m", f"change the retry helper {n}"], check=True)
    return where


def is_distributed(env: dict[str, str]) -> bool:
    return env.get("SCOPEKB_PROFILE") == "distributed"


def test_reconcile_says_what_it_did(env: dict[str, str], tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo", {"a.py": "def retry_helper():\n    return 1\n"})
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    p = run(["reconcile"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == "", p.stderr  # no kombu/OpenSearch client warnings around the line
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout
    if is_distributed(env):
        assert lines[0].startswith("verifying syncs enqueued for the workers: 1;"), lines
    else:
        assert lines[0].startswith("verifying syncs run in this process: 1 (1 done);"), lines
        # the sync left its job record where `scopekb up`'s /v1/jobs reads it
        from scopekb.runtime import build_embedded_runtime
        from scopekb.settings import Settings

        rt = build_embedded_runtime(Settings(data_dir=Path(env["SCOPEKB_HOME"]), embedding={"provider": "none"},
                                             profile="embedded"))
        jobs = [j for j in rt.records.list_jobs() if j.trigger == "reconcile"]
        assert [j.state for j in jobs] == ["done"], jobs
