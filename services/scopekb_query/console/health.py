"""What the console's health page reports: each backing service, the queue depth and worker heartbeats.

Every probe is bounded (short client timeouts, a 1 s broadcast for worker pings) and reports its failure as
text instead of raising, so the page renders while a service is down. In the embedded profile the services are
the SQLite stores, the blob folder and the in-process queue; what cannot be asked there says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scopekb.logging import get_logger
from scopekb.runtime import Runtime

log = get_logger("scopekb.console")

#: Celery's Redis transport keeps a priority queue as one list per step (kombu's default steps 0, 3, 6, 9);
#: the list of step 0 has the queue's own name, the others the name + "\x06\x16" + step.
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


@dataclass(frozen=True)
class Check:
    """One line of the health page: ``ok`` True/False (None: not applicable here) and a short detail."""

    name: str
    ok: bool | None
    detail: str


def _probe(name: str, fn: Any) -> Check:
    try:
        ok, detail = fn()
        return Check(name, ok, detail)
    except Exception as e:  # noqa: BLE001 - a health page reports any failure as text
        log.warning("console_health_probe_failed", probe=name, error=type(e).__name__)
        return Check(name, False, f"error: {type(e).__name__}: {str(e)[:200]}")


def health_checks(rt: Runtime) -> list[Check]:
    """Probe the chunk store, the coordination backend, the blob store, the sync queue and the workers."""
    if rt.profile == "embedded":
        return [
            _probe(f"index ({rt.chunks.kind})", lambda: _local_index(rt)),
            _probe(f"coordination ({rt.coord.kind})", lambda: _local_coordination(rt)),
            Check("blob store", True, f"folder {getattr(rt.blobs, 'root', '')}"),
            Check("queue depth", None, "in-process queue: not measurable"),
            Check("workers", None, "one in-process worker (scopekb up)"),
        ]
    return [
        _probe("OpenSearch", lambda: _opensearch(rt)),
        _probe("Redis", lambda: _redis(rt)),
        _probe("S3", lambda: _s3(rt)),
        _probe("queue depth", lambda: _queue_depth(rt)),
        _probe("workers", lambda: _workers(rt.tasks.app)),
    ]


def _local_index(rt: Runtime) -> tuple[bool, str]:
    rt.chunks.health()
    return True, f"{rt.chunks.count()} chunks"


def _local_coordination(rt: Runtime) -> tuple[bool, str]:
    rt.coord.ping()
    return True, "in this process"


def _opensearch(rt: Runtime) -> tuple[bool, str]:
    h = rt.opensearch_client.cluster.health(params={"request_timeout": 2})
    status = str(h.get("status"))
    return status in ("green", "yellow"), (f"cluster {h.get('cluster_name')}: {status}, "
                                           f"{h.get('number_of_nodes')} node(s), {rt.chunks.count()} chunks")


def _redis(rt: Runtime) -> tuple[bool, str]:
    rt.coord.ping()
    info = rt.coord.client.info("server")  # type: ignore[attr-defined]
    return True, f"version {info.get('redis_version')}, up {info.get('uptime_in_seconds')} s"


def _s3(rt: Runtime) -> tuple[bool, str]:
    client, bucket = rt.blobs.client, rt.blobs.bucket  # type: ignore[attr-defined]
    exists = client.bucket_exists(bucket)
    return bool(exists), f"bucket {bucket}: {'present' if exists else 'missing'}"


def _queue_depth(rt: Runtime) -> tuple[bool, str]:
    client = rt.coord.client  # type: ignore[attr-defined] - the broker is the same Redis
    queue = rt.settings.worker.queue
    depth = sum(int(client.llen(queue + suffix)) for suffix in _PRIORITY_SUFFIXES)
    return True, f"{depth} task(s) waiting in {queue}"


def _workers(celery: Any) -> tuple[bool, str]:
    replies = celery.control.ping(timeout=1.0) or []
    names = sorted(name for reply in replies for name in reply)
    if not names:
        return False, "no worker answered a ping within 1 s"
    return True, f"{len(names)} answered: " + ", ".join(names)
