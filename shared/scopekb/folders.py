"""Plain folders as git sources: a private bare repository snapshots the folder, so the same exact-incremental
sync (diff against the last indexed commit) indexes folders that are not git repositories.

``git add`` keeps a stat cache in the private index, so re-snapshotting an unchanged folder re-hashes nothing;
the folder's own ``.gitignore`` files are honoured and symlinks are recorded as symlinks (never followed).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

_ENV = {"GIT_AUTHOR_NAME": "scopekb", "GIT_AUTHOR_EMAIL": "scopekb@localhost", "GIT_COMMITTER_NAME": "scopekb",
        "GIT_COMMITTER_EMAIL": "scopekb@localhost", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}


class FolderError(RuntimeError):
    """The folder cannot be read or snapshotted; the message is one line."""


def is_git_repo(path: Path) -> bool:
    """True when ``path`` is the top of a git work tree or a bare repository."""
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def current_branch(repo: Path) -> str | None:
    """The checked-out branch of a work tree, or None (detached HEAD)."""
    p = subprocess.run(["git", "-C", str(repo), "symbolic-ref", "--quiet", "--short", "HEAD"],
                       capture_output=True, text=True)
    return p.stdout.strip() or None if p.returncode == 0 else None


def snapshot_folder(folder: Path, data_dir: Path, branch: str = "main") -> tuple[Path, str]:
    """Commit the folder's current content to a private bare repository; return (repository path, commit).

    The commit is reused when nothing changed, so an unchanged folder syncs as a no-op.

    Raises:
        FolderError: the folder does not exist or git fails.
    """
    folder = folder.resolve()
    if not folder.is_dir():
        raise FolderError(f"{folder} is not a folder")
    gd = Path(data_dir) / "folders" / (hashlib.sha256(str(folder).encode()).hexdigest()[:16] + ".git")
    env = {**os.environ, **_ENV, "GIT_DIR": str(gd), "GIT_WORK_TREE": str(folder)}

    def git(*args: str, check: bool = True) -> str:
        p = subprocess.run(["git", *args], capture_output=True, text=True, env=env)
        if check and p.returncode != 0:
            raise FolderError(f"git {args[0]} failed for {folder}: {(p.stderr or p.stdout).strip()[-300:]}")
        return p.stdout.strip()

    if not (gd / "HEAD").exists():
        gd.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch", branch, str(gd)], check=True,
                       capture_output=True, env={**os.environ, **_ENV})
        (gd / "description").write_text(f"scopekb snapshot of {folder}\n")
    git("add", "--all", "--ignore-errors", ".", check=False)
    tree = git("write-tree")
    parent = git("rev-parse", "--quiet", "--verify", f"refs/heads/{branch}", check=False)
    if parent and git("rev-parse", f"{parent}^{{tree}}") == tree:
        return gd, parent
    args = ["commit-tree", tree, "-m", f"snapshot of {folder}"]
    if parent:
        args[2:2] = ["-p", parent]
    commit = git(*args)
    git("update-ref", f"refs/heads/{branch}", commit)
    return gd, commit
