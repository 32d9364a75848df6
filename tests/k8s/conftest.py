"""Fixtures of the `k8s` tests: a real Kubernetes API server (``scripts/k8s``) and the pinned Helm.

Every test under tests/k8s is marked ``k8s``. The cluster is the one ``scripts/k8s up`` runs (kine +
kube-apiserver + kube-controller-manager, built from Go modules): if it is not running, the session starts it
(a first build takes minutes) and stops it at the end; if that fails, every test fails with the reason.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.k8s.kube import Kube, KubeError

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "scripts" / "k8s"
INSTALL_HELM = REPO / "scripts" / "install-helm"
KEDA_CRDS = sorted((REPO / "tests" / "unit" / "deploy_schemas").glob("keda.sh_*.yaml"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.k8s)


def _k8s(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(K8S), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[Path]:
    """The admin kubeconfig of the scripts/k8s cluster; started (and later stopped) here if it is not up."""
    started = _k8s("status", timeout=60).returncode != 0
    if started:
        try:
            proc = _k8s("up", timeout=3000)  # waits for a build in progress (scripts/test starts one early)
        except subprocess.TimeoutExpired:
            pytest.fail("scripts/k8s up did not finish within 50 minutes", pytrace=False)
        if proc.returncode != 0:
            pytest.fail(f"the Kubernetes API server could not start (scripts/k8s up):\n{proc.stderr[-4000:]}",
                        pytrace=False)
    env = _k8s("env", timeout=60).stdout.strip()
    path = Path(env.split("=", 1)[1].strip("'\""))
    try:
        yield path
    finally:
        if started:
            _k8s("down", timeout=300)


@pytest.fixture(scope="session")
def kube(kubeconfig: Path) -> Kube:
    client = Kube(kubeconfig)
    client.version()
    return client


@pytest.fixture(scope="session")
def helm_env(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for helm: this cluster's kubeconfig, and Helm's own cache/config/data in a temporary folder."""
    home = tmp_path_factory.mktemp("helm")
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), HELM_CACHE_HOME=str(home / "cache"),
               HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"))
    return env


@pytest.fixture(scope="session")
def helm() -> str:
    """The pinned helm binary (scripts/install-helm; instant once installed)."""
    proc = subprocess.run([str(INSTALL_HELM)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        pytest.fail(f"helm is not installed: scripts/install-helm failed: {last}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def keda_crds(kube: Kube) -> list[str]:
    """KEDA's CustomResourceDefinitions (the vendored files in tests/unit/deploy_schemas) created on the server
    and established, so ScaledObjects are validated by the schema the API server itself serves."""
    names = []
    for path in KEDA_CRDS:
        crd = yaml.safe_load(path.read_text())
        names.append(crd["metadata"]["name"])
        try:
            kube.create(crd)
        except KubeError as e:
            if e.code != 409:  # already there from an earlier session on the same cluster
                raise
    deadline = time.monotonic() + 60
    for name in names:
        while True:
            crd = kube.read("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
            conditions = {c["type"]: c["status"] for c in ((crd or {}).get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"CRD {name} not established after 60s: {conditions}"
            time.sleep(0.5)
    kube.forget_discovery()
    return names
