"""The sync pipeline as plain functions: fetch, diff, read, store blobs, chunk, bulk-write, delete stale.

Celery tasks (workers) and the CLI call :func:`run_sync`; nothing here knows about Celery or HTTP.

One sync brings every given source of one repository to the ref's current commit:

1. fetch the bare mirror once;
2. per source, diff its last indexed commit (sync state) against the target in git, or list the whole tree
   when there is no usable state (first sync, force push that dropped the old commit);
3. read each changed blob once (``cat-file --batch``), skip non-text with a recorded reason, and put the
   bytes in the blob store under a content-addressed key;
4. per batch of files: read blobs back from the store, chunk once per blob, write the chunks of every bound
   scope with deterministic ids, delete the stale chunks of those paths;
5. delete the chunks of removed and renamed-away paths;
6. advance each source's sync state only when all of its writes succeeded.

Faults (DESIGN §11, issue 12): the sync state carries a ``writing`` marker while a sync writes, so the next sync
knows when one died half-way (a file's chunks may be partly written) and re-plans what it touched; bulk items
OpenSearch could not take (unreachable, 429, 5xx) are re-sent with jittered backoff, bounded, and then the sync
fails as :class:`StoreUnavailable` for the task to retry later; a file whose chunking kills the process every
time is counted per attempt (:class:`FileAttempts`) and, past the limit, skipped and parked as a dead letter;
a verifying sync (``verify=True``, the reconcile) compares the index with git's tree by content id and repairs
what differs even when the sync state says the source is up to date.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Container, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from scopekb import fields as F
from scopekb import filetypes, gitattributes, overlays
from scopekb.blobs import BlobStore, BlobUploads, LocalBlobStore, blob_key
from scopekb.chunking import TokenCounter, chunk_document, embedding_text
from scopekb.documents import (
    DOCUMENT_SUFFIXES,
    OBJECT_METADATA_KEY,
    DocumentError,
    FolderPrefix,
    ObjectPrefix,
    document_prefix,
    to_text,
)
from scopekb.embedding import Embedder, EmbeddingCache, embed_with_cache
from scopekb.embedding.limits import backoff_delay
from scopekb.errors import Refused, Transient
from scopekb.gitrepo import MODE_GITLINK, MODE_SYMLINK, Mirror, TreeEntry, is_sha
from scopekb.logging import get_logger
from scopekb.models import Chunk, Job, JobStage, JobState, Source, utcnow
from scopekb.refs import cap_refs, match_refs, put_ref_state, ref_states, unfit_refs
from scopekb.settings import Settings, git_cache_dir
from scopekb.stores.base import BulkReport, ChunkStore, RecordStore, answered_problem

log = get_logger(__name__)

SKIP_UNSUPPORTED = "unsupported_document"
SKIP_UNREADABLE = "unreadable_document"
#: Skip reasons of files whose chunking crashed the process too often, or raised.
SKIP_POISON = "poison"
SKIP_CHUNKING_ERROR = "chunking_error"

#: Bulk items OpenSearch did not take because it was unreachable, busy or failing (``status: reason`` prefixes
#: of :class:`BulkReport` errors) are re-sent up to this many rounds, with jittered exponential backoff
#: (about 40 s in all), before the sync gives up with :class:`StoreUnavailable`.
BULK_RETRY_ROUNDS = 6
BULK_BACKOFF_BASE_S = 1.0
BULK_BACKOFF_MAX_S = 20.0
_TRANSIENT_BULK_STATUSES = frozenset({"N/A", "TIMEOUT", "429", "502", "503", "504"})

#: Test-only fault injection: with ``SCOPEKB_TESTING_FAULTS=1``, chunking a path listed (comma-separated) in
#: ``SCOPEKB_TEST_CRASH_CHUNKING`` ends the process at once (``os._exit``), as a segfault or OOM kill would.
TESTING_FAULTS_ENV = "SCOPEKB_TESTING_FAULTS"
CRASH_CHUNKING_ENV = "SCOPEKB_TEST_CRASH_CHUNKING"

#: Progress callback: (phase, done, total). Phases: "read", "index".
Progress = Callable[[str, int, int], None]


class SyncError(Refused):
    """A sync cannot run (no sources, sources of different repositories, ref missing): permanent, not retried."""


class StoreUnavailable(Transient):
    """OpenSearch kept refusing or not answering writes through the bounded bulk retries (transient: the task
    retries the sync later; nothing was recorded as indexed)."""


class FileAttempts(Protocol):
    """Attempts at chunking one file (``path`` at blob ``sha``) for a group of sources, counted where they
    survive the process (Redis in the worker), so a file whose chunking kills the process every time is noticed
    on the next delivery of the task instead of crashing it forever. Used only for jobs that were already
    redelivered after a death (``job.retries["redelivered"]``), so a file is parked after ``limit`` counted
    deaths plus the first, uncounted one.

    Attributes:
        limit: attempts allowed; the next one is not made: the file is skipped and :meth:`park` is called.
    """

    limit: int

    def begin(self, source_ids: Sequence[str], path: str, sha: str) -> int:
        """Count an attempt that is about to start; returns the attempts so far, this one included."""
        ...

    def done(self, source_ids: Sequence[str], path: str, sha: str) -> None:
        """The attempt finished (the process survived it): forget the count (may be deferred until the next
        :meth:`begin` or :meth:`flush`)."""
        ...

    def flush(self) -> None:
        """Send deferred :meth:`done` calls (called after each batch's chunking, before its writes)."""
        ...

    def park(self, job: Job, path: str, sha: str, attempts: int) -> None:
        """Record the file as a dead letter (replaying it retries the sync with the count reset)."""
        ...


class EmbedSink(Protocol):
    """Where the sync stage sends embedding work when embedding is its own stage (issue 19,
    ``worker.embed_queue``), and where the embedding stage records finished parts.

    Distributed: :meth:`send` enqueues a ``scopekb.embed_chunks`` task on the embedding queue; results live in the
    coordination backend (Redis). Embedded: parts are kept and run in this process by :meth:`run_pending` right
    after the sync stage. Both: :class:`scopekb.runtime.QueuedEmbedSink`, :class:`scopekb.runtime.LocalEmbedSink`.
    """

    def send(self, job_id: str, run: str, part: int, items: list[list[str]]) -> None:
        """Queue one part: ``items`` = ``[[chunk id, text to embed, blob sha], ...]``. Broker errors propagate
        (:class:`scopekb.errors.Transient`)."""
        ...

    def part_done(self, job_id: str, run: str, part: int, result: dict[str, Any]) -> None:
        """Record a finished part's counts (idempotent per ``(job_id, run, part)``)."""
        ...

    def parts_done(self, job_id: str, run: str) -> list[dict[str, Any]]:
        """Every finished part's counts of one run."""
        ...

    def run_pending(self, deps: SyncDeps) -> None:
        """Run parts kept in this process (embedded); a no-op where workers take them from a queue."""
        ...


@dataclass
class SyncDeps:
    """What a sync needs: settings, the three stores and, unless keyword-only, the embedder and its cache."""

    settings: Settings
    records: RecordStore
    chunks: ChunkStore
    blobs: BlobStore
    embedder: Embedder | None = None
    embed_cache: EmbeddingCache | None = None
    counter: TokenCounter | None = None
    #: Crash-survivable attempt counts per file, used once a job was redelivered after its process died (None: not
    #: tracked, e.g. the embedded profile's one process).
    attempts: FileAttempts | None = None
    #: Embedding as its own stage (issue 19): chunks are written without vectors and their texts sent here; None:
    #: the sync embeds its chunks itself.
    embed_sink: EmbedSink | None = None
    #: Folder of object-store sources' documents (the embedded profile); None: S3. When not given, a runtime
    #: whose blobs are a local folder (embedded) and that was given no S3 settings keeps documents next to them.
    documents_dir: Path | None = None

    def __post_init__(self) -> None:
        if (self.documents_dir is None and isinstance(self.blobs, LocalBlobStore)
                and "s3" not in self.settings.model_fields_set):
            self.documents_dir = self.blobs.root.parent / "documents"


@dataclass
class _Plan:
    source: Source
    from_commit: str | None
    to_index: list[str] = field(default_factory=list)
    to_delete: list[str] = field(default_factory=list)
    #: Paths being re-indexed that may already have chunks (modified, or present in the index before).
    maybe_stale: set[str] = field(default_factory=set)
    #: The sync state record as read before planning (restored without the ``writing`` marker if needed).
    state: dict[str, Any] = field(default_factory=dict)
    #: A verifying sync of an up-to-date source: paths the index lacks, holds at another version, or holds
    #: although git does not (``missing``, ``changed``, ``stale``).
    drift: dict[str, set[str]] | None = None
    #: Paths whose stored chunks are not trusted even where the id matches (a verifying sync: a chunk may have
    #: been altered behind scopekb's back): every chunk of them is written again.
    rewrite: set[str] = field(default_factory=set)
    #: A ref indexed for the first time starts as a copy of this indexed ref's membership (issue 23).
    copy_from: str | None = None
    #: The chunk store's :meth:`~scopekb.stores.base.ChunkStore.generation` this sync writes into (recorded with
    #: the ref's commit).
    generation: str | None = None
    #: ``branch`` or ``tag`` for a ref listed by git (a search for ``refs/tags/x`` must not answer from branch x).
    kind: str | None = None
    #: Blob ids the index already holds for this source and scope (so the blob store has them).
    held: set[str] = field(default_factory=set)


@dataclass
class _Outcome:
    """What :func:`_index` did: sources with a failed file, sources with chunks OpenSearch refused, paths written,
    and the failed paths per source id."""

    failed: set[str] = field(default_factory=set)
    failed_paths: dict[str, set[str]] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)


@dataclass
class _Prepared:
    """A path's outcome after reading: a blob key to index, or a skip reason."""

    entry: TreeEntry
    skip: str | None = None
    #: The blob's bytes as read from git (None: read it back from the blob store).
    data: bytes | None = None
    #: An object-store document's normalised user metadata (:func:`scopekb.documents.object_metadata`), stored on
    #: its chunks under ``metadata["s3"]``; empty for git files.
    meta: dict[str, str] = field(default_factory=dict)


def run_sync(deps: SyncDeps, job_id: str, source_ids: list[str], *, trigger: str = "webhook",
             branch_deleted: bool = False, progress: Progress | None = None, verify: bool = False,
             attempt: int = 0, retried: Callable[[Exception], bool] | None = None) -> Job:
    """Bring ``source_ids`` (one repository, one ref) to the ref's current commit and return the job record.

    The job record (``jobs`` system index, id ``job_id``) is updated as the sync goes. Idempotent: a retry with
    the same arguments converges to the same index (deterministic ids; unchanged files are not rewritten).

    Args:
        branch_deleted: the delivery said the ref was deleted; acted on only when git confirms the ref is gone,
            otherwise the sources are synced to the ref's current commit (a payload never decides an effect).
        verify: compare the index with the tree by content id and repair any difference, even for a source
            whose sync state is already at the ref (the reconcile's check); what it repaired is ``job.drift``.
        attempt: how many times the task already ran this job and failed transiently (``job.retries["task"]``).
        retried: says whether the caller runs the job again after this error (a worker's retry policy): the
            record then says ``queued`` with the error, never ``failed``, so nobody polling the job takes it for
            over in the moment before the retry is enqueued. None: every error fails the job.

    Raises:
        SyncError: the sources are missing or span several repositories or refs.
        scopekb.gitrepo.GitError: the repository cannot be fetched.
        StoreUnavailable: OpenSearch did not take the writes within the bounded retries.
    """
    sources = [s for s in (deps.records.get_source(i) for i in source_ids) if s is not None]
    if not sources:
        raise SyncError(f"none of the sources {source_ids} exist")
    repo_url, ref = sources[0].repo_url, sources[0].ref
    if any(s.repo_url != repo_url for s in sources):
        raise SyncError("one sync covers one repository; split the sources")
    prev = deps.records.get_job(job_id)
    if (prev is not None and prev.trigger == "pin" and prev.state == JobState.failed and prev.finished_at
            and not attempt):
        return prev  # its pin was refused by an earlier sync of the source (_add_pins): the record says why
    job = Job(id=job_id, trigger=prev.trigger if prev else trigger, created_at=prev.created_at if prev else utcnow(),
              source_ids=[s.id for s in sources], repo=sources[0].repo_name or repo_url, ref=ref,
              state=JobState.running, started_at=utcnow(), retries=dict(prev.retries) if prev else {})
    if prev is not None and prev.state == JobState.running and attempt <= prev.retries.get("task", 0):
        _count(job, "redelivered")  # the process running this attempt died (a retry's record may just be stale)
    if attempt:
        job.retries["task"] = attempt
    job.stage = JobStage.syncing
    staged = deps.embed_sink is not None and deps.embedder is not None
    # A token per run: a re-run of the job (retry, redelivery) counts only the embedding parts it sent itself.
    job.embed_run, job.embed_parts = (uuid.uuid4().hex[:16], 0) if staged else (None, 0)
    deps.records.put_job(job)
    t0 = time.monotonic()
    try:
        with deps.chunks.sync_guard(), _counting_embedding_retries(None if staged else deps.embedder, job):
            if not (branch_deleted and _delete_branch_if_gone(deps, job, sources)):
                _sync(deps, job, sources, progress, verify, pushed=prev.ref if prev is not None else None)
    except Exception as e:  # recorded, then re-raised for the task's retry policy
        again = retried is not None and retried(e)
        job.state = JobState.queued if again else JobState.failed
        job.errors.append(f"{type(e).__name__}: {e}")
        job.finished_at = None if again else utcnow()
        log.error("sync_failed", job_id=job.id, error=str(e), retries=job.retries)
        why = _cluster_cannot_serve(deps, e)
        if why is not None:  # a write now hangs until a cluster manager is elected: the task waits instead, and
            # its resumed run rewrites the record (issue 24: this write took a red cluster's sync past its time limit)
            log.warning("job_record_not_stored", job_id=job.id, error=why)
            raise
        try:
            deps.records.put_job(job)
        except Exception as store_error:  # noqa: BLE001 - the store may be what failed; keep the first error
            log.error("job_record_not_stored", job_id=job.id, error=str(store_error))
        raise
    if job.chunks_written or job.chunks_deleted:
        deps.chunks.refresh()  # a finished sync stage means its changes are keyword-searchable
    _drop_removed_sources(deps, job, sources)  # after the refresh: what this sync wrote is visible to deletes
    if staged and job.embed_parts:
        job.stage = JobStage.embedding  # still running: the index is complete when the last part is embedded
        deps.records.put_job(job)
        log.info("sync_stage_finished", job_id=job.id, embed_parts=job.embed_parts, chunks_written=job.chunks_written,
                 seconds=round(time.monotonic() - t0, 3))
        assert deps.embed_sink is not None
        deps.embed_sink.run_pending(deps)
        return finish_embedding(deps, job.id) or deps.records.get_job(job.id) or job
    return _settle(deps, job, files_deleted=job.files_deleted, chunks_deleted=job.chunks_deleted,
                   retries=job.retries, drift=job.drift, seconds=round(time.monotonic() - t0, 3))


def embed_part(deps: SyncDeps, job_id: str, run: str, part: int, items: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The embedding stage's unit of work (issue 19): vectors for ``items`` (``[chunk id, text, blob sha]``)
    through the embedding cache, added to the chunks the sync stage wrote (:meth:`ChunkStore.set_vectors`), then
    the part recorded as done and the job finished if it was the last one (:func:`finish_embedding`).

    Idempotent: a redelivered part computes the same vectors (cache hits), overwrites the same chunks by id and
    its own result entry, so it neither duplicates chunks nor counts twice. A text the provider refuses leaves
    its chunk without vector and blob id (the next sync re-indexes the file) and is named in the result's
    ``errors``.

    Returns:
        ``{"part", "computed", "cached", "written", "errors"}``.

    Raises:
        StoreUnavailable: the store refused updates (the task retries the part).
        scopekb.embedding.EmbeddingUnavailable: the provider is unavailable (transient; the task retries).
    """
    if deps.embedder is None or deps.embed_sink is None:
        raise SyncError("the embedding stage needs an embedder and worker.embed_queue")
    texts = [str(it[1]) for it in items]
    vectors, stats, errors = embed_with_cache(deps.embedder, deps.embed_cache, texts)
    updates = {str(it[0]): (v, str(it[2])) for it, v in zip(items, vectors, strict=True) if v is not None}
    with deps.chunks.sync_guard():  # not into tables a rebuild is replacing (embedded: another process's reindex)
        report = deps.chunks.set_vectors(updates, deps.embedder.model_id) if updates else BulkReport()
    if report.errors:
        raise StoreUnavailable(f"{len(report.errors)} vectors not stored: {report.errors[0][2][:300]}")
    refused = [f"chunk {items[pos][0]}: embedding refused: {reason}" for pos, reason in sorted(errors.items())]
    result = {"part": part, "computed": stats.computed, "cached": stats.cached, "written": report.written,
              "errors": refused}
    deps.embed_sink.part_done(job_id, run, part, result)
    log.info("embed_part_done", job_id=job_id, part=part, chunks=len(items), computed=stats.computed,
             cached=stats.cached, written=report.written)
    finish_embedding(deps, job_id)
    return result


def finish_embedding(deps: SyncDeps, job_id: str) -> Job | None:
    """Close a job whose embedding stage has every part done: add the parts' counts and errors, mark it
    ``done`` (``partial`` with errors) and make its vectors searchable. Returns the finished job, or None when the
    job is not in its embedding stage or parts are missing. Safe to call from several workers at once: each
    computes the same record from the stage's record and the parts' results."""
    job = deps.records.get_job(job_id)
    if job is None or job.stage != JobStage.embedding or not job.embed_run or deps.embed_sink is None:
        return None
    results = deps.embed_sink.parts_done(job_id, job.embed_run)
    if len({r.get("part") for r in results}) < job.embed_parts:
        return None
    for r in sorted(results, key=lambda r: int(r.get("part", 0))):
        job.embeddings_computed += int(r.get("computed", 0))
        job.embeddings_cached += int(r.get("cached", 0))
        job.errors.extend(str(e) for e in r.get("errors", []))
    deps.chunks.refresh()
    return _settle(deps, job, embed_parts=job.embed_parts, embeddings_computed=job.embeddings_computed,
                   embeddings_cached=job.embeddings_cached)


def _drop_removed_sources(deps: SyncDeps, job: Job, sources: list[Source]) -> list[str]:
    """Delete what this sync wrote for the sources removed while it ran (chunks, sync state, overlay); their ids.

    Hostile review 3: a source removed (``DELETE /v1/sources/{id}``) while its sync ran kept every chunk the sync
    wrote after the removal's delete (22,500 of 30,000 embedded, 29,400 distributed), searchable with no source
    left to remove. Checked after the sync's last write and refresh; :func:`scopekb.ops.remove_source` deletes the
    chunks once more after the source record, so a removal either is seen here or deletes after every write.
    The job notes it (state ``partial``)."""
    gone = [s.id for s in sources if deps.records.get_source(s.id) is None]
    for sid in gone:
        n = deps.chunks.delete_source(sid)
        deps.records.delete("state", sid)
        deps.records.delete(overlays.KIND, sid)
        job.errors.append(f"source {sid} was removed during this sync: its {n} chunks written since were deleted")
        log.warning("sync_source_removed", job_id=job.id, source_id=sid, chunks_deleted=n)
    return gone


def _settle(deps: SyncDeps, job: Job, **logged: Any) -> Job:
    """End ``job``: stage done, state ``failed`` when its own pin was refused, else ``partial`` when it has errors,
    else ``done``, finish time now; write the record
    and log ``sync_finished`` with its counts plus ``logged`` (the one ending of a sync, inline or after its
    embedding stage)."""
    job.stage = JobStage.done
    job.finished_at = utcnow()
    # failed only when its own pin was refused (_add_pins); else partial with errors, done without
    job.state = JobState.failed if job.state == JobState.failed else JobState.partial if job.errors else JobState.done
    deps.records.put_job(job)
    log.info("sync_finished", job_id=job.id, state=job.state.value, to_commit=job.to_commit,
             files_indexed=job.files_indexed, chunks_written=job.chunks_written, **logged)
    return job


def _cluster_cannot_serve(deps: SyncDeps, exc: Exception) -> str | None:
    """For a transient failure, why the search cluster says it cannot serve now (red, no elected cluster manager),
    or None: also when no node answers or the question itself fails (best effort)."""
    if not isinstance(exc, Transient):
        return None
    try:
        return answered_problem(deps.chunks.problem())
    except Exception:  # noqa: BLE001 - see above
        return None


def _count(job: Job, kind: str, n: int = 1) -> None:
    if n:
        job.retries[kind] = job.retries.get(kind, 0) + n


@contextlib.contextmanager
def _counting_embedding_retries(embedder: Embedder | None, job: Job) -> Iterator[None]:
    """Count the embedder's retries (429/5xx/connection errors) into ``job.retries["embedding"]``.

    The OpenAI-compatible provider calls its ``sleep`` hook once before every retry; it is wrapped for the
    duration of the sync (one sync at a time per process). Providers without retries are left alone.
    """
    sleep = getattr(embedder, "_sleep", None)
    if embedder is None or not callable(sleep):
        yield
        return

    def counted(delay: float) -> None:
        _count(job, "embedding")
        sleep(delay)

    embedder._sleep = counted  # type: ignore[attr-defined]  # the provider's documented sleep hook
    try:
        yield
    finally:
        embedder._sleep = sleep  # type: ignore[attr-defined]


def _delete_branch_if_gone(deps: SyncDeps, job: Job, sources: list[Source]) -> bool:
    """Act on a branch deletion only once git confirms it (issue 16): fetch the mirror (``--prune``) and delete the
    sources' chunks only when their ref no longer resolves. Returns True when the chunks were deleted; False when
    the ref still exists (a forged, unsigned or replayed deletion, or the branch was re-created since), in which
    case the caller syncs to the ref's current commit instead — every effect is re-derived from git state, never
    from the payload. Object-store sources have no branches: always False.

    Raises:
        scopekb.gitrepo.GitError: the repository cannot be fetched (nothing is deleted; the task retries).
    """
    if any(s.refs for s in sources):
        return False  # sources tracking several refs: the sync itself drops the refs git no longer has
    reader = _reader(deps, sources[0])
    if isinstance(reader, (ObjectPrefix, FolderPrefix)):
        return False
    try:
        reader.fetch()
        head = reader.resolve(sources[0].ref)
    finally:
        reader.close()
    if head is not None:
        log.warning("branch_deletion_not_confirmed", job_id=job.id, ref=job.ref, head=head,
                    reason="the ref still exists in the repository; syncing to it instead")
        return False
    _delete_branch(deps, job, sources)
    return True


def _delete_branch(deps: SyncDeps, job: Job, sources: list[Source]) -> None:
    for src in sources:
        job.chunks_deleted += deps.chunks.delete_source(src.id)
        overlays.drop_source_overlays(deps.records, src.id)
        deps.records.set_indexed_commit(src.id, None)
    log.info("branch_deleted", job_id=job.id, ref=job.ref, chunks_deleted=job.chunks_deleted)


def _reader(deps: SyncDeps, src: Source) -> Mirror | ObjectPrefix | FolderPrefix:
    s = deps.settings
    if src.kind == "s3":
        return document_prefix(s, src.bucket, src.prefix or "", deps.documents_dir)
    return Mirror(git_cache_dir(s), src.repo_url, allow_local=s.git.allow_local_paths, timeout_s=s.git.fetch_timeout_s)


def _sync(deps: SyncDeps, job: Job, sources: list[Source], progress: Progress | None, verify: bool = False,
          pushed: str | None = None) -> None:
    """Bring every tracked ref of ``sources`` (one repository) to its current commit, one ref after the other, with
    one fetch; refs no longer tracked (a deleted branch, a pattern no longer matching) lose their membership.
    ``pushed``: the ref the queued job named (a webhook's pushed ref), reported when the ref cap leaves it out."""
    reader = _reader(deps, sources[0])
    generation = deps.chunks.generation()  # a state of another generation does not say what this index holds
    kinds: dict[str, dict[str, str]] = {}  # source id -> ref -> branch/tag, recorded with the ref's commit
    try:
        reader.fetch()
        if isinstance(reader, (ObjectPrefix, FolderPrefix)):
            tree = reader.tree()
            target = hashlib.sha1("\n".join(f"{p}\0{e.sha}" for p, e in sorted(tree.items())).encode()).hexdigest()
            tracked = {s.id: {s.ref: target} for s in sources}
            trees: dict[str, dict[str, TreeEntry]] = {target: tree}
        else:
            tracked = _tracked_refs(deps, job, reader, sources, pushed, kinds)
            _add_pins(deps, job, reader, sources, tracked)
            trees = {}
        ref_targets = {r: c for t in tracked.values() for r, c in t.items()}
        vendored_of: dict[str, Container[str]] = {}  # commit -> what its .gitattributes mark (for every ref)
        job.ref_commits = dict(sorted(ref_targets.items()))
        primary = sources[0].ref
        job.to_commit = ref_targets.get(primary) or next(iter(job.ref_commits.values()), None)
        for ref in sorted(ref_targets, key=lambda r: (r != primary, r)):
            target = ref_targets[ref]
            if target not in trees:
                trees[target] = {e.path: e for e in reader.tree(target)}  # type: ignore[union-attr]
                for reason in reader.dropped.values():  # type: ignore[union-attr]  # not-UTF-8 names
                    job.files_skipped[reason] = job.files_skipped.get(reason, 0) + 1
            group = [s for s in sources if tracked[s.id].get(ref) == target]
            _sync_ref(deps, job, reader, group, ref, target, trees[target], progress, verify, generation, kinds,
                      vendored_of)
    finally:
        reader.close()
    for src in sources:  # refs indexed before and not tracked now: their membership goes, chunks no ref uses too
        drop_refs(deps, job, src, set(_ref_states(deps, src)) - set(tracked[src.id]))


def drop_refs(deps: SyncDeps, job: Job, src: Source, refs: set[str]) -> None:
    """Take ``refs`` (names) out of ``src``: their chunk membership (chunks no other ref holds are deleted) and
    their sync state. Pins whose TTL has not run out are kept (issue 23: they live until then, whatever the
    patterns say)."""
    now = utcnow()
    for ref in sorted(refs):
        st = _ref_states(deps, src).get(ref)
        if st is None or (st.get("pinned") and not pin_expired(st, now)):
            continue
        # Overlays based on this ref first take what they see through it as their own (scopekb.overlays).
        job.chunks_linked += overlays.dissolve(deps.chunks, deps.records, src.agent_name, src.context_id, src.id, ref)
        unlinked, deleted = deps.chunks.remove_ref(src.agent_name, src.context_id, src.id, ref)
        job.chunks_deleted += deleted
        overlays.put_overlay(deps.records, src.id, ref, None)
        _put_ref_state(deps, src, ref, None)
        log.info("ref_removed", source_id=src.id, ref=ref, pinned=bool(st.get("pinned")), chunks_unlinked=unlinked,
                 chunks_deleted=deleted)


def pin_expired(st: dict[str, Any], now: Any) -> bool:
    """True when a pinned ref's ``expires_at`` (ISO time) has passed (or is missing or unreadable)."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(st.get("expires_at"))) <= now
    except ValueError:
        return True


def _add_pins(deps: SyncDeps, job: Job, reader: Mirror, sources: list[Source],
              tracked: dict[str, dict[str, str]]) -> None:
    """Add each source's live pins (issue 23; ref name = the pinned commit id) to ``tracked``. A pin whose commit
    the repository does not have, or whose diff from the nearest indexed ref touches more than
    ``git.max_pin_files`` files, is dropped with the reason in ``job.errors``."""
    now = utcnow()
    for src in sources:
        for name, st in _ref_states(deps, src).items():
            if not st.get("pinned") or pin_expired(st, now):
                continue
            why = None
            if not reader.has_commit(name):
                why = f"commit {name} is not in the repository {src.repo_name or src.repo_url}"
            elif not st.get("commit"):
                near = _nearest_ref(deps, reader, src, name, name)
                if near is not None and near[2] > deps.settings.git.max_pin_files:
                    why = (f"pinning {name} changes {near[2]} files from {near[0]}, more than "
                           f"git.max_pin_files={deps.settings.git.max_pin_files}")
            if why:
                pin_job = st.get("job_id")
                # another pin's job, queued behind this sync: its record says why (a pin indexed before whose commit
                # is gone now has a finished job: this job says it)
                if not (pin_job and pin_job != job.id and _fail_pin_job(deps, str(pin_job), why)):
                    job.errors.append(why)
                    if pin_job == job.id:  # this job was sent for that pin: it failed, whatever else it synced
                        job.state = JobState.failed
                _put_ref_state(deps, src, name, None)
                log.warning("pin_refused", source_id=src.id, commit=name, reason=why)
                continue
            tracked[src.id][name] = name


def _fail_pin_job(deps: SyncDeps, job_id: str, why: str) -> bool:
    """Record on a pin's own job (not yet run: the repository lock holds it behind the sync that refused the pin)
    that its pin was refused and why, as ``failed``; :func:`run_sync` then ends that job at once (hostile review:
    with several pins at once, a refused pin's error went to whichever job ran, and its own job said ``done``).
    False when that job has no record or has finished already."""
    rec = deps.records.get_job(job_id)
    if rec is None or rec.finished_at is not None:
        return False
    rec.state, rec.stage, rec.finished_at = JobState.failed, JobStage.done, utcnow()
    rec.errors.append(why)
    deps.records.put_job(rec)
    log.warning("pin_job_failed", job_id=job_id, reason=why)
    return True


def _tracked_refs(deps: SyncDeps, job: Job, reader: Mirror, sources: list[Source], pushed: str | None = None,
                  kinds: dict[str, dict[str, str]] | None = None) -> dict[str, dict[str, str]]:
    """source id -> {ref name: commit} of the refs each source tracks now: those its patterns match
    (:func:`scopekb.refs.match_refs`) under its cap ``git.max_refs_per_source`` (:func:`scopekb.refs.cap_refs`: the
    source's ``ref`` and the refs already indexed always stay). New refs the cap leaves out are named in
    ``job.errors`` (the job ends ``partial``), the ``pushed`` ref too when it is one of them. A source tracking
    one ``ref`` that is a full commit id (no branch or tag of that name) tracks that commit (``scopekb eval``
    indexes parent commits so). ``kinds`` (when given) gets source id → ref name → ``branch`` or ``tag``.

    Raises:
        SyncError: a source tracking one ``ref`` only (no ``refs`` patterns) whose branch does not exist.
    """
    listed = reader.list_refs()
    cap = deps.settings.git.max_refs_per_source
    out: dict[str, dict[str, str]] = {}
    for src in sources:
        matched = match_refs(src.ref_patterns, listed)
        out[src.id], left_out = cap_refs(matched, src.ref, set(_ref_states(deps, src)), cap)
        if kinds is not None:
            kinds[src.id] = {n: "tag" if n in matched.tags else "branch" for n in out[src.id]}
        unfit = unfit_refs(src.ref_patterns, listed) if src.refs else []
        if unfit:
            job.errors.append(f"source {src.id}: {len(unfit)} refs its refs patterns match are not indexed: "
                              + ", ".join(f"{n[:100]!r} ({why})" for n, why in unfit[:5])
                              + (f" and {len(unfit) - 5} more" if len(unfit) > 5 else ""))
            log.warning("refs_unfit", source_id=src.id, count=len(unfit))
        if left_out:
            job.errors.append(_left_out_error(src, left_out, cap, pushed))
            log.warning("refs_left_out", source_id=src.id, left_out=len(left_out), cap=cap, sample=left_out[:5])
        if not src.refs and not out[src.id]:
            commit = reader.resolve(src.ref) if is_sha(src.ref) else None
            if commit is None:
                raise SyncError(f"ref {src.ref!r} not found in {src.repo_url}")
            out[src.id] = {src.ref: commit}
    return out


def _left_out_error(src: Source, left_out: list[str], cap: int, pushed: str | None) -> str:
    """The job error naming the refs the cap left out: how many, the first five (each cut to 100 characters), and
    the pushed ref when it is one of them."""
    names = ", ".join(repr(n[:100]) for n in left_out[:5]) + (f" and {len(left_out) - 5} more" if len(left_out) > 5
                                                              else "")
    text = (f"source {src.id}: {len(left_out)} refs its refs patterns match are not indexed, over "
            f"git.max_refs_per_source={cap} (its ref and the refs already indexed stay, then new refs by name, "
            f"branches before tags): {names}")
    if pushed and pushed in left_out:
        text += f"; the pushed ref {pushed[:100]!r} is one of them"
    return text


def _ref_states(deps: SyncDeps, src: Source) -> dict[str, dict[str, Any]]:
    return ref_states(deps.records, src)


def _put_ref_state(deps: SyncDeps, src: Source, ref: str, value: dict[str, Any] | None) -> None:
    put_ref_state(deps.records, src, ref, value)


def _sync_ref(deps: SyncDeps, job: Job, reader: Mirror | ObjectPrefix | FolderPrefix, sources: list[Source],
              ref: str, target: str, tree: dict[str, TreeEntry], progress: Progress | None, verify: bool,
              generation: str | None = None, kinds: dict[str, dict[str, str]] | None = None,
              vendored_of: dict[str, Container[str]] | None = None) -> None:
    """Bring ``ref`` of ``sources`` to ``target``: plan against the ref's last indexed commit (or the nearest
    indexed ref's, whose membership is copied first), read, write and advance the ref's state. ``generation``:
    the chunk store's (:meth:`~scopekb.stores.base.ChunkStore.generation`), and ``kinds`` (source id → ref →
    ``branch``/``tag``; pins and object sources have none), recorded with the commit. ``vendored_of``: commit →
    the paths its ``.gitattributes`` mark, shared by the refs of one sync and filled only when a ref needs it (a
    ref already at its commit reads no ``.gitattributes``)."""
    cache = {} if vendored_of is None else vendored_of

    def vendored() -> Container[str]:
        if target not in cache:
            cache[target] = _vendored_paths(reader, tree) if isinstance(reader, Mirror) else frozenset()
        return cache[target]

    # The ref's plan, its overlay start and its deletions read the store by search: make the writes of the refs
    # synced before it in this job visible first (OpenSearch searches see refreshed writes only).
    deps.chunks.refresh()
    plans = [_plan(deps, reader, src, target, tree, verify, ref, generation, vendored) for src in sources]
    for plan in plans:
        plan.kind = (kinds or {}).get(plan.source.id, {}).get(ref)
        job.from_commit.setdefault(plan.source.id, plan.from_commit)
    deps.records.put_job(job)
    wanted = sorted({p for plan in plans for p in plan.to_index})
    job.files_seen += len(wanted)
    uploads = BlobUploads(deps.blobs)
    try:
        held = frozenset(b for plan in plans for b in plan.held)
        prepared = _read_and_store(deps, reader, tree, wanted, job, progress, uploads, held,
                                   vendored() if wanted else frozenset())
        _write_ref(deps, job, plans, prepared, ref, target, progress, uploads)
    finally:
        uploads.close()


def _write_ref(deps: SyncDeps, job: Job, plans: list[_Plan], prepared: dict[str, _Prepared], ref: str, target: str,
               progress: Progress | None, uploads: BlobUploads) -> None:
    """The writing half of :func:`_sync_ref`: mark the ref as being written, copy membership, index, delete, and
    advance the ref's state once every write and blob put has finished."""
    for plan in plans:  # from here on a death leaves files half-written: say so in the sync state first
        if plan.to_index or plan.to_delete or plan.copy_from:
            _put_ref_state(deps, plan.source, ref, {**plan.state, "writing": target})
        if plan.copy_from:
            src = plan.source
            joined = overlays.start_overlay(deps.chunks, deps.records, src.agent_name, src.context_id, src.id, ref,
                                            plan.copy_from, sorted(set(plan.to_index) | set(plan.to_delete)))
            job.chunks_linked += joined
            log.info("ref_copied", source_id=src.id, ref=ref, from_ref=plan.copy_from, chunks=joined)
    # Files are counted only once a process died running this job: a healthy sync costs Redis nothing.
    attempts = deps.attempts if job.retries.get("redelivered") else None
    outcome = _index(deps, job, plans, prepared, target, progress, attempts, ref, uploads)
    uploads.wait()  # every blob of this ref's sync is in the blob store before its state advances
    for plan in plans:
        if plan.to_delete:
            src = plan.source
            deps.chunks.refresh()  # the batches' writes are visible to the search below
            held = deps.chunks.chunk_versions(src.agent_name, src.context_id, src.id, plan.to_delete, ref=ref,
                                              overlay=overlays.get_overlay(deps.records, src.id, ref))
            job.chunks_deleted += _leave(deps, src.agent_name, src.context_id, src.id, ref,
                                         [cid for ids in held.values() for cid in ids])
        job.files_deleted += len(plan.to_delete)
    now = utcnow().isoformat()
    for plan in plans:
        sid = plan.source.id
        if plan.drift is not None:
            found = {"missing": len(plan.drift["missing"] & outcome.written), "changed": len(plan.drift["changed"]),
                     "stale": len(plan.drift["stale"])}
            if any(found.values()):
                job.drift[sid] = found
                log.warning("index_drift_repaired", source_id=sid, ref=ref, **found,
                            sample=sorted((plan.drift["missing"] & outcome.written) | plan.drift["changed"]
                                          | plan.drift["stale"])[:5])
        bad = sorted(outcome.failed_paths.get(sid, ()))
        if sid not in outcome.failed or (bad and len(bad) <= MAX_FAILED_PATHS):
            # A file the store refused or whose embedding failed does not hold the ref back (hostile review 2,
            # H1): the ref advances with those paths named in its state (status shows them); each later sync
            # writes them again until they are stored.
            _put_ref_state(deps, plan.source, ref, {**plan.state, "commit": target, "indexed_at": now,
                                                    "writing": None, "failed": bad or None,
                                                    "generation": plan.generation, "kind": plan.kind})
        elif (plan.to_index or plan.to_delete) and sid not in outcome.refused:
            # Every write was made; the failed files carry no content id (or no chunks), so the next sync retries
            # them by itself. Chunks OpenSearch refused leave the marker: the next sync re-plans all touched paths.
            _put_ref_state(deps, plan.source, ref, {**plan.state, "writing": None})


def _nearest_ref(deps: SyncDeps, reader: Mirror, src: Source, ref: str,
                 target: str, generation: str | None = None) -> tuple[str, str, int] | None:
    """The indexed ref of ``src`` (clean: no sync died writing it; indexed into the store's ``generation`` when
    given) whose commit differs least from ``target`` (fewest changed paths), as ``(name, commit, changed
    paths)``; None when there is none."""
    best: tuple[int, str, str] | None = None
    for name, st in _ref_states(deps, src).items():
        commit = st.get("commit")
        if name == ref or st.get("writing") or not commit or not reader.has_commit(commit):
            continue
        if _lost(st, generation):
            continue
        n = len(reader.diff(commit, target)) if commit != target else 0
        if best is None or (n, name) < best[:2]:
            best = (n, name, commit)
    return (best[1], best[2], best[0]) if best else None


def _lost(state: dict[str, Any], generation: str | None) -> bool:
    """True when a ref's sync state was written into another chunk index than the live one (``generation``): the
    index was deleted and made again, or the SQLite file lost, so the state's commit says nothing about what the
    index holds. States written before generations were recorded are trusted."""
    have = state.get("generation")
    return bool(state.get("commit")) and generation is not None and have is not None and have != generation


def _plan(deps: SyncDeps, reader: Mirror | ObjectPrefix | FolderPrefix, src: Source, target: str,
          tree: dict[str, TreeEntry], verify: bool = False, ref: str | None = None,
          generation: str | None = None, vendored: Callable[[], Container[str]] = frozenset) -> _Plan:
    ref = ref or src.ref
    state = _ref_states(deps, src).get(ref, {})
    writing = state.pop("writing", None)
    retry = [p for p in state.pop("failed", None) or () if isinstance(p, str)]  # failed at the last sync
    last = state.get("commit")
    plan = _Plan(source=src, from_commit=last, state=state, generation=generation)
    lost = _lost(state, generation)
    if lost:  # compared with the index like a verifying sync: what it lacks is written again
        log.warning("index_lost", source_id=src.id, ref=ref, commit=last, indexed_into=state.get("generation"),
                    live=generation)
    if last == target and not writing and not verify and not retry and not lost:
        return plan
    git = isinstance(reader, Mirror)
    usable = git and last and reader.has_commit(last) and not lost
    if git and not last and not writing and not verify:
        # A ref never indexed (issue 23): start from the nearest indexed ref of the source - its chunks of every
        # path the diff does not touch join this ref as they are, the diff is indexed like a push.
        near = _nearest_ref(deps, reader, src, ref, target, generation)  # type: ignore[arg-type]
        if near is not None:
            plan.copy_from, last = near[0], near[1]
            usable = True
    # A sync that died while writing (marker ``writing``) may have left files half-written at that commit: its
    # changes are planned again too, or everything when they cannot be known.
    touched: set[str] | None = set()
    if writing and writing != target and usable and reader.has_commit(writing):
        touched = {p for c in reader.diff(last, writing) for p in (c.path, c.old_path) if p}
    elif writing and (not usable or writing != target):
        touched = None
    changes = reader.diff(last, target) if usable and not verify and touched is not None and last != target else []
    attributes = any(_is_attributes_file(c.path) or _is_attributes_file(c.old_path) for c in changes)
    if attributes:
        # a changed .gitattributes can mark or unmark files the diff does not touch (hostile review: a file
        # marked generated by a push stayed indexed, one unmarked was never indexed): compare the whole tree
        log.info("gitattributes_changed", source_id=src.id, ref=ref, from_commit=last, to_commit=target)
        usable, plan.copy_from = False, None
    if usable and not verify and touched is not None:
        for c in changes:
            if c.status == "D":
                plan.to_delete.append(c.path)
            else:
                if c.old_path:
                    plan.to_delete.append(c.old_path)
                plan.to_index.append(c.path)
                if c.status != "A":
                    plan.maybe_stale.add(c.path)
        for p in sorted(touched - set(plan.to_index) - set(plan.to_delete)):
            (plan.to_index if p in tree else plan.to_delete).append(p)
            plan.maybe_stale.add(p)
        mode = "copy+diff" if plan.copy_from else "diff"
    else:
        # No usable state (first sync, history rewritten, an object listing) or a verifying sync: compare the
        # tree with what the index holds for this ref, by content id, so unchanged documents are neither read nor
        # written again - unless a sync died writing with no known set of changes: then the index's content ids
        # are not trusted (a file may be half-written at the right id) and everything is written again.
        indexed = deps.chunks.indexed_blobs(src.id, src.agent_name, src.context_id, ref=ref,
                                            overlay=overlays.get_overlay(deps.records, src.id, ref))
        trusted = indexed if touched is not None else {}
        if touched:
            trusted = {p: sha for p, sha in indexed.items() if p not in touched}
        plan.to_index = [p for p, e in tree.items() if trusted.get(p) != e.sha]
        plan.to_delete = sorted(set(indexed) - set(tree))
        plan.maybe_stale = set(indexed) & set(plan.to_index)
        plan.held = {b for b in trusted.values() if b}
        # indexed before the tree's .gitattributes marked them vendored or generated: read again, so skipped and
        # their chunks deleted
        marks = vendored() if indexed else frozenset()
        planned = set(plan.to_index)
        marked = [p for p in indexed if p in tree and p not in planned and p in marks]  # marks: asked last
        plan.to_index += marked
        plan.maybe_stale |= set(marked)
        mode = "verify" if verify else "lost" if lost else "attributes" if attributes else "full"
        if verify:
            plan.rewrite = set(plan.maybe_stale)
        if (verify or lost) and last == target and not writing:
            plan.drift = {"missing": {p for p in plan.to_index if p not in indexed},
                          "changed": {p for p in plan.to_index if p in indexed}, "stale": set(plan.to_delete)}
    for p in retry:  # the files the last sync of this ref could not store are written again, whatever the diff says
        if p in tree and p not in plan.to_index:
            plan.to_index.append(p)
        plan.maybe_stale.add(p)
        plan.rewrite.add(p)
    if src.include or src.exclude:  # the source's own globs: excluded paths are dropped, and lose their chunks
        excluded = {p for p in plan.to_index if filetypes.path_skip_reason(p, src.include, src.exclude)}
        plan.to_index = [p for p in plan.to_index if p not in excluded]
        plan.to_delete = sorted(set(plan.to_delete) | set(excluded))
    log.info("sync_planned", source_id=src.id, ref=ref, mode=mode, from_commit=last, to_commit=target,
             writing=writing, index=len(plan.to_index), delete=len(plan.to_delete))
    return plan


#: Failed paths a ref's sync state names at most; a sync with more failed files does not advance the ref (its next
#: sync plans every touched path again, as after a crash).
MAX_FAILED_PATHS = 100

#: Bytes of blob contents a sync keeps in memory from the git reader so chunking needs no blob-store read;
#: files past it are read back from the blob store (after their put finished).
KEEP_IN_MEMORY_BYTES = 256 * 1024 * 1024


def _read_and_store(deps: SyncDeps, mirror: Mirror | ObjectPrefix | FolderPrefix, tree: dict[str, TreeEntry],
                    paths: list[str], job: Job, progress: Progress | None, uploads: BlobUploads,
                    held: frozenset[str] = frozenset(), vendored: Container[str] = frozenset()
                    ) -> dict[str, _Prepared]:
    """Classify and read each path once; put text blobs in the blob store (concurrently, through ``uploads``)
    unless ``held`` says the index already holds that blob (content-addressed: it was stored when those chunks
    were written). Returns path → outcome; up to :data:`KEEP_IN_MEMORY_BYTES` of text stay in the outcomes so
    chunking reads them straight from the git reader.

    Issue 20: git blobs come through one pipelined ``git cat-file --batch`` stream (:meth:`Mirror.read_blobs`),
    and the puts of blobs kept in memory start only once every blob is read (they run while the sync chunks and
    writes; each batch waits for its own blobs before its chunks are written), so the upload threads do not
    compete with the read loop for the interpreter. A blob not kept in memory is put at once (its bytes go).
    Object-store documents are read one by one with their metadata (each object has its own). ``vendored``: the
    tree's paths its ``.gitattributes`` mark vendored or generated (skipped).
    """
    s = deps.settings
    documents = isinstance(mirror, (ObjectPrefix, FolderPrefix))
    out: dict[str, _Prepared] = {}
    path_reason: dict[str, str | None] = {}
    to_read: dict[str, None] = {}  # git blob shas to read, in the order of their first path
    for path in paths:
        e = tree.get(path)
        if e is None:  # deleted between diff and tree listing cannot happen for one commit; be safe
            continue
        reason = None
        if e.mode == MODE_GITLINK:
            reason = filetypes.SKIP_SUBMODULE
        elif e.mode == MODE_SYMLINK:
            reason = filetypes.SKIP_SYMLINK
        else:
            reason = filetypes.path_skip_reason(path, (), (), vendored)
            if reason is None and e.size is not None and e.size > s.git.max_file_bytes:
                reason = filetypes.SKIP_TOO_LARGE
        if reason is None and documents and not path.lower().endswith(DOCUMENT_SUFFIXES):
            reason = SKIP_UNSUPPORTED
        path_reason[path] = reason
        if reason is None and not documents:
            to_read[e.sha] = None
    blobs = mirror.read_blobs(list(to_read)) if isinstance(mirror, Mirror) else iter(())
    seen: dict[str, tuple[str | None, bytes | None]] = {}  # blob sha -> (skip reason, bytes kept in memory)
    later: list[tuple[str, bytes]] = []  # puts started after the read loop
    kept = 0
    try:
        for n, path in enumerate(paths, 1):
            if path not in path_reason:
                continue
            e = tree[path]
            reason = path_reason[path]
            data: bytes | None = None
            meta: dict[str, str] = {}
            if reason is None and e.sha in seen and not documents:  # documents: each object has its own metadata
                reason, data = seen[e.sha]
            elif reason is None:
                if documents:
                    data, meta = mirror.read_document(path, e.sha)  # type: ignore[union-attr]
                    try:
                        data = to_text(path, data) or data
                    except DocumentError as err:
                        reason = SKIP_UNREADABLE
                        job.errors.append(f"{path}: {err}")
                else:
                    sha, data = next(blobs)  # one stream, in the order of each blob's first path
                    if sha != e.sha:
                        raise SyncError(f"blob stream out of order at {path!r}: {sha} for {e.sha}")
                reason = reason or filetypes.content_skip_reason(data)
                if reason is None:
                    if kept + len(data) > KEEP_IN_MEMORY_BYTES:
                        if e.sha not in held:
                            uploads.put(blob_key(e.sha), data)
                        data = None
                    else:
                        kept += len(data)
                        if e.sha not in held:
                            later.append((blob_key(e.sha), data))
                else:
                    data = None
                seen[e.sha] = (reason, data)
            out[path] = _Prepared(entry=e, skip=reason, data=data, meta=meta)
            if reason:
                job.files_skipped[reason] = job.files_skipped.get(reason, 0) + 1
            if progress:
                progress("read", n, len(paths))
    finally:
        close = getattr(blobs, "close", None)
        if close is not None:
            close()
    for key, data in later:
        uploads.put(key, data)
    return out


#: Attributes that keep a path out of the index (GitHub Linguist's: vendored or generated code).
VENDORED_ATTRIBUTES = ("linguist-vendored", "linguist-generated")
#: Largest ``.gitattributes`` read, in bytes; a larger one is skipped with a warning. git's own limit is 100 MiB
#: (``ATTR_MAX_FILE_SIZE``), but no more than ``gitattributes.max_patterns`` rules are used anyway, and reading a
#: 100 MiB blob into a worker for that is not worth it (hostile review).
MAX_GITATTRIBUTES_BYTES = 4 * 1024 * 1024
#: The marks of a tree without ``.gitattributes``: no path.
NO_MARKS: frozenset[str] = frozenset()


def _is_attributes_file(path: str | None) -> bool:
    return path is not None and (path == ".gitattributes" or path.endswith("/.gitattributes"))


def _vendored_paths(mirror: Mirror, tree: dict[str, TreeEntry]) -> Container[str]:
    """The paths of ``tree`` marked ``linguist-vendored`` or ``linguist-generated`` by its ``.gitattributes``
    files, by git's rules, as a container answered path by path when asked
    (:class:`scopekb.gitattributes.AttributeMatcher`: every such file, later and deeper rules overriding; a sync
    asks only about the paths it reads or compares); :data:`NO_MARKS` when the tree has none."""
    files = [(p.rpartition("/")[0], e) for p, e in tree.items() if _is_attributes_file(p)
             and e.mode not in (MODE_GITLINK, MODE_SYMLINK)]  # git reads no .gitattributes through a symlink
    if not files:
        return NO_MARKS
    big = [f"{((folder + '/' if folder else '') + '.gitattributes')[:200]!r}: over {MAX_GITATTRIBUTES_BYTES} "
           "bytes, not read" for folder, e in files if e.size is None or e.size > MAX_GITATTRIBUTES_BYTES]
    texts = [(folder, filetypes.decode_text(mirror.read_blob(e.sha))) for folder, e in files
             if e.size is not None and e.size <= MAX_GITATTRIBUTES_BYTES]
    marks = gitattributes.AttributeMatcher(texts, VENDORED_ATTRIBUTES)
    if big or marks.refused_count:
        log.warning("gitattributes_patterns_ignored", count=len(big) + marks.refused_count,
                    sample=(big + marks.refused)[:3])
    return marks


def _index(deps: SyncDeps, job: Job, plans: list[_Plan], prepared: dict[str, _Prepared], commit: str,
           progress: Progress | None, attempts: FileAttempts | None = None, ref: str | None = None,
           uploads: BlobUploads | None = None) -> _Outcome:
    """Chunk and write every planned path of ``ref`` (default: each source's ``ref``) for every source, batch by
    batch. A chunk the store already holds for another ref of the source joins ``ref`` without being written or
    embedded again; a chunk written anew keeps the refs it had (issue 23). A batch's chunks are written only once
    its blobs are in the blob store (``uploads``)."""
    # One writer thread: batch i is bulk-written while batch i+1 is chunked (and embedded); at most one batch is
    # in flight, so memory holds at most two batches of documents (issue 20).
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sync-writer")
    try:
        return _index_batches(deps, job, plans, prepared, commit, progress, attempts, ref, uploads, writer)
    finally:
        writer.shutdown(wait=True)


def _index_batches(deps: SyncDeps, job: Job, plans: list[_Plan], prepared: dict[str, _Prepared], commit: str,
                   progress: Progress | None, attempts: FileAttempts | None, ref: str | None,
                   uploads: BlobUploads | None, writer: ThreadPoolExecutor) -> _Outcome:
    s = deps.settings
    out = _Outcome()
    failed = out.failed
    # (blob sha, language) -> chunks: one chunking per blob and language per sync. Chunking depends on the path's
    # language (markdown sections, line windows, notebook cells, syntax), so one blob at a.py and b.md is chunked
    # twice; keyed by blob alone, b.md got a.py's line windows (CI failure of test_multi_ref at d1a6203).
    chunk_cache: dict[tuple[str, str], list[Chunk]] = {}
    index_sets = {plan.source.id: frozenset(plan.to_index) for plan in plans}
    all_paths = sorted(set().union(*index_sets.values()))
    group = sorted(index_sets)
    crash = _test_crash_paths()
    # Issue 20: when no other ref of these sources has a sync state (no branch, tag or pin indexed besides this
    # one), every stored chunk of theirs holds this ref at most, so no chunk can join it by a membership update:
    # the per-batch lookup of the ids (`_link_shared`) is skipped (on a first full sync it finds nothing).
    alone = all(set(_ref_states(deps, plan.source)) <= {ref or plan.source.ref} for plan in plans)
    done = 0
    pending: Future[None] | None = None
    for i, j in batch_bounds(len(all_paths), s.worker.batch_files):
        batch = all_paths[i:j]
        docs: list[dict[str, Any]] = []
        now = utcnow().isoformat(timespec="microseconds")
        per_path: list[tuple[str, str, str, list[Chunk]]] = []  # (path, language, blob sha, chunks)
        failed_paths: set[str] = set()
        for path in batch:
            prep = prepared.get(path)
            if prep is None:
                continue
            chunks: list[Chunk] = []
            lang = filetypes.language_for(path)
            if prep.skip is None:
                sha = prep.entry.sha
                key = (sha, lang)
                got = (chunk_cache[key] if key in chunk_cache
                       else _chunk_file(deps, job, group, path, sha, crash, attempts, prep.data, uploads))
                if got is None:
                    failed_paths.add(path)
                else:
                    chunks = chunk_cache[key] = got
                    if prep.meta:  # copies: the cached chunks stay without this object's metadata
                        chunks = [dataclasses.replace(c, metadata={**c.metadata, OBJECT_METADATA_KEY: dict(prep.meta)})
                                  for c in chunks]
            per_path.append((path, lang, prep.entry.sha, chunks))
            if prep.skip is None and chunks:
                job.files_indexed += 1
        if attempts is not None:  # a death from here on is not the files' fault
            attempts.flush()
        # Stable ids (issue 20): per (source, path), the new chunks' ids against what the index holds; only the
        # ids it lacks are embedded and written, only the vanished ones deleted.
        writes, vanished = _changes(deps, plans, index_sets, per_path, failed_paths, ref)
        linked = {} if alone else _link_shared(deps, job, plans, writes, failed_paths, ref)
        needed = {(path, c.chunk_index) for (_sid, path), todo in writes.items() for c, _ in todo}
        staged = deps.embed_sink is not None and deps.embedder is not None
        vectors = {} if staged else _embed(deps, job, per_path, failed_paths, needed)
        to_embed: list[list[str]] = []  # [chunk id, text, blob sha] for the embedding stage
        for path, lang, sha, _chunks in per_path:
            for plan in plans:
                if path not in index_sets[plan.source.id]:
                    continue
                if path in failed_paths:
                    failed.add(plan.source.id)
                    out.failed_paths.setdefault(plan.source.id, set()).add(path)
                for c, cid in writes.get((plan.source.id, path), ()):
                    # A file whose embedding failed carries no blob id, so the next full sync sees it as
                    # changed and retries it (keyword search finds it meanwhile).
                    # Staged (issue 19): written without its blob id until its vector comes, so a chunk whose
                    # embedding task is lost is seen as changed and indexed again by the next sync.
                    doc = _doc(plan.source, path, lang, c, cid, "" if path in failed_paths or staged else sha, commit,
                               now, ref or plan.source.ref, linked.get(cid, ()))
                    if staged:
                        to_embed.append([cid, embedding_text(path, lang, c, s.chunking, deps.counter), sha])
                    vec = vectors.get((path, c.chunk_index))
                    if vec is not None and deps.embedder is not None:
                        doc[F.EMBEDDING] = vec
                        doc[F.EMBEDDING_MODEL] = deps.embedder.model_id
                    docs.append(doc)
        if pending is not None:
            pending.result()  # the previous batch is written: its progress is recorded before this one starts
            deps.records.put_job(job)
            if progress:
                progress("index", done, len(all_paths))
        done += len(batch)
        pending = writer.submit(_write_batch, deps, job, out, docs,
                                {k: (ref or _source_ref(plans, k[2]), ids) for k, ids in vanished.items()},
                                [blob_key(sha) for path, _, sha, _ in per_path if path not in failed_paths], uploads,
                                to_embed)
    if pending is not None:
        pending.result()
        deps.records.put_job(job)
        if progress:
            progress("index", done, len(all_paths))
    return out


def batch_bounds(n: int, size: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the index batches over ``n`` paths: ``size`` paths each, except that the first batches
    are ``size/8``, ``size/4`` and ``size/2`` (at least 1) so the writer thread starts bulk-writing while the
    rest is chunked (issue 20: a repository of fewer than ``size`` files was chunked whole, then written whole,
    its chunking never overlapping a bulk request). Example: ``batch_bounds(120, 200)`` →
    ``[(0, 25), (25, 75), (75, 120)]``."""
    out: list[tuple[int, int]] = []
    i = 0
    for step in (max(1, size // 8), max(1, size // 4), max(1, size // 2)):
        if i >= n:
            return out
        out.append((i, min(n, i + step)))
        i = out[-1][1]
    while i < n:
        out.append((i, min(n, i + max(1, size))))
        i = out[-1][1]
    return out


def _source_ref(plans: list[_Plan], source_id: str) -> str:
    return next(p.source.ref for p in plans if p.source.id == source_id)


def _link_shared(deps: SyncDeps, job: Job, plans: list[_Plan], writes: dict[tuple[str, str], list[tuple[Chunk, str]]],
                 failed_paths: set[str], ref: str | None) -> dict[str, list[str]]:
    """Issue 23: of the chunks ``writes`` plans to write for ``ref``, those the store already holds (for other refs
    of the source: same id, so the same path, lines and content) join ``ref`` by a membership update and are
    dropped from ``writes`` - unless the plan distrusts their path or its embedding failed, then they are written
    again. Returns ``id -> refs`` the store holds for the chunks still to write, so a rewrite keeps them."""
    ids = [cid for todo in writes.values() for _, cid in todo]
    have = deps.chunks.chunk_refs(ids) if ids else {}
    for sid in sorted({sid for sid, _ in writes}):  # overlays based on the ref keep their members (scopekb.overlays)
        joining = {cid: have.get(cid, []) for (s, _), todo in writes.items() if s == sid for _, cid in todo}
        overlays.hide_joining(deps.records, sid, ref or _source_ref(plans, sid), joining)
    if not have:
        return {}
    rewrite = {(p.source.id, path) for p in plans for path in p.rewrite}
    updates: dict[str, list[str]] = {}
    keep: dict[str, list[str]] = {}
    for (sid, path), todo in list(writes.items()):
        want = ref or _source_ref(plans, sid)
        rest = []
        for c, cid in todo:
            refs = have.get(cid)
            if refs is None:
                rest.append((c, cid))
            elif want in refs or (sid, path) in rewrite or path in failed_paths:
                keep[cid] = refs
                rest.append((c, cid))
            else:
                updates[cid] = sorted({*refs, want})
        if rest:
            writes[(sid, path)] = rest
        else:
            del writes[(sid, path)]
    if updates:
        report = deps.chunks.set_refs(updates)
        job.chunks_linked += report.written
        if report.errors:  # the ref would miss chunks: the task retries the sync (nothing recorded as indexed)
            raise StoreUnavailable(f"{len(report.errors)} chunks did not join ref {ref!r}: {report.errors[0][2][:300]}")
    return keep


def _write_batch(deps: SyncDeps, job: Job, out: _Outcome, docs: list[dict[str, Any]],
                 vanished: dict[tuple[str, str, str], tuple[str, list[str]]], keys: list[str],
                 uploads: BlobUploads | None, to_embed: Sequence[list[str]] = ()) -> None:
    """Write one batch (in :func:`_index`'s writer thread, while the next batch is chunked): wait for its blobs to
    be stored, bulk-write its chunks (bounded retries), record refusals, then take the ref off the chunks of
    re-indexed paths that its new version no longer has (``(agent, context, source id) -> (ref, ids)``; a chunk
    no ref uses any more is deleted)."""
    if uploads is not None:
        uploads.wait(keys)
    report = _bulk_write(deps, job, docs)
    job.chunks_written += report.written
    bad_ids = {d for d, _, _ in report.errors}
    for _doc_id, path, reason in report.errors:
        job.errors.append(f"{path}: {reason}")
    for d in docs:
        if d["_id"] in bad_ids:
            out.failed.add(d[F.SOURCE_ID])
            out.refused.add(d[F.SOURCE_ID])
            out.failed_paths.setdefault(d[F.SOURCE_ID], set()).add(d[F.PATH])
        else:
            out.written.add(d[F.PATH])
    for (agent, ctx, sid), (ref, ids) in vanished.items():
        job.chunks_deleted += _leave(deps, agent, ctx, sid, ref, ids)
    _send_embedding(deps, job, [it for it in to_embed if it[0] not in bad_ids])


def _send_embedding(deps: SyncDeps, job: Job, items: Sequence[list[str]]) -> None:
    """Send a written batch's chunks to the embedding stage in parts of ``worker.embed_part_chunks`` (issue 19);
    ``job.embed_parts`` counts them (the parts of this run are numbered from 0)."""
    if not items or deps.embed_sink is None or not job.embed_run:
        return
    size = max(1, deps.settings.worker.embed_part_chunks)
    for i in range(0, len(items), size):
        deps.embed_sink.send(job.id, job.embed_run, job.embed_parts, list(items[i:i + size]))
        job.embed_parts += 1


def _leave(deps: SyncDeps, agent: str, ctx: str, sid: str, ref: str, ids: list[str]) -> int:
    """Chunks ``ids`` (members of ``ref`` in one scope and source) leave ``ref``, overlays kept right
    (:mod:`scopekb.overlays`): overlays based on ``ref`` first take those they see as explicit members; in an
    overlay ``ref``, those it sees through its base are hidden; then ``ref`` leaves the chunks naming it (a chunk
    no ref names any more is deleted). Returns chunks deleted."""
    deleted = 0
    for i in range(0, len(ids), 5000):
        part = ids[i:i + 5000]
        before = deps.chunks.chunk_refs(part)
        based = overlays.materialize_leaving(deps.chunks, deps.records, sid, ref, before)
        overlays.hide_in_overlay(deps.records, sid, ref, before)
        deleted += deps.chunks.remove_ref(agent, ctx, sid, ref, ids=part)[1]
        overlays.forget_left(deps.records, sid, based, [cid for cid, refs in before.items() if ref in refs])
    return deleted


def _changes(deps: SyncDeps, plans: list[_Plan], index_sets: dict[str, frozenset[str]],
             per_path: list[tuple[str, str, str, list[Chunk]]], failed_paths: set[str],
             ref: str | None = None) -> tuple[dict[tuple[str, str], list[tuple[Chunk, str]]],
                                             dict[tuple[str, str, str], list[str]]]:
    """Which chunks of a batch to write and which stored chunks to delete (issue 20).

    A chunk's id is stable (:func:`scopekb.fields.chunk_id`: scope, source, path, line range, chunk identity),
    so a stored chunk with the new chunk's id already holds exactly that chunk and is kept, unless it was written
    without a blob id (its embedding failed: written again to get its vector) or the plan distrusts the path
    (:attr:`_Plan.rewrite`). Stored ids the new version does not have are deleted. When a changed path needs no
    write at all (it only lost chunks) but its newest stored chunk names another blob, its first chunk is written
    again, so the newest write names the current blob (:meth:`ChunkStore.indexed_blobs` reads it that way).

    With ``ref`` (issue 23) "what the index holds" is what it holds for that ref, and a vanished chunk only leaves
    the ref (:meth:`ChunkStore.remove_ref`; deleted when no other ref has it).

    Returns:
        ``({(source id, path): [(chunk, id), ...]}, {(agent, context, source id): [chunk ids that vanished]})``.
    """
    writes: dict[tuple[str, str], list[tuple[Chunk, str]]] = {}
    vanished: dict[tuple[str, str, str], list[str]] = {}
    shas = {(path, c.chunk_index): F.chunk_sha(c.content, c.kind, c.symbol, c.signature, c.metadata)
            for path, _, _, chunks in per_path for c in chunks}
    for plan in plans:
        src = plan.source
        stale = [path for path, _, _, _ in per_path if path in plan.maybe_stale and path in index_sets[src.id]]
        view = ref or src.ref
        stored = deps.chunks.chunk_versions(src.agent_name, src.context_id, src.id, stale, ref=view,
                                            overlay=overlays.get_overlay(deps.records, src.id, view)) if stale else {}
        for path, _lang, sha, chunks in per_path:
            if path not in index_sets[src.id]:
                continue
            ids = [F.chunk_id(src.agent_name, src.context_id, src.id, path, c.start_line, c.end_line,
                              shas[(path, c.chunk_index)]) for c in chunks]
            have = stored.get(path, {})
            trusted = {cid for cid, (blob, _) in have.items() if blob} if path not in plan.rewrite else set()
            todo = [(c, cid) for c, cid in zip(chunks, ids, strict=True) if cid not in trusted]
            if not todo and chunks:
                blob = "" if path in failed_paths else sha
                newest = max(t for _, t in have.values())
                if {b for b, t in have.values() if t == newest} != {blob}:
                    todo = [(chunks[0], ids[0])]
            if todo:
                writes[(src.id, path)] = todo
            keep = set(ids)
            gone = [cid for cid in have if cid not in keep]
            if gone:
                vanished.setdefault((src.agent_name, src.context_id, src.id), []).extend(gone)
    return writes, vanished


def _chunk_file(deps: SyncDeps, job: Job, group: Sequence[str], path: str, sha: str, crash: frozenset[str],
                attempts: FileAttempts | None = None, data: bytes | None = None,
                uploads: BlobUploads | None = None) -> list[Chunk] | None:
    """Chunks of one file, or None when it is skipped: its chunking raised, or the process died while chunking
    it more than ``attempts.limit`` times (counted from the job's first redelivery; then it is parked as a dead
    letter and not tried again)."""
    if data is None:  # not kept from the git reader: read back once its put finished
        if uploads is not None:
            uploads.wait([blob_key(sha)])
        data = deps.blobs.get(blob_key(sha))  # store errors are the sync's, not the file's
    text = filetypes.decode_text(data)
    if attempts is not None:
        n = attempts.begin(group, path, sha)
        if n > attempts.limit:
            attempts.park(job, path, sha, n - 1)
            job.files_skipped[SKIP_POISON] = job.files_skipped.get(SKIP_POISON, 0) + 1
            job.errors.append(f"{path}: not indexed: its chunking stopped the worker {n - 1} times; "
                              "parked as a dead letter")
            log.error("file_parked", path=path, blob_sha=sha, attempts=n - 1)
            return None
    if path in crash:
        log.warning("test_fault_crash_chunking", path=path)
        os._exit(86)
    try:
        chunks = chunk_document(path, text, filetypes.language_for(path), deps.settings.chunking, deps.counter)
    except Exception as e:  # noqa: BLE001 - one file's chunker bug must not stop the sync
        job.files_skipped[SKIP_CHUNKING_ERROR] = job.files_skipped.get(SKIP_CHUNKING_ERROR, 0) + 1
        job.errors.append(f"{path}: chunking failed: {type(e).__name__}: {e}"[:500])
        log.error("chunking_failed", path=path, error=str(e))
        chunks = None
    if attempts is not None:
        attempts.done(group, path, sha)
    return chunks


def _test_crash_paths() -> frozenset[str]:
    """Paths whose chunking ends the process (test-only; empty unless ``SCOPEKB_TESTING_FAULTS=1``)."""
    if os.environ.get(TESTING_FAULTS_ENV) != "1":
        return frozenset()
    return frozenset(p for p in os.environ.get(CRASH_CHUNKING_ENV, "").split(",") if p)


def _bulk_write(deps: SyncDeps, job: Job, docs: list[dict[str, Any]]) -> BulkReport:
    """``bulk_write`` that re-sends items OpenSearch did not take for a transient reason (unreachable, 429,
    502-504) with jittered exponential backoff, counted in ``job.retries["bulk_items"]`` together with the 429
    items the store re-sent within one ``bulk_write`` (:attr:`BulkReport.retried`).

    Raises:
        StoreUnavailable: items still not taken after ``BULK_RETRY_ROUNDS`` rounds.
    """
    report = deps.chunks.bulk_write(docs)
    written, errors = report.written, list(report.errors)
    _count(job, "bulk_items", report.retried)  # 429 items the store re-sent itself
    for rounds in range(BULK_RETRY_ROUNDS + 1):
        transient = {doc_id for doc_id, _, reason in errors
                     if reason.split(":", 1)[0].strip() in _TRANSIENT_BULK_STATUSES}
        if not transient:
            break
        if rounds == BULK_RETRY_ROUNDS:
            first = next(reason for doc_id, _, reason in errors if doc_id in transient)
            raise StoreUnavailable(f"{len(transient)} chunks not written after {rounds} retries: {first[:300]}")
        problem = deps.chunks.problem()
        if problem is not None:  # the cluster says it cannot serve (red, no cluster manager): the task waits
            raise StoreUnavailable(f"{len(transient)} chunks not written: {problem}")
        delay = backoff_delay(rounds, BULK_BACKOFF_BASE_S, BULK_BACKOFF_MAX_S)
        log.warning("bulk_retry", items=len(transient), round=rounds + 1, delay_s=round(delay, 2),
                    error=next(r for d, _, r in errors if d in transient)[:200])
        time.sleep(delay)
        _count(job, "bulk_items", len(transient))
        again = deps.chunks.bulk_write([d for d in docs if d["_id"] in transient])
        _count(job, "bulk_items", again.retried)
        written += again.written
        errors = [e for e in errors if e[0] not in transient] + list(again.errors)
    return BulkReport(written=written, errors=errors)


def _embed(deps: SyncDeps, job: Job, per_path: list[tuple[str, str, str, list[Chunk]]],
           failed_paths: set[str], needed: set[tuple[str, int]] | None = None) -> dict[tuple[str, int], list[float]]:
    """Vectors for a batch's chunks, through the cache: ``(path, chunk index) -> vector``.

    Only the chunks in ``needed`` (all when None) are embedded; only texts the cache does not know are sent to
    the embedder, each once. A chunk the provider refuses is
    written without a vector (keyword search still finds it); its path is added to ``failed_paths`` and named
    in ``job.errors``, so the sync ends ``partial`` and the next one retries the file.
    """
    if deps.embedder is None:
        return {}
    keys: list[tuple[str, int]] = []
    texts: list[str] = []
    for path, lang, _sha, chunks in per_path:
        for c in chunks:
            if needed is not None and (path, c.chunk_index) not in needed:
                continue  # kept as stored (stable id): not written, so not embedded
            keys.append((path, c.chunk_index))
            texts.append(embedding_text(path, lang, c, deps.settings.chunking, deps.counter))
    if not texts:
        return {}
    vectors, stats, errors = embed_with_cache(deps.embedder, deps.embed_cache, texts)
    job.embeddings_computed += stats.computed
    job.embeddings_cached += stats.cached
    for pos, reason in sorted(errors.items()):
        path = keys[pos][0]
        if path not in failed_paths:
            failed_paths.add(path)
            job.errors.append(f"{path}: embedding refused: {reason}")
    return {k: list(v) for k, v in zip(keys, vectors, strict=True) if v is not None}


def _doc(src: Source, path: str, lang: str, c: Chunk, doc_id: str, blob_sha: str, commit: str,
         now: str, ref: str | None = None, refs: Sequence[str] = ()) -> dict[str, Any]:
    """A chunk document of ``ref`` (default: the source's) at ``commit``; ``refs``: other refs that hold it."""
    ref = ref or src.ref
    content_sha = hashlib.sha256(c.content.encode("utf-8")).hexdigest()
    return {
        "_id": doc_id,
        F.AGENT_NAME: src.agent_name, F.CONTEXT_ID: src.context_id, F.SOURCE_ID: src.id,
        F.REPO: src.repo_name or src.repo_url, F.REF: ref, F.REFS: sorted({*refs, ref}), F.COMMIT: commit, F.PATH: path,
        F.LANGUAGE: lang, F.KIND: c.kind, F.SYMBOL: c.symbol, F.SIGNATURE: c.signature, F.CONTENT: c.content,
        F.CHUNK_INDEX: c.chunk_index, F.START_LINE: c.start_line, F.END_LINE: c.end_line,
        F.CONTENT_SHA: content_sha, F.BLOB_SHA: blob_sha, F.INDEXED_AT: now,
        F.METADATA: F.storable_metadata(c.metadata or {}),  # untrusted (front matter, object metadata): plain JSON
        **F.def_fields(c.defs),
    }
