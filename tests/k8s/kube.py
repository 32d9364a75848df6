"""A small client of the Kubernetes REST API for the chart tests (issue 26): only what they need.

It talks to the API server of a kubeconfig (``scripts/k8s env`` prints one) with its bearer token and CA file,
finds resources by API discovery, and returns the server's own refusal messages (``Status.message``) and
``Warning`` headers (PodSecurity's "would violate" notes, unknown-field warnings) unchanged, so a test that
fails shows what the server said.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class KubeError(Exception):
    """The API server refused a request. ``code`` is the HTTP status, ``message`` the server's Status.message."""

    def __init__(self, method: str, path: str, code: int, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {code}: {message}")
        self.code = code
        self.message = message
        self.retry_after = 1.0  # seconds, from a 429's Retry-After header


@dataclass
class Resource:
    """One API resource from discovery: plural name, group/version, namespaced or cluster-wide, verbs."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: list[str] = field(default_factory=list)

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{urllib.parse.quote(namespace)}"
        base += f"/{self.plural}"
        return base + (f"/{urllib.parse.quote(name)}" if name else "")


class Kube:
    """Client of one API server, from a kubeconfig (its current context; token and CA file authentication)."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        ctx_name = config["current-context"]
        ctx = next(c["context"] for c in config["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"].rstrip("/")
        self.token = user["token"]
        self.ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self._resources: dict[tuple[str, str], Resource] | None = None

    # ------------------------------------------------------------------------------------------- transport

    def request(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                timeout: float = 30.0) -> tuple[Any, list[str]]:
        """One request -> (decoded JSON body, Warning header texts). Raises KubeError for any 4xx/5xx. A 429
        (the server asks to come back, e.g. "storage is (re)initializing" just after a CRD is created) is
        retried after its Retry-After, as client-go does, for up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._request_once(method, path, body, params, timeout)
            except KubeError as e:
                if e.code != 429 or time.monotonic() + e.retry_after > deadline:
                    raise
                time.sleep(e.retry_after)

    def _request_once(self, method: str, path: str, body: Any, params: dict[str, str] | None,
                      timeout: float) -> tuple[Any, list[str]]:
        url = self.server + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ssl) as resp:
                raw = resp.read()
                warnings = [_warning_text(w) for w in resp.headers.get_all("Warning") or []]
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("message") or raw.decode(errors="replace")
            except ValueError:
                message = raw.decode(errors="replace")
            error = KubeError(method, path, e.code, message)
            error.retry_after = min(float(e.headers.get("Retry-After") or 1), 5.0)
            raise error from None
        return (json.loads(raw) if raw else None), warnings

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        return self.request("GET", path, params=params)[0]

    def version(self) -> str:
        """The server's gitVersion, e.g. v1.34.2."""
        return self.get("/version")["gitVersion"]

    # ------------------------------------------------------------------------------------------- discovery

    def resources(self) -> dict[tuple[str, str], Resource]:
        """(apiVersion, kind) -> Resource for every top-level resource the server serves (cached; call
        forget_discovery() after creating a CRD)."""
        if self._resources is None:
            out: dict[tuple[str, str], Resource] = {}
            versions = ["v1"] + [v["groupVersion"] for g in self.get("/apis")["groups"] for v in g["versions"]]
            for gv in versions:
                base = "/api/v1" if gv == "v1" else f"/apis/{gv}"
                for r in self.get(base)["resources"]:
                    if "/" in r["name"]:
                        continue  # subresources (status, scale, log, ...)
                    out[(gv, r["kind"])] = Resource(gv, r["kind"], r["name"], r["namespaced"], r.get("verbs", []))
            self._resources = out
        return self._resources

    def forget_discovery(self) -> None:
        self._resources = None

    def resource(self, api_version: str, kind: str) -> Resource:
        try:
            return self.resources()[(api_version, kind)]
        except KeyError:
            self.forget_discovery()
            found = self.resources().get((api_version, kind))
            if found is None:
                raise KubeError("GET", "discovery", 404,
                                f"the server has no resource for {api_version} {kind}") from None
            return found

    # ------------------------------------------------------------------------------------------------ objects

    def create(self, doc: dict[str, Any], namespace: str | None = None, *, dry_run: bool = False) -> list[str]:
        """Create `doc` (in `namespace` when namespaced) with strict field validation: an unknown or duplicate
        field is refused, not dropped. dry_run: the server runs validation and admission, stores nothing.
        Returns the server's warnings; raises KubeError with the server's message when refused."""
        res = self.resource(doc["apiVersion"], doc["kind"])
        params = {"fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
        _, warnings = self.request("POST", res.path(namespace), body=doc, params=params)
        return warnings

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             selector: str | None = None) -> list[dict[str, Any]]:
        res = self.resource(api_version, kind)
        params = {"labelSelector": selector} if selector else None
        return self.get(res.path(namespace), params)["items"]

    def read(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.get(self.resource(api_version, kind).path(namespace, name))
        except KubeError as e:
            if e.code == 404:
                return None
            raise

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete with background propagation (the garbage collector removes owned objects); absent is fine."""
        try:
            self.request("DELETE", self.resource(api_version, kind).path(namespace, name),
                         body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
        except KubeError as e:
            if e.code != 404:
                raise


def _warning_text(header: str) -> str:
    """A Warning header (RFC 7234: `299 - "text"`) -> its text."""
    parts = header.split(" ", 2)
    text = parts[2] if len(parts) == 3 else header
    return text.strip().strip('"').replace('\\"', '"')
