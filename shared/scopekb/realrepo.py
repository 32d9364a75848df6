"""Build git repositories from released sources of real projects (PyPI sdists), one commit per release.

Used by the demo, the end-to-end tests and the benchmarks so that scopekb is exercised on code nobody here
wrote. Sdists are fetched with ``pip download --no-binary :all: --no-deps`` into a cache folder once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

_GIT_ENV = {"GIT_AUTHOR_NAME": "scopekb", "GIT_AUTHOR_EMAIL": "scopekb@localhost",
            "GIT_COMMITTER_NAME": "scopekb", "GIT_COMMITTER_EMAIL": "scopekb@localhost",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}


class RealRepoError(RuntimeError):
    """An sdist could not be downloaded or unpacked."""


def fetch_sdist(package: str, version: str, cache_dir: Path) -> Path:
    """Path of the sdist archive of ``package==version`` in ``cache_dir``, downloading it on first use.

    Raises:
        RealRepoError: pip could not download it (the message includes pip's last line).
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    norm = package.lower().replace("-", "_")
    for p in cache_dir.iterdir():
        stem = p.name.lower().replace("-", "_")
        if stem.startswith(f"{norm}_{version}.") and p.suffix in (".gz", ".zip"):
            return p
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                           "--dest", str(cache_dir), f"{package}=={version}"], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RealRepoError(f"pip download {package}=={version} failed: {lines[-1] if lines else proc.returncode}")
    return fetch_sdist(package, version, cache_dir)


def _unpack(archive: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".unpack")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
    else:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
    tops = list(tmp.iterdir())
    root = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
    for p in root.iterdir():
        shutil.move(str(p), dest / p.name)
    shutil.rmtree(tmp, ignore_errors=True)


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with a fixed identity; returns stdout stripped. Raises CalledProcessError."""
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def build_release_repo(dest: Path, package: str, versions: list[str], cache_dir: Path,
                       branch: str = "main") -> list[str]:
    """Create a git repository at ``dest`` with one commit per release of ``package`` (in the given order).

    Each commit's tree is exactly that release's sdist contents. Returns the commit ids, oldest first. The
    branch points at the last commit.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    git(dest, "init", "--quiet", "--initial-branch", branch)
    commits = []
    for v in versions:
        for p in dest.iterdir():
            if p.name != ".git":
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        _unpack(fetch_sdist(package, v, cache_dir), dest)
        git(dest, "add", "--all", "--force")
        git(dest, "commit", "--quiet", "--allow-empty", "-m", f"{package} {v}")
        commits.append(git(dest, "rev-parse", "HEAD"))
    return commits
