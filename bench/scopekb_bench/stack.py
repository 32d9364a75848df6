"""The real scopekb processes of a run (ingester, query service, Celery worker), started and stopped by pid.

Every stack gets its own index alias, system-index prefix, Celery queue, git cache and S3 bucket, all named
``bench-<run id>-...``, so a run never sees other data on shared services and its cleanup removes exactly what it
made (:func:`cleanup`).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from opensearchpy import OpenSearch

from scopekb_bench.util import REPO, log, stop_processes
from scopekb_ingester.providers import github_signature

ZERO = "0" * 40
WEBHOOK_SECRET = "bench-webhook-secret"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stack_env(endpoints: dict[str, str], run_id: str, name: str, workdir: Path, provider: str,
              admin_token: str, queue: str | None = None) -> dict[str, str]:
    """Environment of one stack's processes: the endpoints plus names private to this run and stack."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}
    data = workdir / f"data-{name}"
    data.mkdir(parents=True, exist_ok=True)
    return {
        **base, **endpoints,
        "SCOPEKB_OPENSEARCH__ALIAS": f"bench-{run_id}-{name}-chunks",
        "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"bench-{run_id}-{name}-sys",
        "SCOPEKB_S3__BUCKET": f"bench-{run_id}",
        "SCOPEKB_WORKER__QUEUE": queue or f"bench-{run_id}-{name}",
        "SCOPEKB_GIT__CACHE_DIR": str(data / "git"),
        "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true",
        "SCOPEKB_DATA_DIR": str(data),
        "SCOPEKB_QUERY__ADMIN_TOKEN": admin_token,
        "SCOPEKB_EMBEDDING__PROVIDER": provider,
        "SCOPEKB_LOG_FORMAT": "json",
        "TOKENIZERS_PARALLELISM": "false",
    }


class Stack:
    """Ingester, query service and one Celery worker (concurrency 1) as separate processes.

    Args:
        env: from :func:`stack_env`.
        logs: folder for the processes' output.
        parts: which processes to start (``ingester``, ``query``, ``worker``).
    """

    def __init__(self, name: str, env: dict[str, str], logs: Path,
                 parts: tuple[str, ...] = ("ingester", "query", "worker")) -> None:
        self.name = name
        self.env = env
        self.logs = logs
        self.parts = parts
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports = {"ingester": free_port(), "query": free_port()}
        self.ingester_url = f"http://127.0.0.1:{self.ports['ingester']}"
        self.query_url = f"http://127.0.0.1:{self.ports['query']}"
        self.admin_token = env["SCOPEKB_QUERY__ADMIN_TOKEN"]
        self._handles: list[Any] = []

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 180) -> Stack:
        """Start the processes and wait until the HTTP ones answer ``/healthz`` and the worker is consuming.

        A stack with a worker and a query service first runs ``scopekb init`` (a deployment's hook: the chunk index
        and the system indices exist before the services start, so no measured push or search creates one; issue
        20: the first probe search created the ranking index, 0.35-0.71 s of a push's "webhook to searchable")."""
        self.logs.mkdir(parents=True, exist_ok=True)
        if {"query", "worker"} <= set(self.parts):
            with open(self.logs / f"{self.name}-init.log", "wb") as fh:
                done = subprocess.run([sys.executable, "-m", "scopekb_cli.main", "init"], env=self.env, stdout=fh,
                                      stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout_s)
            if done.returncode != 0:
                self._fail("init", f"exited with {done.returncode}")
        cmds = {"ingester": ["serve", "ingester", "--port", str(self.ports["ingester"])],
                "query": ["serve", "query", "--port", str(self.ports["query"])],
                "worker": ["worker", "--concurrency", "1"]}
        for part in self.parts:
            fh = open(self.logs / f"{self.name}-{part}.log", "wb")  # noqa: SIM115 - closed in stop()
            self._handles.append(fh)
            self.procs[part] = subprocess.Popen([sys.executable, "-m", "scopekb_cli.main", *cmds[part]],
                                                env=self.env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + timeout_s
        for part, url in (("ingester", self.ingester_url), ("query", self.query_url)):
            if part in self.procs:
                self._wait_http(part, url + "/healthz", deadline)
        if "worker" in self.procs:
            self._wait_worker(deadline)
        log(f"stack {self.name} up: " + ", ".join(f"{k} pid {p.pid}" for k, p in self.procs.items()))
        return self

    def _fail(self, part: str, why: str) -> None:
        tail = (self.logs / f"{self.name}-{part}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{self.name} {part}: {why}\n{tail}")

    def _wait_http(self, part: str, url: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.procs[part].poll() is not None:
                self._fail(part, f"exited with {self.procs[part].returncode}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self._fail(part, "did not answer in time")

    def _wait_worker(self, deadline: float) -> None:
        """Send the ping task on this stack's queue and wait for the worker's answer."""
        from scopekb import queue
        from scopekb.runtime import celery_app
        from scopekb.settings import RedisSettings, Settings, WorkerSettings

        settings = Settings(redis=RedisSettings(url=self.env["SCOPEKB_REDIS__URL"]),
                            worker=WorkerSettings(queue=self.env["SCOPEKB_WORKER__QUEUE"]))
        app = celery_app(settings, name="scopekb-bench")
        task_id = f"{self.env['SCOPEKB_WORKER__QUEUE']}-ping"
        res = app.send_task(queue.TASK_PING, task_id=task_id, kwargs={"value": "bench"})
        while time.monotonic() < deadline:
            if self.procs["worker"].poll() is not None:
                self._fail("worker", f"exited with {self.procs['worker'].returncode}")
            if res.ready():
                res.forget()
                return
            time.sleep(0.2)
        self._fail("worker", "not ready in time")

    def stop(self) -> None:
        """Terminate this stack's processes (by pid), kill any that do not exit within 20 s."""
        stop_processes(self.procs.values())
        for fh in self._handles:
            fh.close()
        self._handles.clear()
        self.procs.clear()

    def pid(self, part: str) -> int:
        """Process id of one part."""
        return self.procs[part].pid

    # ---- API helpers -----------------------------------------------------------------------------------------

    def admin(self) -> httpx.Client:
        """HTTP client for the query service with the admin token."""
        return httpx.Client(base_url=self.query_url, headers={"Authorization": f"Bearer {self.admin_token}"},
                            timeout=60)

    def register(self, agent: str, context: str, repo_path: Path, repo_name: str) -> tuple[str, str]:
        """Register a source (local path, ref ``main``) and an agent key for its scope; returns (source id, key)."""
        with self.admin() as c:
            r = c.post("/v1/sources", json={"agent_name": agent, "context_id": context, "repo_url": str(repo_path),
                                            "ref": "main", "repo_name": repo_name, "webhook_secret": WEBHOOK_SECRET})
            r.raise_for_status()
            src = r.json()["id"]
            r = c.post("/v1/keys", json={"agent_name": agent, "context_ids": [context], "label": "bench"})
            r.raise_for_status()
            return src, r.json()["key"]

    def push(self, repo_name: str, clone_url: str, before: str, after: str, delivery: str) -> httpx.Response:
        """POST a signed GitHub push of ``refs/heads/main`` to the ingester."""
        body, headers = github_push(repo_name, clone_url, before, after, delivery)
        return httpx.post(self.ingester_url + "/webhooks/github", content=body, headers=headers, timeout=60)

    def wait_job(self, job_id: str, timeout_s: float = 1800, poll_s: float = 0.1,
                 max_poll_s: float = 0.5) -> dict[str, Any]:
        """Poll ``GET /v1/jobs/{id}`` until the job finished; returns the record (raises on timeout).

        The interval is ``poll_s``, growing to 1/20 of the time waited so far (at most ``max_poll_s``), so the
        finish is seen at most 5% (and 0.5 s) late. Issue 20: polling every 0.1 s through a 60 s full index made
        about 550 real-time gets against the job record the worker keeps rewriting, about 1.5 OpenSearch CPU
        seconds charged to the pipeline's side of the ingest ratio (the baseline bulk has no poller) on cores the
        pipeline is bound by."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        with self.admin() as c:
            while time.monotonic() < deadline:
                r = c.get(f"/v1/jobs/{job_id}")
                if r.status_code == 200 and r.json()["state"] in ("done", "partial", "failed"):
                    return r.json()
                if "worker" in self.procs and self.procs["worker"].poll() is not None:
                    self._fail("worker", "exited during a job")
                time.sleep(poll_interval(time.monotonic() - t0, poll_s, max_poll_s))
        self._fail("worker", f"job {job_id} did not finish in {timeout_s}s")
        raise AssertionError("unreachable")


def poll_interval(waited_s: float, poll_s: float = 0.1, max_poll_s: float = 0.5) -> float:
    """Seconds to sleep before the next job poll after ``waited_s``: ``poll_s``, growing to 1/20 of the time
    waited, at most ``max_poll_s`` (a finish is seen at most 5% and ``max_poll_s`` late)."""
    return min(max_poll_s, max(poll_s, waited_s / 20))


def github_push(repo_name: str, clone_url: str, before: str, after: str, delivery: str,
                secret: str = WEBHOOK_SECRET) -> tuple[bytes, dict[str, str]]:
    """Body and headers of a signed GitHub push delivery (the format GitHub documents)."""
    body = json.dumps({"ref": "refs/heads/main", "before": before, "after": after, "commits": [],
                       "repository": {"full_name": repo_name, "clone_url": clone_url}}).encode()
    return body, {"Content-Type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": delivery,
                  "X-Hub-Signature-256": github_signature(secret, body)}


def new_admin_token() -> str:
    """A random admin token for this run's query services."""
    return "bench-admin-" + secrets.token_hex(16)


def cleanup(endpoints: dict[str, str], run_id: str) -> dict[str, int]:
    """Delete everything this run created on the shared services: ``bench-<run id>-*`` indices and aliases, the
    ``bench-<run id>`` bucket and its objects, and Redis keys containing ``bench-<run id>``. Returns counts."""
    prefix = f"bench-{run_id}"
    out = {"indices": 0, "objects": 0, "redis_keys": 0}
    try:
        client = OpenSearch(hosts=[endpoints["SCOPEKB_OPENSEARCH__URL"]], timeout=60)
        names = list(client.indices.get(index=f"{prefix}-*", params={"expand_wildcards": "all"}).keys())
        for n in names:
            client.indices.delete(index=n, params={"ignore_unavailable": "true"})
        out["indices"] = len(names)
    except Exception as e:  # noqa: BLE001 - report, keep cleaning the rest
        log(f"cleanup: OpenSearch: {e}")
    try:
        from minio import Minio
        from minio.deleteobjects import DeleteObject

        mc = Minio(endpoints["SCOPEKB_S3__ENDPOINT"], access_key=endpoints.get("SCOPEKB_S3__ACCESS_KEY", ""),
                   secret_key=endpoints.get("SCOPEKB_S3__SECRET_KEY", ""),
                   secure=endpoints.get("SCOPEKB_S3__SECURE", "false").lower() == "true")
        if mc.bucket_exists(prefix):
            objs = [DeleteObject(o.object_name) for o in mc.list_objects(prefix, recursive=True)]
            for i in range(0, len(objs), 1000):
                for err in mc.remove_objects(prefix, objs[i:i + 1000]):
                    log(f"cleanup: S3 delete error {err}")
            mc.remove_bucket(prefix)
            out["objects"] = len(objs)
    except Exception as e:  # noqa: BLE001
        log(f"cleanup: S3: {e}")
    try:
        r = redis.Redis.from_url(endpoints["SCOPEKB_REDIS__URL"])
        keys = list(r.scan_iter(match=f"*{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i:i + 500])
        out["redis_keys"] = len(keys)
    except Exception as e:  # noqa: BLE001
        log(f"cleanup: Redis: {e}")
    return out
