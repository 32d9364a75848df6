"""Bulk items OpenSearch answers 429 for are re-sent and every re-send is counted in the job record.

The store's own 429 retries (inside one ``bulk_write``) used to be invisible in the job; now they land in
``job.retries["bulk_items"]`` with the sync's re-send rounds. The client is a fake (pure logic: which items are
re-sent and how they are counted); the real 429 path against OpenSearch is the same code.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import scopekb.stores.opensearch as os_store
from scopekb.indexing import SyncDeps, _bulk_write
from scopekb.models import Job
from scopekb.settings import Settings
from scopekb.stores.opensearch import OpenSearchChunkStore


class Refusing429:
    """A bulk endpoint that answers 429 for the first ``refuse`` item sends of each listed id, then 201."""

    def __init__(self, refuse: dict[str, int]) -> None:
        from opensearchpy.serializer import JSONSerializer

        self.refuse = dict(refuse)
        self.sent: list[str] = []
        self.transport = SimpleNamespace(serializer=JSONSerializer())  # what helpers.streaming_bulk reads

    def bulk(self, body: Any = None, **_: Any) -> dict[str, Any]:
        lines = body if isinstance(body, list) else body.splitlines()
        items = []
        for line in lines[::2]:
            meta = json.loads(line)["index"]
            doc_id = meta["_id"]
            self.sent.append(doc_id)
            if self.refuse.get(doc_id, 0) > 0:
                self.refuse[doc_id] -= 1
                items.append({"index": {"_id": doc_id, "status": 429, "error": {
                    "type": "es_rejected_execution_exception", "reason": "rejected execution"}}})
            else:
                items.append({"index": {"_id": doc_id, "status": 201, "result": "created"}})
        return {"errors": any(i["index"]["status"] != 201 for i in items), "items": items}


def test_429_item_resends_are_counted_in_the_job(monkeypatch) -> None:
    monkeypatch.setattr(os_store.time, "sleep", lambda _s: None)
    fake = Refusing429({"a": 2, "b": 1})
    store = OpenSearchChunkStore(fake, alias="chunks")  # type: ignore[arg-type]
    docs = [{"_id": i, "path": f"{i}.py", "content": i} for i in ("a", "b", "c")]
    deps = SyncDeps(settings=Settings(), records=None, chunks=store, blobs=None)  # type: ignore[arg-type]
    job = Job(id="j", source_ids=["s"], trigger="test")
    report = _bulk_write(deps, job, docs)
    assert report.written == 3 and report.errors == []
    assert fake.sent.count("a") == 3 and fake.sent.count("b") == 2 and fake.sent.count("c") == 1
    assert job.retries == {"bulk_items": 3}


def test_no_retry_no_count(monkeypatch) -> None:
    store = OpenSearchChunkStore(Refusing429({}), alias="chunks")  # type: ignore[arg-type]
    deps = SyncDeps(settings=Settings(), records=None, chunks=store, blobs=None)  # type: ignore[arg-type]
    job = Job(id="j", source_ids=["s"], trigger="test")
    assert _bulk_write(deps, job, [{"_id": "x", "path": "x.py"}]).written == 1
    assert job.retries == {}
