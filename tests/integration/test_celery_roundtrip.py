"""A Celery task round trip through the real Redis broker to a real worker process (issue 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from scopekb import queue
from scopekb.runtime import celery_app
from scopekb.settings import Settings


def test_ping_task_round_trip_through_real_worker(redis_url: str, tmp_path) -> None:
    q = f"it-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SCOPEKB_REDIS__URL": redis_url, "SCOPEKB_WORKER__QUEUE": q}
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "scopekb_cli.main", "worker", "--concurrency", "1"],
                                env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        app = celery_app(Settings(redis={"url": redis_url}, worker={"queue": q}), name="it-client")
        res = app.send_task(queue.TASK_PING, kwargs={"value": "hello"})
        try:
            out = res.get(timeout=90)
        except Exception as e:  # show the worker's side when it did not answer
            pytest.fail(f"no answer from the worker ({e}); log:\n{log.read_text(errors='replace')[-2000:]}")
        assert out["value"] == "hello"
        assert out["pid"] != os.getpid() and out["pid"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
