"""The chunk index on OpenSearch: one shared index behind an alias, every chunk tagged with its scope.

Writers call :meth:`OpenSearchChunkStore.bulk_write` and the delete methods; readers call :meth:`keyword_search`.
Every read is filtered by a :class:`ScopeFilter`; there is no unscoped search method.
"""

from __future__ import annotations

import contextlib
import functools
import random
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from opensearchpy import OpenSearch, helpers
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import ConnectionTimeout, NotFoundError, RequestError, TransportError

from scopekb import fields as F
from scopekb.errors import Refused, ScopekbError, Transient, translating
from scopekb.logging import get_logger
from scopekb.patterns import CEILING, compile_globs
from scopekb.settings import OpenSearchSettings
from scopekb.stores.base import (
    SLOW_PROBLEM,
    BulkReport,
    IndexPlacementError,
    RawHit,
    RefOverlay,
    ScopeFilter,
    SearchFilter,
    StoreVersionMismatch,
    SymbolQuery,
    answered_problem,
    model_mismatch_fix,
    newest_blob_per_path,
    no_model_fix,
)
from scopekb.stores.sqlite.text import keyword_terms
from scopekb.textsearch import LiteralQuery

log = get_logger(__name__)

T = TypeVar("T")


class IndexVersionMismatch(StoreVersionMismatch):
    """The live index behind the alias was built for another mapping version or embedding dimension."""


#: HTTP statuses a non-interactive client retries on another node (opensearch-py's default also retries 503; see
#: :func:`make_client`).
RETRY_STATUSES = (502, 504)


#: Connections kept per node when neither the caller nor ``opensearch.pool_maxsize`` says (``http.worker_threads``'
#: default: anyio's default thread limiter, 40 threads).
DEFAULT_POOL_MAXSIZE = 40


def make_client(cfg: OpenSearchSettings, interactive: bool = False, pool_maxsize: int | None = None) -> OpenSearch:
    """Build an opensearch-py client from settings (basic auth when a username is set).

    ``pool_maxsize``: HTTP connections kept open per node (default ``cfg.pool_maxsize``, or
    :data:`DEFAULT_POOL_MAXSIZE` when that is 0); give the number of threads that may call the client at once.
    opensearch-py keeps one otherwise, so concurrent requests beyond the first each opened a new connection that
    was closed after its answer (issue 20).

    ``interactive`` (the query service): at most 10 s per request and no retry on timeout, so a frozen cluster
    gives callers a quick 503 instead of a hang of ``timeout × retries``.
    ``cfg.url`` may name several nodes (comma-separated): requests go round-robin and a node that refuses the
    connection is marked dead and the request retried on another (opensearch-py's connection pool).

    Outside ``interactive`` (workers, the CLI, the ingester) a request is retried on another node after a
    refused connection or a 502/504, but not after a timeout or a 503: with no elected cluster manager a write
    can hang past its own ``timeout`` (a stack dump 36 s into a sync found its job-record write, ``timeout=10s``,
    still waiting for the answer) and a blocked write answers 503, the same on every node; with three more
    tries one record write or bulk request of a sync lasted long enough to take the task past its time limit
    while the cluster was red (issue 24). The callers' own policies decide instead: bulk retry rounds (timeouts
    and 503 items included), the task's wait for the cluster, 503 to HTTP clients.
    """
    auth = None
    if cfg.username:
        auth = (cfg.username, cfg.password.get_secret_value() if cfg.password else "")
    pool = pool_maxsize or cfg.pool_maxsize or DEFAULT_POOL_MAXSIZE
    if interactive:
        return OpenSearch(hosts=cfg.hosts(), http_auth=auth, verify_certs=cfg.verify_certs,
                          timeout=min(cfg.timeout_s, 10.0), max_retries=1, retry_on_timeout=False, pool_maxsize=pool)
    return OpenSearch(hosts=cfg.hosts(), http_auth=auth, verify_certs=cfg.verify_certs, timeout=cfg.timeout_s,
                      max_retries=3, retry_on_timeout=False, http_compress=False, retry_on_status=RETRY_STATUSES,
                      pool_maxsize=pool)


#: A bulk request waits at most 20 s on the server for a primary shard or a cluster block (no elected cluster
#: manager) before answering 503 for its items (OpenSearch's default is 1 min, longer than the client's 30 s, so a red
#: cluster gave client timeouts retried three times: minutes in one call). ``request_timeout`` (the client's 30 s)
#: must be given too: without it opensearch-py takes ``timeout`` as its own.
_BULK_PARAMS = {"timeout": "20s", "request_timeout": 30}
#: Bulk writes of chunks ask only for each item's id, status and error (issue 20: the full answer repeats index,
#: version, shard counts and sequence numbers for every item - about 200 bytes an item to build and parse).
_BULK_WRITE_PARAMS = {**_BULK_PARAMS, "filter_path": "errors,items.*._id,items.*.status,items.*.error"}
#: Seconds one look at a by-query task waits for it to finish before the cluster's health is asked again.
BY_QUERY_WAIT_S = 10

#: Searches never answer from part of the shards: with a shard that has no live copy (a red index) OpenSearch
#: fails the search (503, ``search_phase_execution_exception``) instead of returning fewer hits as if complete.
#: A copy lost mid-search is first retried on the shard's other copies, so replicas keep searches whole.
_WHOLE_RESULTS = {"allow_partial_search_results": "false"}


def _raw_hits(res: dict[str, Any]) -> list[RawHit]:
    """``(doc id, score, _source)`` of a search response's hits, in order."""
    return [(h["_id"], float(h["_score"] or 0.0), h["_source"]) for h in res["hits"]["hits"]]


def _existing(client: OpenSearch, index: str, timeout_s: float) -> tuple[str, bool]:
    """``index`` (comma-separated names and patterns) without the plain names that do not exist, from the node's
    local view (one ``HEAD`` per plain name; patterns are kept; ``""`` when nothing is left), and whether a node
    took a check's connection but did not answer within ``timeout_s``. A check that fails keeps its name and ends
    the checks (the health request that follows reports why)."""
    names = index.split(",")
    kept = []
    for i, name in enumerate(names):
        if "*" not in name:
            try:
                if not client.indices.exists(index=name, params={"local": "true", "request_timeout": timeout_s}):
                    continue
            except Exception as e:  # noqa: BLE001 - unreachable or refused: the health request reports it
                return ",".join(kept + names[i:]), isinstance(e, ConnectionTimeout)
        kept.append(name)
    return ",".join(kept), False


def cluster_problem(client: OpenSearch, index: str | None = None, timeout_s: float = 2.0,
                    recovering: bool = False) -> str | None:
    """Why the cluster cannot serve now, in one line, or None when it can (green or yellow).

    Asks the node the client reaches for its *local* view of ``_cluster/health`` (``local=true``), which answers
    at once even when no cluster manager is elected (the plain call then waits and fails with
    ``cluster_manager_not_discovered_exception``). ``index`` narrows the status to that index (an alias works).
    Examples: ``"cluster red: no elected cluster manager (a majority of cluster-manager nodes is unreachable)"``,
    ``"cluster red: 2 primary shard(s) unassigned"``, ``"unreachable: ConnectionError"`` (every node refused),
    ``"unreachable: ConnectionTimeout"`` (:data:`~scopekb.stores.base.SLOW_PROBLEM`: some node took the connection
    but none answered within ``timeout_s`` seconds).

    With ``recovering`` a green or yellow cluster whose shard copies are still initializing or relocating is also a
    problem (``"cluster yellow: recovering, 2 shard copies initializing, 0 relocating"``): right after nodes come
    back, writes fail for a while with ``shard_not_in_primary_mode_exception`` / ``retry_on_primary_exception``
    (HTTP 500) although the status is no longer red. A worker asks this after a failed write, to wait for the
    recovery instead of spending an attempt; readiness and search errors do not (a yellow cluster serves).
    """
    nodes = len(getattr(getattr(client, "transport", None), "hosts", None) or [None])
    timed_out = False
    if index is not None:  # `_cluster/health/<missing index>` is held open until its timeout instead of 404
        # (README newcomer: `scopekb status` before `scopekb init` took 4 s and said "green ...; unreachable")
        index, timed_out = _existing(client, index, timeout_s)
        if timed_out and nodes == 1:
            return SLOW_PROBLEM  # the one node took the connection and did not answer: not asked twice
        if index == "":
            return None  # the index does not exist yet: nothing is unavailable
    health: dict[str, Any] = {}
    for attempt in range(nodes):  # a node that refuses is set aside by the pool: the next try asks another
        try:
            health = client.cluster.health(index=index, params={"local": "true", "request_timeout": timeout_s})
            break
        except NotFoundError:
            return None  # the index does not exist yet: nothing is unavailable
        except OSConnectionError as e:
            # a node that took the connection and did not answer in time is there but slow (heavy load): said so
            # even when the last try met a node that refused (issue 24: a dead node tried last hid the slow one)
            timed_out = timed_out or isinstance(e, ConnectionTimeout)
            if attempt == nodes - 1:
                return SLOW_PROBLEM if timed_out else f"unreachable: {type(e).__name__}"
        except TransportError as e:
            return f"health check failed: {e.status_code} {e.error}"
        except Exception as e:  # noqa: BLE001 - any other client failure (timeouts) is reported by its type
            return f"unreachable: {type(e).__name__}"
    status = str(health.get("status"))
    if not health.get("discovered_cluster_manager", health.get("discovered_master", True)):
        return (f"cluster {status}: no elected cluster manager (a majority of cluster-manager nodes is "
                "unreachable)")
    if status == "red":
        unassigned = int(health.get("unassigned_shards", 0))
        return f"cluster red: {unassigned} shard copies unassigned, a primary among them"
    moving = int(health.get("initializing_shards", 0)), int(health.get("relocating_shards", 0))
    if recovering and any(moving):
        return f"cluster {status}: recovering, {moving[0]} shard copies initializing, {moving[1]} relocating"
    return None


def _jittered(delay: float) -> float:
    """A backoff delay with "equal jitter" (``[delay/2, delay]``), so writers that were refused together do not
    come back together."""
    return delay / 2 + random.random() * delay / 2


def scope_clauses(scope: ScopeFilter) -> list[dict[str, Any]]:
    """OpenSearch ``filter`` clauses enforcing a scope: the agent always, the contexts unless cross-context."""
    out: list[dict[str, Any]] = [{"term": {F.AGENT_NAME: scope.agent_name}}]
    if scope.context_ids is not None:
        out.append({"terms": {F.CONTEXT_ID: list(scope.context_ids)}})
    return out


def filter_clauses(flt: SearchFilter) -> list[dict[str, Any]]:
    """All filters of a search: the scope (always) plus optional provenance, language and path globs."""
    out = scope_clauses(flt.scope)
    if flt.source_id:
        out.append({"term": {F.SOURCE_ID: flt.source_id}})
    if flt.repo:
        out.append({"term": {F.REPO: flt.repo}})
    if flt.ref:
        out.append(member_clause(flt.ref.removeprefix("refs/heads/"), flt.overlays))
    elif flt.pinned:  # leave out chunks of pins only: a member of a pin and of no ref named otherwise than a commit id
        out.append({"bool": {"must_not": [{"bool": {"filter": [{"terms": {F.REFS: list(flt.pinned)}}], "must_not": [
            {"regexp": {F.REFS: {"value": "~([0-9a-f]{40})", "flags": "COMPLEMENT"}}}]}}]}})
    if flt.languages:
        out.append({"terms": {F.LANGUAGE: list(flt.languages)}})
    if flt.file_patterns:
        # Bounded globs (scopekb.patterns): at most 2**max_globstars wildcard values each, few wildcards per value.
        globs = compile_globs(flt.file_patterns, CEILING)
        out.append({"bool": {"should": [{"wildcard": {F.PATH: {"value": w}}} for g in globs for w in g.wildcards],
                             "minimum_should_match": 1}})
    for key, values in flt.metadata:  # flat_object: each leaf is a keyword at its dotted path
        out.append({"terms": {f"{F.METADATA}.{key}": list(values)}})
    return out


#: Order of exact/regex/symbol candidates: path, chunk index, then the scope and content as tie-breaks.
_TEXT_ORDER = [{F.PATH: "asc"}, {F.CHUNK_INDEX: "asc"}, {F.SOURCE_ID: "asc"}, {F.CONTEXT_ID: "asc"},
               {F.AGENT_NAME: "asc"}, {F.CONTENT_SHA: "asc"}]


def ref_clause(ref: str) -> dict[str, Any]:
    """Chunks of ``ref``: members of it (issue 23), or chunks written without ``refs`` (before it; a bare bulk
    write) whose one ``ref`` it is."""
    return {"bool": {"should": [
        {"term": {F.REFS: ref}},
        {"bool": {"must_not": [{"exists": {"field": F.REFS}}], "filter": [{"term": {F.REF: ref}}]}}],
        "minimum_should_match": 1}}


def member_clause(ref: str, overlays: Sequence[RefOverlay] = ()) -> dict[str, Any]:
    """Chunks of ``ref`` (:func:`ref_clause`) plus, per :class:`RefOverlay`, the chunks of its source whose
    ``refs`` name its base and whose id it does not hide."""
    if not overlays:
        return ref_clause(ref)
    parts: list[dict[str, Any]] = [ref_clause(ref)]
    for ov in overlays:
        part: dict[str, Any] = {"filter": [{"term": {F.SOURCE_ID: ov.source_id}}, {"term": {F.REFS: ov.base}}]}
        if ov.hidden:
            part["must_not"] = [{"ids": {"values": sorted(ov.hidden)}}]
        parts.append({"bool": part})
    return {"bool": {"should": parts, "minimum_should_match": 1}}


#: OpenSearch root causes that mean "the query is too large": the caller's to fix.
QUERY_TOO_LARGE = ("too_many_clauses", "too_many_nested_clauses")


def backend_reason(exc: TransportError) -> str:
    """The root cause type OpenSearch gave for a refused request (``query_shard_exception``), or its error."""
    info = exc.info if isinstance(exc.info, dict) else {}
    causes = (info.get("error") or {}).get("root_cause") if isinstance(info.get("error"), dict) else None
    return str(causes[0].get("type")) if causes else str(exc.error)


#: Root causes of a search that failed because a node holding a shard copy left while the search ran: the query
#: phase moves to another copy by itself, but a fetch phase already sent to that node fails the whole search (a
#: 500 ``search_phase_execution_exception``; issue 24's node-loss fault test saw one, 3 s after a data node's
#: SIGKILL, with the replicas already promoted). Such a search is sent again (:data:`LOST_COPY_RETRIES`).
LOST_COPY = frozenset({"node_disconnected_exception", "node_not_connected_exception", "node_closed_exception",
                       "connect_transport_exception", "send_request_transport_exception"})
#: Times a search that failed for :data:`LOST_COPY` is sent again, :data:`LOST_COPY_PAUSE_S` apart (a read: safe
#: to repeat; a cluster without another copy fails the next attempt the same way, and its error is raised).
LOST_COPY_RETRIES = 2
LOST_COPY_PAUSE_S = 0.2


def lost_copy(error: Any) -> bool:
    """Whether a failed search's error - an opensearch-py :class:`TransportError`, or the ``error`` object of one
    ``_msearch`` response item - has a root cause in :data:`LOST_COPY`."""
    if isinstance(error, TransportError):
        if isinstance(error, (NotFoundError, RequestError)):
            return False
        return backend_reason(error) in LOST_COPY
    causes = error.get("root_cause") if isinstance(error, dict) else None
    types = {str(c.get("type")) for c in causes if isinstance(c, dict)} if isinstance(causes, list) else set()
    return bool(types & LOST_COPY) or (isinstance(error, dict) and str(error.get("type")) in LOST_COPY)


def translate_opensearch(exc: BaseException) -> ScopekbError:
    """scopekb's error for an opensearch-py error: unreachable -> ``Transient("search backend unavailable")``; a
    request refused as too large or malformed (400, too many clauses) -> ``Refused`` (400) naming what to reduce;
    anything else (429, 5xx, other 4xx of a misconfigured cluster) -> ``Transient("search backend error")``."""
    if isinstance(exc, OSConnectionError) or not isinstance(exc, TransportError):
        return Transient("search backend unavailable")
    reason = backend_reason(exc)
    if exc.status_code == 400 or reason in QUERY_TOO_LARGE:
        log.warning("opensearch_refused", status=exc.status_code, reason=reason)
        return Refused(f"the search backend refused the query ({reason}); use fewer query terms, file patterns "
                       "or languages", 400)
    log.error("opensearch_error", status=exc.status_code, error=str(exc.error)[:300], reason=reason)
    return Transient("search backend error")


#: Applied to every OpenSearch adapter: public methods raise :mod:`scopekb.errors`, never opensearch-py types.
opensearch_errors = translating(TransportError, translate_opensearch)


class ClusterUnavailable(Transient):
    """A request failed while the cluster says why it cannot serve (red, no elected cluster manager): the message
    names that reason (``search backend unavailable: cluster red: no elected cluster manager ...``)."""


def explain_failure(client: OpenSearch, err: ScopekbError, index: str | None = None) -> ScopekbError:
    """``err``, or for a :class:`Transient` while the cluster reports a problem (:func:`cluster_problem` of
    ``index``, or of the whole cluster) a :class:`ClusterUnavailable` naming it. A cluster no node of which
    answers keeps ``err`` (``search backend unavailable``): there is no better reason to give."""
    if not isinstance(err, Transient) or isinstance(err, ClusterUnavailable):
        return err
    why = answered_problem(cluster_problem(client, index=index))
    if why is None:
        return err
    return ClusterUnavailable(f"search backend unavailable: {why}")


def explained(cls: type[T]) -> type[T]:
    """:data:`opensearch_errors` for an adapter holding ``self.client``, whose :class:`Transient` errors also name
    why the cluster cannot serve when it says (:func:`explain_failure`): the record store's key lookups, job and
    state reads fail with the same reason as searches (issue 24)."""
    cls = opensearch_errors(cls)

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except Transient as e:
                better = explain_failure(self.client, e)
                if better is e:
                    raise
                raise better from e.__cause__
        return call

    for name, value in list(vars(cls).items()):
        if not name.startswith("_") and callable(value) and not isinstance(value, (staticmethod, classmethod, type)):
            setattr(cls, name, wrap(value))
    return cls


@opensearch_errors
class OpenSearchChunkStore:
    """Chunk documents in one OpenSearch index behind ``alias``.

    Args:
        client: an opensearch-py client.
        alias: the alias every reader and writer uses (``scopekb-chunks``).
        dimension: embedding dimension, or None for a keyword-only index.
        model: embedding model id (part of the index version name).
        encoder: ``none``, ``sq`` (Lucene scalar quantization of the vectors) or ``int8`` (vectors stored as
            bytes: every vector written and every query vector goes through :func:`scopekb.fields.int8_vector`);
            see :func:`scopekb.fields.chunk_mapping`.
        system_prefix: prefix of the system indices (job records, sync state) the worker writes too; when given,
            :meth:`problem` with ``recovering`` asks about them as well.
    """

    kind = "opensearch"
    #: Documents a by-query task reads per scroll batch (OpenSearch's default, 1000).
    by_query_batch = 1000

    def __init__(self, client: OpenSearch, alias: str = "scopekb-chunks", dimension: int | None = None,
                 model: str | None = None, shards: int = 1, replicas: int = 0,
                 bulk_max_bytes: int = 4 * 1024 * 1024, bulk_in_flight: int = 1, encoder: str = "none",
                 system_prefix: str | None = None) -> None:
        self.client = client
        self.system_prefix = system_prefix
        self.bulk_in_flight = max(1, int(bulk_in_flight))
        self.encoder = encoder
        self.alias = alias
        self.dimension = dimension
        self.model = model
        self.shards = shards
        self.replicas = replicas
        self.bulk_max_bytes = bulk_max_bytes
        #: concrete indices whose vectors :meth:`_check_vector_index` found to be of this store's model and encoder
        self._vetted: set[str] = {self.version_name}

    # ---- index lifecycle -------------------------------------------------------------------------------------

    @property
    def version_name(self) -> str:
        """The concrete index name for this mapping version and model."""
        return F.index_version_name(self.alias, self.dimension, self.model, self.encoder)

    def ensure_index(self) -> str:
        """Create the versioned index with its mapping in one call and point the alias at it, idempotently.

        Returns the concrete index name. Raises :class:`IndexVersionMismatch` when the alias already points at an
        index of another mapping version or dimension (a reindex is needed, not a silent switch), and
        :class:`IndexPlacementError` before creating an index whose replicas the cluster has too few data nodes
        for (an existing index is used as it is: a node lost for a while must not stop the services).
        """
        current = self.live_index()
        if current is not None:
            meta = self.client.indices.get_mapping(index=current)[current]["mappings"].get("_meta", {})
            if meta.get("mapping_version") != F.MAPPING_VERSION or meta.get("dimension") != self.dimension:
                fix = (no_model_fix(meta["dimension"], meta.get("model")) if meta.get("dimension")
                       and not self.dimension and meta.get("mapping_version") == F.MAPPING_VERSION
                       else "Run `scopekb reindex`.")
                raise IndexVersionMismatch(
                    f"index {current!r} behind alias {self.alias!r} has mapping version "
                    f"{meta.get('mapping_version')} and dimension {meta.get('dimension')}; this process wants "
                    f"version {F.MAPPING_VERSION} and dimension {self.dimension}. {fix}")
            # indices made before model/encoder were recorded have neither key: accepted as they are
            for key, want in (("model", self.model), ("encoder", self.encoder)):
                if self.dimension and meta.get(key) is not None and want is not None and meta[key] != want:
                    raise IndexVersionMismatch(
                        f"index {current!r} behind alias {self.alias!r} holds vectors of {key} {meta[key]!r}; this "
                        f"process wants {want!r}. "
                        + (model_mismatch_fix(meta[key], want) if key == "model" else "Run `scopekb reindex`."))
            self._migrate_refs(current)
            if not meta.get("generation"):  # an index made before generations were recorded (_meta is replaced whole)
                self.client.indices.put_mapping(index=current, body={"_meta": {**meta,
                                                                               "generation": secrets.token_hex(8)}})
            return current
        name = self.version_name
        self._check_data_nodes(self.replicas)
        body = {"settings": F.chunk_index_settings(self.shards, self.replicas, knn=bool(self.dimension),
                                                         encoder=self.encoder),
                "mappings": F.chunk_mapping(self.dimension, self.model, self.encoder)}
        body["mappings"]["_meta"]["generation"] = secrets.token_hex(8)
        try:
            self.client.indices.create(index=name, body=body)
            log.info("chunk_index_created", index=name, dimension=self.dimension)
        except RequestError as e:
            if e.error != "resource_already_exists_exception":
                raise
        self.client.cluster.health(index=name, wait_for_status="yellow", params={"request_timeout": 35})
        try:
            self.client.indices.update_aliases(body={"actions": [{"add": {"index": name, "alias": self.alias}}]})
        except RequestError:
            if self.live_index() != name:
                raise
        return name

    def _migrate_refs(self, index: str) -> None:
        """Give an index made before issue 23 the multi-valued ``refs`` field (an additive mapping change) and
        each of its chunks ``refs = [ref]``, once (idempotent: only documents without ``refs`` are touched)."""
        props = self.client.indices.get_mapping(index=index)[index]["mappings"].get("properties", {})
        if F.REFS in props:
            return
        self.client.indices.put_mapping(index=index, body={"properties": {F.REFS: {"type": "keyword"}}})
        res = self._run_by_query_task("update_by_query", index, {
            "query": {"bool": {"must_not": [{"exists": {"field": F.REFS}}]}},
            "script": {"lang": "painless", "source": f"ctx._source.{F.REFS} = [ctx._source.{F.REF}]"}},
            refresh=True)
        log.info("chunk_refs_migrated", index=index, updated=res.get("updated"))

    def _check_data_nodes(self, replicas: int) -> int:
        """The cluster's data node count; raises :class:`IndexPlacementError` when ``replicas + 1`` copies of a
        shard cannot each go to a different data node (OpenSearch never puts two copies on one node)."""
        health = self.client.cluster.health(params={"request_timeout": 10})
        nodes = int(health.get("number_of_data_nodes", 0))
        if replicas + 1 > nodes:
            raise IndexPlacementError(
                f"the chunk index asks for {replicas} replica(s), so {replicas + 1} copies of each shard on "
                f"different data nodes, but the cluster has {nodes} data node(s); set SCOPEKB_OPENSEARCH__REPLICAS "
                f"to at most {max(nodes - 1, 0)} or add data nodes")
        return nodes

    def check_placement(self) -> dict[str, Any]:
        """Check that the cluster can place every copy of the chunk index (``scopekb init``, a deploy hook).

        Returns ``{"index", "status", "data_nodes", "shards", "replicas", "unassigned_shards"}`` (``index`` None
        when not created yet: then the configured shards/replicas are checked).

        Raises:
            IndexPlacementError: fewer data nodes than ``replicas + 1``; or the index is red (a primary shard
                unassigned), with OpenSearch's allocation explanation.
        """
        current = self.live_index()
        if current is None:
            nodes = self._check_data_nodes(self.replicas)
            return {"index": None, "status": "absent", "data_nodes": nodes, "shards": self.shards,
                    "replicas": self.replicas, "unassigned_shards": 0}
        index_settings = self.client.indices.get_settings(index=current)[current]["settings"]["index"]
        replicas = int(index_settings.get("number_of_replicas", 0))
        shards = int(index_settings.get("number_of_shards", 1))
        nodes = self._check_data_nodes(replicas)
        health = self.client.cluster.health(index=current, params={"request_timeout": 10})
        status = str(health.get("status"))
        if status == "red":
            raise IndexPlacementError(
                f"index {current!r} is red: {health.get('unassigned_shards')} shard copies unassigned, a primary "
                f"among them ({self._allocation_reason()}); searches and syncs of its chunks fail until it is "
                "assigned")
        return {"index": current, "status": status, "data_nodes": nodes, "shards": shards, "replicas": replicas,
                "unassigned_shards": int(health.get("unassigned_shards", 0))}

    def _allocation_reason(self) -> str:
        """OpenSearch's explanation of the first unassigned shard, in one line (best effort)."""
        try:
            res = self.client.cluster.allocation_explain(params={"request_timeout": 10})
        except TransportError as e:
            return f"no explanation: {e.error}"
        return str(res.get("allocate_explanation") or res.get("unassigned_info", {}).get("reason") or "unknown")

    def live_index(self) -> str | None:
        """The index the alias points at, or None when the alias does not exist."""
        try:
            # ignore=404: a missing alias is an answer here, not a failure for the client to log as a warning
            res = self.client.indices.get_alias(name=self.alias, params={"ignore": 404})
        except NotFoundError:
            return None
        if res.get("status") == 404:
            return None
        names = sorted(k for k, v in res.items() if isinstance(v, dict))
        return names[-1] if names else None

    def index_dimension(self) -> int | None:
        """The embedding dimension the index behind the alias was built with, from its mapping (``_meta.dimension``
        as :func:`scopekb.fields.chunk_mapping` writes it, else the ``embedding`` field's ``dimension``): what the
        live index holds, whatever this store was configured with; None for a keyword-only index (``...-kw``).
        No index behind the alias yet: this store's own :attr:`dimension` (the index it would create). One
        ``_alias`` and one ``_mapping`` request; raises what the client raises."""
        current = self.live_index()
        if current is None:
            return self.dimension
        try:
            mapping = self.client.indices.get_mapping(index=current)[current]["mappings"]
        except NotFoundError:  # the alias moved between the two requests
            return self.dimension
        dim = mapping.get("_meta", {}).get("dimension")
        if dim is None:
            dim = mapping.get("properties", {}).get(F.EMBEDDING, {}).get("dimension")
        return int(dim) if dim else None

    def sync_guard(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to hold: distributed syncs wait for ``scopekb reindex`` through the coordination store."""
        return contextlib.nullcontext()

    def rebuild_guard(self, wait_s: float) -> contextlib.AbstractContextManager[None]:
        """Nothing to hold: ``scopekb reindex`` waits for running syncs through the coordination store, and the
        rebuild writes a new index behind the alias."""
        return contextlib.nullcontext()

    def index_model(self) -> str | None:
        """The embedding model id of the index behind the alias (``_meta.model`` as :func:`scopekb.fields.chunk_mapping`
        writes it; None for a keyword-only index); this store's own :attr:`model` when no index is behind the alias
        yet. One ``_alias`` and one ``_mapping`` request; raises what the client raises."""
        current = self.live_index()
        if current is None:
            return self.model if self.dimension else None
        try:
            mapping = self.client.indices.get_mapping(index=current)[current]["mappings"]
        except NotFoundError:  # the alias moved between the two requests
            return self.model if self.dimension else None
        return mapping.get("_meta", {}).get("model") or None

    def generation(self) -> str | None:
        """``_meta.generation`` of the index behind the alias: a random id :meth:`ensure_index` writes when it
        creates the index (and adds to an index made before), which ``scopekb reindex`` carries into the index it
        builds from this one; an index deleted and made again by the next sync has another. None when no index is
        behind the alias. One ``_mapping`` request; raises what the client raises."""
        res = self.client.indices.get_mapping(index=self.alias, params={"ignore": 404})
        gens = sorted(str(v["mappings"].get("_meta", {}).get("generation") or "") for v in res.values()
                      if isinstance(v, dict) and isinstance(v.get("mappings"), dict))
        return ",".join(gens) if gens and all(gens) else None

    def health(self) -> None:
        """Raise :class:`scopekb.errors.Transient` naming the reason when the cluster cannot serve the chunk index
        now: unreachable within 2 s, no elected cluster manager, or the index red (readiness)."""
        self.client.cluster.health(params={"local": "true", "request_timeout": 2})  # unreachable: its error
        why = self.problem()
        if why is not None:
            raise Transient(why)

    def _search(self, body: dict[str, Any], params: dict[str, str] | None = None) -> dict[str, Any]:
        """``client.search`` on the alias through :meth:`_sent_again`."""
        return self._sent_again(lambda: self.client.search(index=self.alias, body=body, params=params))

    def _msearch(self, body: list[dict[str, Any]]) -> dict[str, Any]:
        """``client.msearch`` through :meth:`_sent_again`, which also looks at each answer's ``error``."""
        return self._sent_again(lambda: self.client.msearch(body=body),
                                lambda res: any(lost_copy(item.get("error")) for item in res.get("responses", [])))

    def _sent_again(self, send: Callable[[], Any], lost_in: Callable[[Any], bool] = lambda _res: False) -> Any:
        """``send()``, sent again (at most :data:`LOST_COPY_RETRIES` times, :data:`LOST_COPY_PAUSE_S` apart) when it
        failed, or ``lost_in`` found an answer that failed, because a node holding a shard copy left mid-search
        (:func:`lost_copy`). The last attempt's answer is returned, or its error raised, as the client gives it."""
        for attempt in range(LOST_COPY_RETRIES + 1):
            last = attempt == LOST_COPY_RETRIES
            try:
                res = send()
            except TransportError as e:
                if last or not lost_copy(e):
                    raise
                reason = backend_reason(e)
            else:
                if last or not lost_in(res):
                    return res
                reason = "a lost shard copy in one answer"
            log.warning("opensearch_search_retried", reason=reason, attempt=attempt + 1)
            time.sleep(LOST_COPY_PAUSE_S)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _search_failure(self, exc: TransportError) -> ScopekbError:
        """scopekb's error for a failed search: :func:`translate_opensearch`'s, and when the cluster itself says
        why it cannot serve the chunk index (red, no elected cluster manager) a ``Transient`` naming that reason
        (:func:`explain_failure`)."""
        return explain_failure(self.client, translate_opensearch(exc), index=self.alias)

    def problem(self, recovering: bool = False) -> str | None:
        """Why the cluster cannot serve the chunk index now, in one line, or None (:func:`cluster_problem`; with
        ``recovering`` shard copies still initializing or relocating count too, and the system indices
        ``<system_prefix>-*`` are asked about with the chunk index: a worker asks after a failed step, and the step
        may have been a job record or sync state write refused with ``shard_not_in_primary_mode_exception`` while a
        system index's copies recover - issue 24, seen on a loaded machine with the chunk index already settled)."""
        index = f"{self.alias},{self.system_prefix}-*" if recovering and self.system_prefix else self.alias
        return cluster_problem(self.client, index=index, recovering=recovering)

    def cluster_health(self) -> dict[str, Any]:
        """The cluster as ``scopekb status`` and ``GET /v1/status`` show it, from the node reached's local view of
        ``_cluster/health`` (it answers without an elected cluster manager): ``{"store": "opensearch", "status":
        green|yellow|red|unreachable, "nodes", "data_nodes", "unassigned_shards", "problem": one line or None}``
        (``problem`` as :meth:`problem`, for the chunk index)."""
        try:
            h = self.client.cluster.health(params={"local": "true", "request_timeout": 5})
        except TransportError as e:
            return {"store": "opensearch", "status": "unreachable", "nodes": 0, "data_nodes": 0,
                    "unassigned_shards": None, "problem": f"unreachable: {type(e).__name__}"}
        return {"store": "opensearch", "status": str(h.get("status")), "nodes": int(h.get("number_of_nodes", 0)),
                "data_nodes": int(h.get("number_of_data_nodes", 0)),
                "unassigned_shards": int(h.get("unassigned_shards", 0)), "problem": self.problem()}

    def refresh(self) -> None:
        """Make every write so far visible to search (tests and the CLI; syncs rely on the refresh interval)."""
        self.client.indices.refresh(index=self.alias)

    # ---- writes ----------------------------------------------------------------------------------------------

    def bulk_write(self, docs: Iterable[dict[str, Any]], refresh: bool = False) -> BulkReport:
        """Index chunk documents (each with ``_id``) in bulk requests of about ``bulk_max_bytes``, up to
        ``bulk_in_flight`` requests at once.

        Per-item errors are inspected: 429 items are retried with backoff (up to 5 attempts, counted in
        ``BulkReport.retried``); any other error (e.g. a mapping error) is returned against the document's path,
        never dropped silently.
        """
        report = BulkReport()
        pending = [d for d in docs]
        attempt = 0
        while pending:
            retry: list[dict[str, Any]] = []
            actions = ({"_op_type": "index", "_index": self.alias, "_id": d["_id"],
                        "_source": self.stored_source(d)} for d in pending)
            by_id = {d["_id"]: d for d in pending}
            for ok, item in self._bulk(actions):
                info = item.get("index", {})
                if ok:
                    report.written += 1
                    continue
                doc_id = str(info.get("_id"))
                status = info.get("status")
                if status == 429 and attempt < 5:
                    retry.append(by_id[doc_id])
                    continue
                err = info.get("error")
                reason = err.get("reason", str(err)) if isinstance(err, dict) else str(err)
                cause = err.get("caused_by", {}).get("reason") if isinstance(err, dict) else None
                if cause and cause not in reason:
                    reason = f"{reason}: {cause}"
                report.errors.append((doc_id, str(by_id.get(doc_id, {}).get(F.PATH, "?")), f"{status}: {reason}"))
            pending = retry
            if pending:
                report.retried += len(pending)
                log.warning("bulk_item_429_retry", items=len(pending), attempt=attempt + 1)
                attempt += 1
                time.sleep(_jittered(min(8.0, 0.25 * 2**attempt)))
        if refresh:
            self.refresh()
        return report

    def stored_source(self, d: dict[str, Any]) -> dict[str, Any]:
        """The ``_source`` written for document ``d``: without ``_id``, the vector as this index's encoder takes it."""
        src = {k: v for k, v in d.items() if k != "_id"}
        if self.encoder == "int8" and src.get(F.EMBEDDING) is not None:
            src[F.EMBEDDING] = F.int8_vector(src[F.EMBEDDING])
        return src

    def _bulk(self, actions: Iterable[dict[str, Any]]) -> Iterator[tuple[bool, dict[str, Any]]]:
        """(ok, item) per action: requests cut at ``bulk_max_bytes`` (or 10,000 actions), ``bulk_in_flight`` of them
        sent at once (issue 20); transport failures come back as failed items, never raised."""
        if self.bulk_in_flight > 1:
            return helpers.parallel_bulk(self.client, actions, thread_count=self.bulk_in_flight,
                                         queue_size=self.bulk_in_flight, chunk_size=10_000,
                                         max_chunk_bytes=self.bulk_max_bytes, raise_on_error=False,
                                         raise_on_exception=False, params=_BULK_WRITE_PARAMS)
        return helpers.streaming_bulk(self.client, actions, max_chunk_bytes=self.bulk_max_bytes, chunk_size=10_000,
                                      raise_on_error=False, raise_on_exception=False, max_retries=0,
                                      params=_BULK_WRITE_PARAMS)

    def delete_path(self, scope_agent: str, scope_context: str, source_id: str, path: str,
                    keep_ids: Sequence[str] = ()) -> int:
        """Delete a document's chunks for one scope and source, except ``keep_ids`` (the chunks just written).

        Returns the number of chunks deleted.
        """
        query: dict[str, Any] = {"bool": {"filter": [
            {"term": {F.AGENT_NAME: scope_agent}}, {"term": {F.CONTEXT_ID: scope_context}},
            {"term": {F.SOURCE_ID: source_id}}, {"term": {F.PATH: path}}]}}
        if keep_ids:
            query["bool"]["must_not"] = [{"ids": {"values": list(keep_ids)}}]
        return self._delete_by_query(query)

    def delete_paths(self, scope_agent: str, scope_context: str, source_id: str, paths: Sequence[str],
                     keep_ids: Sequence[str] = ()) -> int:
        """Delete the chunks of several paths of one scope and source, except ``keep_ids``, in one request per
        1,000 paths. Returns the number of chunks deleted."""
        total = 0
        for i in range(0, len(paths), 1000):
            query: dict[str, Any] = {"bool": {"filter": [
                {"term": {F.AGENT_NAME: scope_agent}}, {"term": {F.CONTEXT_ID: scope_context}},
                {"term": {F.SOURCE_ID: source_id}}, {"terms": {F.PATH: list(paths[i:i + 1000])}}]}}
            if keep_ids:
                query["bool"]["must_not"] = [{"ids": {"values": list(keep_ids)}}]
            total += self._delete_by_query(query)
        return total

    def delete_source(self, source_id: str, paths: Sequence[str] | None = None) -> int:
        """Delete every chunk of a source (all its scopes), or only those of ``paths``. Returns chunks deleted."""
        flt: list[dict[str, Any]] = [{"term": {F.SOURCE_ID: source_id}}]
        total = 0
        if paths is None:
            return self._delete_by_query({"bool": {"filter": flt}})
        for i in range(0, len(paths), 1000):
            total += self._delete_by_query(
                {"bool": {"filter": [*flt, {"terms": {F.PATH: list(paths[i:i + 1000])}}]}})
        return total

    # ---- ref membership (issue 23) ---------------------------------------------------------------------------

    def chunk_refs(self, ids: Sequence[str]) -> dict[str, list[str]]:
        """``id -> refs`` of the chunks among ``ids`` that exist (real-time: writes not yet refreshed count)."""
        out: dict[str, list[str]] = {}
        ids = list(dict.fromkeys(ids))
        for i in range(0, len(ids), 1000):
            try:
                res = self.client.mget(index=self.alias, body={"ids": ids[i:i + 1000]},
                                       params={"_source_includes": f"{F.REFS},{F.REF}", "realtime": "true"})
            except NotFoundError:
                return out
            for d in res.get("docs", []):
                if d.get("found"):
                    src = d.get("_source") or {}
                    refs = src.get(F.REFS)
                    out[d["_id"]] = list(refs) if isinstance(refs, list) else [refs or src.get(F.REF) or ""]
        return out

    def set_refs(self, refs_by_id: dict[str, list[str]]) -> BulkReport:
        """Replace the ``refs`` of existing chunks (partial updates: content and vectors are not sent again)."""
        report = BulkReport()
        actions = ({"_op_type": "update", "_index": self.alias, "_id": i, "doc": {F.REFS: sorted(set(r))}}
                   for i, r in refs_by_id.items())
        for ok, item in helpers.streaming_bulk(self.client, actions, chunk_size=1000, raise_on_error=False,
                                               raise_on_exception=False, max_retries=3, params=_BULK_PARAMS):
            info = item.get("update", {})
            if ok:
                report.written += 1
            else:
                report.errors.append((str(info.get("_id")), "?", f"{info.get('status')}: {info.get('error')}"))
        return report

    def set_vectors(self, vectors_by_id: dict[str, tuple[Sequence[float], str]], model: str) -> BulkReport:
        """:meth:`ChunkStore.set_vectors` as partial updates (the stored ``_source`` keeps no vector, mapping version
        6, but derived source gives it back to every later partial update or update_by_query, so a membership
        change keeps it). A 404 (the chunk is gone) is skipped."""
        report = BulkReport()
        actions = ({"_op_type": "update", "_index": self.alias, "_id": i,
                    "doc": {F.EMBEDDING: F.stored_vector(vec, self.encoder), F.EMBEDDING_MODEL: model,
                            F.BLOB_SHA: blob}}
                   for i, (vec, blob) in vectors_by_id.items())
        for ok, item in helpers.streaming_bulk(self.client, actions, chunk_size=500, raise_on_error=False,
                                               raise_on_exception=False, max_retries=3, params=_BULK_PARAMS):
            info = item.get("update", {})
            if ok:
                report.written += 1
            elif info.get("status") != 404:
                report.errors.append((str(info.get("_id")), "?", f"{info.get('status')}: {info.get('error')}"))
        return report

    def remove_ref(self, scope_agent: str, scope_context: str, source_id: str, ref: str,
                   paths: Sequence[str] | None = None, keep_ids: Sequence[str] = (),
                   ids: Sequence[str] | None = None) -> tuple[int, int]:
        """Take ``ref`` out of the membership of the chunks of one scope and source (only those of ``paths``, or
        with ``ids``, when given), except ``keep_ids``; a chunk left with no ref is deleted. Returns ``(unlinked,
        deleted)``.

        Refreshes first, so the query sees every membership change of the sync so far (an update-by-query that
        met a version it did not see would skip the chunk).
        """
        self.refresh()
        base: list[dict[str, Any]] = [
            {"term": {F.AGENT_NAME: scope_agent}}, {"term": {F.CONTEXT_ID: scope_context}},
            {"term": {F.SOURCE_ID: source_id}}, {"term": {F.REFS: ref}}]
        if ids is not None:
            if not ids:
                return 0, 0
            base.append({"ids": {"values": list(ids)}})
        parts: list[list[str] | None] = [None] if paths is None else [
            list(paths[i:i + 1000]) for i in range(0, len(paths), 1000)]
        script = {"lang": "painless", "params": {"ref": ref}, "source": (
            f"def r = ctx._source.{F.REFS}; if (!(r instanceof List)) {{ r = [r]; }}"
            f" r.removeIf(x -> x == params.ref); ctx._source.{F.REFS} = r;"
            " if (r.isEmpty()) { ctx.op = 'delete'; }")}
        unlinked = deleted = 0
        for part in parts:
            query: dict[str, Any] = {"bool": {"filter": [*base, *([{"terms": {F.PATH: part}}] if part else [])]}}
            if keep_ids:
                query["bool"]["must_not"] = [{"ids": {"values": list(keep_ids)}}]
            res = self._by_query("update_by_query", {"query": query, "script": script})
            unlinked += int(res.get("updated", 0)) + int(res.get("deleted", 0))
            deleted += int(res.get("deleted", 0))
        return unlinked, deleted

    def copy_ref(self, scope_agent: str, scope_context: str, source_id: str, from_ref: str, to_ref: str,
                 exclude_paths: Sequence[str] = (), exclude_ids: Sequence[str] = ()) -> int:
        """Make every chunk of ``from_ref`` (one scope and source) a member of ``to_ref`` too, except the chunks
        of ``exclude_paths``: a new ref starts as a copy of the nearest indexed one, without writing a chunk.
        Returns the chunks that joined ``to_ref``."""
        self.refresh()
        query: dict[str, Any] = {"bool": {"filter": [
            {"term": {F.AGENT_NAME: scope_agent}}, {"term": {F.CONTEXT_ID: scope_context}},
            {"term": {F.SOURCE_ID: source_id}}, ref_clause(from_ref)]}}
        if exclude_paths or exclude_ids:
            query["bool"]["must_not"] = [*([{"terms": {F.PATH: list(exclude_paths)}}] if exclude_paths else []),
                                         *([{"ids": {"values": list(exclude_ids)}}] if exclude_ids else [])]
        script = {"lang": "painless", "params": {"ref": to_ref, "old": from_ref}, "source": (
            f"def r = ctx._source.{F.REFS}; if (r == null) {{ r = [params.old]; }}"
            " else if (!(r instanceof List)) { r = [r]; }"
            " if (r.contains(params.ref)) { ctx.op = 'noop'; }"
            f" else {{ r.add(params.ref); ctx._source.{F.REFS} = r; }}")}
        return int(self._by_query("update_by_query", {"query": query, "script": script}).get("updated", 0))

    def _by_query(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """Run ``delete_by_query``/``update_by_query`` on the alias (conflicts proceed), retrying 429/503 with
        jittered backoff up to 5 times; ``{}`` when the index does not exist. See :meth:`_run_by_query_task`."""
        for attempt in range(6):
            try:
                return self._run_by_query_task(op, self.alias, body)
            except NotFoundError:
                return {}
            except TransportError as e:
                if e.status_code in (429, 503) and attempt < 5:
                    time.sleep(_jittered(0.25 * 2**attempt))
                    continue
                raise
        return {}

    def _run_by_query_task(self, op: str, index: str, body: dict[str, Any], refresh: bool = False,
                           timeout_s: float = 900.0) -> dict[str, Any]:
        """Start ``op`` (``update_by_query``/``delete_by_query``) as a background task and wait for its result
        through the tasks API; returns the task's response (``updated``, ``deleted``, ``failures`` ...).

        Not one blocking request: OpenSearch 2.19 adds a ``TASK_RESOURCE_USAGE`` response header for every scroll
        batch of a by-query request, and Python's ``http.client`` refuses a response with more than 100 headers
        (``got more than 100 headers``: measured on 130,000 chunks, i.e. django's membership copy), after which
        the client's retry would run the whole operation again. A long operation also needs no 15-minute HTTP
        request. Raises :class:`opensearchpy.TransportError` when the task fails (its ``error``), with status
        504 when it has not finished within ``timeout_s`` seconds (the task keeps running on the cluster), and with
        status 503 naming the reason as soon as the cluster says it cannot serve (red, no elected cluster manager:
        the task's writes wait for a cluster that may stay red for minutes, longer than a sync's time limit; the
        task is cancelled, best effort, and the caller redoes the idempotent operation later; issue 24)."""
        started = getattr(self.client, op)(index=index, body=body, conflicts="proceed", refresh=refresh,
                                           params={"slices": "auto", "wait_for_completion": "false",
                                                   "scroll_size": self.by_query_batch, "request_timeout": 60})
        task_id = started["task"]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                res = self.client.tasks.get(task_id=task_id, params={
                    "wait_for_completion": "true", "timeout": f"{BY_QUERY_WAIT_S}s", "request_timeout": 60})
            except TransportError as e:
                # not finished within the wait's timeout: 408, or (OpenSearch 2.19, seen on a loaded machine) 500
                # with error timeout_exception
                if e.status_code != 408 and e.error != "timeout_exception":
                    raise
                res = {"completed": False}
            if res.get("completed"):
                break
            why = answered_problem(cluster_problem(self.client, index=index))
            if why is not None:
                with contextlib.suppress(Exception):  # the task may be gone with its node
                    self.client.tasks.cancel(task_id=task_id, params={"request_timeout": 5})
                raise TransportError(503, "cluster_unavailable", f"{op} task {task_id} abandoned: {why}")
            if time.monotonic() > deadline:
                raise TransportError(504, "by_query_timeout",
                                     f"{op} task {task_id} did not finish within {timeout_s:.0f} s")
        if res.get("error"):
            err = res["error"]
            raise TransportError(500, str(err.get("type", "by_query_failed")), err)
        return dict(res.get("response") or {})

    def _delete_by_query(self, query: dict[str, Any]) -> int:
        return int(self._by_query("delete_by_query", {"query": query}).get("deleted", 0))

    # ---- reads -----------------------------------------------------------------------------------------------

    def indexed_paths(self, source_id: str, agent_name: str | None = None,
                      context_id: str | None = None) -> set[str]:
        """Every path that has chunks for a source (optionally one scope), via a paged composite aggregation."""
        flt: list[dict[str, Any]] = [{"term": {F.SOURCE_ID: source_id}}]
        if agent_name is not None:
            flt.append({"term": {F.AGENT_NAME: agent_name}})
        if context_id is not None:
            flt.append({"term": {F.CONTEXT_ID: context_id}})
        return {b[F.PATH] for b in self._composite(flt, [F.PATH])}

    def indexed_blobs(self, source_id: str, agent_name: str, context_id: str,
                      ref: str | None = None, overlay: RefOverlay | None = None) -> dict[str, str]:
        """path → blob id of what one scope of a source holds: the blob of the path's most recent write.

        A changed file rewrites only its changed chunks (issue 20), so a path's chunks normally carry several blob
        ids; the one written last (greatest ``indexed_at``) names the version the path was last brought to. Two
        blob ids sharing the latest write time (a chunk altered behind scopekb's back) give ``""``: the path is
        treated as changed and rewritten. One composite aggregation of (path, blob id) with ``max(indexed_at)``.
        """
        flt: list[dict[str, Any]] = [{"term": {F.SOURCE_ID: source_id}}, {"term": {F.AGENT_NAME: agent_name}},
                                     {"term": {F.CONTEXT_ID: context_id}},
                                     *([member_clause(ref, [overlay] if overlay else [])] if ref else [])]
        return newest_blob_per_path(
            (b[F.PATH], b[F.BLOB_SHA], float(b.get("t") or 0.0))
            for b in self._composite(flt, [F.PATH, F.BLOB_SHA], sub={"t": {"max": {"field": F.INDEXED_AT}}}))

    def chunk_versions(self, agent_name: str, context_id: str, source_id: str, paths: Sequence[str],
                       ref: str | None = None,
                       overlay: RefOverlay | None = None) -> dict[str, dict[str, tuple[str, str]]]:
        """What one scope of a source holds for ``paths``: path → {chunk id: (blob id, indexed_at)} (issue 20:
        the sync compares these ids with the new chunks' ids, writes only the missing ones and deletes only the
        vanished ones). One search per 1,000 paths; a scroll when more than 10,000 chunks match."""
        out: dict[str, dict[str, tuple[str, str]]] = {}
        for i in range(0, len(paths), 1000):
            query = {"bool": {"filter": [
                {"term": {F.AGENT_NAME: agent_name}}, {"term": {F.CONTEXT_ID: context_id}},
                {"term": {F.SOURCE_ID: source_id}}, {"terms": {F.PATH: list(paths[i:i + 1000])}},
                *([member_clause(ref, [overlay] if overlay else [])] if ref else [])]}}
            fields = [F.PATH, F.BLOB_SHA, F.INDEXED_AT]
            try:
                res = self.client.search(index=self.alias, body={"query": query, "size": 10000,
                                                                 "_source": fields, "track_total_hits": True})
            except NotFoundError:
                return out
            hits = res["hits"]["hits"]
            if res["hits"]["total"]["value"] > len(hits):
                hits = helpers.scan(self.client, index=self.alias, query={"query": query, "_source": fields},
                                    size=5000)
            for h in hits:
                src = h["_source"]
                out.setdefault(src[F.PATH], {})[h["_id"]] = (src.get(F.BLOB_SHA) or "", src.get(F.INDEXED_AT) or "")
        return out

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Delete chunks by id in bulk requests; ids already gone are not errors. Returns chunks deleted.

        Raises:
            opensearchpy.TransportError: a request failed (the sync fails and is retried).
        """
        deleted = 0
        actions = ({"_op_type": "delete", "_index": self.alias, "_id": i} for i in ids)
        for ok, item in helpers.streaming_bulk(self.client, actions, chunk_size=1000, raise_on_error=False,
                                               raise_on_exception=True, max_retries=3, params=_BULK_PARAMS):
            info = item.get("delete", {})
            if ok and info.get("result") == "deleted":
                deleted += 1
            elif not ok and info.get("status") != 404:
                raise TransportError(info.get("status", "N/A"), str(info.get("error")), info)
        return deleted

    def _composite(self, flt: list[dict[str, Any]], keys: list[str],
                   sub: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Buckets of a composite aggregation over ``keys`` (paged), each with ``doc_count`` and the ``value`` of
        every single-value sub-aggregation in ``sub`` under its name."""
        after: dict[str, Any] | None = None
        while True:
            comp: dict[str, Any] = {"size": 1000, "sources": [{k: {"terms": {"field": k}}} for k in keys]}
            if after:
                comp["after"] = after
            agg_body: dict[str, Any] = {"composite": comp}
            if sub:
                agg_body["aggs"] = sub
            try:
                res = self.client.search(index=self.alias, body={
                    "size": 0, "query": {"bool": {"filter": flt}}, "aggs": {"c": agg_body}})
            except NotFoundError:
                return
            agg = res["aggregations"]["c"]
            for b in agg["buckets"]:
                yield {**b["key"], "doc_count": b["doc_count"], **{n: b[n].get("value") for n in (sub or {})}}
            after = agg.get("after_key")
            if not after or not agg["buckets"]:
                return

    def count(self, flt: list[dict[str, Any]] | None = None) -> int:
        """Number of chunks matching filter clauses (all chunks when None)."""
        body = {"query": {"bool": {"filter": flt}}} if flt else {"query": {"match_all": {}}}
        try:
            return int(self.client.count(index=self.alias, body=body)["count"])
        except NotFoundError:
            return 0

    def source_stats(self, source_id: str) -> dict[str, int]:
        """``{"documents": distinct paths, "chunks": chunk count}`` for one source."""
        flt = [{"term": {F.SOURCE_ID: source_id}}]
        try:
            res = self.client.search(index=self.alias, body={
                "size": 0, "track_total_hits": True, "query": {"bool": {"filter": flt}},
                "aggs": {"docs": {"cardinality": {"field": F.PATH, "precision_threshold": 40000}}}})
        except NotFoundError:
            return {"documents": 0, "chunks": 0}
        return {"documents": int(res["aggregations"]["docs"]["value"]),
                "chunks": int(res["hits"]["total"]["value"])}

    def find_blob(self, flt: SearchFilter, path: str, blob_sha: str) -> dict[str, Any] | None:
        """Stored fields (without content and vector) of one chunk of ``path`` at ``blob_sha`` within ``flt`` (its
        scope, and its repo/source/ref when set), plus its id under ``"_id"``, or None. Among several (refs,
        sources, contexts), the most recently indexed one."""
        body = {"size": 1, "query": {"bool": {"filter": [*filter_clauses(flt), {"term": {F.PATH: path}},
                                                         {"term": {F.BLOB_SHA: blob_sha}}]}},
                "sort": [{F.INDEXED_AT: "desc"}, {F.SOURCE_ID: "asc"}],
                "_source": {"excludes": [F.EMBEDDING, F.CONTENT]}}
        try:
            res = self._search(body)
        except NotFoundError:
            return None
        except TransportError as e:
            raise self._search_failure(e) from e
        hits = res["hits"]["hits"]
        return {**hits[0]["_source"], "_id": hits[0]["_id"]} if hits else None

    def keyword_search(self, query: str, flt: SearchFilter, size: int, offset: int = 0,
                       boosts: tuple[float, ...] | None = None) -> list[RawHit]:
        """BM25 over symbol^5, signature^3, content and path^2 (:data:`F.KEYWORD_MATCH`; ``boosts``: other field
        boosts in that order, :func:`F.keyword_fields`), within ``filters``.

        The fields are searched as one (``cross_fields``: each query term scores by its best field plus 0.3 of
        the others), like the SQLite store's FTS5 ``bm25()`` over all its columns; ``best_fields`` (the best field
        for the whole query) lost NDCG@10 0.442 → 0.533 and 0.609 → 0.684 on two docstring sets (issue 21,
        docs/benchmarks.md). The terms sent are :func:`scopekb.stores.sqlite.text.keyword_terms` (no English stop
        words, identifier parts added), as on SQLite. Returns ``(doc id, raw BM25 score, _source)`` best first;
        ties are broken by content sha, chunk index and path so pages are stable.
        """
        try:
            res = self._search(self._keyword_body(query, flt, size, offset, boosts), _WHOLE_RESULTS)
        except NotFoundError:
            return []
        except TransportError as e:
            raise self._search_failure(e) from e
        return _raw_hits(res)

    @staticmethod
    def _keyword_body(query: str, flt: SearchFilter, size: int, offset: int = 0,
                      boosts: tuple[float, ...] | None = None) -> dict[str, Any]:
        return {
            "size": size, "from": offset,
            "query": {"bool": {"filter": filter_clauses(flt), "must": [{"multi_match": {
                "query": " ".join(keyword_terms(query)), **F.KEYWORD_MATCH,
                **({"fields": F.keyword_fields(boosts)} if boosts is not None else {})}}]}},
            "sort": [{"_score": "desc"}, {F.CONTENT_SHA: "asc"}, {F.CHUNK_INDEX: "asc"}, {F.PATH: "asc"},
                     {F.SOURCE_ID: "asc"}, {F.CONTEXT_ID: "asc"}, {F.AGENT_NAME: "asc"}],
            "track_scores": True,
            "_source": {"excludes": [F.EMBEDDING]},
        }

    def vector_search(self, vector: Sequence[float], flt: SearchFilter, k: int) -> list[RawHit]:
        """kNN (lucene hnsw, cosinesimil) with the filters inside the ``knn`` clause, so k hits come back when
        k matching chunks exist. Scores are the plugin's ``(1 + cos) / 2`` in [0, 1] (with ``int8``, the cosine of
        the int8 vectors: the query vector is converted like the stored ones).

        With scalar quantization (``encoder`` ``sq``) the graph search ranks by the 7-bit vectors, which on
        clustered test vectors gave recall@10 of 0.94-0.96 against exact search; so ``4k`` candidates (at least
        40) are taken and rescored with the exact cosine of the full-precision vectors Lucene keeps beside the
        quantized ones (the ``knn_score`` script, which scores ``(1 + cos) / 2`` too), and the best k kept.

        Raises :class:`IndexVersionMismatch` when the index's vectors are of another dimension, model or encoder
        than this store's (:meth:`_check_vector_index`), and what :meth:`_search_failure` raises.
        """
        if not self.dimension:
            return []
        try:
            res = self._search(self._vector_body(vector, flt, k), _WHOLE_RESULTS)
        except NotFoundError:
            return []
        except RequestError as e:
            raise self._vector_failure(e) from e
        except TransportError as e:
            raise self._search_failure(e) from e
        self._check_vector_index(res)
        return _raw_hits(res)

    def _check_vector_index(self, res: dict[str, Any]) -> None:
        """Raise :class:`IndexVersionMismatch` when the kNN hits of ``res`` come from an index whose vectors are of
        another model or encoder than this process embeds queries with (hostile review of issue 19: a query
        service left running while ``scopekb reindex`` switched ``embedding.local_backend``, or a CLI search with
        other settings, ranked by the cosine between two vector spaces of the same dimension and said nothing).

        Free on the common path: a hit's ``_index`` is the concrete index name, which encodes model and encoder
        (:func:`scopekb.fields.index_version_name`); only an index of another name has its ``_meta`` read, once
        (then remembered when it matches, e.g. an index made before the model was recorded, which is accepted as
        :meth:`ensure_index` accepts it). No hits: nothing was ranked, nothing to check."""
        if not self.dimension or self.model is None:
            return
        for h in res["hits"]["hits"]:
            index = h.get("_index")
            if not index or index in self._vetted:
                continue
            try:
                meta = self.client.indices.get_mapping(index=index)[index]["mappings"].get("_meta", {})
            except NotFoundError:  # deleted since the search: the next search reads the index the alias names now
                continue
            for key, want in (("model", self.model), ("encoder", self.encoder)):
                have = meta.get(key)
                if have is not None and have != want:
                    fix = (model_mismatch_fix(have, want) if key == "model" else "Run `scopekb reindex`.")
                    raise IndexVersionMismatch(
                        f"index {index!r} behind alias {self.alias!r} holds vectors of {key} {have!r}; this process "
                        f"embeds queries with {want!r}. {fix}")
            self._vetted.add(index)

    def _vector_failure(self, e: RequestError) -> Exception:
        if "dimension" in str(e.info).lower():
            return IndexVersionMismatch(
                f"the index behind {self.alias!r} was rebuilt for another embedding model; restart this "
                "process with the new model settings")
        return self._search_failure(e)

    def _vector_body(self, vector: Sequence[float], flt: SearchFilter, k: int) -> dict[str, Any]:
        depth = max(4 * k, 40) if self.encoder == "sq" else k
        body: dict[str, Any] = {"size": k, "query": {"knn": {F.EMBEDDING: {
            "vector": F.stored_vector(vector, self.encoder), "k": depth,
            "filter": {"bool": {"filter": filter_clauses(flt)}},
            # lucene's default ef_search (= k) gave recall@10 of 0.73 on random vectors here; 100 gave 0.99.
            "method_parameters": {"ef_search": max(100, depth)}}}},
            "_source": {"excludes": [F.EMBEDDING]}}
        if self.encoder == "sq":
            body["rescore"] = {"window_size": depth, "query": {
                "query_weight": 0.0, "rescore_query_weight": 1.0, "rescore_query": {"script_score": {
                    "query": {"match_all": {}},
                    "script": {"source": "knn_score", "lang": "knn", "params": {
                        "field": F.EMBEDDING, "query_value": list(vector), "space_type": "cosinesimil"}}}}}}
        return body

    def hybrid_search(self, query: str, vector: Sequence[float], flt: SearchFilter, size: int, k: int,
                      boosts: tuple[float, ...] | None = None) -> tuple[list[RawHit], list[RawHit]]:
        """:meth:`keyword_search` (``size``, ``boosts``) and :meth:`vector_search` (``k``) in one round trip
        (``_msearch``, issue 20): ``(keyword hits, vector hits)``, each as its method returns them. Raises what
        they raise."""
        if not self.dimension:
            return self.keyword_search(query, flt, size, boosts=boosts), []
        head = {"index": self.alias, "allow_partial_search_results": False}
        body = [head, self._keyword_body(query, flt, size, 0, boosts), head, self._vector_body(vector, flt, k)]
        try:
            res = self._msearch(body)
        except NotFoundError:
            return [], []
        except TransportError as e:
            raise self._search_failure(e) from e
        out: list[list[RawHit]] = []
        for item in res["responses"]:
            err = item.get("error")
            if err is not None:
                status = int(item.get("status") or 500)
                if status == 404:
                    out.append([])
                    continue
                exc_type = RequestError if status == 400 else TransportError
                e = exc_type(status, str(err.get("type") if isinstance(err, dict) else err), err)
                if len(out) == 1 and isinstance(e, RequestError):
                    raise self._vector_failure(e) from e
                raise self._search_failure(e) from e
            if len(out) == 1:
                self._check_vector_index(item)
            out.append(_raw_hits(item))
        return out[0], out[1]

    def literal_candidates(self, lq: LiteralQuery, flt: SearchFilter, limit: int) -> Iterator[RawHit]:
        """Chunks within ``flt`` whose ``content.tri`` (every 3-gram of the content, :func:`F.trigram_clauses`)
        holds the 3-grams of every literal of one group of ``lq`` (ASCII case variants when ``lq`` ignores case): a
        superset of the chunks holding the literals; all chunks of ``flt`` when ``lq.groups`` is empty. Pages of 500
        by ``search_after`` in path / chunk index order, at most ``limit``. Raises ``Transient``/``Refused``."""
        clauses = filter_clauses(flt)
        if lq.groups:
            budget = max(1, F.MAX_TRIGRAM_CLAUSES // len(lq.groups))
            should = [F.trigram_clauses(list(g), lq.case_sensitive, budget) for g in lq.groups]
            if all(should):  # a group without a 3-gram filters nothing, and so does the OR of the groups
                clauses.append({"bool": {"should": [{"bool": {"filter": c}} for c in should],
                                         "minimum_should_match": 1}})
        yield from self._ordered(clauses, limit)

    def symbol_candidates(self, sq: SymbolQuery, flt: SearchFilter, limit: int) -> list[RawHit]:
        """Chunks within ``flt`` whose ``def_names`` (or ``def_paths``) equal or start with ``sq.text``
        lower-cased (keyword fields with a lower-case normalizer), optionally with a kind in ``sq.kinds``; at most
        ``limit`` in path / chunk index order. Raises ``Transient``/``Refused``."""
        field = F.DEF_PATHS if sq.field == "path" else F.DEF_NAMES
        clauses = filter_clauses(flt)
        clauses.append({"prefix" if sq.prefix else "term": {field: sq.text.lower()}})
        if sq.kinds:
            clauses.append({"terms": {F.DEF_KINDS: list(sq.kinds)}})
        return list(self._ordered(clauses, limit))

    def _ordered(self, clauses: list[dict[str, Any]], limit: int) -> Iterator[RawHit]:
        after: list[Any] | None = None
        seen = 0
        while seen < limit:
            size = min(500, limit - seen)
            body: dict[str, Any] = {"size": size, "query": {"bool": {"filter": clauses}}, "sort": _TEXT_ORDER,
                                    "track_total_hits": False, "_source": {"excludes": [F.EMBEDDING]}}
            if after is not None:
                body["search_after"] = after
            try:
                res = self._search(body, _WHOLE_RESULTS)
            except NotFoundError:
                return
            except TransportError as e:
                raise self._search_failure(e) from e
            hits = res["hits"]["hits"]
            for h in hits:
                yield h["_id"], 1.0, h["_source"]
            seen += len(hits)
            if len(hits) < size:
                return
            after = hits[-1]["sort"]
