"""The embedded record store on SQLite: small JSON records by kind in one table."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from scopekb.stores.base import RecordStore
from scopekb.stores.sqlite.db import Connections


class SqliteRecordStore(RecordStore):
    """Small JSON records by kind (``sources``, ``jobs``, ``state``, ``keys``) in one SQLite table.

    Semantics of :class:`scopekb.stores.records.OpenSearchRecordStore`: ``put`` replaces, ``get`` returns the
    document or None, ``delete`` says whether it existed, ``find`` matches fields equal to a value or lists
    containing it and sorts newest first. Every write is visible to the next read at once (``wait`` is moot).

    Args:
        path: database file (created with its parent folders); may be the file of a :class:`SqliteChunkStore`.
    """

    _DDL = ("CREATE TABLE IF NOT EXISTS scopekb_records (kind TEXT NOT NULL, id TEXT NOT NULL, doc TEXT NOT NULL,"
            " PRIMARY KEY (kind, id))")

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._db = Connections(self.path)
        self._ready = False

    def close(self) -> None:
        """Close every connection this store opened (it reopens on next use)."""
        self._db.close()

    def ensure(self, kind: str) -> None:
        """Create the records table if missing (one table holds every kind; idempotent)."""
        if self._ready:
            return
        with self._db.write() as conn:
            conn.execute(self._DDL)
        self._ready = True

    def put(self, kind: str, rec_id: str, doc: dict[str, Any], wait: bool = True) -> None:
        """Create or replace a record (a JSON-able dict).

        Raises:
            TypeError, ValueError: ``doc`` is not JSON-serialisable.
        """
        self.ensure(kind)
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        with self._db.write() as conn:
            conn.execute("INSERT OR REPLACE INTO scopekb_records (kind, id, doc) VALUES (?, ?, ?)",
                         (kind, rec_id, text))

    def get(self, kind: str, rec_id: str) -> dict[str, Any] | None:
        """A record by id, or None."""
        self.ensure(kind)
        with self._db.read() as conn:
            row = conn.execute("SELECT doc FROM scopekb_records WHERE kind = ? AND id = ?", (kind, rec_id)).fetchone()
        return json.loads(row[0]) if row else None

    def update(self, kind: str, rec_id: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None],
               wait: bool = True) -> dict[str, Any] | None:
        """Atomic read-modify-write: read, ``change`` and write inside one ``BEGIN IMMEDIATE`` transaction (other
        writers, of this process or another, wait). See :meth:`scopekb.stores.base.RecordStore.update`."""
        self.ensure(kind)
        with self._db.write() as conn:
            row = conn.execute("SELECT doc FROM scopekb_records WHERE kind = ? AND id = ?", (kind, rec_id)).fetchone()
            cur = json.loads(row[0]) if row else None
            new = change(json.loads(row[0]) if row else None)
            if new is None:
                return cur
            conn.execute("INSERT OR REPLACE INTO scopekb_records (kind, id, doc) VALUES (?, ?, ?)",
                         (kind, rec_id, json.dumps(new, ensure_ascii=False, separators=(",", ":"))))
            return new

    def delete(self, kind: str, rec_id: str) -> bool:
        """Delete a record; True when it existed."""
        self.ensure(kind)
        with self._db.write() as conn:
            cur = conn.execute("DELETE FROM scopekb_records WHERE kind = ? AND id = ?", (kind, rec_id))
            return cur.rowcount > 0

    def find(self, kind: str, size: int = 1000, sort: str | None = None, **terms: Any) -> list[dict[str, Any]]:
        """Records whose fields equal ``terms`` (all must match; None values are ignored; a list field matches
        when it contains the value), sorted by ``sort`` descending (missing values last, then by id), at most
        ``size``. Date strings sort by instant."""
        self.ensure(kind)
        where, args = ["kind = ?"], [kind]
        for name, value in terms.items():
            if value is None:
                continue
            if not re.fullmatch(r"[A-Za-z0-9_]+", name):
                return []
            where.append(f"EXISTS (SELECT 1 FROM json_each(doc, '$.{name}') WHERE json_each.value = ?)")
            args.append(_json_scalar(value))
        with self._db.read() as conn:
            rows = conn.execute(f"SELECT id, doc FROM scopekb_records WHERE {' AND '.join(where)} ORDER BY id",
                                args).fetchall()
        docs = [(rid, json.loads(text)) for rid, text in rows]
        if sort:
            present = [(rid, d) for rid, d in docs if d.get(sort) is not None]
            missing = [(rid, d) for rid, d in docs if d.get(sort) is None]
            present.sort(key=lambda t: (_sort_key(t[1][sort]), t[0]), reverse=True)
            docs = present + missing
        return [d for _, d in docs[:max(0, size)]]


def _json_scalar(value: Any) -> Any:
    if isinstance(value, bool):
        return 1 if value else 0
    if isinstance(value, int | float | str):
        return value
    return str(value)


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, str):
        try:
            return (1, datetime.fromisoformat(value).timestamp())
        except ValueError:
            return (2, value)
    if isinstance(value, bool | int | float):
        return (0, float(value))
    return (3, json.dumps(value, sort_keys=True))
