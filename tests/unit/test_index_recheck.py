"""A worker checks the chunk index again when the alias moved (hostile review: a worker started without an
embedding provider kept writing chunks without vectors into the vector index a `scopekb reindex` swapped in; one of
another model of the same dimension would have mixed two vector spaces). Fake chunk store: pure logic."""

from __future__ import annotations

from typing import Any

import pytest

from scopekb.stores.base import StoreVersionMismatch
from scopekb_worker import app as worker_app


class _Chunks:
    def __init__(self) -> None:
        self.live = "chunks-v9-kw"
        self.checks = 0
        self.mismatch: str | None = None

    def live_index(self) -> str:
        return self.live

    def ensure_index(self) -> str:
        self.checks += 1
        if self.mismatch:
            raise StoreVersionMismatch(self.mismatch)
        return self.live


class _Rt:
    def __init__(self) -> None:
        self.chunks = _Chunks()


def test_the_index_is_checked_again_when_the_alias_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_app, "_index_checked", [])
    rt: Any = _Rt()
    worker_app.ensure_chunk_index(rt)
    worker_app.ensure_chunk_index(rt)
    assert rt.chunks.checks == 1  # the same live index: one alias request, no second check
    rt.chunks.live = "chunks-v9-384-local-abc"  # a reindex swapped the alias
    rt.chunks.mismatch = "index holds 384-dimension vectors; this process has no embedding model"
    with pytest.raises(StoreVersionMismatch, match="no embedding model"):
        worker_app.ensure_chunk_index(rt)
    with pytest.raises(StoreVersionMismatch):  # every sync after it is refused too, until the worker is fixed
        worker_app.ensure_chunk_index(rt)
    assert rt.chunks.checks == 3
