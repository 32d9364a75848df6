"""CLI usage errors are one line naming ``--help`` with click's exit code 2, like every other CLI error (new-user
review: click's four-line usage block, and pydantic's "Value error, " prefix for a refused ``--mode``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}
    env["PYTHONPATH"] = os.pathsep.join(str(ROOT / d) for d in ("shared", "services", "workers", "cli"))
    return subprocess.run([str(Path(sys.executable).parent / "scopekb"), "--data-dir", str(tmp / "data"), *args],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.mark.parametrize(("args", "said", "where"), [
    (["search", "--bogus"], "No such option: --bogus", "scopekb search --help"),
    (["search", "x", "--mode", "bogus"], "Invalid value for '--mode': 'bogus' is not one of", "scopekb search --help"),
    (["search"], "Missing argument 'query'", "scopekb search --help"),
    (["nosuch"], "No such command 'nosuch'", "scopekb --help"),
    (["source", "add"], "Missing option", "scopekb source add --help"),
])
def test_a_usage_error_is_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str, where: str) -> None:
    p = _cli(args, tmp_path)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: ") and said in p.stderr, p.stderr
    assert f"(see `{where}`)" in p.stderr and "Value error" not in p.stderr and "Usage:" not in p.stderr


def test_help_and_a_command_error_keep_their_answers(tmp_path: Path) -> None:
    p = _cli(["search", "--help"], tmp_path)
    assert p.returncode == 0 and "Usage:" in p.stdout, (p.stdout, p.stderr)
    p = _cli(["source", "remove", "nope"], tmp_path)
    assert p.returncode == 1 and p.stderr == "error: no source 'nope'\n", p.stderr
