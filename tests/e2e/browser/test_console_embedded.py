"""The console of the embedded profile (`scopekb up`: one process, SQLite, in-memory queue) in headless Chromium:
sign in, add a source, watch its job finish, search the planted function, read the health page (issue 25)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from tests.e2e.conftest import _wait_http, free_port, start_procs, stop_procs

from .conftest import ConsoleStack, make_repo
from .test_console import add_source, refused_form_values_come_back_bounded, sign_in, wait_job_state

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
ADMIN = "embedded-console-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    """`scopekb up` with no OpenSearch, Redis or S3 setting (the embedded profile), stopped by pid."""
    home = tmp_path_factory.mktemp("embedded-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}
    env.update({"SCOPEKB_HOME": str(home), "SCOPEKB_EMBEDDING__PROVIDER": "none",
                "SCOPEKB_QUERY__ADMIN_TOKEN": ADMIN, "SCOPEKB_LOG_FORMAT": "json"})
    port = free_port()
    logs = tmp_path_factory.mktemp("embedded-logs")
    st = ConsoleStack(url=f"http://127.0.0.1:{port}", env=env, logs=logs)
    try:
        st.procs = start_procs({"up": [sys.executable, "-m", "scopekb_cli.main", "up", "--port", str(port)]},
                               env, logs)
        _wait_http(st.url + "/healthz", st.procs[0], logs / "up.log", timeout_s=120)
        yield st
    finally:
        stop_procs(st.procs)


def test_embedded_console_indexes_searches_and_reports_health(chrome: Any, embedded: ConsoleStack,
                                                              tmp_path: Path, shot: Any) -> None:
    repo = tmp_path / "solo"
    make_repo(repo, {"pkg/solo.py": "def embedded_console_marker():\n    return 'one process'\n"})
    driver = chrome()
    sign_in(driver, embedded, ADMIN)
    add_source(driver, embedded, "solo", "c", repo, "me/solo")
    wait_job_state(driver, embedded)
    shot(driver, "e1-embedded-job-done")
    driver.get(embedded.url + "/console/search?q=embedded_console_marker&agent=solo")
    hits = driver.find_elements(By.CSS_SELECTOR, ".hit .path")
    assert [h.text for h in hits] == ["pkg/solo.py:1–2"]
    # each hit says why it was chosen, in the text answer's words (a HitReason broke the page before)
    why = [w.text for w in driver.find_elements(By.CSS_SELECTOR, ".hit .why")]
    assert len(why) == 1 and why[0].startswith("why: keyword #1") and "embedded_console_marker" in why[0], why
    shot(driver, "e2-embedded-search")
    driver.get(embedded.url + "/console/health")
    items = {li.find_element(By.TAG_NAME, "strong").text: li.text
             for li in driver.find_elements(By.CSS_SELECTOR, ".checks li")}
    assert items["index (sqlite)"].startswith("ok") and items["coordination (memory)"].startswith("ok"), items
    assert "embedded profile" in driver.find_element(By.CLASS_NAME, "foot").text
    shot(driver, "e3-embedded-health")


def test_embedded_refused_form_values_come_back_bounded(embedded: ConsoleStack) -> None:
    refused_form_values_come_back_bounded(embedded, ADMIN)
