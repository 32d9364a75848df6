"""The Helm chart on a real Kubernetes API server (issue 26): what the server accepts, admits and removes.

The cluster is ``scripts/k8s``: kube-apiserver v1.34 (RBAC, the default admission plugins with PodSecurity) on
kine, and kube-controller-manager, so Deployments become ReplicaSets and Pods and Jobs make Pods. There is no
scheduler and no kubelet: Pods are created and admitted, never run (no container image is pulled).

For each value set (the defaults; external services with an existing Secret; ci/all-features-values.yaml),
in a namespace that enforces (and warns on) the ``restricted`` Pod Security Standard:

- server-side dry run: ``helm install --dry-run=server``, then every rendered object, hooks included, sent to the
  server with ``dryRun=All`` and strict field validation; a refusal or a warning (PodSecurity's "would
  violate", an unknown field) fails with the server's words;
- ``helm install --no-hooks``; every Deployment's ReplicaSet creates all its Pods, each admitted by the real
  PodSecurity admission (a refused Pod fails the test with the admission message);
- ``helm upgrade`` with other worker replicas and settings: the ConfigMap checksum in each pod template changes,
  every Deployment rolls to a new ReplicaSet whose Pods are admitted, the replica counts follow the values;
- ``helm rollback`` to revision 1: the first pod templates and replica counts are back;
- ``helm uninstall``: nothing labelled with the release is left in the namespace (the garbage collector
  removes ReplicaSets and Pods), Helm's release records are gone, objects the release did not own remain;
- the ``pre-install,pre-upgrade`` init Job (and its hook Secret) created on the server: the Job controller
  makes its Pod and the Pod is admitted;
- KEDA ScaledObjects and TriggerAuthentications accepted under the CRD schemas the server serves, and that
  schema refusing a malformed ScaledObject.
"""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.kube import Kube, KubeError

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "scopekb"
ALL_FEATURES = CHART / "ci" / "all-features-values.yaml"
RELEASE = "skb"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
#: how long the controllers get to create the Pods of a change (they take well under a second when idle)
SETTLE_S = 120.0
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}


@dataclass
class Case:
    """A value set: helm arguments, the objects an operator creates first, and the values of the upgrade."""

    args: list[str]
    prerequisites: list[dict[str, Any]] = field(default_factory=list)
    upgrade: dict[str, Any] = field(default_factory=dict)
    keda: bool = False


def _secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "stringData": data}


def _all_features_upgrade() -> dict[str, Any]:
    """The all-features workers with the fixed-size pool resized (its pools on KEDA have no replica count)."""
    workers = copy.deepcopy(yaml.safe_load(ALL_FEATURES.read_text())["workers"])
    fixed = [w for w in workers if not w.get("keda", {}).get("enabled", True)]
    assert fixed, "ci/all-features-values.yaml has no worker pool without KEDA to resize"
    for w in fixed:
        w["replicaCount"] = w.get("replicaCount", 1) + 1
    return {"workers": workers, "config": {"SCOPEKB_LOG_LEVEL": "WARNING"}}


EXTERNAL_SECRET = _secret("scopekb-credentials", {
    "SCOPEKB_REDIS__URL": "redis://:pw@redis.data.svc:6379/0", "SCOPEKB_QUERY__ADMIN_TOKEN": "t",
    "redis-password": "pw"})

CASES: dict[str, Case] = {
    "defaults": Case(args=[], upgrade={"workerDefaults": {"replicaCount": 2},
                                       "config": {"SCOPEKB_LOG_LEVEL": "WARNING"}}),
    "external-secret": Case(
        args=["--set", "secrets.existingSecret=scopekb-credentials",
              "--set", "config.SCOPEKB_OPENSEARCH__URL=https://search.example:9200",
              "--set", "config.SCOPEKB_S3__ENDPOINT=s3.example:443", "--set", "config.SCOPEKB_S3__SECURE=true"],
        prerequisites=[EXTERNAL_SECRET],
        upgrade={"workerDefaults": {"replicaCount": 3}, "config": {"SCOPEKB_QUERY__MAX_RESULTS_CAP": "50"}}),
    "all-features": Case(
        args=["-f", str(ALL_FEATURES)],
        prerequisites=[
            EXTERNAL_SECRET,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "scopekb-init"},
             "automountServiceAccountToken": False},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "corporate-ca"},
             "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\n"}},
            # cluster-wide; the Priority admission plugin refuses Pods naming a class that does not exist
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "scopekb-normal"},
             "value": 1000, "globalDefault": False},
        ],
        upgrade=_all_features_upgrade(), keda=True),
}


# ------------------------------------------------------------------------------------------------ helpers


def _helm(helm: str, env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args[:1])} failed (exit {proc.returncode}); the server said:\n"
                    f"{proc.stderr.strip()}", pytrace=False)
    return proc


def _docs(manifest: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest) if d]


def _name(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.fixture
def namespaces(kube: Kube) -> Iterator[list[str]]:
    """Namespaces a test made: deleted after it, passed or failed (the namespace controller empties them)."""
    made: list[str] = []
    yield made
    for ns in made:
        kube.delete("v1", "Namespace", ns)


def _namespace(kube: Kube, case: str, made: list[str]) -> str:
    """A new namespace enforcing (and warning on, for workload objects) the restricted Pod Security Standard."""
    ns = f"{case}-{secrets.token_hex(3)}"
    made.append(ns)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": RESTRICTED}})
    deadline = time.monotonic() + 60  # the service-account controller gives it its "default" ServiceAccount
    while kube.read("v1", "ServiceAccount", "default", ns) is None:
        assert time.monotonic() < deadline, f"namespace {ns} got no default ServiceAccount in 60s"
        time.sleep(0.3)
    return ns


def _prepare(kube: Kube, case: Case, ns: str) -> None:
    for doc in case.prerequisites:
        res = kube.resource(doc["apiVersion"], doc["kind"])
        try:
            kube.create(doc, ns if res.namespaced else None)
        except KubeError as e:
            if e.code != 409 or res.namespaced:  # a cluster-wide object may exist from another case
                raise


def _values_file(tmp_path: Path, name: str, values: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def render_on_server(helm: str, env: dict[str, str], ns: str, args: list[str]) -> tuple[list, list]:
    """``helm install --dry-run=server``: (manifest objects, hook objects) as the server-aware render makes them
    (kubeVersion checked against the real server, lookups answered by it)."""
    proc = _helm(helm, env, "install", RELEASE, str(CHART), "-n", ns, "--dry-run=server", "-o", "json", *args)
    release = json.loads(proc.stdout)
    hooks = [d for h in release.get("hooks", []) for d in _docs(h["manifest"])]
    return _docs(release["manifest"]), hooks


def server_dry_run(kube: Kube, ns: str, docs: list[dict[str, Any]]) -> list[str]:
    """Every object sent with dryRun=All and fieldValidation=Strict: the server's refusals and warnings."""
    problems = []
    for doc in docs:
        try:
            res = kube.resource(doc["apiVersion"], doc["kind"])
            warnings = kube.create(doc, ns if res.namespaced else None, dry_run=True)
        except KubeError as e:
            problems.append(f"{_name(doc)}: refused: {e.message}")
            continue
        problems += [f"{_name(doc)}: warning: {w}" for w in warnings]
    return problems


def _failed_creates(kube: Kube, ns: str, owner_kind: str, owner: str) -> list[str]:
    """FailedCreate events of a controller: the server's refusal of the Pods it tried to create."""
    events = kube.list("v1", "Event", ns)
    return sorted({e["message"] for e in events if e.get("reason") == "FailedCreate"
                   and e["involvedObject"]["kind"] == owner_kind and e["involvedObject"]["name"] == owner})


def pods_admitted(kube: Kube, ns: str, timeout: float = SETTLE_S) -> dict[str, dict[str, Any]]:
    """Wait until every Deployment of the release has rolled out its current pod template to a ReplicaSet
    and that ReplicaSet created all its Pods (i.e. the API server admitted them). Returns Deployment name ->
    {"replicas", "template" (pod template annotations), "replicaset"}; fails with the server's refusal."""
    deadline = time.monotonic() + timeout
    while True:
        pending: list[str] = []
        refused: list[str] = []
        out: dict[str, dict[str, Any]] = {}
        deployments = kube.list("apps/v1", "Deployment", ns, INSTANCE)
        assert deployments, f"the release has no Deployment in {ns}"
        replicasets = kube.list("apps/v1", "ReplicaSet", ns, INSTANCE)
        pods = kube.list("v1", "Pod", ns, INSTANCE)
        for d in deployments:
            name = d["metadata"]["name"]
            revision = d["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision")
            if d.get("status", {}).get("observedGeneration", 0) < d["metadata"]["generation"] or not revision:
                pending.append(f"{name}: not yet seen by the deployment controller")
                continue
            owned = [r for r in replicasets if any(o["uid"] == d["metadata"]["uid"]
                                                  for o in r["metadata"].get("ownerReferences", []))]
            current = [r for r in owned
                       if r["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision") == revision]
            if not current:
                pending.append(f"{name}: no ReplicaSet for revision {revision}")
                continue
            rs = current[0]
            rs_name = rs["metadata"]["name"]
            if rs["spec"]["template"]["metadata"].get("annotations") != \
                    d["spec"]["template"]["metadata"].get("annotations"):
                pending.append(f"{name}: ReplicaSet {rs_name} has another pod template")
                continue
            for cond in rs.get("status", {}).get("conditions", []):
                if cond["type"] == "ReplicaFailure" and cond["status"] == "True":
                    refused.append(f"ReplicaSet {rs_name}: {cond.get('message')}")
            refused += [f"ReplicaSet {rs_name}: {m}" for m in _failed_creates(kube, ns, "ReplicaSet", rs_name)]
            want = rs["spec"].get("replicas", 0)
            have = [p for p in pods if any(o["uid"] == rs["metadata"]["uid"]
                                           for o in p["metadata"].get("ownerReferences", []))]
            if want < 1:
                pending.append(f"{name}: ReplicaSet {rs_name} wants no Pod yet")
            elif len(have) < want:
                pending.append(f"{name}: ReplicaSet {rs_name} has {len(have)} of {want} Pods")
            out[name] = {"replicas": d["spec"].get("replicas"), "replicaset": rs_name,
                         "template": d["spec"]["template"]["metadata"].get("annotations", {})}
        if refused:
            pytest.fail("the API server refused Pods of the release:\n" + "\n".join(sorted(set(refused))),
                        pytrace=False)
        if not pending:
            return out
        if time.monotonic() > deadline:
            pytest.fail(f"not settled after {timeout:.0f}s:\n" + "\n".join(pending), pytrace=False)
        time.sleep(0.5)


def _listable_namespaced(kube: Kube) -> list[tuple[str, str]]:
    kube.forget_discovery()
    return sorted((r.api_version, r.kind) for r in kube.resources().values()
                  if r.namespaced and "list" in r.verbs and r.kind != "Event")


def leftovers(kube: Kube, ns: str) -> list[str]:
    """Every object in `ns` labelled with the release, and Helm's release records (Secrets owner=helm)."""
    out = []
    for api_version, kind in _listable_namespaced(kube):
        out += [f"{kind}/{o['metadata']['name']}" for o in kube.list(api_version, kind, ns, INSTANCE)]
    out += [f"Secret/{s['metadata']['name']} (Helm release record)"
            for s in kube.list("v1", "Secret", ns, f"owner=helm,name={RELEASE}")]
    return sorted(set(out))


def _replicas_in(manifest: list[dict[str, Any]]) -> dict[str, int | None]:
    return {d["metadata"]["name"]: d["spec"].get("replicas") for d in manifest if d["kind"] == "Deployment"}


def _revision_manifest(helm: str, env: dict[str, str], ns: str) -> list[dict[str, Any]]:
    return _docs(_helm(helm, env, "get", "manifest", RELEASE, "-n", ns).stdout)


# -------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case_name", list(CASES))
def test_release_lifecycle(case_name: str, kube: Kube, helm: str, helm_env: dict[str, str], keda_crds: list[str],
                           namespaces: list[str], tmp_path: Path) -> None:
    case = CASES[case_name]
    ns = _namespace(kube, case_name, namespaces)
    _prepare(kube, case, ns)

    # 1. server-side dry run: Helm's own, then every object (hooks too) through validation and admission
    manifest, hooks = render_on_server(helm, helm_env, ns, case.args)
    problems = server_dry_run(kube, ns, manifest + hooks)
    assert not problems, "server-side dry run:\n" + "\n".join(problems)
    kinds = {d["kind"] for d in manifest}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    assert ("ScaledObject" in kinds) == case.keda

    # 2. install (hooks are tested on their own: without a kubelet the init Job never completes)
    _helm(helm, helm_env, "install", RELEASE, str(CHART), "-n", ns, "--no-hooks", *case.args)
    first = pods_admitted(kube, ns)
    assert set(first) == {d["metadata"]["name"] for d in manifest if d["kind"] == "Deployment"}
    installed = {(d["kind"], d["metadata"]["name"]) for d in manifest}
    for kind, name in installed:
        api_version = next(d["apiVersion"] for d in manifest if (d["kind"], d["metadata"]["name"]) == (kind, name))
        assert kube.read(api_version, kind, name, ns) is not None, f"{kind}/{name} was not created"

    # 3. upgrade: other replica counts and settings roll every Deployment
    upgrade_file = _values_file(tmp_path, "upgrade", case.upgrade)
    _helm(helm, helm_env, "upgrade", RELEASE, str(CHART), "-n", ns, "--no-hooks", *case.args, "-f", upgrade_file)
    second = pods_admitted(kube, ns)
    rendered = _replicas_in(_revision_manifest(helm, helm_env, ns))
    for name, state in second.items():
        assert state["template"].get("checksum/config") != first[name]["template"].get("checksum/config"), \
            f"{name}: the settings changed but its pod template's checksum did not (no rollout)"
        assert state["replicaset"] != first[name]["replicaset"], f"{name} did not roll to a new ReplicaSet"
        if rendered[name] is not None:
            assert state["replicas"] == rendered[name], f"{name}: replicas {state['replicas']} != {rendered[name]}"
    resized = [n for n in second if rendered[n] is not None and rendered[n] != _replicas_in(manifest)[n]]
    assert resized, "the upgrade changed no Deployment's replica count"

    # 4. rollback to revision 1: the first pod templates and replica counts again
    _helm(helm, helm_env, "rollback", RELEASE, "1", "-n", ns, "--no-hooks")
    third = pods_admitted(kube, ns)
    fixed = {name: r for name, r in _replicas_in(manifest).items() if r is not None}  # not HPA/KEDA-managed
    for name, state in third.items():
        assert state["template"] == first[name]["template"], f"{name}: pod template not rolled back"
        if name in fixed:
            assert state["replicas"] == fixed[name], f"{name}: replicas {state['replicas']} != {fixed[name]}"
    history = json.loads(_helm(helm, helm_env, "history", RELEASE, "-n", ns, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2, 3]
    assert history[-1]["status"] == "deployed" and "Rollback to 1" in history[-1]["description"]

    # 5. uninstall: nothing of the release is left; what the operator created stays
    _helm(helm, helm_env, "uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s")
    deadline = time.monotonic() + SETTLE_S
    while (left := leftovers(kube, ns)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"left behind by helm uninstall (after {SETTLE_S:.0f}s):\n" + "\n".join(left)
    for doc in case.prerequisites:
        res = kube.resource(doc["apiVersion"], doc["kind"])
        assert kube.read(doc["apiVersion"], doc["kind"], doc["metadata"]["name"],
                         ns if res.namespaced else None) is not None, f"uninstall removed {_name(doc)}"


@pytest.mark.parametrize("case_name", list(CASES))
def test_init_job_is_accepted_and_its_pod_admitted(case_name: str, kube: Kube, helm: str,
                                                  helm_env: dict[str, str], keda_crds: list[str],
                                                  namespaces: list[str]) -> None:
    """The pre-install/pre-upgrade hook objects, created as Helm creates them before the release: the server
    accepts them and the Job controller's Pod passes admission (it never runs: there is no kubelet)."""
    case = CASES[case_name]
    ns = _namespace(kube, case_name, namespaces)
    _prepare(kube, case, ns)
    _, hooks = render_on_server(helm, helm_env, ns, case.args)
    jobs = [h for h in hooks if h["kind"] == "Job"]
    assert len(jobs) == 1, f"expected one init Job hook, got {[_name(h) for h in hooks]}"
    assert jobs[0]["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    warnings = []
    for doc in sorted(hooks, key=lambda d: int(d["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))):
        try:
            warnings += [f"{_name(doc)}: {w}" for w in kube.create(doc, ns)]
        except KubeError as e:
            pytest.fail(f"the server refused the hook {_name(doc)}: {e.message}", pytrace=False)
    job = jobs[0]["metadata"]["name"]
    deadline = time.monotonic() + SETTLE_S
    while True:
        refused = _failed_creates(kube, ns, "Job", job)
        if refused:
            pytest.fail("the API server refused the init Job's Pod:\n" + "\n".join(refused), pytrace=False)
        pods = kube.list("v1", "Pod", ns, f"batch.kubernetes.io/job-name={job}")
        if pods:
            break
        assert time.monotonic() < deadline, f"the Job controller made no Pod for {job} in {SETTLE_S:.0f}s"
        time.sleep(0.5)
    assert not warnings, "the server warned about the hooks:\n" + "\n".join(warnings)
    spec = pods[0]["spec"]
    assert spec["containers"][0]["args"][0] == "init"
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_keda_schema_served_by_the_server_refuses_bad_scaled_objects(kube: Kube, keda_crds: list[str],
                                                                     namespaces: list[str]) -> None:
    """The CRDs are live: a ScaledObject with a wrong type, or an unknown field under strict validation, is
    refused by the server itself (so the all-features release's ScaledObjects were really checked)."""
    ns = _namespace(kube, "keda", namespaces)
    good = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
            "spec": {"scaleTargetRef": {"name": "w"}, "minReplicaCount": 0,
                     "triggers": [{"type": "redis", "metadata": {"listName": "q"}}]}}
    assert kube.create(good, ns, dry_run=True) == []
    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["minReplicaCount"] = "zero"
    with pytest.raises(KubeError) as refused:
        kube.create(wrong_type, ns, dry_run=True)
    assert refused.value.code == 422 and "minReplicaCount" in refused.value.message
    unknown = copy.deepcopy(good)
    unknown["spec"]["maxReplicas"] = 3  # the field is maxReplicaCount
    with pytest.raises(KubeError) as refused:
        kube.create(unknown, ns, dry_run=True)
    assert "maxReplicas" in refused.value.message


def test_a_pod_breaking_restricted_is_refused_by_admission(kube: Kube, helm: str, helm_env: dict[str, str],
                                                         namespaces: list[str]) -> None:
    """The checks above can fail: a container allowed to escalate privileges is reported by the dry run
    (PodSecurity's warning) and its Pods are refused on install, with the admission message."""
    ns = _namespace(kube, "broken", namespaces)
    args = ["--set", "securityContext.allowPrivilegeEscalation=true"]
    manifest, _ = render_on_server(helm, helm_env, ns, args)
    problems = server_dry_run(kube, ns, manifest)
    assert any('would violate PodSecurity "restricted:latest"' in p and "allowPrivilegeEscalation" in p
               for p in problems), problems
    _helm(helm, helm_env, "install", RELEASE, str(CHART), "-n", ns, "--no-hooks", *args)
    with pytest.raises(pytest.fail.Exception) as failed:
        pods_admitted(kube, ns)
    assert 'violates PodSecurity "restricted:latest"' in str(failed.value), str(failed.value)
    assert "allowPrivilegeEscalation != false" in str(failed.value), str(failed.value)
    _helm(helm, helm_env, "uninstall", RELEASE, "-n", ns)
