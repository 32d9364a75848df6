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
"""

from __future__ import annotations

import fnmatch
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scopekb import fields as F
from scopekb import filetypes
from scopekb.blobs import BlobStore, blob_key
from scopekb.chunking import TokenCounter, chunk_document, embedding_text
from scopekb.documents import DOCUMENT_SUFFIXES, DocumentError, ObjectPrefix, to_text
from scopekb.embedding import Embedder, EmbeddingCache, embed_with_cache
from scopekb.gitrepo import MODE_GITLINK, MODE_SYMLINK, Mirror, TreeEntry
from scopekb.logging import get_logger
from scopekb.models import Chunk, Job, JobState, Source, utcnow
from scopekb.settings import Settings, git_cache_dir
from scopekb.stores.base import ChunkStore
from scopekb.stores.records import RecordStore

log = get_logger(__name__)

SKIP_UNSUPPORTED = "unsupported_document"
SKIP_UNREADABLE = "unreadable_document"

#: Progress callback: (phase, done, total). Phases: "read", "index".
Progress = Callable[[str, int, int], None]


class SyncError(RuntimeError):
    """A sync cannot run (no sources, sources of different repositories, ref missing)."""


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


@dataclass
class _Plan:
    source: Source
    from_commit: str | None
    to_index: list[str] = field(default_factory=list)
    to_delete: list[str] = field(default_factory=list)
    #: Paths being re-indexed that may already have chunks (modified, or present in the index before).
    maybe_stale: set[str] = field(default_factory=set)


@dataclass
class _Prepared:
    """A path's outcome after reading: a blob key to index, or a skip reason."""

    entry: TreeEntry
    skip: str | None = None


def run_sync(deps: SyncDeps, job_id: str, source_ids: list[str], *, trigger: str = "webhook",
             branch_deleted: bool = False, progress: Progress | None = None) -> Job:
    """Bring ``source_ids`` (one repository, one ref) to the ref's current commit and return the job record.

    The job record (``jobs`` system index, id ``job_id``) is updated as the sync goes. Idempotent: a retry with
    the same arguments converges to the same index (deterministic ids; unchanged files are not rewritten).

    Raises:
        SyncError: the sources are missing or span several repositories or refs.
        scopekb.gitrepo.GitError: the repository cannot be fetched.
    """
    sources = [s for s in (deps.records.get_source(i) for i in source_ids) if s is not None]
    if not sources:
        raise SyncError(f"none of the sources {source_ids} exist")
    repo_url, ref = sources[0].repo_url, sources[0].ref
    if any(s.repo_url != repo_url or s.ref != ref for s in sources):
        raise SyncError("one sync covers one repository and ref; split the sources")
    job = deps.records.get_job(job_id) or Job(id=job_id, trigger=trigger)
    job = Job(id=job_id, trigger=job.trigger, created_at=job.created_at, source_ids=[s.id for s in sources],
              repo=sources[0].repo_name or repo_url, ref=ref, state=JobState.running, started_at=utcnow())
    deps.records.put_job(job)
    t0 = time.monotonic()
    try:
        if branch_deleted:
            _delete_branch(deps, job, sources)
        else:
            _sync(deps, job, sources, progress)
    except Exception as e:  # recorded, then re-raised for the task's retry policy
        job.state = JobState.failed
        job.errors.append(f"{type(e).__name__}: {e}")
        job.finished_at = utcnow()
        deps.records.put_job(job)
        log.error("sync_failed", job_id=job.id, error=str(e))
        raise
    if job.chunks_written or job.chunks_deleted:
        deps.chunks.refresh()  # a finished job means its changes are searchable
    job.finished_at = utcnow()
    job.state = JobState.partial if job.errors else JobState.done
    deps.records.put_job(job)
    log.info("sync_finished", job_id=job.id, state=job.state.value, to_commit=job.to_commit,
             files_indexed=job.files_indexed, files_deleted=job.files_deleted, chunks_written=job.chunks_written,
             chunks_deleted=job.chunks_deleted, seconds=round(time.monotonic() - t0, 3))
    return job


def _delete_branch(deps: SyncDeps, job: Job, sources: list[Source]) -> None:
    for src in sources:
        job.chunks_deleted += deps.chunks.delete_source(src.id)
        deps.records.set_indexed_commit(src.id, None)
    log.info("branch_deleted", job_id=job.id, ref=job.ref, chunks_deleted=job.chunks_deleted)


def _reader(deps: SyncDeps, src: Source) -> Mirror | ObjectPrefix:
    s = deps.settings
    if src.kind == "s3":
        return ObjectPrefix(s.s3, src.bucket or s.s3.bucket, src.prefix or "")
    return Mirror(git_cache_dir(s), src.repo_url, allow_local=s.git.allow_local_paths, timeout_s=s.git.fetch_timeout_s)


def _sync(deps: SyncDeps, job: Job, sources: list[Source], progress: Progress | None) -> None:
    reader = _reader(deps, sources[0])
    try:
        reader.fetch()
        if isinstance(reader, ObjectPrefix):
            tree = reader.tree()
            target = hashlib.sha1("\n".join(f"{p}\0{e.sha}" for p, e in sorted(tree.items())).encode()).hexdigest()
        else:
            resolved = reader.resolve(sources[0].ref)
            if resolved is None:
                raise SyncError(f"ref {sources[0].ref!r} not found in {sources[0].repo_url}")
            target = resolved
            tree = {e.path: e for e in reader.tree(target)}
        job.to_commit = target
        plans = [_plan(deps, reader, src, target, tree) for src in sources]
        job.from_commit = {p.source.id: p.from_commit for p in plans}
        deps.records.put_job(job)
        wanted = sorted({p for plan in plans for p in plan.to_index})
        job.files_seen = len(wanted)
        prepared = _read_and_store(deps, reader, tree, wanted, job, progress)
    finally:
        reader.close()
    failed_sources = _index(deps, job, plans, prepared, target, progress)
    for plan in plans:
        if plan.to_delete:
            job.chunks_deleted += deps.chunks.delete_paths(plan.source.agent_name, plan.source.context_id,
                                                           plan.source.id, plan.to_delete)
        job.files_deleted += len(plan.to_delete)
    for plan in plans:
        if plan.source.id not in failed_sources:
            deps.records.set_indexed_commit(plan.source.id, target)


def _plan(deps: SyncDeps, reader: Mirror | ObjectPrefix, src: Source, target: str,
          tree: dict[str, TreeEntry]) -> _Plan:
    last = deps.records.indexed_commit(src.id)
    plan = _Plan(source=src, from_commit=last)
    if last == target:
        return plan
    if isinstance(reader, Mirror) and last and reader.has_commit(last):
        for c in reader.diff(last, target):
            if c.status == "D":
                plan.to_delete.append(c.path)
            else:
                if c.old_path:
                    plan.to_delete.append(c.old_path)
                plan.to_index.append(c.path)
                if c.status != "A":
                    plan.maybe_stale.add(c.path)
        mode = "diff"
    else:
        # No usable state (first sync, history rewritten, an object listing): compare the tree with what the
        # index holds, by content id, so unchanged documents are neither read nor written again.
        indexed = deps.chunks.indexed_blobs(src.id, src.agent_name, src.context_id)
        plan.to_index = [p for p, e in tree.items() if indexed.get(p) != e.sha]
        plan.to_delete = sorted(set(indexed) - set(tree))
        plan.maybe_stale = set(indexed) & set(plan.to_index)
        mode = "full"
    if src.include or src.exclude:  # the source's own globs: excluded paths are dropped, and lose their chunks
        excluded = [p for p in plan.to_index if filetypes.path_skip_reason(p, src.include, src.exclude)]
        plan.to_index = [p for p in plan.to_index if p not in set(excluded)]
        plan.to_delete = sorted(set(plan.to_delete) | set(excluded))
    log.info("sync_planned", source_id=src.id, mode=mode, from_commit=last, to_commit=target,
             index=len(plan.to_index), delete=len(plan.to_delete))
    return plan


def _read_and_store(deps: SyncDeps, mirror: Mirror | ObjectPrefix, tree: dict[str, TreeEntry], paths: list[str],
                    job: Job, progress: Progress | None) -> dict[str, _Prepared]:
    """Classify and read each path once; put text blobs in the blob store. Returns path → outcome."""
    s = deps.settings
    documents = isinstance(mirror, ObjectPrefix)
    vendored = frozenset() if documents else _vendored_paths(mirror, tree)
    out: dict[str, _Prepared] = {}
    stored: set[str] = set()
    for n, path in enumerate(paths, 1):
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
        if reason is None and e.sha not in stored:
            data = mirror.read_blob(e.sha)
            if documents:
                try:
                    data = to_text(path, data) or data
                except DocumentError as err:
                    reason = SKIP_UNREADABLE
                    job.errors.append(f"{path}: {err}")
            reason = reason or filetypes.content_skip_reason(data)
            if reason is None:
                deps.blobs.put(blob_key(e.sha), data)
                stored.add(e.sha)
        out[path] = _Prepared(entry=e, skip=reason)
        if reason:
            job.files_skipped[reason] = job.files_skipped.get(reason, 0) + 1
        if progress:
            progress("read", n, len(paths))
    return out


def _vendored_paths(mirror: Mirror, tree: dict[str, TreeEntry]) -> frozenset[str]:
    ga = tree.get(".gitattributes")
    if ga is None or ga.mode in (MODE_GITLINK, MODE_SYMLINK):
        return frozenset()
    patterns = filetypes.parse_gitattributes_vendored(filetypes.decode_text(mirror.read_blob(ga.sha)))
    if not patterns:
        return frozenset()
    return frozenset(p for p in tree for pat in patterns
                     if fnmatch.fnmatchcase(p, pat.lstrip("/")) or fnmatch.fnmatchcase(p, pat.lstrip("/") + "/*"))


def _index(deps: SyncDeps, job: Job, plans: list[_Plan], prepared: dict[str, _Prepared], commit: str,
           progress: Progress | None) -> set[str]:
    """Chunk and write every planned path for every source, batch by batch. Returns ids of failed sources."""
    s = deps.settings
    failed: set[str] = set()
    chunk_cache: dict[str, list[Chunk]] = {}  # blob sha -> chunks: one chunking per blob per sync
    index_sets = {plan.source.id: frozenset(plan.to_index) for plan in plans}
    all_paths = sorted(set().union(*index_sets.values()))
    done = 0
    for i in range(0, len(all_paths), s.worker.batch_files):
        batch = all_paths[i:i + s.worker.batch_files]
        docs: list[dict[str, Any]] = []
        keep: dict[tuple[str, str], list[str]] = {}
        now = utcnow().isoformat()
        per_path: list[tuple[str, str, str, list[Chunk]]] = []  # (path, language, blob sha, chunks)
        for path in batch:
            prep = prepared.get(path)
            if prep is None:
                continue
            chunks: list[Chunk] = []
            if prep.skip is None:
                chunks = chunk_cache.get(prep.entry.sha) or _chunk_blob(deps, path, prep.entry.sha, s)
                chunk_cache[prep.entry.sha] = chunks
            per_path.append((path, filetypes.language_for(path), prep.entry.sha, chunks))
            if prep.skip is None and chunks:
                job.files_indexed += 1
        failed_paths: set[str] = set()
        vectors = _embed(deps, job, per_path, failed_paths)
        for path, lang, sha, chunks in per_path:
            for plan in plans:
                if path not in index_sets[plan.source.id]:
                    continue
                if path in failed_paths:
                    failed.add(plan.source.id)
                ids = keep.setdefault((plan.source.id, path), [])
                for c in chunks:
                    # A file whose embedding failed carries no blob id, so the next full sync sees it as
                    # changed and retries it (keyword search finds it meanwhile).
                    doc = _doc(plan.source, path, lang, c, "" if path in failed_paths else sha, commit, now)
                    vec = vectors.get((path, c.chunk_index))
                    if vec is not None and deps.embedder is not None:
                        doc[F.EMBEDDING] = vec
                        doc[F.EMBEDDING_MODEL] = deps.embedder.model_id
                    docs.append(doc)
                    ids.append(doc["_id"])
        report = deps.chunks.bulk_write(docs)
        job.chunks_written += report.written
        bad_ids = {d for d, _, _ in report.errors}
        for _doc_id, path, reason in report.errors:
            job.errors.append(f"{path}: {reason}")
        for d in docs:
            if d["_id"] in bad_ids:
                failed.add(d[F.SOURCE_ID])
        # Stale chunks of re-indexed paths that had chunks before: everything of that (scope, source, path) not
        # just written, in one delete per source and batch.
        for plan in plans:
            stale = [p for p in batch if p in plan.maybe_stale]
            if stale:
                job.chunks_deleted += deps.chunks.delete_paths(
                    plan.source.agent_name, plan.source.context_id, plan.source.id, stale,
                    keep_ids=[i for p in stale for i in keep.get((plan.source.id, p), [])])
        done += len(batch)
        deps.records.put_job(job)  # progress
        if progress:
            progress("index", done, len(all_paths))
    return failed


def _chunk_blob(deps: SyncDeps, path: str, sha: str, s: Settings) -> list[Chunk]:
    text = filetypes.decode_text(deps.blobs.get(blob_key(sha)))
    return chunk_document(path, text, filetypes.language_for(path), s.chunking, deps.counter)


def _embed(deps: SyncDeps, job: Job, per_path: list[tuple[str, str, str, list[Chunk]]],
           failed_paths: set[str]) -> dict[tuple[str, int], list[float]]:
    """Vectors for a batch's chunks, through the cache: ``(path, chunk index) -> vector``.

    Only texts the cache does not know are sent to the embedder, each once. A chunk the provider refuses is
    written without a vector (keyword search still finds it); its path is added to ``failed_paths`` and named
    in ``job.errors``, so the sync ends ``partial`` and the next one retries the file.
    """
    if deps.embedder is None:
        return {}
    keys: list[tuple[str, int]] = []
    texts: list[str] = []
    for path, lang, _sha, chunks in per_path:
        for c in chunks:
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


def _doc(src: Source, path: str, lang: str, c: Chunk, blob_sha: str, commit: str, now: str) -> dict[str, Any]:
    content_sha = hashlib.sha256(c.content.encode("utf-8")).hexdigest()
    return {
        "_id": F.chunk_id(src.agent_name, src.context_id, src.id, path, c.chunk_index, content_sha),
        F.AGENT_NAME: src.agent_name, F.CONTEXT_ID: src.context_id, F.SOURCE_ID: src.id,
        F.REPO: src.repo_name or src.repo_url, F.REF: src.ref, F.COMMIT: commit, F.PATH: path,
        F.LANGUAGE: lang, F.KIND: c.kind, F.SYMBOL: c.symbol, F.SIGNATURE: c.signature, F.CONTENT: c.content,
        F.CHUNK_INDEX: c.chunk_index, F.START_LINE: c.start_line, F.END_LINE: c.end_line,
        F.CONTENT_SHA: content_sha, F.BLOB_SHA: blob_sha, F.METADATA: c.metadata, F.INDEXED_AT: now,
    }
