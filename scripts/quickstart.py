"""Quick start, main job, embedded: index a real repository and search it in one process, no servers.

Builds a git repository from the click 8.1.0 sdist (PyPI), then runs ``scopekb index`` and a few
``scopekb search`` commands with the embedded profile (SQLite, local model when installed). Everything lives
under ``.scopekb-quickstart/``; running it again re-indexes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scopekb.realrepo import build_release_repo

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".scopekb-quickstart"
QUERIES = ["parse command line options into a dict", "resultcallback", "shell completion for bash"]


def main() -> None:
    repo = HOME / "click"
    if not (repo / ".git").exists():
        print("==> building a git repository from the click 8.1.0 sdist", flush=True)
        build_release_repo(repo, "click", ["8.1.0"], ROOT / ".services" / "cache" / "sdists")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}  # no services: embedded
    env.update({"SCOPEKB_HOME": str(HOME / "data"), "HF_HUB_OFFLINE": "1", "SCOPEKB_LOG_LEVEL": "WARNING"})
    cli = [sys.executable, "-m", "scopekb_cli.main"]
    print(f"==> scopekb index {repo}", flush=True)
    subprocess.run([*cli, "index", str(repo)], env=env, check=True)
    for q in QUERIES:
        # its own context only: the README invites indexing more into the same data folder
        print(f"\n==> scopekb search {q!r} --context click", flush=True)
        subprocess.run([*cli, "search", q, "--context", "click", "--max-results", "3"], env=env, check=True)


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as e:
        sys.exit(f"error: {' '.join(map(str, e.cmd[2:]))} exited with {e.returncode}")
