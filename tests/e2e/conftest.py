"""Run the real scopekb processes (ingester, query service, Celery worker) against the real services.

Each test session gets its own index alias, system-index prefix and Celery queue, so runs never see each
other's data or tasks on the shared OpenSearch and Redis.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "e2e-admin-" + uuid.uuid4().hex
S3_EVENT_TOKEN = "e2e-s3-" + uuid.uuid4().hex


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    """The running processes and how to reach them."""

    env: dict[str, str]
    ingester_url: str
    query_url: str
    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.query_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            timeout=30)

    def agent(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.query_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)

    def wait_job(self, job_id: str, timeout_s: float = 300) -> dict:
        """Poll ``GET /v1/jobs/{id}`` until the job has finished; fail with the worker log tail otherwise."""
        deadline = time.monotonic() + timeout_s
        with self.admin() as c:
            while time.monotonic() < deadline:
                r = c.get(f"/v1/jobs/{job_id}")
                if r.status_code == 200 and r.json()["state"] in ("done", "partial", "failed"):
                    return r.json()
                time.sleep(0.3)
        tail = (self.logs / "worker.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"job {job_id} did not finish in {timeout_s}s; worker log tail:\n{tail}")


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"process exited ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} not up after {timeout_s}s")


def start_procs(cmds: dict[str, list[str]], env: dict[str, str], logs: Path) -> list[subprocess.Popen]:
    """Start each command (``name -> argv``) with its output in ``logs/<name>.log``; returns them in order."""
    procs = []
    for name, argv in cmds.items():
        fh = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT))
    return procs


def stop_procs(procs: list[subprocess.Popen]) -> None:
    """Terminate the processes (by their own pids), killing any still running after 20 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture(scope="session")
def stack_env(opensearch_url: str, redis_url: str, s3_config: dict, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, str]:
    """Environment for scopekb processes of this session (isolated alias, prefix, queue and caches)."""
    run = uuid.uuid4().hex[:8]
    data = tmp_path_factory.mktemp("scopekb-data")
    return {
        **os.environ,
        "SCOPEKB_OPENSEARCH__URL": opensearch_url,
        "SCOPEKB_OPENSEARCH__ALIAS": f"e2e-{run}-chunks",
        "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"e2e-{run}-sys",
        "SCOPEKB_REDIS__URL": redis_url,
        "SCOPEKB_S3__ENDPOINT": s3_config["endpoint"],
        "SCOPEKB_S3__ACCESS_KEY": s3_config["access_key"],
        "SCOPEKB_S3__SECRET_KEY": s3_config["secret_key"],
        "SCOPEKB_S3__SECURE": "true" if s3_config["secure"] else "false",
        "SCOPEKB_S3__BUCKET": f"e2e-{run}",
        "SCOPEKB_WORKER__QUEUE": f"e2e-{run}",
        "SCOPEKB_GIT__CACHE_DIR": str(data / "git"),
        "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true",
        "SCOPEKB_DATA_DIR": str(data),
        "SCOPEKB_QUERY__ADMIN_TOKEN": ADMIN_TOKEN,
        "SCOPEKB_INGESTER__S3_EVENT_TOKEN": S3_EVENT_TOKEN,
        "SCOPEKB_LOG_FORMAT": "json",
    }


@pytest.fixture(scope="session")
def stack(stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Ingester, query service and one Celery worker as separate processes; stopped by pid afterwards."""
    logs = tmp_path_factory.mktemp("logs")
    ip, qp = free_port(), free_port()
    st = Stack(env=stack_env, ingester_url=f"http://127.0.0.1:{ip}", query_url=f"http://127.0.0.1:{qp}",
               logs=logs)
    cmds = {
        "ingester": ["serve", "ingester", "--port", str(ip)],
        "query": ["serve", "query", "--port", str(qp)],
        "worker": ["worker", "--concurrency", "1"],
    }
    try:
        st.procs = start_procs({name: [sys.executable, "-m", "scopekb_cli.main", *args]
                                for name, args in cmds.items()}, stack_env, logs)
        _wait_http(st.ingester_url + "/healthz", st.procs[0], logs / "ingester.log")
        _wait_http(st.query_url + "/healthz", st.procs[1], logs / "query.log")
        yield st
    finally:
        stop_procs(st.procs)
