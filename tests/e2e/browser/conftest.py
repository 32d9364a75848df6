"""Browser tests of the console (issue 25): Debian's Chromium driven by Selenium through Debian's chromedriver,
against a real query service and Celery worker on the real services.

Screenshots of every page go to ``.artifacts/browser/`` at the repository root (gitignored); CI keeps them as
test artefacts. Chromium runs headless with a fresh profile and every background-network feature off (the
machine has no network but the package registries; see scripts/install-chromium).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import ADMIN_TOKEN, ROOT, _wait_http, free_port, start_procs, stop_procs

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = ROOT / ".artifacts" / "browser"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--disable-extensions", "--disable-default-apps")


@dataclass
class ConsoleStack:
    """A query service with the console and one worker, on a private alias, system prefix and queue."""

    url: str
    env: dict[str, str]
    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def api(self, token: str = ADMIN_TOKEN) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def session(self, token: str = ADMIN_TOKEN) -> tuple[httpx.Client, str]:
        """An httpx client signed in to the console with ``token`` (admin or agent key) and its CSRF token."""
        c = httpx.Client(base_url=self.url, timeout=30)
        login = c.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
        assert csrf, login.text
        r = c.post("/console/login", data={"token": token, "csrf": csrf.group(1)})
        assert r.status_code == 303 and r.headers["location"] == "/console/sources", (r.status_code, r.text)
        page = c.get("/console/sources")
        token_match = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token_match, page.text
        return c, token_match.group(1)

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(
            self.logs.glob("*.log")))


@pytest.fixture(scope="module")
def console_stack(stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    """Query service (+ console) and a Celery worker as processes; a failing sync is parked at once
    (``worker.max_retries=0``) so the dead-letter page has something to replay. Blobs share the session's bucket
    (content-addressed; one S3 collection fewer)."""
    run = uuid.uuid4().hex[:8]
    env = {**stack_env, "SCOPEKB_OPENSEARCH__ALIAS": f"ui-{run}-chunks",
           "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"ui-{run}-sys", "SCOPEKB_WORKER__QUEUE": f"ui-{run}",
           "SCOPEKB_WORKER__MAX_RETRIES": "0",
           "SCOPEKB_EMBEDDING__PROVIDER": "none"}
    logs = tmp_path_factory.mktemp("console-logs")
    port = free_port()
    st = ConsoleStack(url=f"http://127.0.0.1:{port}", env=env, logs=logs)
    subprocess.run([sys.executable, "-m", "scopekb_cli.main", "init"], env=env, cwd=ROOT, check=True,
                   capture_output=True)
    cmds = {"query": [sys.executable, "-m", "scopekb_cli.main", "serve", "query", "--port", str(port)],
            "worker": [sys.executable, "-m", "scopekb_cli.main", "worker", "--concurrency", "1"]}
    try:
        st.procs = start_procs(cmds, env, logs)
        _wait_http(st.url + "/healthz", st.procs[0], logs / "query.log")
        yield st
    finally:
        stop_procs(st.procs)


def _require_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run scripts/install-chromium (Debian chromium + "
                    "chromium-driver)", pytrace=False)


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., object]]:
    """A factory of headless Chromium sessions (``chrome(width=, height=)``), each with a fresh profile."""
    _require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    drivers = []

    def make(width: int = 1280, height: int = 900) -> webdriver.Chrome:
        opts = Options()
        opts.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS:
            opts.add_argument(flag)
        opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
        opts.add_argument(f"--window-size={width},{height}")
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
        driver.set_page_load_timeout(60)
        drivers.append(driver)
        return driver

    yield make
    for d in drivers:
        d.quit()


@pytest.fixture(scope="session")
def shot() -> Callable[[object, str], Path]:
    """Save a full-page screenshot as ``.artifacts/browser/<name>.png`` and return its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def save(driver: object, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        height = driver.execute_script("return document.documentElement.scrollHeight")  # type: ignore[attr-defined]
        width = driver.execute_script("return window.innerWidth")  # type: ignore[attr-defined]
        size = driver.get_window_size()  # type: ignore[attr-defined]
        driver.set_window_size(size["width"], max(size["height"], min(int(height) + 120, 4000)))  # type: ignore[attr-defined]
        driver.save_screenshot(str(path))  # type: ignore[attr-defined]
        driver.set_window_size(size["width"], size["height"])  # type: ignore[attr-defined]
        assert path.stat().st_size > 1000 and width > 0
        return path

    return save


def wait_until(fn: Callable[[], object], timeout_s: float = 120, what: str = "condition") -> object:
    """Poll ``fn`` until it returns a truthy value; fail after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - the page may be between loads
            last = e
        time.sleep(0.3)
    pytest.fail(f"{what} not reached in {timeout_s}s (last: {last!r})")


def make_repo(path: Path, files: dict[str, str]) -> str:
    """A git repository at ``path`` on branch main with ``files`` committed; returns the commit sha."""
    from scopekb.realrepo import git

    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for rel, text in files.items():
        f = path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "fixture")
    return git(path, "rev-parse", "HEAD")
