"""Git access for syncs: a bare mirror cache per repository, tree listing, diffs and fast blob reads.

Blobs are read from git's object database through one long-lived ``git cat-file --batch`` process per
repository object (GitPython's persistent command), never one process per file and never from a working tree,
so symlinks are never followed. Fetches never touch submodules and only allow the transports the settings
permit (``https``/``ssh``; ``file`` only when local paths are allowed): ``ext::`` is never run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

from scopekb.errors import Transient
from scopekb.logging import get_logger

log = get_logger(__name__)

MODE_GITLINK = "160000"
MODE_SYMLINK = "120000"
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


class GitError(Transient):
    """A git operation failed; the message is one line naming the repository and the cause (transient: the host
    or network may answer later; the worker retries)."""


class CommitNotFound(GitError):
    """The commit is not in the mirror (never pushed, or gone after a force push and gc)."""


#: Longest cause :func:`git_cause` gives (characters).
GIT_CAUSE_LIMIT = 400
_GIT_STDERR = re.compile(r"^\s*stderr: '(.*)'\s*$", re.S)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]+")


def git_cause(e: git.GitCommandError) -> str:
    """The cause of a failed git command in one line of at most :data:`GIT_CAUSE_LIMIT` characters: its stderr
    without GitPython's ``stderr: '...'`` wrapper, the lines up to and including the first ``fatal:`` or
    ``error:`` line joined with "; " (so "ssh: connect to host ... Connection refused; fatal: Could not read from
    remote repository." rather than git's closing advice "and the repository exists."), control characters
    dropped (the text comes from a remote host). Without stderr, GitPython's own message (exit code, a timeout)."""
    raw = e.stderr if isinstance(e.stderr, str) else ""
    m = _GIT_STDERR.match(raw)
    lines = [ln.strip() for ln in (m.group(1) if m else raw).replace("\r", "\n").splitlines() if ln.strip()]
    first = next((i for i, ln in enumerate(lines) if ln.startswith(("fatal:", "error:"))), None)
    if first is not None:
        lines = lines[:first + 1]
    elif lines:
        lines = lines[-1:]
    text = "; ".join(lines) or " ".join(str(e).split())
    text = _CONTROL.sub(" ", text)
    return text if len(text) <= GIT_CAUSE_LIMIT else text[:GIT_CAUSE_LIMIT - 1] + "…"


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One file of a commit's tree: ``mode`` (e.g. 100644), object id, size in bytes (None for gitlinks)."""

    path: str
    mode: str
    sha: str
    size: int | None


@dataclass(frozen=True, slots=True)
class Change:
    """One changed path between two commits. ``status`` is A, M, D, T or R (rename: ``old_path`` set)."""

    status: str
    path: str
    old_path: str | None = None


#: Skip reason of a path whose escaped form (:func:`escape_path`) equals another path of the same tree.
SKIP_PATH_COLLISION = "path_collision"


def _is_escaped_byte(ch: str) -> bool:
    return "\udc80" <= ch <= "\udcff"


def escape_path(raw: str) -> str:
    """The indexable form of a path as git output decodes it (UTF-8 with ``surrogateescape``, GitPython's way).

    A valid UTF-8 path is returned unchanged. A path with bytes that are not UTF-8 (e.g. ``caf\\xe9.txt`` from a
    Latin-1 file system) becomes valid text by percent-encoding those bytes and, in such a path only, the ``%``
    itself (RFC 3986 style): ``caf%E9.txt``, ``100%E9%.txt`` → ``100%25%E9%25.txt``. The form is lossless
    (:func:`unescape_path` gives back the bytes), is what chunks are stored, found and deleted under, and has no
    character that globs or OpenSearch wildcards treat specially.
    """
    if raw.isascii() or not any(_is_escaped_byte(c) for c in raw):
        return raw
    return "".join(f"%{ord(c) - 0xDC00:02X}" if _is_escaped_byte(c) else "%25" if c == "%" else c for c in raw)


def unescape_path(escaped: str) -> bytes:
    """The original bytes of a path escaped by :func:`escape_path` because it was not UTF-8 (``%XX`` → byte)."""
    out = bytearray()
    i = 0
    while i < len(escaped):
        hexpair = escaped[i + 1:i + 3]
        if escaped[i] == "%" and len(hexpair) == 2 and all(c in "0123456789ABCDEF" for c in hexpair):
            out.append(int(escaped[i + 1:i + 3], 16))
            i += 3
        else:
            out += escaped[i].encode("utf-8")
            i += 1
    return bytes(out)


def is_sha(value: str | None) -> bool:
    """True for a full 40-hex commit id."""
    return bool(value) and bool(_SHA_RE.match(value or ""))


def mirror_path(cache_dir: Path, repo_url: str) -> Path:
    """Where the bare mirror of ``repo_url`` lives: ``<cache_dir>/<sha256(url)[:16]>.git``."""
    return Path(cache_dir) / (hashlib.sha256(repo_url.encode()).hexdigest()[:16] + ".git")


def _git_env(allow_local: bool) -> dict[str, str]:
    return {
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "https:ssh:file" if allow_local else "https:ssh",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_LFS_SKIP_SMUDGE": "1",
    }


class Mirror:
    """A bare mirror of one repository in the local cache.

    Args:
        cache_dir: folder holding mirrors (created when missing).
        repo_url: clone URL or local path, already validated by source registration.
        allow_local: allow the ``file`` transport (embedded mode and tests only).
    """

    def __init__(self, cache_dir: Path, repo_url: str, allow_local: bool = False,
                 timeout_s: float = 600.0) -> None:
        self.repo_url = repo_url
        self.path = mirror_path(cache_dir, repo_url)
        self.allow_local = allow_local
        self.timeout_s = timeout_s
        self._repo: git.Repo | None = None
        #: Paths of the last :meth:`tree` left out, with the reason (an escaped name equal to another path).
        self.dropped: dict[str, str] = {}

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive file lock on this mirror (one fetch at a time per host)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.path) + ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def fetch(self) -> None:
        """Clone (first time) or fetch all branches and tags into the mirror, pruning deleted refs.

        Raises:
            GitError: the repository cannot be reached or read.
        """
        if not self.allow_local and self.repo_url.startswith(("/", "file://")):
            # one line naming the setting, as registering such a source says (git only said "transport 'file' not
            # allowed": README newcomer run, `scopekb index SOURCE_ID` of a local-path source in the CLI)
            raise GitError(f"{self.repo_url} is a local path: reading it needs SCOPEKB_GIT__ALLOW_LOCAL_PATHS=true "
                           "(git.allow_local_paths) in this process, as in the ingester and the workers")
        env = _git_env(self.allow_local)
        cfg = ["-c", "protocol.ext.allow=never", "-c", "submodule.recurse=false",
               "-c", "core.symlinks=false", "-c", "fetch.recurseSubmodules=false"]
        if not self.allow_local:
            cfg += ["-c", "protocol.file.allow=never"]
        with self.locked():
            try:
                g = git.Git()
                if not (self.path / "HEAD").exists():
                    g.execute(["git", *cfg, "clone", "--mirror", "--quiet", "--", self.repo_url, str(self.path)],
                              env=env, kill_after_timeout=self.timeout_s)
                else:
                    g.execute(["git", *cfg, "--git-dir", str(self.path), "fetch", "--quiet", "--prune", "--force",
                               "origin", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"],
                              env=env, kill_after_timeout=self.timeout_s)
            except git.GitCommandError as e:
                raise GitError(f"git fetch of {self.repo_url} failed: {git_cause(e)}") from None
        self._repo = None

    @property
    def repo(self) -> git.Repo:
        if self._repo is None:
            self._repo = git.Repo(str(self.path), odbt=git.GitCmdObjectDB)
        return self._repo

    def close(self) -> None:
        """Stop the persistent ``cat-file`` processes."""
        if self._repo is not None:
            self._repo.close()
            self._repo = None

    def resolve(self, ref: str) -> str | None:
        """Commit id of a branch (``main`` or ``refs/heads/main``) or commit-ish, or None when missing."""
        name = ref if ref.startswith("refs/") or is_sha(ref) else f"refs/heads/{ref}"
        try:
            return str(self.repo.git.rev_parse("--verify", "--quiet", f"{name}^{{commit}}")).strip() or None
        except git.GitCommandError:
            return None

    def list_refs(self) -> dict[str, str]:
        """Every branch and tag of the mirror: full ref name (``refs/heads/main``, ``refs/tags/v1.0``) → commit id
        (annotated tags peeled to their commit; tags of non-commits left out)."""
        out: dict[str, str] = {}
        raw = str(self.repo.git.for_each_ref("--format=%(refname)%00%(objectname)%00%(*objectname)%00%(*objecttype)"
                                             "%00%(objecttype)", "refs/heads", "refs/tags"))
        for line in raw.splitlines():
            parts = line.split("\0")
            if len(parts) != 5:
                continue
            name, obj, peeled, peeled_type, obj_type = parts
            if peeled:
                if peeled_type == "commit":
                    out[name] = peeled
            elif obj_type == "commit":
                out[name] = obj
        return out

    def has_commit(self, sha: str | None) -> bool:
        """True when ``sha`` is a commit present in the mirror (the id of an annotated tag object is not one: its
        commit is :meth:`resolve`)."""
        return self.object_type(sha) == "commit"

    def object_type(self, sha: str | None) -> str | None:
        """The git type of object ``sha`` in the mirror (``commit``, ``tree``, ``blob`` or ``tag``), or None when
        ``sha`` is not an object id or the mirror lacks it."""
        if not is_sha(sha):
            return None
        try:
            return str(self.repo.git.cat_file("-t", sha)).strip() or None
        except git.GitCommandError:
            return None

    def tree(self, commit: str) -> list[TreeEntry]:
        """Every entry of the commit's tree, recursively, with sizes (``git ls-tree -r -l -z``).

        Paths that are not UTF-8 are given in their escaped form (:func:`escape_path`); one whose escaped form
        equals another path of the tree is left out and named in :attr:`dropped` (reason ``path_collision``).

        Raises:
            CommitNotFound: ``commit`` is not in the mirror.
        """
        if not self.has_commit(commit):
            raise CommitNotFound(f"commit {commit} not found in {self.repo_url}")
        try:
            out = self.repo.git.ls_tree("-r", "-l", "-z", "--full-tree", commit, strip_newline_in_stdout=False)
        except git.GitCommandError as e:  # a missing or damaged tree object (hostile review: GitPython's message)
            raise GitError(f"cannot read the tree of commit {commit} in {self.repo_url}: {git_cause(e)}") from None
        entries: list[TreeEntry] = []
        escaped: list[TreeEntry] = []
        for rec in out.split("\0"):
            if not rec:
                continue
            meta, raw = rec.split("\t", 1)
            mode, _type, sha, size = meta.split()
            path = escape_path(raw)
            if size != "-" and not size.isdigit():  # git prints "BAD" for an object it cannot read (hostile
                # review: `int("BAD")` ended the sync with a ValueError)
                raise GitError(f"object {sha} ({path!r}) of commit {commit} is missing or damaged in "
                               f"{self.repo_url}: repair the repository (git fsck) and push again")
            (entries if path == raw else escaped).append(
                TreeEntry(path=path, mode=mode, sha=sha, size=None if size == "-" else int(size)))
        self.dropped = {}
        if escaped:
            taken = {e.path for e in entries}
            for e in escaped:
                if e.path in taken:
                    self.dropped[e.path] = SKIP_PATH_COLLISION
                    log.warning("git_path_collision", path=e.path, repo=self.repo_url)
                else:
                    taken.add(e.path)
                    entries.append(e)
        return entries

    def diff(self, old: str, new: str) -> list[Change]:
        """Changed paths from ``old`` to ``new`` with rename detection (``git diff-tree -r -M -z``).

        Paths are in their :func:`escape_path` form, as :meth:`tree` gives them. A type change (file ↔ symlink ↔
        gitlink) is reported as ``T``.
        """
        out = self.repo.git.diff_tree("-r", "-M", "-z", "--no-commit-id", "--raw", old, new,
                                      strip_newline_in_stdout=False)
        parts = out.split("\0")
        changes: list[Change] = []
        i = 0
        while i < len(parts):
            meta = parts[i]
            if not meta.startswith(":"):
                i += 1
                continue
            status = meta.split()[-1]
            if status[0] in "RC":
                old_path, new_path = escape_path(parts[i + 1]), escape_path(parts[i + 2])
                i += 3
                if status[0] == "R":
                    changes.append(Change("R", new_path, old_path))
                else:
                    changes.append(Change("A", new_path))
            else:
                changes.append(Change(status[0], escape_path(parts[i + 1])))
                i += 2
        return changes

    def read_blob(self, sha: str) -> bytes:
        """Contents of a blob through the persistent ``git cat-file --batch`` process."""
        _hexsha, _type, _size, stream = self.repo.git.stream_object_data(sha)
        return stream.read()

    def read_blobs(self, shas: Sequence[str]) -> Iterator[tuple[str, bytes]]:
        """Contents of many blobs, in the order given, streamed through one ``git cat-file --batch`` process whose
        input a thread writes while this generator reads its output (issue 20: no round trip per blob; the
        pipelining ``git cat-file --batch`` itself allows, which the bench uses as its baseline).

        Raises:
            GitError: an object is missing or is not a blob, or git stopped early.
        """
        if not shas:
            return
        proc = subprocess.Popen(["git", "--git-dir", str(self.path), "cat-file", "--batch"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=1 << 20,
                                env={**os.environ, **_git_env(self.allow_local)})
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None

        def feed() -> None:
            try:
                for i in range(0, len(shas), 1024):
                    stdin.write(b"".join(s.encode("ascii") + b"\n" for s in shas[i:i + 1024]))
                stdin.close()
            except (BrokenPipeError, ValueError, OSError):  # the reader stopped early and closed the pipe
                pass

        feeder = threading.Thread(target=feed, name="cat-file-feed", daemon=True)
        feeder.start()
        try:
            for sha in shas:
                header = stdout.readline().split()
                if len(header) != 3 or header[1] != b"blob":
                    raise GitError(f"git cat-file of {self.repo_url} gave no blob for {sha}: "
                                   f"{b' '.join(header).decode('utf-8', 'replace')[:100]}")
                size = int(header[2])
                data = stdout.read(size)
                stdout.read(1)  # the newline after the contents
                if len(data) != size:
                    raise GitError(f"git cat-file of {self.repo_url} stopped while reading {sha}")
                yield sha, data
        finally:  # stop git first: the feeder's blocked write then fails (EPIPE) and only the feeder used stdin
            proc.kill()
            proc.wait()
            feeder.join()
            stdout.close()
            with contextlib.suppress(OSError, ValueError):  # ValueError: the feeder closed it already
                stdin.close()


def local_path_allowed(repo_url: str) -> bool:
    """True when ``repo_url`` names an existing local git repository (for embedded mode and tests)."""
    p = Path(repo_url.removeprefix("file://"))
    return p.is_absolute() and (p / ".git").exists() or (p / "HEAD").exists()

