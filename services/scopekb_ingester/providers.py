"""Per-provider webhook verification and payload parsing: GitHub, GitLab, Gitea/Forgejo, Bitbucket Cloud.

Pure functions over headers and raw bytes (no I/O), written from each provider's documented formats:

- GitHub: ``X-GitHub-Event``, ``X-GitHub-Delivery``, ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256>``; JSON or
  form-encoded (``payload=``) bodies; events ``push`` and ``ping``.
- GitLab: ``X-Gitlab-Event`` (``Push Hook`` / ``Tag Push Hook``), ``X-Gitlab-Event-UUID``, ``X-Gitlab-Token`` (the
  shared secret itself, compared in constant time).
- Gitea / Forgejo: ``X-Gitea-Event`` / ``X-Forgejo-Event``, ``X-Gitea-Delivery`` / ``X-Forgejo-Delivery``,
  ``X-Gitea-Signature`` / ``X-Forgejo-Signature`` (bare hex HMAC-SHA256); GitHub-shaped push payloads.
- Bitbucket Cloud: ``X-Event-Key: repo:push``, ``X-Request-UUID``, ``X-Hub-Signature: sha256=<hex>``; one push
  carries a ``push.changes`` list, one entry per updated ref.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from scopekb.models import ZERO_SHA


class BadRequest(ValueError):
    """Malformed webhook (HTTP 400); the message is safe to return."""


@dataclass(frozen=True)
class PushEvent:
    """One updated ref. ``ref`` is the full ref (``refs/heads/main``); shas are 40-hex or zeros."""

    ref: str
    before: str
    after: str

    @property
    def branch(self) -> str | None:
        """Branch name for ``refs/heads/*`` refs, None for tags and others."""
        return self.ref.removeprefix("refs/heads/") if self.ref.startswith("refs/heads/") else None

    @property
    def deleted(self) -> bool:
        return self.after == ZERO_SHA


@dataclass(frozen=True)
class Repository:
    """How a payload names its repository: clone/web URLs and the host's full name (``owner/repo``)."""

    urls: tuple[str, ...]
    full_name: str | None


@dataclass(frozen=True)
class Parsed:
    """A decoded delivery: ``kind`` is ``push``, ``ping`` or ``ignored`` (an event we acknowledge and skip)."""

    kind: str
    repository: Repository
    pushes: tuple[PushEvent, ...] = ()


def hmac_hex(secret: str, body: bytes) -> str:
    """Hex HMAC-SHA256 of ``body`` under ``secret``."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def github_signature(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends: ``sha256=`` + hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac_hex(secret, body)


def _any_equal(candidates: list[str], given: str) -> bool:
    ok = False
    for c in candidates:  # no early exit: the time taken does not depend on which secret matched
        ok |= hmac.compare_digest(c.encode("utf-8"), given.encode("utf-8", "replace"))
    return ok


def verify_github(secrets: list[str], body: bytes, header: str | None) -> bool:
    """True when ``header`` is a valid ``sha256=`` signature of ``body`` under any of ``secrets``."""
    if not header or not header.startswith("sha256="):
        return False
    return _any_equal([github_signature(s, body) for s in secrets], header)


def verify_hex(secrets: list[str], body: bytes, header: str | None) -> bool:
    """Gitea/Forgejo: ``header`` is the bare hex HMAC-SHA256 of ``body`` under any of ``secrets``."""
    if not header:
        return False
    return _any_equal([hmac_hex(s, body) for s in secrets], header.strip().lower())


def verify_token(secrets: list[str], _body: bytes, header: str | None) -> bool:
    """GitLab: ``header`` equals one of ``secrets`` (constant-time)."""
    if not header:
        return False
    return _any_equal(secrets, header)


def decode_body(body: bytes, content_type: str | None) -> dict[str, Any]:
    """Decode a webhook body: JSON, or form-encoded with the JSON in ``payload=`` (GitHub's form option).

    Raises:
        BadRequest: not decodable, or not a JSON object.
    """
    ctype = (content_type or "").split(";")[0].strip().lower()
    try:
        if ctype == "application/x-www-form-urlencoded":
            form = parse_qs(body.decode("utf-8"), strict_parsing=False)
            if "payload" not in form:
                raise BadRequest("form body has no payload field")
            data = json.loads(form["payload"][0])
        else:
            data = json.loads(body)
    except BadRequest:
        raise
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return data


parse_github_body = decode_body


def _sha(v: Any, name: str) -> str:
    if not isinstance(v, str) or len(v) != 40 or any(c not in "0123456789abcdef" for c in v):
        raise BadRequest(f"push payload needs '{name}' as a 40-hex commit id")
    return v


def _ref(v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("refs/"):
        raise BadRequest("push payload needs a string 'ref' starting with refs/")
    return v


def _strs(obj: Mapping[str, Any], *keys: str) -> tuple[str, ...]:
    return tuple(str(obj[k]) for k in keys if isinstance(obj.get(k), str))


def _obj(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = data.get(key)
    if not isinstance(v, dict):
        raise BadRequest(f"payload has no {key} object")
    return v


def github_repository(data: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
    """Clone URLs and ``full_name`` of a GitHub-shaped payload's repository.

    Raises:
        BadRequest: no ``repository`` object.
    """
    repo = _obj(data, "repository")
    name = repo.get("full_name") if isinstance(repo.get("full_name"), str) else None
    return _strs(repo, "clone_url", "ssh_url", "html_url", "git_url", "url"), name


def parse_github_push(data: dict[str, Any]) -> PushEvent:
    """A push event from a decoded GitHub-shaped payload (GitHub, Gitea, Forgejo).

    Raises:
        BadRequest: ``ref``, ``before`` or ``after`` missing or of the wrong type/shape.
    """
    return PushEvent(ref=_ref(data.get("ref")), before=_sha(data.get("before"), "before"),
                     after=_sha(data.get("after"), "after"))


def parse_github(event: str, data: dict[str, Any]) -> Parsed:
    """GitHub (and Gitea/Forgejo, same payload shape) ``push`` / ``ping``; other events are 400."""
    urls, name = github_repository(data)
    repo = Repository(urls, name)
    if event == "ping":
        return Parsed("ping", repo)
    if event == "push":
        return Parsed("push", repo, (parse_github_push(data),))
    if event in ("create", "delete"):  # Gitea also sends these next to the push; the push is enough
        return Parsed("ignored", repo)
    raise BadRequest(f"unsupported event {event!r}")


def parse_gitlab(event: str, data: dict[str, Any]) -> Parsed:
    """GitLab ``Push Hook`` and ``Tag Push Hook``; other events are 400."""
    project = data.get("project") if isinstance(data.get("project"), dict) else {}
    repository = data.get("repository") if isinstance(data.get("repository"), dict) else {}
    if not project and not repository:
        raise BadRequest("payload has no project or repository object")
    urls = _strs(project, "git_http_url", "git_ssh_url", "web_url", "http_url", "ssh_url") + \
        _strs(repository, "git_http_url", "git_ssh_url", "homepage", "url")
    name = project.get("path_with_namespace") if isinstance(project.get("path_with_namespace"), str) else None
    repo = Repository(urls, name)
    if event not in ("Push Hook", "Tag Push Hook", "System Hook"):
        raise BadRequest(f"unsupported event {event!r}")
    return Parsed("push", repo, (PushEvent(ref=_ref(data.get("ref")), before=_sha(data.get("before"), "before"),
                                           after=_sha(data.get("after"), "after")),))


def parse_bitbucket(event: str, data: dict[str, Any]) -> Parsed:
    """Bitbucket Cloud ``repo:push``: one :class:`PushEvent` per entry of ``push.changes``.

    A branch deletion has ``new: null``; a creation ``old: null``. Bitbucket sends short or full hashes; full
    40-hex hashes are required here (Bitbucket Cloud's ``target.hash`` is the full id).
    """
    repo_obj = _obj(data, "repository")
    links = repo_obj.get("links") if isinstance(repo_obj.get("links"), dict) else {}
    urls: list[str] = []
    html = links.get("html") if isinstance(links, dict) else None
    if isinstance(html, dict) and isinstance(html.get("href"), str):
        urls.append(html["href"])
    for c in links.get("clone", []) if isinstance(links.get("clone"), list) else []:
        if isinstance(c, dict) and isinstance(c.get("href"), str):
            urls.append(c["href"])
    name = repo_obj.get("full_name") if isinstance(repo_obj.get("full_name"), str) else None
    repo = Repository(tuple(urls), name)
    if event == "diagnostics:ping":
        return Parsed("ping", repo)
    if event != "repo:push":
        raise BadRequest(f"unsupported event {event!r}")
    push = _obj(data, "push")
    changes = push.get("changes")
    if not isinstance(changes, list):
        raise BadRequest("push has no changes list")
    out = []
    for ch in changes:
        if not isinstance(ch, dict):
            raise BadRequest("push change must be an object")
        new, old = ch.get("new"), ch.get("old")
        ref_of = new if isinstance(new, dict) else old
        if not isinstance(ref_of, dict) or not isinstance(ref_of.get("name"), str):
            raise BadRequest("push change has neither new nor old ref")
        prefix = "refs/heads/" if ref_of.get("type") == "branch" else "refs/tags/"

        def target(side: Any, label: str) -> str:
            if not isinstance(side, dict):
                return ZERO_SHA
            t = side.get("target")
            return _sha(t.get("hash") if isinstance(t, dict) else None, label)

        out.append(PushEvent(ref=prefix + ref_of["name"], before=target(old, "old.target.hash"),
                             after=target(new, "new.target.hash")))
    return Parsed("push", repo, tuple(out))


@dataclass(frozen=True)
class Provider:
    """How one git host signs and names its deliveries."""

    name: str
    event_headers: tuple[str, ...]
    delivery_headers: tuple[str, ...]
    signature_headers: tuple[str, ...]
    verify: Callable[[list[str], bytes, str | None], bool]
    parse: Callable[[str, dict[str, Any]], Parsed]

    def header(self, headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
        for n in names:
            v = headers.get(n)
            if v:
                return v
        return None


PROVIDERS: dict[str, Provider] = {
    "github": Provider("github", ("x-github-event",), ("x-github-delivery",), ("x-hub-signature-256",),
                       verify_github, parse_github),
    "gitlab": Provider("gitlab", ("x-gitlab-event",), ("x-gitlab-event-uuid", "x-gitlab-webhook-uuid"),
                       ("x-gitlab-token",), verify_token, parse_gitlab),
    "gitea": Provider("gitea", ("x-gitea-event", "x-forgejo-event", "x-gogs-event"),
                      ("x-gitea-delivery", "x-forgejo-delivery", "x-gogs-delivery"),
                      ("x-gitea-signature", "x-forgejo-signature"), verify_hex, parse_github),
    "bitbucket": Provider("bitbucket", ("x-event-key",), ("x-request-uuid", "x-hook-uuid"),
                          ("x-hub-signature",), verify_github, parse_bitbucket),
}
PROVIDERS["forgejo"] = PROVIDERS["gitea"]
