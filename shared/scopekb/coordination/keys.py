"""Every coordination key name scopekb uses, in one place (the onyx layout, DESIGN §12).

In the distributed profile these are Redis keys shared by the ingester, workers, query service and CLI; in the
embedded profile the same names live in the process's in-memory coordination. Nothing else spells a key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

#: A claimed webhook delivery id (``SET NX EX``, kept ``ingester.dedupe_ttl_s``).
DELIVERY = "scopekb:delivery:{provider}:{delivery_id}"
#: The queued marker of a job no worker has started yet (JSON of :class:`scopekb.models.Job`).
JOB_QUEUED = "scopekb:job:{job_id}"
JOB_QUEUED_PATTERN = "scopekb:job:*"
#: The lock serialising syncs of one group of sources (one repository and ref).
REPO_LOCK = "scopekb:lock:repo:{group}"
REPO_LOCK_PATTERN = "scopekb:lock:repo:*"
#: Held while ``scopekb reindex`` rebuilds the chunk index; syncs wait while it exists.
REINDEX_LOCK = "scopekb:lock:reindex"
#: Bumped on every source registration change so ingesters reload their in-memory source cache at once.
SOURCES_VERSION = "scopekb:sources:version"
#: Bumped on every key revocation: each query replica's key cache empties when it moves (issue 16).
KEYS_VERSION = "scopekb:keys:version"
#: Attempts at chunking one file of a group of sources at one blob (counted only after a worker death).
FILE_ATTEMPTS = "scopekb:attempts:{group}:{sha}:{path_hash}"
FILE_ATTEMPTS_PREFIX = "scopekb:attempts:"
#: The outcome (JSON counts) of one finished part of a job's embedding stage (issue 19), per sync run.
EMBED_PART = "scopekb:embed:{job}:{run}:{part}"


def repo_hash(text: str) -> str:
    """Short stable hash (16 hex of sha256) of a repository URL or a source-id list, for keys and job ids."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def group(source_ids: Sequence[str]) -> str:
    """The hash naming a group of sources (order-insensitive)."""
    return repo_hash(",".join(sorted(source_ids)))


def delivery(provider: str, delivery_id: str) -> str:
    """Key of a claimed webhook delivery."""
    return DELIVERY.format(provider=provider, delivery_id=delivery_id)


def job_queued(job_id: str) -> str:
    """Key of a job's queued marker."""
    return JOB_QUEUED.format(job_id=job_id)


def repo_lock(source_ids: Sequence[str]) -> str:
    """Key of the repository lock of a group of sources."""
    return REPO_LOCK.format(group=group(source_ids))


def file_attempts(source_ids: Sequence[str], path: str, sha: str) -> str:
    """Key counting chunking attempts of ``path`` at blob ``sha`` for a group of sources."""
    return FILE_ATTEMPTS.format(group=group(source_ids), sha=sha,
                                path_hash=hashlib.sha256(path.encode()).hexdigest()[:16])


def embed_part(job_id: str, run: str, part: int | str) -> str:
    """Key of one finished embedding part (``part="*"``: the pattern of every part of the run). The job id is
    hashed (delivery ids come from webhook headers), the run is a hex token of :func:`scopekb.indexing.run_sync`."""
    return EMBED_PART.format(job=repo_hash(job_id), run=run, part=part)
