"""Processes, repositories and checks shared by the fault scenarios.

A :class:`Stack` is one scenario's set of real scopekb processes (query service, Celery workers) on the private
services, with its own index alias, system prefix, queue and bucket, so scenarios never see each other's data
or tasks. Workers run in their own process group so a test can SIGKILL one whole worker (parent and pool
children) like a lost machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis as redis_lib
from opensearchpy import OpenSearch, helpers
from opensearchpy.exceptions import NotFoundError

from .services import ROOT, PrivateServices

ADMIN_TOKEN = "faults-admin-" + uuid.uuid4().hex
GIT_ENV = {"GIT_AUTHOR_NAME": "faults", "GIT_AUTHOR_EMAIL": "faults@localhost", "GIT_COMMITTER_NAME": "faults",
           "GIT_COMMITTER_EMAIL": "faults@localhost", "GIT_CONFIG_NOSYSTEM": "1"}

Chunk = tuple[str, int, str]  # (path, start line, chunk text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- repositories -------------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with a fixed identity; stdout stripped."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def _python_module(i: int, functions: int) -> str:
    parts = [f'"""Generated module {i}: helpers for batch {i % 17}."""\n\nimport math\n\n']
    for j in range(functions):
        body = "\n".join(f"    value = value * {j + 2} + {k} - math.floor(value / {k + 3})"
                         for k in range(3 + (i + j) % 9))
        parts.append(f"def compute_{i}_{j}(value: float) -> float:\n    \"\"\"Step {j} of module {i}.\"\"\"\n"
                     f"{body}\n    return value\n\n\n")
    parts.append(f"class Registry{i}:\n    \"\"\"Keeps the results of module {i}.\"\"\"\n\n"
                 f"    def __init__(self) -> None:\n        self.items: list[float] = []\n\n"
                 f"    def add(self, item: float) -> None:\n        self.items.append(compute_{i}_0(item))\n")
    return "".join(parts)


def generate_repo(dest: Path, files: int, *, extra: dict[str, bytes | str] | None = None) -> str:
    """A git repository at ``dest`` (branch ``main``) with ``files`` generated Python modules in 20 packages,
    some markdown and text, a binary, an empty file and a symlink, plus ``extra``; returns the commit id."""
    dest.mkdir(parents=True)
    git(dest, "init", "--quiet", "--initial-branch", "main")
    for i in range(files):
        pkg = dest / "src" / f"pkg{i % 20:02d}"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"module_{i:04d}.py").write_text(_python_module(i, 3 + i % 8))
    docs = dest / "docs"
    docs.mkdir()
    for i in range(max(1, files // 20)):
        (docs / f"guide-{i}.md").write_text(
            f"# Guide {i}\n\nHow package {i} works.\n\n## Usage\n\n" + "Call the helpers in order.\n" * (5 + i % 30)
            + "\n## Notes\n\n```python\n# not a heading\nprint('x')\n```\n")
    (dest / "notes.txt").write_text("".join(f"line {n}: plain text notes\n" for n in range(150)))
    (dest / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    (dest / "empty.py").write_text("")
    os.symlink("notes.txt", dest / "link-to-notes")
    for rel, content in (extra or {}).items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    git(dest, "add", "--all")
    git(dest, "commit", "--quiet", "-m", f"{files} generated modules")
    return git(dest, "rev-parse", "HEAD")


# ---- comparison ---------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """An index's chunks of one source against a fresh full index of the same commit."""

    actual: Counter[Chunk]
    expected: Counter[Chunk]

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.actual.values() if n > 1)

    @property
    def missing(self) -> Counter[Chunk]:
        return self.expected - self.actual

    @property
    def extra(self) -> Counter[Chunk]:
        return self.actual - self.expected

    @property
    def equal(self) -> bool:
        return self.actual == self.expected

    def summary(self) -> str:
        def sample(c: Counter[Chunk]) -> list[tuple[str, int]]:
            return sorted({(p, line) for p, line, _ in c})[:4]

        return (f"indexed {sum(self.actual.values())} chunks / {len({p for p, _, _ in self.actual})} paths, "
                f"fresh index {sum(self.expected.values())} chunks / {len({p for p, _, _ in self.expected})} paths, "
                f"missing {sum(self.missing.values())} {sample(self.missing)}, "
                f"extra {sum(self.extra.values())} {sample(self.extra)}, duplicates {self.duplicates}")


# ---- processes ----------------------------------------------------------------------------------------------


@dataclass
class Proc:
    """A scopekb process of a scenario; ``popen`` leads its own process group."""

    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tree(self) -> list[int]:
        """Pids of the process and its descendants (a Celery worker's pool processes)."""
        try:
            parent = psutil.Process(self.pid)
            return [self.pid, *[c.pid for c in parent.children(recursive=True)]]
        except psutil.NoSuchProcess:
            return []

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Stack:
    """One scenario's scopekb processes on the private services."""

    services: PrivateServices
    name: str
    workdir: Path
    settings: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    query_url: str = ""

    def __post_init__(self) -> None:
        run = f"{self.name}-{uuid.uuid4().hex[:6]}"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SCOPEKB_", "OPENAI_"))}
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.env: dict[str, str] = {
            **base, **self.services.client_env(),
            "PYTHONPATH": str(ROOT) + os.pathsep + base.get("PYTHONPATH", ""),
            "SCOPEKB_PROFILE": "distributed",
            "SCOPEKB_EMBEDDING__PROVIDER": "none",
            "SCOPEKB_OPENSEARCH__ALIAS": f"{run}-chunks",
            "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"{run}-sys",
            "SCOPEKB_S3__BUCKET": f"faults-{run}".lower()[:60],
            "SCOPEKB_WORKER__QUEUE": f"faults-{run}",
            "SCOPEKB_WORKER__TASK_SOFT_TIME_LIMIT_S": "150",
            "SCOPEKB_WORKER__TASK_TIME_LIMIT_S": "160",
            "SCOPEKB_WORKER__VISIBILITY_TIMEOUT_S": "170",
            "SCOPEKB_WORKER__HEARTBEAT_S": "5",
            "SCOPEKB_GIT__CACHE_DIR": str(self.workdir / "git"),
            "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true",
            "SCOPEKB_DATA_DIR": str(self.workdir / "data"),
            "SCOPEKB_QUERY__ADMIN_TOKEN": ADMIN_TOKEN,
            "SCOPEKB_LOG_FORMAT": "json",
            **self.settings,
        }
        self.alias = self.env["SCOPEKB_OPENSEARCH__ALIAS"]
        self.prefix = self.env["SCOPEKB_OPENSEARCH__SYSTEM_PREFIX"]
        self.queue = self.env["SCOPEKB_WORKER__QUEUE"]
        self.os = OpenSearch(hosts=self.services.opensearch_urls, timeout=30)

    # ---- processes -----------------------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as fh:
            popen = subprocess.Popen([sys.executable, *args], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                     cwd=self.workdir, start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_query(self) -> Proc:
        """The query service (REST API), waited for until ``/healthz`` answers."""
        port = free_port()
        self.query_url = f"http://127.0.0.1:{port}"
        proc = self._spawn("query", ["-m", "scopekb_cli.main", "serve", "query", "--port", str(port)], self.env)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"query service exited: {proc.log_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.query_url + "/healthz", timeout=1).status_code == 200:
                    return proc
            time.sleep(0.2)
        raise RuntimeError("query service not up after 90 s")

    def start_worker(self, name: str = "worker", env: dict[str, str] | None = None, concurrency: int = 1) -> Proc:
        """A Celery worker (``tests/faults/worker_main.py``), waited for until it consumes its queue."""
        proc = self._spawn(name, ["-m", "tests.faults.worker_main", "--concurrency", str(concurrency)],
                           {**self.env, **(env or {})})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"worker {name} exited: {proc.log_text()[-2000:]}")
            if " ready." in proc.log_text():  # Celery's "celery@<host> ready." once it consumes
                return proc
            time.sleep(0.2)
        raise RuntimeError(f"worker {name} not ready after 90 s: {proc.log_text()[-2000:]}")

    def kill(self, proc: Proc) -> list[int]:
        """SIGKILL a process and its descendants at once (nothing runs its shutdown code); returns the pids."""
        pids = proc.tree()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)
        return pids

    def stop(self, proc: Proc, timeout: float = 15) -> None:
        """SIGTERM (a worker finishes its task first), then SIGKILL of the group after ``timeout``."""
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=10)

    def close(self) -> None:
        """Stop every process and drop the scenario's indices (best effort: the services may be what failed)."""
        for proc in reversed(self.procs):
            self.stop(proc, timeout=5)
        with contextlib.suppress(Exception):
            self.os.indices.delete(index=f"{self.alias}*,{self.prefix}*", params={"expand_wildcards": "open,closed"})
        self.os.close()

    # ---- API -----------------------------------------------------------------------------------------------

    def admin(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.query_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            timeout=timeout)

    def add_source(self, repo: Path, agent: str, context: str = "main", ref: str = "main") -> str:
        with self.admin() as c:
            r = c.post("/v1/sources", json={"agent_name": agent, "context_id": context, "repo_url": str(repo),
                                            "ref": ref})
        r.raise_for_status()
        return str(r.json()["id"])

    def agent_key(self, agent: str) -> str:
        with self.admin() as c:
            r = c.post("/v1/keys", json={"agent_name": agent})
        r.raise_for_status()
        return str(r.json()["key"])

    def sync(self, source_id: str) -> str:
        """Enqueue a sync through the API; returns the job id."""
        with self.admin() as c:
            r = c.post(f"/v1/sources/{source_id}/sync")
        r.raise_for_status()
        return str(r.json()["job_id"])

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job record, or None while it does not exist or the API cannot answer (a service is down)."""
        try:
            with self.admin(timeout=10) as c:
                r = c.get(f"/v1/jobs/{job_id}")
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def wait_job(self, job_id: str, timeout: float = 180, states: tuple[str, ...] = ("done", "partial", "failed"),
                 procs: list[Proc] | None = None) -> dict[str, Any]:
        """Poll until the job is in one of ``states``; on timeout, fail with the worker logs' tails."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job is not None and job["state"] in states:
                return job
            time.sleep(0.5)
        tails = "\n".join(f"--- {p.name}\n{p.log_text()[-2500:]}" for p in (procs or self.procs))
        raise AssertionError(f"job {job_id} not in {states} after {timeout:.0f}s: {self.job(job_id)}\n{tails}")

    def jobs(self, source_id: str) -> list[dict[str, Any]]:
        with self.admin() as c:
            r = c.get("/v1/jobs", params={"source_id": source_id, "limit": 50})
        r.raise_for_status()
        return list(r.json())

    def dead_letters(self, include_replayed: bool = False) -> list[dict[str, Any]]:
        with self.admin() as c:
            r = c.get("/v1/deadletters", params={"include_replayed": include_replayed})
        r.raise_for_status()
        return list(r.json())

    def send_task(self, name: str, **kwargs: Any) -> str:
        """Enqueue a task on the scenario's queue directly (as beat or the ingester would); returns its id."""
        from celery import Celery

        task_id = f"{name.rsplit('.', 1)[-1]}-{uuid.uuid4().hex[:10]}"
        app = Celery("faults", broker=self.services.redis_url, backend=self.services.redis_url)
        try:
            app.send_task(name, task_id=task_id, kwargs=kwargs, queue=self.queue)
        finally:
            app.close()
        return task_id

    def redis(self) -> redis_lib.Redis:
        """A client of the private Redis (the broker, locks and attempt counters)."""
        return redis_lib.Redis.from_url(self.services.redis_url, socket_timeout=5, socket_connect_timeout=2)

    def state(self, source_id: str) -> dict[str, Any]:
        """The source's sync state record (``commit``, and ``writing`` while a sync writes or after it died)."""
        try:
            return dict(self.os.get(index=f"{self.prefix}-state", id=source_id)["_source"])
        except NotFoundError:
            return {}

    # ---- index ---------------------------------------------------------------------------------------------

    def chunks(self, source_id: str) -> Counter[Chunk]:
        """(path, start line, text) of every chunk the scenario's index holds for a source (refreshed first)."""
        # after a fault the shard copies may still be recovering on a loaded machine: a refresh can take longer than
        # the client's default 30 s (seen once after the cluster-red scenario, with every job already settled)
        self.os.indices.refresh(index=self.alias, params={"request_timeout": 180})
        hits = helpers.scan(self.os, index=self.alias, query={"query": {"term": {"source_id": source_id}}},
                            _source=["path", "start_line", "content"], size=1000)
        return Counter((h["_source"]["path"], h["_source"]["start_line"], h["_source"]["content"]) for h in hits)

    def count(self, source_id: str) -> int:
        """Chunks of a source visible now (no refresh forced: what searches see)."""
        try:
            return int(self.os.count(index=self.alias, body={"query": {"term": {"source_id": source_id}}},
                                     params={"request_timeout": 5})["count"])
        except Exception:  # noqa: BLE001 - the index may not exist yet or OpenSearch may be down
            return -1

    def fresh(self, repo: Path, ref: str = "main", env: dict[str, str] | None = None) -> tuple[Counter[Chunk], dict]:
        """A fresh full index of ``repo`` at ``ref`` (another process, throwaway alias): its chunks and job."""
        out = self.workdir / f"fresh-{uuid.uuid4().hex[:6]}.json"
        clean = {k: v for k, v in self.env.items()
                 if k not in ("SCOPEKB_TESTING_FAULTS", "SCOPEKB_TEST_CRASH_CHUNKING")}
        proc = subprocess.run([sys.executable, "-m", "tests.faults.fresh_index", str(repo), ref, str(out)],
                              env={**clean, **(env or {}), "SCOPEKB_LOG_LEVEL": "WARNING"}, cwd=self.workdir,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"fresh index failed: {proc.stderr[-3000:]}")
        data = json.loads(out.read_text())
        return Counter((p, line, text) for p, line, text in data["chunks"]), data["job"]

    def compare(self, source_id: str, expected: Counter[Chunk]) -> Comparison:
        return Comparison(self.chunks(source_id), expected)


class Searcher(threading.Thread):
    """Searches through the query service in a loop until stopped; records (seconds since start, status,
    latency in s, hit count) per request."""

    def __init__(self, stack: Stack, key: str, query: dict[str, Any], pause_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.query = query
        self.client = httpx.Client(base_url=stack.query_url, headers={"Authorization": f"Bearer {key}"},
                                   timeout=30)
        self.pause_s = pause_s
        self.results: list[tuple[float, int, float, int]] = []
        self.halt = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.halt.is_set():
            t = time.monotonic()
            try:
                r = self.client.post("/v1/search", json=self.query)
                hits = len(r.json().get("hits", [])) if r.status_code == 200 else 0
                status = r.status_code
            except httpx.HTTPError:
                status, hits = -1, 0
            self.results.append((round(t - self.t0, 2), status, time.monotonic() - t, hits))
            self.halt.wait(self.pause_s)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=60)
        self.client.close()

    def summary(self, since: float = 0.0) -> dict[str, object]:
        rows = [r for r in self.results if r[0] >= since]
        latencies = sorted(r[2] for r in rows)
        p95 = latencies[int(0.95 * (len(latencies) - 1))] if latencies else 0.0
        bad = [(t, s) for t, s, _, _ in rows if s != 200]
        return {"searches": len(rows), "non_200": len(bad), "non_200_at": bad[:10],
                "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else 0,
                "p95_ms": round(1000 * p95, 1), "max_ms": round(1000 * latencies[-1], 1) if latencies else 0}


def wait_until(check: Callable[[], Any], timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy; returns it. Raises AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not reached after {timeout:.0f}s")
