"""``Mirror.read_blobs``: blobs streamed through one pipelined ``git cat-file --batch`` (issue 20) give exactly the
bytes ``read_blob`` gives, in the order asked, and a missing object is a clear error, not a hang."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scopekb.gitrepo import GitError, Mirror


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def mirror(tmp_path: Path) -> Mirror:
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    _git(work, "config", "user.email", "t@example.invalid")
    _git(work, "config", "user.name", "t")
    (work / "empty.txt").write_bytes(b"")
    (work / "crlf.txt").write_bytes(b"a\r\nb\r\n")
    (work / "nul.bin").write_bytes(bytes(range(256)) * 3)
    (work / "big.py").write_bytes(b"x = 1\n" * 300_000)  # 1.8 MB: more than one pipe buffer
    (work / "no-newline.md").write_bytes(b"# title")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "c")
    m = Mirror(tmp_path / "cache", str(work), allow_local=True)
    m.fetch()
    yield m
    m.close()


def test_streamed_blobs_equal_single_reads_in_order(mirror: Mirror) -> None:
    commit = mirror.resolve("main")
    assert commit
    entries = mirror.tree(commit)
    shas = [e.sha for e in entries] * 2  # repeats are read again, in place
    got = list(mirror.read_blobs(shas))
    assert [s for s, _ in got] == shas
    assert [d for _, d in got] == [mirror.read_blob(s) for s in shas]
    assert {len(d) for _, d in got} >= {0, 1_800_000}


def test_a_missing_object_is_a_git_error_and_an_early_stop_is_clean(mirror: Mirror) -> None:
    commit = mirror.resolve("main")
    sha = mirror.tree(commit)[0].sha
    with pytest.raises(GitError, match="no blob"):
        list(mirror.read_blobs([sha, "0" * 40]))
    with pytest.raises(GitError, match="no blob"):
        list(mirror.read_blobs([commit]))  # a commit is not a blob
    stream = mirror.read_blobs([sha] * 5000)
    assert next(stream)[0] == sha
    stream.close()  # the feeding thread and the git process end
    assert list(mirror.read_blobs([])) == []
