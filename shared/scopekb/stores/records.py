"""The record store on OpenSearch system indices: sources, jobs, sync state, API keys and dead letters.

The contract, :class:`scopekb.stores.base.RecordStore`, lives in :mod:`scopekb.stores.base` (re-exported here).

Each kind lives in its own index ``<system_prefix>-<kind>`` with a strict-enough mapping (keyword fields for the
lookups used here, everything else stored but not indexed). Writes use ``refresh="wait_for"`` so a record is
visible to the next read from any process, which is what registration and job polling expect.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConflictError, NotFoundError, RequestError

from scopekb.errors import Transient
from scopekb.stores.base import RecordStore
from scopekb.stores.opensearch import explained

__all__ = ["OpenSearchRecordStore", "RecordStore"]

_KEYWORD_FIELDS: dict[str, list[str]] = {
    "sources": ["id", "agent_name", "context_id", "repo_url", "repo_name", "ref"],
    "jobs": ["id", "state", "source_ids", "repo", "ref", "trigger"],
    "state": ["source_id", "commit"],
    "keys": ["id", "agent_name", "key_hash", "context_ids", "role"],
    "deadletters": ["id", "task"],
    "ranking": ["agent_name", "context_id", "source_id"],  # per-context ranking choice (scopekb.tuning)
    "overlays": ["source_id"],  # ref overlays of a source (scopekb.overlays)
}
_DATE_FIELDS = {"created_at", "started_at", "finished_at", "indexed_at", "revoked_at", "replayed_at"}
#: A record write waits at most 10 s on the server for its primary shard or a cluster block (no elected cluster
#: manager) before OpenSearch answers 503 (its default is 1 min, which the client retries three times: a red
#: cluster held one job-record update for minutes, long enough for a sync's task time limit to end it; issue 24).
#: ``request_timeout`` (the client's) must be given too: without it opensearch-py takes ``timeout`` as its own.
_WRITE_PARAMS = {"timeout": "10s", "request_timeout": 15}


#: OpenSearch's limit on a document ``_id``, in UTF-8 bytes (``IndexRequest``: "id ... is too long, must be no
#: longer than 512 bytes").
MAX_ID_BYTES = 512


@explained
class OpenSearchRecordStore(RecordStore):
    """Records in OpenSearch system indices ``<prefix>-<kind>``."""

    def __init__(self, client: OpenSearch, prefix: str = "scopekb-sys") -> None:
        self.client = client
        self.prefix = prefix
        self._ensured: set[str] = set()

    def index_name(self, kind: str) -> str:
        return f"{self.prefix}-{kind}"

    def ensure(self, kind: str) -> None:
        """Create the system index of ``kind`` if missing (idempotent, safe under races)."""
        if kind in self._ensured:
            return
        props: dict[str, Any] = {f: {"type": "keyword"} for f in _KEYWORD_FIELDS[kind]}
        props.update({f: {"type": "date"} for f in _DATE_FIELDS})
        # One replica whenever the cluster has a second node, none on a single node: sources, jobs, sync state and
        # keys must survive the loss of a node (searches look keys up here).
        body = {"settings": {"index": {"number_of_shards": 1, "auto_expand_replicas": "0-1"}},
                "mappings": {"dynamic": False, "properties": props}}
        try:
            self.client.indices.create(index=self.index_name(kind), body=body)
        except RequestError as e:
            if e.error != "resource_already_exists_exception":
                raise
        # Another process may have created it a moment ago: wait until its primary shard can answer.
        self.client.cluster.health(index=self.index_name(kind), wait_for_status="yellow",
                                   params={"request_timeout": 35})
        self._ensured.add(kind)

    def put(self, kind: str, rec_id: str, doc: dict[str, Any], wait: bool = True) -> None:
        """Create or replace a record."""
        self.ensure(kind)
        self.client.index(index=self.index_name(kind), id=rec_id, body=doc,
                          refresh="wait_for" if wait else "false", params=_WRITE_PARAMS)

    def get(self, kind: str, rec_id: str) -> dict[str, Any] | None:
        """A record by id, or None (also for an id longer than OpenSearch's ``_id`` limit, :data:`MAX_ID_BYTES`:
        no record has one, and a request line past 4 KB was refused as ``too_long_http_line_exception``, which
        a route then reported as a refused search - hostile review)."""
        if len(rec_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
            return None
        self.ensure(kind)
        try:
            return dict(self.client.get(index=self.index_name(kind), id=rec_id)["_source"])
        except NotFoundError:
            return None

    def update(self, kind: str, rec_id: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None],
               wait: bool = True) -> dict[str, Any] | None:
        """Atomic read-modify-write (optimistic: a real-time get, then a write with ``if_seq_no``/
        ``if_primary_term``, or ``op_type=create`` for a new record; on a version conflict ``change`` runs again on
        the newer record, at most 50 times). See :meth:`scopekb.stores.base.RecordStore.update`."""
        self.ensure(kind)
        index = self.index_name(kind)
        for _ in range(50):
            try:
                got = self.client.get(index=index, id=rec_id)
                cur: dict[str, Any] | None = dict(got["_source"])
                version = {"if_seq_no": got["_seq_no"], "if_primary_term": got["_primary_term"]}
            except NotFoundError:
                cur, version = None, {"op_type": "create"}
            new = change(copy.deepcopy(cur))
            if new is None:
                return cur
            try:
                self.client.index(index=index, id=rec_id, body=new, refresh="wait_for" if wait else "false",
                                  params=_WRITE_PARAMS, **version)
                return new
            except ConflictError:
                continue  # another writer was first: re-read and apply the change to its record
        raise Transient(f"record {kind}/{rec_id[:64]} kept changing under 50 writes in a row; try again")

    def delete(self, kind: str, rec_id: str) -> bool:
        """Delete a record; True when it existed (never for an id past :data:`MAX_ID_BYTES`)."""
        if len(rec_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
            return False
        self.ensure(kind)
        try:
            self.client.delete(index=self.index_name(kind), id=rec_id, refresh="wait_for", params=_WRITE_PARAMS)
            return True
        except NotFoundError:
            return False

    def find(self, kind: str, size: int = 1000, sort: str | None = None, **terms: Any) -> list[dict[str, Any]]:
        """Records whose keyword fields equal ``terms`` (all must match), at most ``size``."""
        self.ensure(kind)
        flt = [{"term": {k: v}} for k, v in terms.items() if v is not None]
        body: dict[str, Any] = {"size": size, "query": {"bool": {"filter": flt}} if flt else {"match_all": {}}}
        if sort:
            body["sort"] = [{sort: "desc"}]
        res = self.client.search(index=self.index_name(kind), body=body)
        return [h["_source"] for h in res["hits"]["hits"]]
