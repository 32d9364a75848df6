"""The application layer: every admin action and "enqueue a sync", written once (DESIGN §13 "one door per action").

REST (``scopekb_query.routes``), MCP (``scopekb_query.mcp_server``), the CLI, the webhook ingester and the
worker's reconcile call these functions with their process's runtime (:mod:`scopekb.runtime`); none of them
repeats the logic. Errors are scopekb's own family (:mod:`scopekb.errors`): :class:`Refused` /
:class:`NotFound` for the caller's mistakes (HTTP 4xx, CLI one line) and :class:`Transient` when the queue or a
store is unavailable (HTTP 503, the host retries).

Every enqueued sync writes its queued marker first (:meth:`scopekb.coordination.Coordination.mark_queued`), so
``GET /v1/jobs/{id}`` answers for it from the moment it is accepted, whatever enqueued it.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from scopekb import overlays
from scopekb.auth import ApiKey, new_key
from scopekb.coordination import keys
from scopekb.documents import document_name_problem
from scopekb.errors import NotFound, Refused, Transient
from scopekb.gitrepo import Mirror, mirror_path
from scopekb.logging import get_logger
from scopekb.models import (
    DeadLetter,
    Job,
    JobStage,
    JobState,
    KeyCreate,
    ReadRequest,
    ReadResult,
    Source,
    SourceCreate,
    utcnow,
)
from scopekb.queue import TASK_SYNC_SOURCES, embed_task_id
from scopekb.reading import read_lines
from scopekb.refs import CommitNotIndexed, pin_ref_state, ref_states
from scopekb.runtime import ControlRuntime, Runtime
from scopekb.search import forget_pinned
from scopekb.settings import git_cache_dir
from scopekb.sources import repo_key, validate_repo_url, webhook_secret_for
from scopekb.status import source_status
from scopekb.stores.base import ScopeFilter

log = get_logger("scopekb.ops")

#: Largest document ``upload_document`` takes: this many times ``ingester.max_body_bytes``.
UPLOAD_BODY_FACTOR = 10


# ---- sources -------------------------------------------------------------------------------------------------

def register_source(rt: ControlRuntime, body: SourceCreate, allow_local: bool | None = None) -> Source:
    """Register a git repository + ref, or an object-store prefix, for a scope; ingesters reload their sources.

    Git clone URLs are validated (https/ssh; no private, loopback or metadata hosts unless allowlisted; local
    paths only when ``allow_local``, default ``git.allow_local_paths``). A webhook-driven source registered
    without a secret gets a generated one (show it once with :func:`registration_view`); ``webhooks=False``
    stores none, and such a source refuses every delivery.

    Raises:
        scopekb.sources.InvalidRepoUrl: (a :class:`Refused`, 422) the clone URL is refused, with the reason.
        Refused: (409) a source of the same scope already registers the same repository (any spelling of its
            URL or path: :func:`scopekb.sources.repo_key`) or prefix with the same ref, refs, include and exclude;
            each hit would then be answered once per copy (hostile review).
    """
    url = body.repo_url
    if body.kind == "git":
        git = rt.settings.git
        url = validate_repo_url(body.repo_url, git.allow_local_paths if allow_local is None else allow_local,
                                git.host_allowlist)
    same = _same_source(rt, body, url)
    if same is not None:
        raise Refused(f"source {same.id} already registers this {'repository' if body.kind == 'git' else 'prefix'} "
                      f"and ref for {body.agent_name}/{body.context_id}; sync it, or remove it first", 409)
    secret, _shown = webhook_secret_for(body)  # a webhook-driven source always has one (issue 16)
    src = Source(**{**body.model_dump(), "repo_url": url, "webhook_secret": secret}, id=Source.new_id())
    rt.records.put_source(src)
    rt.coord.bump_sources_version()
    log.info("source_added", source_id=src.id, agent_name=src.agent_name, context_id=src.context_id)
    return src


def _same_source(rt: ControlRuntime, body: SourceCreate, url: str) -> Source | None:
    """A registered source of ``body``'s scope that would index exactly what ``body`` asks for, or None."""
    def where(kind: str, repo: str, bucket: str | None, prefix: str | None) -> tuple[str, ...]:
        return (kind, repo_key(repo), "") if kind == "git" else (kind, bucket or "", prefix or "")

    want = (where(body.kind, url, body.bucket, body.prefix), body.ref.removeprefix("refs/heads/"), sorted(body.refs),
            body.include, body.exclude)
    for src in rt.records.list_sources(agent_name=body.agent_name):
        if src.context_id == body.context_id and want == (
                where(src.kind, src.repo_url, src.bucket, src.prefix), src.ref.removeprefix("refs/heads/"),
                sorted(src.refs), src.include, src.exclude):
            return src
    return None


def registration_view(body: SourceCreate, src: Source) -> dict[str, Any]:
    """The answer to a registration: the source without secrets, plus ``webhook_secret`` when it was generated
    (a webhook-driven source registered without one) - the only time that secret is ever shown."""
    out = src.public()
    if src.webhooks and src.webhook_secret is not None and not (
            body.webhook_secret is not None and body.webhook_secret.get_secret_value()):
        out["webhook_secret"] = src.webhook_secret.get_secret_value()
    return out


def get_source(rt: ControlRuntime, source_id: str) -> Source:
    """The registered source ``source_id``.

    Raises:
        NotFound: no such source.
    """
    src = rt.records.get_source(source_id)
    if src is None:
        raise NotFound("source not found")
    return src


def remove_source(rt: Runtime, source_id: str) -> int:
    """Unregister a source and delete its chunks and sync state. Returns the number of chunks deleted.

    Raises:
        NotFound: no such source.
    """
    get_source(rt, source_id)
    deleted = rt.chunks.delete_source(source_id)
    rt.records.delete("state", source_id)
    rt.records.delete(overlays.KIND, source_id)
    rt.records.delete("sources", source_id)
    rt.coord.bump_sources_version()
    # Once more, after the record: a sync that still saw the source wrote before it looked, and one that looks
    # later finds it gone and deletes what it wrote (scopekb.indexing._drop_removed_sources; hostile review 3).
    rt.chunks.refresh()
    deleted += rt.chunks.delete_source(source_id)
    log.info("source_removed", source_id=source_id, chunks_deleted=deleted)
    return deleted


def source_report(rt: Runtime, src: Source) -> dict[str, Any]:
    """A source's public fields with its status (:func:`scopekb.status.source_status`)."""
    return {**src.public(), **source_status(rt.records, rt.chunks, src)}


def index_status(rt: Runtime) -> dict[str, Any]:
    """The search store's health (``cluster``: status, nodes, problem), the live index, its chunk count and every
    source with its status (``GET /v1/status``)."""
    return {"cluster": rt.chunks.cluster_health(), "index": rt.chunks.live_index(), "chunks": rt.chunks.count(),
            "sources": [source_report(rt, s) for s in rt.records.list_sources()]}


def upload_document(rt: Runtime, source_id: str, name: str, data: bytes, content_type: str | None) -> dict[
        str, Any]:
    """Store a document under an object-store source's prefix and enqueue its sync.

    ``name`` is the document's path below the prefix (``runbooks/restart.md``). Returns ``{"status": "queued",
    "key": <object key>, "job_id": ...}``.

    Raises:
        NotFound: no such source.
        Refused: not an object-store source (400), a bad name (422), a body over ``UPLOAD_BODY_FACTOR`` times
            ``ingester.max_body_bytes`` (413).
        scopekb.settings.S3NotConfigured: S3 is to be used but has no credentials.
    """
    src = get_source(rt, source_id)
    if src.kind != "s3":
        raise Refused("documents can only be uploaded to an object-store (s3) source")
    rel = name.lstrip("/")  # "/runbooks/x.md" is below the prefix too; nothing else is changed before the check
    problem = document_name_problem(rel, src.prefix or "")  # one rule for S3 and the embedded folder
    if problem:
        raise Refused(problem, 422)
    if len(data) > rt.settings.ingester.max_body_bytes * UPLOAD_BODY_FACTOR:
        raise Refused("document too large", 413)
    key = rt.documents(src.bucket, src.prefix or "").put(
        rel, data, content_type or "application/octet-stream")
    return {"status": "queued", "key": key, "job_id": sync_source(rt, src, "upload")}


# ---- keys ----------------------------------------------------------------------------------------------------

def create_key(rt: ControlRuntime, body: KeyCreate) -> tuple[ApiKey, str]:
    """Create an agent key. Returns the stored record (only the key's sha256 in it) and the key, shown once."""
    secret, h = new_key()
    rec = ApiKey(id="key_" + uuid.uuid4().hex[:12], agent_name=body.agent_name,
                 context_ids=body.context_ids, key_hash=h, label=body.label)
    rt.records.put("keys", rec.id, rec.model_dump(mode="json"))
    log.info("key_created", key_id=rec.id, agent_name=rec.agent_name)
    return rec, secret


def list_keys(rt: ControlRuntime) -> list[ApiKey]:
    """Every key record, oldest first (hashes included: callers drop them before showing)."""
    return [ApiKey.model_validate(d) for d in rt.records.find("keys", sort="created_at")]


def revoke_key(rt: ControlRuntime, key_id: str) -> None:
    """Revoke a key; this process's key lookup forgets its cache at once, and the keys version is bumped so every
    other replica's lookup does on its next request (issue 16).

    Raises:
        NotFound: no such key.
    """
    d = rt.records.get("keys", key_id)
    if d is None:
        raise NotFound("key not found")
    d["revoked_at"] = utcnow().isoformat()
    rt.records.put("keys", key_id, d)
    rt.keys.forget()
    rt.coord.bump_keys_version()
    log.info("key_revoked", key_id=key_id)


# ---- syncs and jobs ------------------------------------------------------------------------------------------

def enqueue_sync(rt: ControlRuntime, source_ids: Sequence[str], *, trigger: str, job_id: str | None = None,
                 ref: str | None = None, to_commit: str | None = None, **task_kwargs: Any) -> str:
    """Enqueue ``scopekb.sync_sources`` for sources of one repository and ref, after writing its queued marker.

    Args:
        trigger: why (``webhook``, ``manual``, ``upload``, ``s3-event``, ``reconcile``, ``replay``).
        job_id: the task and job id; default ``<trigger>-<16 hex>``.
        ref, to_commit: shown on the queued job until a worker records it.
        task_kwargs: further task arguments (``after``, ``branch_deleted``, ``delivery_id``, ``verify``).

    Returns:
        The job id.

    Raises:
        Transient: the coordination backend or the broker is unavailable.
    """
    job, kwargs = _queued_job(source_ids, trigger, job_id or f"{trigger}-{uuid.uuid4().hex[:16]}", ref, to_commit,
                              task_kwargs)
    _enqueue(rt, job, kwargs)
    return job.id


def _queued_job(source_ids: Sequence[str], trigger: str, job_id: str, ref: str | None, to_commit: str | None,
                task_kwargs: dict[str, Any]) -> tuple[Job, dict[str, Any]]:
    """The queued job a sync shows until a worker records it, and its task's arguments."""
    ids = list(source_ids)
    return (Job(id=job_id, source_ids=ids, ref=ref, to_commit=to_commit, trigger=trigger),
            {"job_id": job_id, "source_ids": ids, "trigger": trigger, **task_kwargs})


def _enqueue(rt: ControlRuntime, job: Job, task_kwargs: dict[str, Any]) -> None:
    """Write ``job``'s queued marker (with the task's arguments), then publish its sync task."""
    rt.coord.mark_queued(job, ttl_s=rt.settings.worker.result_expires_s, task_kwargs=task_kwargs)
    rt.tasks.send(TASK_SYNC_SOURCES, job.id, task_kwargs)


def sync_source(rt: ControlRuntime, source: Source | str, trigger: str = "manual") -> str:
    """Enqueue a sync of one source to its ref's current commit (or its prefix's current listing); the job id.

    Raises:
        NotFound: ``source`` is an id with no source.
        Transient: as :func:`enqueue_sync`.
    """
    src = get_source(rt, source) if isinstance(source, str) else source
    return enqueue_sync(rt, [src.id], trigger=trigger, ref=src.ref)


@dataclass(frozen=True)
class SyncSpec:
    """One sync a delivery asks for: its job id, sources and what the queued job shows; ``task_kwargs`` go to
    the task as they are."""

    job_id: str
    source_ids: list[str]
    trigger: str
    ref: str | None = None
    to_commit: str | None = None
    task_kwargs: dict[str, Any] = field(default_factory=dict)


def delivery_key(provider: str, delivery_id: str, source_ids: Iterable[str]) -> str:
    """The dedupe key and job id stem of a webhook or object-store delivery: ``<delivery id>.<12 hex>``.

    The hex is the first 12 of sha256 over the host kind and the sorted ids of the sources the delivery concerns
    (for a signed webhook: those whose secret verified the body). A delivery id is chosen by the sender (any git
    host, or a tenant replaying another tenant's id with its own valid signature), so it alone must neither
    dedupe against nor name another scope's job: equal keys mean the same host, the same sources and the same id
    (a true redelivery); the id stays the prefix so logs still trace one push end to end.
    """
    scope = "\0".join([provider, *sorted(set(source_ids))])
    return f"{delivery_id}.{hashlib.sha256(scope.encode()).hexdigest()[:12]}"


def enqueue_delivery(rt: ControlRuntime, provider: str, key: str, specs: Sequence[SyncSpec],
                     delivery_id: str | None = None, sources_version: int | None = None) -> bool:
    """Claim a webhook or object-store delivery once by its ``key`` (:func:`delivery_key`), then enqueue its
    syncs. False for a repeat. ``delivery_id`` (the host's, default ``key``) goes to the task for its log lines.

    The claim and the syncs' queued markers are written in one atomic step (one Redis round trip:
    :meth:`scopekb.coordination.Coordination.claim_delivery`), then each sync task is published; True only once
    every message is with the broker. If a publish fails the claim is released with the markers of the syncs not
    published, so the sender's retry is not dropped as a duplicate and no job the sender was told failed shows as
    queued. With ``sources_version`` (the sources version the caller judged the delivery against) the claim
    first checks that it is still current.

    Raises:
        Transient: the coordination backend or the broker is unavailable (nothing of the unpublished syncs is
            remembered).
        scopekb.coordination.SourcesChanged: ``sources_version`` is no longer current (nothing was written).
    """
    queued = [_queued_job(s.source_ids, s.trigger, s.job_id, s.ref, s.to_commit,
                          {"delivery_id": delivery_id or key, **s.task_kwargs}) for s in specs]
    if not rt.coord.claim_delivery(provider, key, rt.settings.ingester.dedupe_ttl_s, queued=queued,
                                   queued_ttl_s=rt.settings.worker.result_expires_s, sources_version=sources_version):
        return False
    sent = 0
    try:
        for job, kwargs in queued:
            rt.tasks.send(TASK_SYNC_SOURCES, job.id, kwargs)
            sent += 1
    except Exception as e:
        with contextlib.suppress(Exception):  # the backend itself may be the failure; the error below says so
            rt.coord.release_delivery(provider, key, queued=[job.id for job, _ in queued[sent:]])
        raise Transient(f"queue unavailable ({type(e).__name__})") from e
    return True


def get_job(rt: ControlRuntime, job_id: str) -> Job:
    """A sync job's record; a job no worker has started yet is reported from its queued marker.

    Raises:
        NotFound: neither a record nor a marker (unknown, or the marker expired).
    """
    job = rt.records.get_job(job_id) or rt.coord.queued_job(job_id)
    if job is None:
        raise NotFound("job not found")
    return job


#: Seconds between the two looks at the broker that must both miss a job's message before it counts as lost
#: (a worker moves a message from its queue list to the unacknowledged hash in two steps).
LOST_CONFIRM_S = 2.0
#: Times the reconcile enqueues a lost job again before it fails it with the reason.
LOST_REQUEUES = 1


@dataclass(frozen=True)
class LostJobs:
    """What :func:`settle_lost_jobs` did: job ids enqueued again and job ids failed."""

    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _waiting_jobs(rt: ControlRuntime, grace_s: float, known: set[str]) -> dict[str, tuple[Job, dict[str, Any]]]:
    """Jobs that should have a message in the broker: a queued marker older than ``grace_s`` for sources of this
    deployment (``known``; other deployments may share the Redis) and either no record yet, a record still
    ``queued`` (a retry waiting for its countdown) or one ``running`` (a running task holds its message until it
    ends: acks_late). ``{job id: (job, task kwargs)}``."""
    now = utcnow()
    out: dict[str, tuple[Job, dict[str, Any]]] = {}
    for marker, kwargs in rt.coord.queued_markers():
        if (now - marker.created_at).total_seconds() < grace_s or not known.intersection(marker.source_ids):
            continue
        rec = rt.records.get_job(marker.id)
        if rec is None or rec.state in (JobState.queued, JobState.running):
            out[marker.id] = (rec or marker, kwargs)
    return out


def _broker_task_ids(rt: ControlRuntime, job_id: str, job: Job) -> dict[str, int | None]:
    """The task ids whose messages keep ``job`` going, each with its embedding part number (None: the sync task):
    the sync task's own, or for a job in its embedding stage (issue 19; its sync task has ended and acknowledged its
    message) one per part not yet recorded done. Empty: every part is done but the job was never settled."""
    if job.state == JobState.running and job.stage == JobStage.embedding and job.embed_run:
        done = {int(r.get("part", -1)) for r in rt.coord.embed_parts_done(job_id, job.embed_run)}
        return {embed_task_id(job_id, job.embed_run, p): p for p in range(job.embed_parts) if p not in done}
    return {job_id: None}


def _unheld(probes: dict[str, int | None], in_broker: set[str]) -> set[str] | None:
    """The probed task ids the broker does not hold; None when nothing was probed (a settled-never stage)."""
    return {t for t in probes if t not in in_broker} if probes else None


def settle_lost_jobs(rt: ControlRuntime, grace_s: float | None = None,
                     confirm_s: float = LOST_CONFIRM_S) -> LostJobs:
    """Settle queued jobs whose task message the broker lost (issue 24), so none stays ``queued`` until its marker
    expires, and running jobs whose task ended without settling them (its worker process was ended by the hard
    time limit, or the record store failed the task's last write), so none stays ``running``.

    A job counts as lost when its queued marker is older than ``grace_s`` (default
    ``worker.lost_message_grace_s``), it has no record or one still ``queued`` or ``running``, and the broker
    holds no message for it - in no queue and delivered to no worker (:meth:`scopekb.runtime.CeleryTasks.held`;
    a running task's message stays delivered until it ends) - at two looks ``confirm_s`` apart. A lost job is
    enqueued again under the same job id with its original task arguments, a ``running`` record set back to
    ``queued`` (``job.retries["requeued"]`` counts it, ``job.errors`` says why); one lost again after
    ``LOST_REQUEUES`` re-enqueues is recorded ``failed`` with the reason. A wrong guess costs at most one
    duplicate sync (tasks are idempotent and serialised by the repository lock).

    A job in its embedding stage (issue 19) is looked for by its parts instead: it is lost when a part not yet
    done has no message in the broker at both looks (or every part is done and the job was never settled). Its
    sync is enqueued again the same way: the re-run writes the chunks still without vectors again (their blob id
    is only set with the vector) and sends their parts anew; parts of the old run still queued change nothing.

    The embedded profile has no broker to lose a message from (tasks run in the process that also holds the
    markers): nothing is settled there.

    Raises:
        Transient: the coordination backend, the broker or the record store is unavailable.
    """
    held = getattr(rt.tasks, "held", None)
    if held is None:
        return LostJobs()
    grace = rt.settings.worker.lost_message_grace_s if grace_s is None else grace_s
    known = {s.id for s in rt.records.list_sources()}
    first = _waiting_jobs(rt, grace, known)
    probes = {j: _broker_task_ids(rt, j, job) for j, (job, _) in first.items()}
    in_broker = held({t for p in probes.values() for t in p}) if first else None
    if in_broker is None:
        return LostJobs()
    unheld = {j: _unheld(p, in_broker) for j, p in probes.items()}
    if not any(u is None or u for u in unheld.values()):
        return LostJobs()
    time.sleep(confirm_s)
    again = _waiting_jobs(rt, grace, known)
    suspects = {j: again[j] for j, u in unheld.items() if (u is None or u) and j in again}
    probes2 = {j: _broker_task_ids(rt, j, job) for j, (job, _) in suspects.items()}
    in_broker2 = held({t for p in probes2.values() for t in p}) if suspects else set()
    lost_parts: dict[str, list[int]] = {}
    for j, p in probes2.items():
        u = _unheld(p, in_broker2 or set())
        first_unheld = unheld[j]
        if u is None:
            lost_parts[j] = []
        elif (gone := u if first_unheld is None else u & first_unheld):
            lost_parts[j] = sorted(part for t, part in p.items() if t in gone and part is not None)
    lost = sorted(lost_parts)
    out = LostJobs()
    for job_id in lost:
        job, kwargs = suspects[job_id]
        parts = lost_parts[job_id]
        if job.state == JobState.running and job.stage == JobStage.embedding:
            why = (f"embedding part{'s' if len(parts) > 1 else ''} {', '.join(str(p) for p in parts)} of "
                   f"{job.embed_parts} lost by the broker (in no queue, held by no worker)" if parts else
                   "embedding stage ended without settling its job (every part done)")
        elif job.state == JobState.running:
            why = "task ended without settling its running job (no message in any queue, held by no worker)"
        else:
            why = "task message lost by the broker (in no queue, held by no worker)"
        times = job.retries.get("requeued", 0)
        if times < LOST_REQUEUES and kwargs:
            job.retries["requeued"] = times + 1
            job.errors.append(f"{why}: enqueued again by the reconcile")
            again_job = job.model_copy(update={"created_at": utcnow(), "state": JobState.queued,
                                               **({"stage": None} if job.stage == JobStage.embedding else {})})
            if job.state == JobState.running:  # the record must not say running while the job waits in the queue
                rt.records.put_job(again_job.model_copy(update={"created_at": job.created_at}))
            _enqueue(rt, again_job, kwargs)
            out.requeued.append(job_id)
            continue
        job.errors.append(f"{why}{' again' if times else ''}: failed by the reconcile, whose verifying sync "
                          "brings the sources to their ref")
        now = utcnow()
        rt.records.put_job(job.model_copy(update={"state": JobState.failed, "finished_at": now,
                                                  "started_at": job.started_at or now}))
        out.failed.append(job_id)
    if lost:
        log.warning("lost_jobs_settled", requeued=out.requeued, failed=out.failed)
    return out


def reconcile(rt: ControlRuntime) -> dict[str, Any]:
    """Settle queued jobs whose message the broker lost (:func:`settle_lost_jobs`), then enqueue a verifying sync
    for every (repository, ref) with registered sources, except those whose sync runs now (their repository
    lock is held; the next pass checks them).

    Returns:
        ``{"groups": verifying syncs enqueued, "busy": groups skipped, "requeued": [job id], "failed": [job id],
        "jobs": [job id of each verifying sync]}``. When the runtime's tasks run in this process
        (``rt.tasks.runs_here``, the embedded profile's one-shot commands) the syncs have ended: their job records
        say how.
    """
    lost = settle_lost_jobs(rt)
    groups: dict[tuple[str, str], list[str]] = {}
    for src in rt.records.list_sources():  # sources tracking the same refs of a repository are synced together
        groups.setdefault((src.repo_url, "\0".join(src.ref_patterns)), []).append(src.id)
    stamp = int(time.time())
    busy = 0
    jobs: list[str] = []
    for (url, refs), ids in groups.items():
        if rt.coord.repo_locked(ids):
            busy += 1
            continue
        jobs.append(enqueue_sync(rt, sorted(ids), trigger="reconcile",
                                 job_id=f"reconcile-{keys.repo_hash(url + refs)}-{stamp}", ref=refs.split("\0")[0],
                                 verify=True))
    log.info("reconcile_enqueued", groups=len(groups) - busy, busy=busy, requeued=len(lost.requeued),
             failed=len(lost.failed))
    return {"groups": len(groups) - busy, "busy": busy, "requeued": lost.requeued, "failed": lost.failed,
            "jobs": jobs}


# ---- pinned commits (issue 23) -------------------------------------------------------------------------------

_FULL_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def read(rt: Runtime, scope: ScopeFilter, req: ReadRequest) -> ReadResult:
    """Exact lines of an indexed blob within ``scope`` (:func:`scopekb.reading.read_lines` with the runtime's
    stores): REST ``GET /v1/read``, the MCP ``read`` tool and ``scopekb read``.

    Raises:
        NotFound: as :func:`~scopekb.reading.read_lines`; a ``ref`` that is a tree, blob or annotated tag id says
            so (:func:`not_a_commit`).
        Refused: as :func:`~scopekb.reading.read_lines`.
    """
    try:
        return read_lines(rt.chunks, rt.blobs, scope, req, rt.records, rt.settings.query.revocation_bound_s)
    except CommitNotIndexed as e:
        raise explain_not_indexed(rt, scope, e) from None


def not_a_commit(rt: ControlRuntime, scope: ScopeFilter, oid: str) -> str | None:
    """Why ``oid`` (a full object id given as a ref) cannot be one, when a local mirror of a git source of the
    scope holds it as another type: ``"<oid> is a tree id, not a commit: give a commit id, a branch or a tag as
    ref"`` (``blob`` alike; an annotated tag object: ``... is an annotated tag id, not a commit: give the tag's
    name or the commit it tags (<commit id>) as ref``); None for a commit, an id no mirror holds, or no mirror
    here (a query replica). The one message REST, MCP and the CLI give for it (search and read)."""
    oid = oid.lower()
    if not _FULL_SHA.match(oid):
        return None
    for src in rt.records.list_sources(agent_name=scope.agent_name):
        if src.kind != "git" or (scope.context_ids is not None and src.context_id not in scope.context_ids):
            continue
        if not mirror_path(git_cache_dir(rt.settings), src.repo_url).exists():
            continue
        mirror = Mirror(git_cache_dir(rt.settings), src.repo_url, allow_local=rt.settings.git.allow_local_paths)
        try:
            kind = mirror.object_type(oid)
            tagged = mirror.resolve(oid) if kind == "tag" else None
        finally:
            mirror.close()
        if kind in ("tree", "blob"):
            return f"{oid} is a {kind} id, not a commit: give a commit id, a branch or a tag as ref"
        if kind == "tag":
            return (f"{oid} is an annotated tag id, not a commit: give the tag's name or the commit it tags"
                    f"{f' ({tagged})' if tagged else ''} as ref")
    return None


def explain_not_indexed(rt: ControlRuntime, scope: ScopeFilter, e: CommitNotIndexed) -> NotFound:
    """The 404 to raise for a ref that looks like a commit id and is no indexed head (``e``): the object type
    when a mirror knows it (:func:`not_a_commit`), else ``e`` as it is."""
    problem = not_a_commit(rt, scope, e.commit)
    return NotFound(problem) if problem else e


def pin_commit(rt: ControlRuntime, scope: ScopeFilter, commit: str, source_id: str | None = None,
               repo: str | None = None) -> dict[str, Any]:
    """Index ``commit`` of a git source the scope may see as a temporary ref (named by the commit id), so a search
    at it can be answered: the sync diffs it from the nearest indexed ref and reuses every unchanged chunk; the pin
    lives ``git.pin_ttl_s`` seconds. A pin already requested answers with its job again.

    Returns ``{"status": "pinning", "ref": commit, "source_id", "job_id", "expires_at"}`` (HTTP 202: search again
    when the job is done), or ``{"status": "indexed", "ref", "source_id"}`` when the commit (an annotated tag's,
    peeled) is already some ref's indexed commit: the caller searches at ``ref`` at once.

    Raises:
        NotFound: (404) ``commit`` is not a full commit id; no git source of the scope (narrowed by ``source_id``
            and ``repo``); or the local mirrors of every candidate source lack the commit (another repository's,
            a tree or blob id (the message names its type), or one pushed since the source's last sync: the
            message says a sync fetches it).
        Refused: (422) several sources may hold it and none is named; (429) the source already holds
            ``git.max_pins_per_source`` pins.

    The id of an annotated tag object is pinned as the commit it tags (``<id>^{commit}``), and the answer's
    ``ref`` is that commit: search with it.
    """
    commit = commit.lower()
    if not _FULL_SHA.match(commit):
        raise NotFound(f"commit {commit[:64]!r} is not the indexed head of any ref of this scope's sources; give the "
                       "full commit id to index it (pin)")
    sources = [s for s in rt.records.list_sources(agent_name=scope.agent_name)
               if s.kind == "git" and (scope.context_ids is None or s.context_id in scope.context_ids)
               and (not source_id or s.id == source_id) and (not repo or (s.repo_name or s.repo_url) == repo)]
    if not sources:
        raise NotFound("no git source of this scope to find that commit in")
    for src in sources:
        states = ref_states(rt.records, src)
        if any(st.get("commit") == commit for st in states.values()):  # an annotated tag's commit, indexed already
            return {"status": "indexed", "ref": commit, "source_id": src.id}  # hostile review 5: search at it
        st = states.get(commit)
        if st and st.get("pinned"):
            return {"status": "pinning", "ref": commit, "source_id": src.id, "job_id": st.get("job_id"),
                    "expires_at": st.get("expires_at")}
    holding, unknown = [], []
    not_commit: str | None = None  # the type of `commit` in a mirror where it names a tree or a blob
    peeled: dict[str, str] = {}  # source id -> the commit `commit` names there (an annotated tag: its commit)
    for src in sources:
        where = mirror_path(git_cache_dir(rt.settings), src.repo_url)
        if not where.exists():
            unknown.append(src)  # no local mirror (a query replica): the worker checks the commit
            continue
        mirror = Mirror(git_cache_dir(rt.settings), src.repo_url, allow_local=rt.settings.git.allow_local_paths)
        try:
            # `<id>^{commit}` (hostile review L2): a commit is itself, an annotated tag object its commit; a tree
            # or blob id is none, as is an id the mirror lacks
            if (named := mirror.resolve(commit)) is not None:
                holding.append(src)
                peeled[src.id] = named
            elif (kind := mirror.object_type(commit)) in ("tree", "blob"):
                not_commit = kind
        finally:
            mirror.close()
    # a source with an indexed tracked ref first (the pin diffs from it and belongs with it), never one that tracks
    # nothing indexed when another holds the commit (hostile review F4); stable: registration order otherwise
    holding.sort(key=lambda s: not any(st.get("commit") and not st.get("pinned")
                                       for st in ref_states(rt.records, s).values()))
    chosen = holding[:1] or unknown
    if not chosen and not_commit:
        raise NotFound(f"{commit} is a {not_commit} id, not a commit: give a commit id, a branch or a tag as ref")
    if not chosen:  # hostile review L1: only the local mirrors were asked, as of each source's last fetch
        raise NotFound(f"commit {commit} is not in the repository of any source of this scope as last fetched "
                       "(no commit there, or not fetched yet): a commit pushed since is fetched by a sync of its "
                       "source (POST /v1/sources/{id}/sync, the MCP index tool, or the push's webhook); search "
                       "again when that job is done")
    if len(chosen) > 1:
        raise Refused("several sources may hold that commit; name source_id or repo to pin it", 422)
    src = chosen[0]
    if peeled.get(src.id, commit) != commit:  # an annotated tag's id: pin (and name) the commit it tags
        return pin_commit(rt, scope, peeled[src.id], src.id)
    now = utcnow()
    job_id = f"pin-{commit[:12]}-{uuid.uuid4().hex[:8]}"
    expires = (now + timedelta(seconds=rt.settings.git.pin_ttl_s)).isoformat()
    # the limit is checked in the same atomic write as the pin (hostile review 2, H2): concurrent pins and the
    # worker's state writes lose nothing and never exceed git.max_pins_per_source
    st = pin_ref_state(rt.records, src, commit, {"pinned": True, "pinned_at": now.isoformat(), "expires_at": expires,
                                                 "job_id": job_id}, rt.settings.git.max_pins_per_source)
    forget_pinned()  # this process's searches without ref leave the pin's chunks out at once
    if st.get("job_id") != job_id:  # pinned a moment ago by another request: its job is under way
        return {"status": "pinning", "ref": commit, "source_id": src.id, "job_id": st.get("job_id"),
                "expires_at": st.get("expires_at")}
    enqueue_sync(rt, [src.id], trigger="pin", job_id=job_id, ref=commit, to_commit=commit)
    log.info("commit_pinned", source_id=src.id, commit=commit, job_id=job_id, expires_at=expires)
    return {"status": "pinning", "ref": commit, "source_id": src.id, "job_id": job_id, "expires_at": expires}


def gc_pins(rt: Runtime) -> dict[str, int]:
    """Drop every pinned commit whose TTL ran out (``git.pin_ttl_s``) from every source: its membership goes and
    chunks no ref uses any more are deleted (syncs do the same for their sources). Returns ``{"pins": dropped,
    "chunks_deleted": n}``."""
    from scopekb.indexing import drop_refs, pin_expired

    job = Job(id=f"gc-{uuid.uuid4().hex[:8]}", trigger="gc")
    now, dropped = utcnow(), 0
    for src in rt.records.list_sources():
        expired = {n for n, st in ref_states(rt.records, src).items() if st.get("pinned") and pin_expired(st, now)}
        drop_refs(rt.sync_deps(), job, src, expired)
        dropped += len(expired)
    if job.chunks_deleted:
        rt.chunks.refresh()
    log.info("pins_collected", pins=dropped, chunks_deleted=job.chunks_deleted)
    return {"pins": dropped, "chunks_deleted": job.chunks_deleted}


# ---- dead letters --------------------------------------------------------------------------------------------

def list_dead_letters(rt: ControlRuntime, include_replayed: bool = False) -> list[DeadLetter]:
    """Tasks parked after failing ``worker.max_retries`` times, newest first; replayed ones only when asked."""
    out = [DeadLetter.model_validate(d) for d in rt.records.find("deadletters", sort="created_at")]
    return [d for d in out if include_replayed or d.replayed_at is None]


def replay_dead_letter(rt: ControlRuntime, dl_id: str) -> str:
    """Enqueue a parked task again under a new task/job id (a sync with its queued marker) and mark it
    replayed. Returns the new job id.

    Where the task runs before this returns (``rt.tasks.wait``: the embedded profile's one-shot commands) and its
    job fails, the letter stays parked with that failure as its error and one more attempt, as a worker would
    park it again after its retries.

    Raises:
        NotFound: no dead letter with that id.
        Refused: its arguments are not those of a task (``source_ids`` not a list of ids), or its task cannot run
            in this profile; the letter stays parked.
        Transient: as :func:`enqueue_sync`.
    """
    d = rt.records.get("deadletters", dl_id)
    if d is None:
        raise NotFound("dead letter not found")
    dl = DeadLetter.model_validate(d)
    job_id = f"{dl.id}-replay-{uuid.uuid4().hex[:6]}"
    kwargs = {**dl.kwargs}
    if "job_id" in kwargs:
        kwargs["job_id"] = job_id
    if dl.task == TASK_SYNC_SOURCES:
        ids = kwargs.pop("source_ids", [])
        trigger = kwargs.pop("trigger", "webhook")
        kwargs.pop("job_id", None)
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids) \
                or not isinstance(trigger, str):
            raise Refused("its arguments are malformed (source_ids must be a list of source ids, trigger a "
                          "string): remove it or fix the task that parked it")
        enqueue_sync(rt, ids, trigger=trigger, job_id=job_id, **kwargs)
    else:
        rt.tasks.send(dl.task, job_id, kwargs)
    job = rt.records.get_job(job_id) if getattr(rt.tasks, "wait", False) else None
    if job is not None and job.state == JobState.failed:
        dl.attempts += 1
        dl.error = "; ".join(dict.fromkeys(job.errors)) or dl.error
    else:
        dl.replayed_at = utcnow()
    rt.records.put("deadletters", dl.id, dl.model_dump(mode="json"))
    return job_id


def replay_all(rt: ControlRuntime) -> list[str]:
    """Replay every parked task not replayed yet; their new job ids."""
    return [replay_dead_letter(rt, d.id) for d in list_dead_letters(rt)]
