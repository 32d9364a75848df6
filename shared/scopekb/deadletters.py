"""Dead letters: list and replay tasks that failed ``worker.max_retries`` times (DESIGN §11)."""

from __future__ import annotations

import uuid

from celery import Celery

from scopekb.models import DeadLetter, utcnow
from scopekb.stores.records import RecordStore


def list_dead_letters(records: RecordStore, include_replayed: bool = False) -> list[DeadLetter]:
    """Parked tasks, newest first; replayed ones only when asked."""
    out = [DeadLetter.model_validate(d) for d in records.find("deadletters", sort="created_at")]
    return [d for d in out if include_replayed or d.replayed_at is None]


def replay(records: RecordStore, celery: Celery, dl_id: str) -> str:
    """Enqueue a parked task again under a new task/job id and mark it replayed. Returns the new job id.

    Raises:
        KeyError: no dead letter with that id.
    """
    d = records.get("deadletters", dl_id)
    if d is None:
        raise KeyError(dl_id)
    dl = DeadLetter.model_validate(d)
    job_id = f"{dl.id}-replay-{uuid.uuid4().hex[:6]}"
    kwargs = {**dl.kwargs}
    if "job_id" in kwargs:
        kwargs["job_id"] = job_id
    celery.send_task(dl.task, task_id=job_id, kwargs=kwargs)
    dl.replayed_at = utcnow()
    records.put("deadletters", dl.id, dl.model_dump(mode="json"))
    return job_id
