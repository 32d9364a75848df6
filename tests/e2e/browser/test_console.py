"""The console in a real headless Chromium against a running query service and worker (issue 25).

One operator's day, in order: sign in, add a source and watch its job finish, search for the planted function,
replay a dead letter, revoke a key and see the agent refused. Then what must never happen: a form without its
CSRF token, an agent seeing another agent's sources or hits, indexed text read as HTML. Screenshots of every
page go to ``.artifacts/browser/``.
"""

from __future__ import annotations

import re
import shutil
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.e2e.conftest import ADMIN_TOKEN

from .conftest import ConsoleStack, make_repo, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

PLANTED = "def planted_console_marker(widget):\n    \"\"\"Find me from the console.\"\"\"\n    return widget * 2\n"
GAMMA = "def gamma_private_function():\n    return 'only gamma may see this'\n"
HOSTILE_NAME = "<img src=x onerror=alert(1)>acme/hostile"
HOSTILE_PATH = "odd/<b>bold</b>.py"
HOSTILE_CONTENT = ("def hostile_chunk_marker():\n    return '''<script>window.__pwned = 1</script>"
                   "<img src=x onerror=\"window.__pwned = 2\">'''\n")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Repositories on disk and ids found along the way (filled by the tests, in order)."""
    root = tmp_path_factory.mktemp("console-repos")
    repos = {"alpha": root / "alpha", "beta": root / "beta", "gamma": root / "gamma", "hostile": root / "hostile"}
    make_repo(repos["alpha"], {"lib/marker.py": PLANTED, "README.md": "# alpha\n\nA fixture repository.\n"})
    make_repo(repos["beta"], {"beta.py": "def beta_replayed_function():\n    return 'beta'\n"})
    make_repo(repos["gamma"], {"gamma.py": GAMMA})
    make_repo(repos["hostile"], {HOSTILE_PATH: HOSTILE_CONTENT})
    return {"repos": repos}


def sign_in(driver: Any, stack: ConsoleStack, token: str) -> None:
    driver.get(stack.url + "/console/login")
    field = driver.find_element(By.ID, "token")
    field.send_keys(token)
    field.submit()
    wait_until(lambda: driver.current_url.endswith("/console/sources"), 30, "the sources page after sign-in")


@pytest.fixture(scope="module")
def admin(chrome: Any, console_stack: ConsoleStack, shot: Any) -> Any:
    """A Chromium session signed in as the admin (the sign-in page is screenshotted on the way)."""
    driver = chrome()
    driver.get(console_stack.url + "/console/sources")
    assert driver.current_url.endswith("/console/login")  # no session: sent to sign in
    shot(driver, "01-sign-in")
    sign_in(driver, console_stack, ADMIN_TOKEN)
    return driver


def add_source(driver: Any, stack: ConsoleStack, agent: str, context: str, repo: Path, name: str) -> str:
    """Fill and send the add-source form (sync now checked); returns the job id of the page it lands on."""
    driver.get(stack.url + "/console/sources")
    for field_id, value in (("agent_name", agent), ("context_id", context), ("repo_url", str(repo)),
                            ("repo_name", name)):
        driver.find_element(By.ID, field_id).send_keys(value)
    driver.find_element(By.CSS_SELECTOR, "form[action='/console/sources'] button[type=submit]").click()
    wait_until(lambda: "/console/jobs/" in driver.current_url, 30, "the job page after adding a source")
    return str(driver.current_url.rsplit("/", 1)[1])


def wait_job_state(driver: Any, stack: ConsoleStack, states: tuple[str, ...] = ("done",)) -> str:
    """Wait, on the open job page, until its live progress (job.js, no reload) shows a final state."""
    def state() -> str | None:
        text = driver.find_element(By.CSS_SELECTOR, "[data-field=state]").text
        return text if text in ("done", "partial", "failed") else None

    final = str(wait_until(state, 240, "a final job state on the job page"))
    assert final in states, (final, driver.find_element(By.ID, "errors").text, stack.log_tail())
    return final


def test_add_source_and_watch_its_job_finish(admin: Any, console_stack: ConsoleStack, world: dict[str, Any],
                                             shot: Any) -> None:
    shot(admin, "02-sources-empty")
    job_id = add_source(admin, console_stack, "alpha", "main", world["repos"]["alpha"], "acme/alpha")
    wait_job_state(admin, console_stack)
    assert int(admin.find_element(By.CSS_SELECTOR, "[data-field=files_indexed]").text) == 2
    assert int(admin.find_element(By.CSS_SELECTOR, "[data-field=chunks_written]").text) >= 2
    shot(admin, "03-job-done")
    world["alpha_job"] = job_id

    def alpha_row() -> Any:  # job lists are searched: the sources page follows the job within a refresh (1 s)
        admin.get(console_stack.url + "/console/sources")
        row = admin.find_element(By.XPATH, "//tr[td/a[text()='acme/alpha']]")
        return row if "done" in row.text and "up to date" in row.text else None

    row = wait_until(alpha_row, 30, "the source's row showing its finished job")
    assert "alpha / main" in row.text  # type: ignore[attr-defined]
    link = row.find_element(By.TAG_NAME, "a")  # type: ignore[attr-defined]
    world["alpha_source"] = link.get_attribute("href").rsplit("/", 1)[1]
    shot(admin, "04-sources")
    admin.get(console_stack.url + f"/console/sources/{world['alpha_source']}")
    assert job_id in admin.page_source
    shot(admin, "05-source-detail")


def test_search_shows_the_planted_function(admin: Any, console_stack: ConsoleStack, world: dict[str, Any],
                                           shot: Any) -> None:
    admin.get(console_stack.url + "/console/search")
    admin.find_element(By.ID, "q").send_keys("planted_console_marker widget")
    Select(admin.find_element(By.ID, "agent")).select_by_value("alpha")
    admin.find_element(By.CSS_SELECTOR, "form[role=search] button[type=submit]").click()
    wait_until(lambda: admin.find_elements(By.CSS_SELECTOR, ".hit"), 30, "search hits")
    first = admin.find_elements(By.CSS_SELECTOR, ".hit")[0]
    assert "lib/marker.py:1" in first.find_element(By.CSS_SELECTOR, ".path").text
    assert "acme/alpha@main" in first.find_element(By.CSS_SELECTOR, ".where").text
    marks = [m.text for m in first.find_elements(By.TAG_NAME, "mark")]
    assert "planted_console_marker" in marks and "widget" in marks
    # The console ranks as the API does: the same query through /v1/search gives the same paths in order.
    key, _ = _create_key_via_page(admin, console_stack, "alpha", "main", shot=None)
    with console_stack.api(key) as c:
        api_hits = c.post("/v1/search", json={"query": "planted_console_marker widget", "max_results": 10}).json()
    admin.get(console_stack.url + "/console/search?q=planted_console_marker+widget&agent=alpha&max=10")
    page_paths = [e.text.rsplit(":", 1)[0] for e in admin.find_elements(By.CSS_SELECTOR, ".hit .path")]
    assert page_paths == [h["path"] for h in api_hits["hits"]]
    shot(admin, "06-search")
    world["alpha_key"] = key


def _create_key_via_page(driver: Any, stack: ConsoleStack, agent: str, contexts: str, shot: Any
                         ) -> tuple[str, str]:
    """Create a key on the keys page; returns ``(key, key_id)`` and checks the key is shown only once."""
    driver.get(stack.url + "/console/keys")
    driver.find_element(By.ID, "key_agent").send_keys(agent)
    driver.find_element(By.ID, "key_contexts").send_keys(contexts)
    driver.find_element(By.CSS_SELECTOR, "form[action='/console/keys'] button[type=submit]").click()
    field = wait_until(lambda: driver.find_element(By.ID, "new-key"), 30, "the new key")
    key = str(field.get_attribute("value"))  # type: ignore[attr-defined]
    key_id = str(field.get_attribute("data-key-id"))  # type: ignore[attr-defined]
    assert key.startswith("skb_") and key_id
    if shot is not None:
        shot(driver, "07-key-created")
    driver.get(stack.url + "/console/keys")
    assert key not in driver.page_source and key_id in driver.page_source  # listed, but shown once only
    return key, key_id


def test_replay_a_dead_letter(admin: Any, console_stack: ConsoleStack, world: dict[str, Any], shot: Any) -> None:
    beta = world["repos"]["beta"]
    job_id = add_source(admin, console_stack, "beta", "main", beta, "acme/beta")
    wait_job_state(admin, console_stack)
    # Break the repository, sync again: the worker (max_retries=0) parks the task as a dead letter.
    moved = beta.with_name("beta-moved")
    shutil.move(beta, moved)
    admin.get(console_stack.url + "/console/sources")
    row = admin.find_element(By.XPATH, "//tr[td/a[text()='acme/beta']]")
    row.find_element(By.XPATH, ".//button[text()='Sync now']").click()
    wait_until(lambda: "/console/jobs/" in admin.current_url and job_id not in admin.current_url, 30, "job page")
    failed_job = admin.current_url.rsplit("/", 1)[1]
    wait_job_state(admin, console_stack, ("failed",))
    assert "git" in admin.find_element(By.ID, "errors").text
    shot(admin, "08-job-failed")
    def parked() -> bool:  # the worker parks the task just after recording the job as failed
        admin.get(console_stack.url + "/console/deadletters")
        return failed_job in admin.page_source

    wait_until(parked, 30, "the dead letter on its page")
    shot(admin, "09-dead-letters")
    shutil.move(moved, beta)  # repaired: the replay can succeed
    admin.find_element(By.CSS_SELECTOR, f"button[aria-label='Replay {failed_job}']").click()
    wait_until(lambda: f"/console/jobs/{failed_job}-replay-" in admin.current_url, 30, "the replayed job's page")
    wait_job_state(admin, console_stack)
    admin.get(console_stack.url + "/console/deadletters")
    assert failed_job not in admin.page_source  # replayed ones are hidden by default
    admin.get(console_stack.url + "/console/deadletters?all=1")
    assert failed_job in admin.page_source and "replayed" in admin.page_source


def test_revoked_key_is_refused_at_its_next_search(chrome: Any, admin: Any, console_stack: ConsoleStack,
                                                   world: dict[str, Any], shot: Any) -> None:
    key, key_id = _create_key_via_page(admin, console_stack, "alpha", "main", shot=shot)
    agent = chrome(width=390, height=844)  # a phone-sized screen
    sign_in(agent, console_stack, key)
    shot(agent, "10-agent-sources-narrow")
    assert "acme/alpha" in agent.page_source and "acme/beta" not in agent.page_source
    assert not agent.find_elements(By.CSS_SELECTOR, "form[action='/console/sources']")  # read-only
    agent.get(console_stack.url + "/console/search?q=planted_console_marker")
    assert agent.find_elements(By.CSS_SELECTOR, ".hit")
    shot(agent, "11-agent-search-narrow")
    # The page fits a narrow screen: no horizontal scrolling of the document itself.
    assert agent.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
    with console_stack.api(key) as c:
        assert c.post("/v1/search", json={"query": "planted_console_marker"}).status_code == 200

    admin.get(console_stack.url + "/console/keys")
    admin.find_element(By.CSS_SELECTOR, f"button[aria-label='Revoke {key_id}']").click()
    wait_until(lambda: "notice=revoked" in admin.current_url, 30, "the keys page after revoking")
    assert "Key revoked." in admin.page_source
    assert f"button[aria-label='Revoke {key_id}']" and not admin.find_elements(
        By.CSS_SELECTOR, f"button[aria-label='Revoke {key_id}']")
    shot(admin, "12-keys")
    with console_stack.api(key) as c:
        r = c.post("/v1/search", json={"query": "planted_console_marker"})
        assert r.status_code == 401, r.text
    agent.get(console_stack.url + "/console/search?q=planted_console_marker")
    assert agent.current_url.endswith("/console/login")  # the console session ended with the key


def test_health_page_reports_every_service(admin: Any, console_stack: ConsoleStack, shot: Any) -> None:
    admin.get(console_stack.url + "/console/health")
    items = {li.find_element(By.TAG_NAME, "strong").text: li.text
             for li in admin.find_elements(By.CSS_SELECTOR, ".checks li")}
    for name in ("OpenSearch", "Redis", "S3", "queue depth", "workers"):
        assert name in items and items[name].startswith("ok"), items
    assert "1 answered" in items["workers"]
    shot(admin, "13-health")
    # Over every page this session opened: no Content-Security-Policy violation, nothing blocked or refused.
    log = [e["message"] for e in admin.get_log("browser")]
    assert not [m for m in log if "Content Security Policy" in m or "ERR_" in m], log


# ---- security ---------------------------------------------------------------------------------------------------


def _post_routes() -> list[str]:
    """Every state-changing console route, read from the router itself (a new form cannot be forgotten)."""
    from types import SimpleNamespace

    from scopekb.settings import Settings
    from scopekb_query.console import Console

    console = Console(SimpleNamespace(settings=Settings()), None)  # type: ignore[arg-type]
    return sorted({"/console" + r.path for r in console.router().routes if "POST" in getattr(r, "methods", ())})


def test_every_state_changing_request_without_csrf_is_403(console_stack: ConsoleStack, world: dict[str, Any]
                                                         ) -> None:
    routes = _post_routes()
    assert len(routes) >= 8, routes  # sign in/out, source add/sync/remove, replay, key create/revoke
    ids = {"source_id": world["alpha_source"], "key_id": "key_x", "dl_id": "dl_x"}
    client, csrf = console_stack.session()
    fields = {"agent_name": "zeta", "context_id": "c", "repo_url": str(world["repos"]["gamma"]), "token": ADMIN_TOKEN}
    with closing(client):
        before = client.get("/console/sources").text.count("<tr>")
        for path in routes:
            url = re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], path)
            for sent in ({}, {"csrf": ""}, {"csrf": csrf + "x"}, {"csrf": "forged"}):
                r = client.post(url, data={**fields, **sent})
                assert r.status_code == 403, (url, sent, r.status_code, r.text[:300])
        # Nothing changed, and the session still works.
        page = client.get("/console/sources")
        assert page.status_code == 200 and page.text.count("<tr>") == before
        # The same forms from a client with no session at all are refused too.
        with httpx_client(console_stack) as anon:
            for path in routes:
                url = re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], path)
                assert anon.post(url, data={**fields, "csrf": csrf}).status_code == 403, url


def refused_form_values_come_back_bounded(stack: ConsoleStack, token: str = ADMIN_TOKEN) -> None:
    """The sources form refused for an oversized clone URL and the search page given an oversized query show their
    forms again without the oversized value (hostile review: a 314 KB repo_url came back whole in the 422 page),
    the values within bounds as sent."""
    client, csrf = stack.session(token)
    huge = "https://example.invalid/" + "a" * 300_000
    with closing(client):
        r = client.post("/console/sources", data={"csrf": csrf, "agent_name": "echo-agent", "context_id": "c",
                                                  "repo_url": huge})
        assert r.status_code == 422 and "repo_url" in r.text
        assert len(r.text) < 60_000 and "a" * 5000 not in r.text
        assert 'value="echo-agent"' in r.text  # a value within its bound is kept for the next try
        r = client.get("/console/search", params={"q": "q" * 5000, "agent": "echo-agent"})
        assert r.status_code == 200 and "q" * 4097 not in r.text


def test_refused_form_values_come_back_bounded(console_stack: ConsoleStack) -> None:
    refused_form_values_come_back_bounded(console_stack)


def httpx_client(stack: ConsoleStack) -> Any:
    import httpx

    return httpx.Client(base_url=stack.url, timeout=30)


def test_session_cookie_flags_and_no_token_in_urls(console_stack: ConsoleStack) -> None:
    c, _ = console_stack.session()
    with closing(c):
        login = httpx_client(console_stack).get("/console/login")
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert "Path=/console" in cookie
        r = c.get("/console/sources")
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert "'unsafe-inline'" not in r.headers["content-security-policy"]
        assert ADMIN_TOKEN not in r.text and ADMIN_TOKEN not in str(c.cookies)
    assert ADMIN_TOKEN not in console_stack.log_tail()


def test_an_agent_sees_no_other_agents_sources_or_hits(chrome: Any, console_stack: ConsoleStack,
                                                       world: dict[str, Any], shot: Any) -> None:
    admin_c, csrf = console_stack.session()
    with closing(admin_c):
        r = admin_c.post("/console/sources", data={"csrf": csrf, "agent_name": "gamma", "context_id": "g",
                                                   "repo_url": str(world["repos"]["gamma"]),
                                                   "repo_name": "acme/gamma", "sync": "1"})
        assert r.status_code == 303, r.text
        gamma_job = r.headers["location"].rsplit("/", 1)[1]
        wait_until(lambda: admin_c.get(f"/console/jobs/{gamma_job}/progress").json()["state"] == "done", 240,
                   "gamma's sync")
        r = admin_c.post("/console/keys", data={"csrf": csrf, "agent_name": "gamma", "context_ids": "g"})
        gamma_key = re.search(r'id="new-key" readonly value="([^"]+)"', r.text).group(1)  # type: ignore[union-attr]
    gamma, _ = console_stack.session(gamma_key)
    with closing(gamma):
        sources = gamma.get("/console/sources").text
        assert "acme/gamma" in sources and "acme/alpha" not in sources and "acme/beta" not in sources
        assert gamma.get(f"/console/sources/{world['alpha_source']}").status_code == 404
        assert gamma.get(f"/console/jobs/{world['alpha_job']}").status_code == 404
        assert gamma.get(f"/console/jobs/{world['alpha_job']}/progress").status_code == 404
        assert gamma.get(f"/console/jobs/{gamma_job}").status_code == 200
        for q in ("planted_console_marker", "beta_replayed_function"):
            for extra in ("", "&context=main", "&agent=alpha", "&cross=1", f"&source={world['alpha_source']}"):
                page = gamma.get(f"/console/search?q={q}{extra}")
                assert 'class="hit"' not in page.text and "lib/marker.py" not in page.text, (q, extra)
        own = gamma.get("/console/search?q=gamma_private_function").text
        assert "gamma.py" in own
        for admin_page in ("/console/keys", "/console/deadletters", "/console/health"):
            assert gamma.get(admin_page).status_code == 403, admin_page
    # And alpha's agent (a new key) never sees gamma's function.
    admin_c2, csrf2 = console_stack.session()
    with closing(admin_c2):
        r = admin_c2.post("/console/keys", data={"csrf": csrf2, "agent_name": "alpha", "context_ids": ""})
        alpha_key = re.search(r'id="new-key" readonly value="([^"]+)"', r.text).group(1)  # type: ignore[union-attr]
    alpha, _ = console_stack.session(alpha_key)
    with closing(alpha):
        assert "acme/gamma" not in alpha.get("/console/sources").text
        assert "gamma.py" not in alpha.get("/console/search?q=gamma_private_function&cross=1").text
    driver = chrome()
    sign_in(driver, console_stack, gamma_key)
    driver.get(console_stack.url + "/console/search?q=planted_console_marker")
    assert not driver.find_elements(By.CSS_SELECTOR, ".hit")
    shot(driver, "14-agent-isolation")


def test_indexed_text_paths_and_names_render_as_text(admin: Any, console_stack: ConsoleStack,
                                                     world: dict[str, Any], shot: Any) -> None:
    add_source(admin, console_stack, "hostile", "h", world["repos"]["hostile"], HOSTILE_NAME)
    wait_job_state(admin, console_stack)
    admin.get(console_stack.url + "/console/sources")
    assert HOSTILE_NAME in admin.find_element(By.TAG_NAME, "table").text  # the name is shown as text
    assert not admin.find_elements(By.CSS_SELECTOR, "table img")
    admin.get(console_stack.url + "/console/search?q=hostile_chunk_marker&agent=hostile")
    hit = wait_until(lambda: admin.find_elements(By.CSS_SELECTOR, ".hit"), 30, "the hostile hit")[0]  # type: ignore[index]
    assert HOSTILE_PATH in hit.find_element(By.CSS_SELECTOR, ".path").text
    code = hit.find_element(By.CSS_SELECTOR, "pre.code").text
    assert "<script>window.__pwned = 1</script>" in code
    assert not admin.find_elements(By.CSS_SELECTOR, "main script, main img, main b")
    assert admin.execute_script("return typeof window.__pwned") == "undefined"
    shot(admin, "15-hostile-escaped")
