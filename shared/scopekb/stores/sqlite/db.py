"""SQLite connections shared by the embedded stores: one per thread, WAL journal, serialised writers."""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scopekb.stores.sqlite.text import glob_match

#: Milliseconds a connection waits for another process's write lock.
BUSY_TIMEOUT_MS = 30_000

class Connections:
    """One SQLite connection per thread (and per process: a forked child opens its own) to one file, all closed
    by :meth:`close`. The connection of a thread that has ended is closed when another thread opens one: worker
    pools (anyio's threads end after 10 s idle) would otherwise leave a connection, two file descriptors, per
    thread they ever ran until the process hits its open-file limit."""

    def __init__(self, path: Path) -> None:
        if str(path) == ":memory:":
            raise ValueError("SQLite stores need a file path; ':memory:' would give each thread its own database")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        #: every open connection -> the thread that opened it
        self._all: dict[sqlite3.Connection, weakref.ref[threading.Thread]] = {}
        self._guard = threading.Lock()
        #: Serialises this process's writers (SQLite has one writer; BEGIN IMMEDIATE covers other processes).
        self.write_lock = threading.RLock()

    def get(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) != os.getpid():
            conn = None  # inherited through fork: never touch the parent's connection
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                   check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA temp_store=MEMORY")
            conn.create_function("scopekb_glob", 2, glob_match, deterministic=True)
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._guard:
                ended = [c for c, owner in self._all.items() if not _alive(owner)]
                for c in ended:
                    del self._all[c]
                self._all[conn] = weakref.ref(threading.current_thread())
            for c in ended:  # its thread is gone, so nothing uses it
                try:
                    c.close()
                except sqlite3.Error:  # pragma: no cover - closing is best effort
                    pass
        return conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``; rolled back on any exception)."""
        with self.write_lock:
            conn = self.get()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every statement inside sees one snapshot."""
        conn = self.get()
        if conn.in_transaction:  # nested inside a write of this thread
            yield conn
            return
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def close(self) -> None:
        with self._guard:
            conns, self._all = list(self._all), {}
        for c in conns:
            try:
                c.close()
            except sqlite3.Error:  # pragma: no cover - closing is best effort
                pass
        self._local = threading.local()


def _alive(ref: weakref.ref[threading.Thread]) -> bool:
    thread = ref()
    return thread is not None and thread.is_alive()


def table_exists(conn: sqlite3.Connection, name: str) -> bool:
    """True when table or view ``name`` exists in the connection's database."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?",
                        (name,)).fetchone() is not None
