"""An embedded sync must not leave a SQLite connection behind (hostile review of 5d0e0a4).

That commit wrote the planned job record on a fresh ``ThreadPoolExecutor`` thread per ref per sync; the embedded
record store keeps one SQLite connection per thread (``scopekb.stores.sqlite.db.Connections``) until it is
closed, so each sync left one more open connection (two file descriptors) in a long-running ``scopekb up``, and
with ``ulimit -n 1024`` every sync failed with ``OSError: [Errno 24] Too many open files`` after about 500. The
threads were taken out again; this test fails with them (20 no-op syncs left 20 more connections).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from scopekb import ops
from scopekb.blobs import LocalBlobStore
from scopekb.indexing import SyncDeps, run_sync
from scopekb.models import SourceCreate
from scopekb.settings import Settings
from scopekb.stores.sqlite.chunks import SqliteChunkStore
from scopekb.stores.sqlite.records import SqliteRecordStore

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1"}


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_repeated_embedded_syncs_do_not_accumulate_sqlite_connections(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "--allow-empty", "-m", "c"]):
        if args[0] == "add":
            (repo / "a.py").write_text("def alpha():\n    return 1\n")
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=GIT_ENV)
    settings = Settings(git={"cache_dir": tmp_path / "git", "allow_local_paths": True})
    records = SqliteRecordStore(tmp_path / "records.sqlite3")
    deps = SyncDeps(settings=settings, records=records, chunks=SqliteChunkStore(tmp_path / "index.sqlite3"),
                    blobs=LocalBlobStore(tmp_path / "blobs"))

    class _Rt:  # what ops.register_source needs
        pass

    rt = _Rt()
    rt.settings, rt.records = settings, records  # type: ignore[attr-defined]
    rt.coord = type("C", (), {"bump_sources_version": lambda self: None})()  # type: ignore[attr-defined]
    src = ops.register_source(rt, SourceCreate(agent_name="a", context_id="c", repo_url=str(repo),  # type: ignore[arg-type]
                                                webhooks=False), allow_local=True)
    assert run_sync(deps, "job-first", [src.id]).state == "done"
    held, fds = len(records._db._all), _open_fds()
    for _ in range(20):
        assert run_sync(deps, "job-" + uuid.uuid4().hex[:8], [src.id]).state == "done"
    assert len(records._db._all) - held <= 1, f"{len(records._db._all) - held} more SQLite connections after 20 syncs"
    assert _open_fds() - fds <= 2, f"{_open_fds() - fds} more open file descriptors after 20 syncs"


def test_a_thread_that_ended_leaves_no_connection_open(tmp_path: Path) -> None:
    """Threads that read once and end (anyio's worker threads end after 10 s idle) leave no SQLite connection
    open: the next connection opened closes those of ended threads; a live thread's connection stays usable."""
    import threading

    from scopekb.stores.sqlite.db import Connections

    db = Connections(tmp_path / "x.sqlite3")
    with db.write() as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
    fds = _open_fds()

    def read_once() -> None:
        with db.read() as c:
            assert c.execute("SELECT x FROM t").fetchone() == (1,)

    for _ in range(30):
        th = threading.Thread(target=read_once)
        th.start()
        th.join()
    read_once()  # this (live) thread's connection, opened first, is still the one it uses
    assert len(db._all) <= 2, f"{len(db._all)} connections held after 30 ended threads"
    assert _open_fds() - fds <= 4, f"{_open_fds() - fds} more open file descriptors"
    db.close()
