"""Plain folders as git sources: a private bare repository snapshots the folder, so the same exact-incremental
sync (diff against the last indexed commit) indexes folders that are not git repositories.

``git add`` keeps a stat cache in the private index, so re-snapshotting an unchanged folder re-hashes nothing;
the folder's own ``.gitignore`` files are honoured and symlinks are recorded as symlinks (never followed).
"""

from __future__ import annotations

import hashlib
import os
import re
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


def has_branch(repo: Path, branch: str) -> bool:
    """True when ``refs/heads/<branch>`` of the repository at ``repo`` names a commit (False in a repository with
    no commits yet, whose checked-out branch is unborn)."""
    p = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"],
                       capture_output=True, text=True)
    return p.returncode == 0


def has_commits(repo: Path) -> bool:
    """True when the repository at ``repo`` holds at least one ref."""
    p = subprocess.run(["git", "-C", str(repo), "for-each-ref", "--count=1", "--format=x"], capture_output=True,
                       text=True)
    return p.returncode == 0 and bool(p.stdout.strip())


#: Characters a default context id or repository name made from a path never holds (controls, DEL, and the
#: Unicode line and paragraph separators): each becomes ``_`` in a context id, an escape in a name.
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


def context_for(name: str) -> str:
    """A context id for a folder called ``name``: control characters as ``_``, ends stripped, at most 200
    characters; ``root`` when nothing is left. Always valid for :func:`scopekb.models.check_scope_part`."""
    ctx = _UNSAFE_NAME.sub("_", name).strip()[:200].strip()
    return ctx or "root"


def display_name(path: str) -> str:
    """``path`` as a source's repository name: each control character as its ``\\xNN`` / ``\\uNNNN`` escape, the
    last 200 characters when longer (``…`` first). Always a valid ``repo_name``."""
    safe = _UNSAFE_NAME.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}",
                            path).strip()
    return ("…" + safe[-199:]).strip() if len(safe) > 200 else (safe or "root")


def snapshot_folder(folder: Path, data_dir: Path, branch: str = "main") -> tuple[Path, str]:
    """Commit the folder's current content to a private bare repository; return (repository path, commit).

    The commit is reused when nothing changed, so an unchanged folder syncs as a no-op. A ``data_dir`` inside the
    folder is left out (hostile review: a folder holding scopekb's data folder was indexed with it).

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
    data = Path(data_dir).resolve()
    inside = [f":(exclude,literal){data.relative_to(folder).as_posix()}"] if folder in data.parents else []
    git("add", "--all", "--ignore-errors", "--", ".", *inside, check=False)  # never scopekb's own data folder
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
