"""The embedded profile has no broker that could lose a task message: its reconcile settles no queued job.

In the embedded profile the queued markers (in-memory coordination) and the task messages (Celery's in-memory
broker, or a thread of the process) live in the same process: a message cannot be lost without the process and
its markers. :func:`scopekb.ops.settle_lost_jobs` therefore leaves its queued jobs alone (the distributed case,
where it re-enqueues and fails them, is ``tests/faults/test_lost_message.py`` on real Redis).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from scopekb import ops
from scopekb.models import SourceCreate
from scopekb.runtime import build_embedded_runtime
from tests.profiles import profile_settings


def test_embedded_reconcile_settles_no_queued_job(tmp_path: Path) -> None:
    settings = profile_settings("embedded", tmp_path, {}, "emb", "admin-" + uuid.uuid4().hex)
    rt = build_embedded_runtime(settings)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    src = ops.register_source(rt, SourceCreate(agent_name="a", context_id="c", repo_url=str(repo), ref="main"))
    job_id = ops.enqueue_sync(rt, [src.id], trigger="manual", ref="main")  # no worker consumes it here
    assert rt.tasks.held([job_id]) is None  # the in-memory broker cannot be looked into, nor lose a message
    assert ops.settle_lost_jobs(rt, grace_s=0, confirm_s=0) == ops.LostJobs()
    assert ops.get_job(rt, job_id).state == "queued" and not ops.get_job(rt, job_id).retries
