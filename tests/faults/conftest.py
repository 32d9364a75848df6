"""Fault suite (issue 12): real scopekb processes on a private set of real services, faults injected there.

Every test under ``tests/faults`` carries the ``faults`` marker (``pytest -m faults`` runs only these,
``-m "not faults"`` skips them). The session starts its own Redis, OpenSearch and S3 through ``scripts/services``
in a temporary state folder on free ports (the shared default instance other test runs use is never touched)
and stops them at the end. Each scenario prints what it injected and what it checked.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .harness import Stack
from .services import PrivateServices

FAULTS_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: fault injection on a private set of real services (tests/faults)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if FAULTS_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.faults)


def _running(services: PrivateServices, what: str) -> Iterator[PrivateServices]:
    """Start ``services``, yield them, stop them (by pid file) at the end unless ``SCOPEKB_FAULTS_KEEP_SERVICES=1``."""
    t0 = time.monotonic()
    try:
        services.up()
        print(f"\n[faults] {what} up in {time.monotonic() - t0:.1f}s: redis {services.redis_url}, "
              f"opensearch {services.opensearch_urls}, state {services.state}")
        yield services
    finally:
        if os.environ.get("SCOPEKB_FAULTS_KEEP_SERVICES") != "1":
            services.down()


def _stacks(services: PrivateServices, tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """A ``make(name, **settings)`` factory of scenario stacks on ``services``, all closed afterwards."""
    stacks: list[Stack] = []

    def make(name: str, **settings: str) -> Stack:
        stack = Stack(services, name, tmp_path / name, settings=dict(settings))
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


@pytest.fixture(scope="session")
def private_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateServices]:
    """Redis, OpenSearch and S3 of this session only; stopped (by pid file) at the end, whatever happened.

    For quicker iterations while developing, ``SCOPEKB_FAULTS_SERVICES_DIR`` names a state folder to reuse and
    ``SCOPEKB_FAULTS_KEEP_SERVICES=1`` leaves its services running afterwards.
    """
    state = Path(os.environ.get("SCOPEKB_FAULTS_SERVICES_DIR") or tmp_path_factory.mktemp("faults-services"))
    yield from _running(PrivateServices(state), "private services")


@pytest.fixture(scope="session")
def private_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateServices]:
    """Redis, S3 and a 3-node OpenSearch cluster (small heaps: 256-512 MiB a node) of this session only.

    Started on first use (the cluster scenarios), stopped at the end. ``SCOPEKB_FAULTS_CLUSTER_DIR`` names a state
    folder to reuse; ``SCOPEKB_FAULTS_KEEP_SERVICES=1`` leaves it running.
    """
    state = Path(os.environ.get("SCOPEKB_FAULTS_CLUSTER_DIR") or tmp_path_factory.mktemp("faults-cluster"))
    yield from _running(PrivateServices(state, java_opts="-Xms256m -Xmx512m", opensearch_nodes=3),
                        "private 3-node cluster")


@pytest.fixture()
def make_stack(private_services: PrivateServices, tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """``make_stack(name, **settings)``: a scenario's processes (closed at the end of the test)."""
    yield from _stacks(private_services, tmp_path)


@pytest.fixture()
def make_cluster_stack(private_cluster: PrivateServices, tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """``make_cluster_stack(name, **settings)``: a scenario's processes on the 3-node cluster."""
    yield from _stacks(private_cluster, tmp_path)


@pytest.fixture()
def report(capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> Callable[..., None]:
    """``report(what, **counts)``: one line in the test output (not captured) saying what was injected or
    checked, e.g. ``report("injected", fault="SIGKILL worker", chunks_before=123)``."""
    name = request.node.name

    def emit(what: str, **values: object) -> None:
        text = " ".join(f"{k}={v}" for k, v in values.items())
        with capsys.disabled():
            print(f"\n[faults] {name}: {what}: {text}", flush=True)

    return emit
