"""Endpoints and clients of the real backing services for integration tests.

Where the services come from, in order:

1. The project settings in the environment (``SCOPEKB_OPENSEARCH__URL``, ``SCOPEKB_REDIS__URL``,
   ``SCOPEKB_S3__ENDPOINT``/``ACCESS_KEY``/``SECRET_KEY``/``SECURE``/``BUCKET``), as printed by
   ``scripts/services env`` after ``scripts/services up`` (see scripts/README.md).
2. If none of them is set and a Docker engine answers: testcontainers (OpenSearch, Redis, and SeaweedFS for
   S3 - never an AGPL-licensed S3 image).
3. Otherwise the tests fail with one line naming the commands to run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

# Property tests assert behaviour, never speed: on 2 shared cores under load, input generation and single examples
# can be slow (a landing failed on HealthCheck.too_slow: "only generated 2 valid inputs after 1.37 seconds"). A
# test's own @settings still overrides these.
hypothesis_settings.register_profile("scopekb", suppress_health_check=[HealthCheck.too_slow], deadline=None)
hypothesis_settings.load_profile("scopekb")

ENV_OPENSEARCH = "SCOPEKB_OPENSEARCH__URL"
ENV_REDIS = "SCOPEKB_REDIS__URL"
ENV_S3 = {
    "endpoint": "SCOPEKB_S3__ENDPOINT",
    "access_key": "SCOPEKB_S3__ACCESS_KEY",
    "secret_key": "SCOPEKB_S3__SECRET_KEY",
    "secure": "SCOPEKB_S3__SECURE",
    "bucket": "SCOPEKB_S3__BUCKET",
}
ALL_ENV = (ENV_OPENSEARCH, ENV_REDIS, *ENV_S3.values())

HOW_TO_START = (
    'start them with `scripts/services up && eval "$(scripts/services env)"` '
    "(or start a Docker engine for testcontainers), then run pytest again"
)

# Images for the Docker path only (not used on machines without a Docker engine).
OPENSEARCH_IMAGE = os.environ.get("SCOPEKB_TEST_OPENSEARCH_IMAGE", "opensearchproject/opensearch:2.19.1")
REDIS_IMAGE = os.environ.get("SCOPEKB_TEST_REDIS_IMAGE", "redis:7.0")
SEAWEEDFS_IMAGE = os.environ.get("SCOPEKB_TEST_SEAWEEDFS_IMAGE", "chrislusf/seaweedfs:4.48")

# ---- skip policy (issue 18): with SCOPEKB_ALLOWED_SKIPS set (.ci/run), a skip not on the list fails the run -----

_SKIPPED: list[tuple[str, str]] = []  # (node id, skip message) of this session
_ALLOWED_KEY = pytest.StashKey[list | None]()  # the parsed allow-list, None when not checking


def _skip_message(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


_PYTEST_PID = os.getpid()


def _terminated(signum: int, _frame: object) -> None:
    """pytest's own process: SIGTERM as an interrupt (fixtures tear down). A child forked by a test inherits this
    handler; there SIGTERM keeps its default effect, so a test that terminates its child sees it end by signal."""
    if os.getpid() != _PYTEST_PID:
        import signal

        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    import signal
    import threading

    from tests import skips

    # README newcomer (stop 43): a SIGTERM (`kill -- -PGID` of scripts/test, its EXIT trap) ended pytest without
    # fixture teardown, leaving the fault suite's private Redis, OpenSearch nodes, S3 and workers running. As an
    # interrupt, pytest finishes the session and every fixture's teardown stops what it started.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)

    path = os.environ.get(skips.ENV)
    config.stash[_ALLOWED_KEY] = None
    if path:
        try:
            config.stash[_ALLOWED_KEY] = skips.load(Path(str(config.rootpath)) / path)
        except (OSError, ValueError) as e:
            raise pytest.UsageError(f"{skips.ENV}: {e}") from None


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        _SKIPPED.append((report.nodeid, _skip_message(report)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append((report.nodeid, _skip_message(report)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests import skips

    allowed = session.config.stash.get(_ALLOWED_KEY, None)
    if allowed is not None and skips.unexpected(_SKIPPED, allowed) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    from tests import skips

    allowed = config.stash.get(_ALLOWED_KEY, None)
    tr = terminalreporter
    if allowed is None:
        if _SKIPPED:
            tr.write_line(f"skipped tests: {len(_SKIPPED)} (no allow-list checked; .ci/run sets {skips.ENV})")
        return
    bad = skips.unexpected(_SKIPPED, allowed)
    tr.write_line(f"skipped tests: {len(_SKIPPED)} ({len(_SKIPPED) - len(bad)} on the allow-list "
                  f"{os.environ.get(skips.ENV)}, {len(bad)} not)")
    for nid, msg in bad:
        tr.write_line(f"SKIP NOT ALLOWED: {nid}: {msg}", red=True)
    if bad:
        tr.write_line(f"a skip in CI is a failure: make the test run, or add '<node id pattern> | <reason>' to "
                      f"{os.environ.get(skips.ENV)}", red=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under a tests/integration folder is an integration test (`-m "not integration"` skips
    them). Decided by path, not by this file's location, so the hook is right wherever it is loaded from."""
    root = Path(str(config.rootpath)).resolve()
    for item in items:
        try:
            parts = Path(str(item.path)).resolve().relative_to(root).parts
        except ValueError:
            parts = Path(str(item.path)).parts
        if "integration" in parts[:-1]:
            item.add_marker(pytest.mark.integration)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _first_error(call) -> str | None:
    """Run `call`; return a one-line description of its exception, or None (fail outside `except`, so the
    failure stays one line instead of a chain of tracebacks)."""
    try:
        call()
    except Exception as e:
        text = str(e).splitlines()[0] if str(e) else ""
        return f"{type(e).__name__}: {text[:120]}"
    return None


def _docker_answers() -> bool:
    try:
        import docker  # optional dependency

        docker.from_env().ping()
        return True
    except Exception:
        return False


def _endpoints_from_env() -> dict | None:
    if not any(os.environ.get(k) for k in ALL_ENV):
        return None
    missing = [k for k in (ENV_OPENSEARCH, ENV_REDIS, ENV_S3["endpoint"], ENV_S3["access_key"],
                           ENV_S3["secret_key"]) if not os.environ.get(k)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not set: {HOW_TO_START}", pytrace=False)
    return {
        "opensearch_url": os.environ[ENV_OPENSEARCH],
        "redis_url": os.environ[ENV_REDIS],
        "s3": {
            "endpoint": os.environ[ENV_S3["endpoint"]],
            "access_key": os.environ[ENV_S3["access_key"]],
            "secret_key": os.environ[ENV_S3["secret_key"]],
            "secure": _truthy(os.environ.get(ENV_S3["secure"])),
            "bucket": os.environ.get(ENV_S3["bucket"]) or "scopekb",
        },
    }


@contextlib.contextmanager
def _endpoints_from_testcontainers() -> Iterator[dict]:  # pragma: no cover - needs a Docker engine
    import time
    import urllib.request

    from testcontainers.core.container import DockerContainer
    from testcontainers.opensearch import OpenSearchContainer
    from testcontainers.redis import RedisContainer

    access_key, secret_key = "scopekb-test", "scopekb-test-secret"
    with contextlib.ExitStack() as stack:
        opensearch = stack.enter_context(OpenSearchContainer(image=OPENSEARCH_IMAGE, security_enabled=False))
        redis = stack.enter_context(RedisContainer(image=REDIS_IMAGE))
        seaweed = stack.enter_context(
            DockerContainer(SEAWEEDFS_IMAGE)
            .with_command("server -s3 -s3.port=8333 -dir=/data")
            .with_env("AWS_ACCESS_KEY_ID", access_key)
            .with_env("AWS_SECRET_ACCESS_KEY", secret_key)
            .with_exposed_ports(8333)
        )
        s3_host = f"{seaweed.get_container_host_ip()}:{seaweed.get_exposed_port(8333)}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://{s3_host}/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        os_cfg = opensearch.get_config()
        yield {
            "opensearch_url": f"http://{os_cfg['host']}:{os_cfg['port']}",
            "redis_url": f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/0",
            "s3": {"endpoint": s3_host, "access_key": access_key, "secret_key": secret_key,
                   "secure": False, "bucket": "scopekb"},
        }


@contextlib.contextmanager
def _removing_new_buckets(s3: dict) -> Iterator[None]:
    """Remove, when the session ends, the S3 buckets it created (all but ``s3["bucket"]``), contents included.

    SeaweedFS keeps each bucket in a collection of its own, with at least one volume, and a server has a bounded
    number of volumes: a CI run once failed halfway when ``make_bucket`` answered 500 because the buckets of
    earlier test modules held them all. Buckets that existed before the session are never touched. Best effort:
    an S3 server that is down or refuses leaves the buckets (and the tests' own results) as they are.
    """
    from minio import Minio

    client = Minio(s3["endpoint"], access_key=s3["access_key"], secret_key=s3["secret_key"], secure=s3["secure"])
    try:
        before = {b.name for b in client.list_buckets()}
    except Exception:  # noqa: BLE001 - S3 down: the tests that need it say so themselves
        before = None
    yield
    if before is None:
        return
    with contextlib.suppress(Exception):
        for bucket in client.list_buckets():
            if bucket.name in before or bucket.name == s3["bucket"]:
                continue
            with contextlib.suppress(Exception):  # SeaweedFS deletes a non-empty bucket; others may refuse
                client.remove_bucket(bucket.name)


@pytest.fixture(scope="session")
def _service_endpoints() -> Iterator[dict]:
    from_env = _endpoints_from_env()
    if from_env is not None:
        with _removing_new_buckets(from_env["s3"]):
            yield from_env
    elif _docker_answers():
        with _endpoints_from_testcontainers() as endpoints:
            yield endpoints
    else:
        pytest.fail(f"no services configured (SCOPEKB_* unset) and no Docker engine: {HOW_TO_START}",
                    pytrace=False)


@pytest.fixture(scope="session")
def opensearch_url(_service_endpoints: dict) -> str:
    return _service_endpoints["opensearch_url"]


@pytest.fixture(scope="session")
def redis_url(_service_endpoints: dict) -> str:
    return _service_endpoints["redis_url"]


@pytest.fixture(scope="session")
def s3_config(_service_endpoints: dict) -> dict:
    """{"endpoint": "host:port", "access_key", "secret_key", "secure": bool, "bucket"}."""
    return dict(_service_endpoints["s3"])


@pytest.fixture(scope="session")
def opensearch_client(opensearch_url: str):
    from opensearchpy import OpenSearch

    client = OpenSearch(hosts=opensearch_url.split(","), timeout=60)  # a cluster: every node, comma-separated
    error = _first_error(lambda: client.cluster.health(wait_for_status="yellow", request_timeout=40))
    if error:
        pytest.fail(f"OpenSearch at {opensearch_url} is not usable ({error}): {HOW_TO_START}", pytrace=False)
    yield client
    client.close()


@pytest.fixture(scope="session")
def s3_client(s3_config: dict):
    from minio import Minio

    client = Minio(s3_config["endpoint"], access_key=s3_config["access_key"],
                   secret_key=s3_config["secret_key"], secure=s3_config["secure"])
    error = _first_error(client.list_buckets)
    if error:
        pytest.fail(f"S3 at {s3_config['endpoint']} is not usable ({error}): {HOW_TO_START}", pytrace=False)
    return client


@pytest.fixture(scope="session")
def redis_client(redis_url: str):
    import redis

    client = redis.Redis.from_url(redis_url)
    error = _first_error(client.ping)
    if error:
        pytest.fail(f"Redis at {urlsplit(redis_url).netloc} is not usable ({error}): {HOW_TO_START}",
                    pytrace=False)
    yield client
    client.close()
