"""Embedded mode, no servers (issue 9): `scopekb up` serves the query API, MCP, webhooks and a worker in one
process over an in-memory queue; `scopekb index` / `search` work on a folder. No Redis, OpenSearch or S3
setting is given to these processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from scopekb.realrepo import git
from tests.webhook_fixtures import ZERO, delivery

from .conftest import ROOT, free_port

pytestmark = pytest.mark.e2e
ADMIN = "embedded-admin-" + uuid.uuid4().hex


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}
    env.update({"SCOPEKB_HOME": str(home), "SCOPEKB_EMBEDDING__PROVIDER": "none",
                "SCOPEKB_QUERY__ADMIN_TOKEN": ADMIN, "SCOPEKB_LOG_FORMAT": "json"})
    return env


def _repo(tmp: Path) -> tuple[Path, str]:
    repo = tmp / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "lib.py").write_text("def embedded_marker_function():\n    return 'one process'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    return repo, git(repo, "rev-parse", "HEAD")


def test_up_serves_webhooks_worker_and_search_in_one_process(tmp_path: Path) -> None:
    repo, head = _repo(tmp_path)
    port = free_port()
    log = tmp_path / "up.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "scopekb_cli.main", "up", "--port", str(port)],
                                env=_env(tmp_path / "home"), stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail(log.read_text(errors="replace")[-2000:])
        admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        ready = httpx.get(base + "/readyz", timeout=10)  # 503 before issue 17 (OpenSearch-only internals)
        assert ready.status_code == 200 and ready.json()["checks"] == {"sqlite": "ok", "memory": "ok"}, ready.text
        r = admin.post("/v1/sources", json={"agent_name": "solo", "context_id": "c", "repo_url": str(repo),
                                            "ref": "main", "repo_name": "me/repo", "webhook_secret": "s"})
        assert r.status_code == 201, r.text
        key = admin.post("/v1/keys", json={"agent_name": "solo", "context_ids": ["c"]}).json()["key"]
        body, headers = delivery("github", "me/repo", str(repo), ZERO, head, "s")
        r = httpx.post(base + "/webhooks/github", content=body, headers=headers, timeout=30)
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        for _ in range(600):
            job = admin.get(f"/v1/jobs/{job_id}").json()
            if job.get("state") in ("done", "partial", "failed"):
                break
            time.sleep(0.2)
        assert job["state"] == "done", (job, log.read_text(errors="replace")[-2000:])
        r = httpx.post(base + "/webhooks/github", content=body, headers=headers, timeout=30)
        assert r.json()["status"] == "duplicate"  # dedupe works without Redis
        hits = httpx.post(base + "/v1/search", json={"query": "embedded_marker_function"},
                          headers={"Authorization": f"Bearer {key}"}, timeout=30).json()["hits"]
        assert [h["path"] for h in hits] == ["lib.py"]
        status = admin.get("/v1/status")  # 500 before issue 17
        assert status.status_code == 200 and status.json()["chunks"] >= 1, status.text
        assert [s["status"] for s in status.json()["sources"]] == ["READY"]
        print("checked: signed push -> in-process queue -> worker -> SQLite -> search, in one process")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_cli_index_and_search_a_plain_folder_without_servers(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.md").write_text("# Todo\nfeed the axolotl_tank every morning\n")
    (folder / "ignored.bin").write_bytes(b"\x00\x01")
    env = _env(tmp_path / "home")
    cli = [sys.executable, "-m", "scopekb_cli.main"]
    first = subprocess.run([*cli, "index", str(folder), "--json"], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    job = json.loads(first.stdout)
    assert job["state"] == "done" and job["files_indexed"] == 1 and job["files_skipped"] == {"binary": 1}
    again = json.loads(subprocess.run([*cli, "index", str(folder), "--json"], env=env, capture_output=True,
                                      text=True, check=True).stdout)
    assert again["files_seen"] == 0 and again["chunks_written"] == 0 and again["embeddings_computed"] == 0
    (folder / "todo.md").write_text("# Todo\nwater the bonsai_tree instead\n")
    third = json.loads(subprocess.run([*cli, "index", str(folder), "--json"], env=env, capture_output=True,
                                      text=True, check=True).stdout)
    assert third["files_indexed"] == 1
    out = subprocess.run([*cli, "search", "bonsai_tree", "--json"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert [h["path"] for h in json.loads(out)["hits"]] == ["todo.md"]
    gone = subprocess.run([*cli, "search", "axolotl_tank", "--json"], env=env, capture_output=True, text=True,
                          check=True).stdout
    assert json.loads(gone)["hits"] == []
    bad = subprocess.run([*cli, "index", str(tmp_path / "missing")], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("error:") and "Traceback" not in bad.stderr
