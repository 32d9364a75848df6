"""``source_status`` reads the newest job's record by id (real-time), not as the search that found it saw it: on
OpenSearch a search sees records as of the last refresh, so a job just finished still read ``running`` and status
said INDEXING (an MCP e2e test's ``status`` call right after the job was done failed this way in CI)."""

from __future__ import annotations

from typing import Any

from scopekb import status
from scopekb.models import Job, JobState, Source


class _Records:
    """Record store fake: ``find`` answers with a stale copy of the job, ``get`` with the current one."""

    def __init__(self, stale: Job, current: Job) -> None:
        self.stale, self.current = stale, current

    def list_jobs(self, source_id: str | None = None, size: int = 20) -> list[Job]:
        return [self.stale]

    def get_job(self, job_id: str) -> Job | None:
        return self.current if job_id == self.current.id else None

    def get(self, kind: str, rec_id: str) -> dict[str, Any] | None:
        if kind == "state":
            return {"commit": "c1", "indexed_at": "2026-12-01T00:00:00+00:00"}
        return None


class _Chunks:
    def source_stats(self, source_id: str) -> dict[str, int]:
        return {"documents": 2, "chunks": 5}


def _source() -> Source:
    return Source(id="src_1", agent_name="a", context_id="c", repo_url="https://example.invalid/r.git", ref="main")


def test_status_uses_the_job_record_read_by_id(monkeypatch: Any) -> None:
    monkeypatch.setattr(status.tuning, "get_choice", lambda *a: None)
    monkeypatch.setattr(status.tuning, "describe", lambda c: "default")
    stale = Job(id="j1", state=JobState.running, source_ids=["src_1"], to_commit="c1")
    current = stale.model_copy(update={"state": JobState.done})
    got = status.source_status(_Records(stale, current), _Chunks(), _source())  # type: ignore[arg-type]
    assert got["status"] == "READY"
    assert got["last_job"]["state"] == "done"


def test_status_keeps_the_found_job_when_its_record_is_gone(monkeypatch: Any) -> None:
    monkeypatch.setattr(status.tuning, "get_choice", lambda *a: None)
    monkeypatch.setattr(status.tuning, "describe", lambda c: "default")
    stale = Job(id="j1", state=JobState.running, source_ids=["src_1"], to_commit="c1")
    other = Job(id="j2", state=JobState.done)
    got = status.source_status(_Records(stale, other), _Chunks(), _source())  # type: ignore[arg-type]
    assert got["status"] == "INDEXING"
