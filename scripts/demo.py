"""The distributed demo: real services, real processes, a real repository, a signed push, search results.

Run through ``scripts/demo`` (which installs scopekb and starts Redis, OpenSearch and S3 first). Steps:

1. build a git repository from two releases of click (PyPI sdists), one commit each;
2. start the ingester, the query service and a Celery worker as separate processes;
3. register the repository for scope (demo-agent, ctx-1) and create an agent key;
4. deliver a signed GitHub push of the first release, wait for the job, then push the second release;
5. print search results for a few queries, then stop the processes it started.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from scopekb.realrepo import build_release_repo, git

ROOT = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("SCOPEKB_SERVICES_DIR") or ROOT / ".services").resolve()
PACKAGE, RELEASES = "click", ["8.0.4", "8.1.0"]
DEMO_ALIAS, DEMO_PREFIX = "scopekb-demo-chunks", "scopekb-demo-sys"
QUERIES = ["get_terminal_size", "shell completion for bash", "resultcallback"]


def say(msg: str) -> None:
    """A step line: bold on a terminal, plain text in a log or pipe (no escape codes; README newcomer run)."""
    print(f"\033[1m==> {msg}\033[0m" if sys.stdout.isatty() else f"==> {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen, log: Path) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            sys.exit(f"error: process exited; see {log}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"error: {url} did not come up; see {log}")


def push(ingester: str, repo: Path, before: str, after: str, secret: str) -> str:
    delivery = str(uuid.uuid4())
    body = json.dumps({"ref": "refs/heads/main", "before": before, "after": after,
                       "repository": {"full_name": "pallets/click", "clone_url": str(repo)}}).encode()
    sig = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    r = httpx.post(f"{ingester}/webhooks/github", content=body, timeout=30, headers={
        "Content-Type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": sig})
    if r.status_code != 202:
        sys.exit(f"error: webhook answered {r.status_code}: {r.text}")
    return r.json()["job_id"]


def wait_job(admin: httpx.Client, job_id: str) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < 600:
        r = admin.get(f"/v1/jobs/{job_id}")
        if r.status_code == 200:
            job = r.json()
            if job["state"] in ("done", "partial", "failed"):
                return job
        time.sleep(0.5)
    sys.exit(f"error: job {job_id} did not finish in 10 minutes")


def reset_demo_indices() -> None:
    """Drop what an earlier demo run left (only the demo's own indices), so every run starts empty."""
    url = os.environ.get("SCOPEKB_OPENSEARCH__URL", "http://127.0.0.1:9200")
    for pattern in (f"{DEMO_ALIAS}*", f"{DEMO_PREFIX}-*"):
        httpx.delete(f"{url}/{pattern}", params={"expand_wildcards": "open"}, timeout=30)


def main() -> None:
    demo = STATE / "demo"
    logs = demo / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    say(f"building a git repository from {PACKAGE} {' and '.join(RELEASES)} (PyPI sdists)")
    repo = demo / "click"
    commits = build_release_repo(repo, PACKAGE, RELEASES, STATE / "cache" / "sdists")
    git(repo, "update-ref", "refs/heads/main", commits[0])

    admin_token, secret = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    reset_demo_indices()
    env = {**os.environ, "SCOPEKB_QUERY__ADMIN_TOKEN": admin_token, "SCOPEKB_GIT__ALLOW_LOCAL_PATHS": "true",
           "SCOPEKB_GIT__CACHE_DIR": str(demo / "git"), "SCOPEKB_OPENSEARCH__ALIAS": DEMO_ALIAS,
           "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": DEMO_PREFIX, "SCOPEKB_WORKER__QUEUE": "scopekb-demo",
           "SCOPEKB_LOG_FORMAT": "json"}
    ip, qp = free_port(), free_port()
    ingester, query = f"http://127.0.0.1:{ip}", f"http://127.0.0.1:{qp}"
    procs: list[subprocess.Popen] = []
    try:
        say("starting ingester, query service and worker")
        for name, args in (("ingester", ["serve", "ingester", "--port", str(ip)]),
                           ("query", ["serve", "query", "--port", str(qp)]),
                           ("worker", ["worker", "--concurrency", "1"])):
            fh = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
            procs.append(subprocess.Popen([sys.executable, "-m", "scopekb_cli.main", *args], env=env, stdout=fh,
                                          stderr=subprocess.STDOUT))
        wait_up(f"{ingester}/healthz", procs[0], logs / "ingester.log")
        wait_up(f"{query}/healthz", procs[1], logs / "query.log")

        admin = httpx.Client(base_url=query, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30)
        src = admin.post("/v1/sources", json={"agent_name": "demo-agent", "context_id": "ctx-1",
                                              "repo_url": str(repo), "ref": "main", "repo_name": "pallets/click",
                                              "webhook_secret": secret})
        src.raise_for_status()
        key = admin.post("/v1/keys", json={"agent_name": "demo-agent", "context_ids": ["ctx-1"]}).json()["key"]
        say(f"registered source {src.json()['id']} for scope demo-agent/ctx-1")

        for before, after, rel in ((("0" * 40), commits[0], RELEASES[0]), (commits[0], commits[1], RELEASES[1])):
            git(repo, "update-ref", "refs/heads/main", after)
            t0 = time.monotonic()
            job_id = push(ingester, repo, before, after, secret)
            job = wait_job(admin, job_id)
            say(f"push of {PACKAGE} {rel}: job {job['state']} in {time.monotonic() - t0:.1f}s — "
                f"{job['files_indexed']} files indexed, {job['files_deleted']} deleted, "
                f"{job['chunks_written']} chunks written, skipped {job['files_skipped']}")
            if job["state"] != "done":
                sys.exit(f"error: job ended {job['state']}: {job['errors'][:3]}")

        agent = httpx.Client(base_url=query, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        for q in QUERIES:
            r = agent.post("/v1/search", json={"query": q, "max_results": 3})
            r.raise_for_status()
            hits = r.json()["hits"]
            say(f"search {q!r}: {len(hits)} hits")
            for n, h in enumerate(hits, 1):
                print(f"[{n}] {h['path']}:{h['start_line']}-{h['end_line']} (score {h['score']:.2f}) "
                      f"commit {h['commit'][:10]}")
                lines = [ln for ln in h["content"].splitlines() if ln.strip()][:6]
                print("\n".join("      " + ln[:110] for ln in lines))
        say("done. Services keep running; stop them with: scripts/services down")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
