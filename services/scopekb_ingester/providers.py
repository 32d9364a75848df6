"""Per-provider webhook verification and payload parsing: GitHub, GitLab, Gitea/Forgejo, Bitbucket Cloud.

Pure functions over headers and raw bytes (no I/O), written from each provider's documented formats:

- GitHub: ``X-GitHub-Event``, ``X-GitHub-Delivery``, ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256>``; JSON or
  form-encoded (``payload=``) bodies; events ``push`` and ``ping`` (sent when a hook is created; an organisation
  hook's ping has an ``organization`` and no ``repository``).
- GitLab: ``X-Gitlab-Event`` (``Push Hook`` / ``Tag Push Hook``), ``X-Gitlab-Event-UUID``, ``X-Gitlab-Token`` (the
  shared secret itself, compared in constant time).
- Gitea / Forgejo: ``X-Gitea-Event`` / ``X-Forgejo-Event``, ``X-Gitea-Delivery`` / ``X-Forgejo-Delivery``,
  ``X-Gitea-Signature`` / ``X-Forgejo-Signature`` (bare hex HMAC-SHA256); GitHub-shaped push payloads.
- Bitbucket Cloud: ``X-Event-Key: repo:push``, ``X-Request-UUID``, ``X-Hub-Signature: sha256=<hex>``; one push
  carries a ``push.changes`` list, one entry per updated ref; ``diagnostics:ping`` tests a hook.

Every other event a hook may be set to send (pull requests, issues, releases, GitLab ``Issue Hook``, Bitbucket
``pullrequest:created``...) parses as ``ignored`` with a reason, and each host's test event (GitHub/Gitea
``ping``, GitLab ``Test Hook``, Bitbucket ``diagnostics:ping``) as ``ping``, so the host shows the hook healthy;
only malformed bodies raise :class:`BadRequest`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from scopekb.http.jsonlimits import JsonTooDeep, loads_bounded
from scopekb.http.unicode import LONE_SURROGATE, lone_surrogate_at
from scopekb.models import ZERO_SHA
from scopekb.render import one_line


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


NO_REPOSITORY = Repository((), None)


@dataclass(frozen=True)
class Parsed:
    """A decoded delivery: ``kind`` is ``push``, ``ping`` or ``ignored`` (an event we acknowledge and skip).

    Attributes:
        repository: the payload's repository (:data:`NO_REPOSITORY` for organisation- or group-level events).
        reason: why an ``ignored`` event is not acted on (safe to return).
        hook: for a ``ping``, the hook as the payload names it (``Repository hook 109948940``), validated.
        owner: the organisation, group or workspace the event belongs to, when the payload names one.
    """

    kind: str
    repository: Repository
    pushes: tuple[PushEvent, ...] = ()
    reason: str | None = None
    hook: str | None = None
    owner: str | None = None


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
        BadRequest: not decodable, nested deeper than ``http.json_max_depth`` (64), not a JSON object, or a string
            in it holds a lone UTF-16 surrogate.
    """
    ctype = (content_type or "").split(";")[0].strip().lower()
    form_body = ctype == "application/x-www-form-urlencoded"
    try:
        if form_body:
            form = parse_qs(body.decode("utf-8"), strict_parsing=False, errors="strict")
            if "payload" not in form:
                raise BadRequest("form body has no payload field")
            data = loads_bounded(form["payload"][0])
        else:
            data = loads_bounded(body)  # nesting checked first: never a RecursionError (issue 16)
    except BadRequest:
        raise
    except JsonTooDeep as e:
        raise BadRequest(str(e)) from None
    except UnicodeDecodeError:
        raise BadRequest("body is not valid UTF-8") from None
    except ValueError:
        raise BadRequest("form field 'payload' is not valid JSON" if form_body else "body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    where = lone_surrogate_at(data)
    if where:  # e.g. "\\ud800" in a form-encoded payload: not valid Unicode, unusable as a name or ref
        raise BadRequest(f"{where}: {LONE_SURROGATE}")
    return data


parse_github_body = decode_body


_SHA = re.compile("[0-9a-f]{40}")


def _sha(v: Any, name: str) -> str:
    if not isinstance(v, str) or not _SHA.fullmatch(v):
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


def _opt_obj(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """``data[key]`` when it is an object, None when absent or null; another type is malformed."""
    v = data.get(key)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise BadRequest(f"payload's {key} must be an object")
    return v


#: Names, logins and hook types echoed back must look like one (letters, digits, ``._-/``; bounded length).
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


def _name(v: Any) -> str | None:
    return v if isinstance(v, str) and _NAME_RE.match(v) else None


def _unused(host: str, event: str, acted_on: str) -> str:
    """The reason an event is acknowledged and skipped; the event name is bounded and shown escaped."""
    return f"{host} event '{one_line(event, 60)}' is not used: scopekb syncs on {acted_on}"


def _github_owner(data: Mapping[str, Any], repo: Mapping[str, Any] | None) -> str | None:
    org = data.get("organization")
    if isinstance(org, dict) and _name(org.get("login")):
        return org["login"]
    owner = repo.get("owner") if repo else None
    if isinstance(owner, dict):
        return _name(owner.get("login")) or _name(owner.get("username"))
    return None


def _hook_name(data: Mapping[str, Any]) -> str | None:
    """``<type> hook <id>`` from a GitHub-shaped ping (``hook_id``, ``hook.type``), from validated values only."""
    hook = data.get("hook") if isinstance(data.get("hook"), dict) else {}
    hid = data.get("hook_id", hook.get("id"))
    if isinstance(hid, bool) or not isinstance(hid, int):
        hid = None
    kind = hook.get("type") if isinstance(hook.get("type"), str) and re.fullmatch(r"[A-Za-z]{1,30}",
                                                                                  hook["type"]) else None
    if hid is None and kind is None:
        return None
    return " ".join(x for x in (kind, "hook", None if hid is None else str(hid)) if x)


def github_repository(data: dict[str, Any], required: bool = True) -> tuple[tuple[str, ...], str | None]:
    """Clone URLs and ``full_name`` of a GitHub-shaped payload's repository (none when not ``required`` and the
    payload has no repository, as an organisation hook's events).

    Raises:
        BadRequest: no ``repository`` object where one is required, or one that is not an object.
    """
    repo = _obj(data, "repository") if required else _opt_obj(data, "repository")
    if repo is None:
        return (), None
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
    """GitHub (and Gitea/Forgejo, same payload shape): ``push``; ``ping`` naming its hook; every other event
    ``ignored`` with a reason (Gitea's ``create``/``delete`` come next to the push, which is enough).

    Raises:
        BadRequest: a push without a well-formed repository, ref or commit ids; a repository that is not an
            object.
    """
    urls, name = github_repository(data, required=event == "push")
    repo = Repository(urls, name)
    owner = _github_owner(data, _opt_obj(data, "repository"))
    if event == "ping":
        return Parsed("ping", repo, hook=_hook_name(data), owner=owner)
    if event == "push":
        return Parsed("push", repo, (parse_github_push(data),), owner=owner)
    return Parsed("ignored", repo, reason=_unused("the", event, "push events"), owner=owner)


#: GitLab events carrying a push (``X-Gitlab-Event``); a ``System Hook`` is a push when its ``event_name`` is.
GITLAB_PUSH_EVENTS = ("Push Hook", "Tag Push Hook")
GITLAB_TEST_EVENTS = ("Test Hook",)


def parse_gitlab(event: str, data: dict[str, Any]) -> Parsed:
    """GitLab ``Push Hook``, ``Tag Push Hook`` and push/tag_push ``System Hook``; ``Test Hook`` as a ping; every
    other event (``Issue Hook``, ``Merge Request Hook``, group hooks without a project...) ``ignored``.

    Raises:
        BadRequest: a push without a project/repository object, ref or commit ids.
    """
    project = data.get("project") if isinstance(data.get("project"), dict) else {}
    repository = data.get("repository") if isinstance(data.get("repository"), dict) else {}
    urls = _strs(project, "git_http_url", "git_ssh_url", "web_url", "http_url", "ssh_url") + \
        _strs(repository, "git_http_url", "git_ssh_url", "homepage", "url")
    name = project.get("path_with_namespace") if isinstance(project.get("path_with_namespace"), str) else None
    repo = Repository(urls, name)
    # The group a project or group event belongs to: the project's namespace path, else the group of a group
    # hook (a member's group, a new subgroup's parent).
    owner = ((name.rsplit("/", 1)[0] if name and "/" in name else None) or _name(data.get("group_path"))
             or _name(data.get("parent_full_path")) or _name(data.get("full_path")))
    is_push = event in GITLAB_PUSH_EVENTS or (event == "System Hook" and data.get("event_name") in
                                              ("push", "tag_push"))
    if event in GITLAB_TEST_EVENTS:
        return Parsed("ping", repo, owner=owner)
    if not is_push:
        return Parsed("ignored", repo, reason=_unused("GitLab", event, "Push Hook and Tag Push Hook events"),
                      owner=owner)
    if not project and not repository:
        raise BadRequest("payload has no project or repository object")
    return Parsed("push", repo, (PushEvent(ref=_ref(data.get("ref")), before=_sha(data.get("before"), "before"),
                                           after=_sha(data.get("after"), "after")),), owner=owner)


def parse_bitbucket(event: str, data: dict[str, Any]) -> Parsed:
    """Bitbucket Cloud ``repo:push``: one :class:`PushEvent` per entry of ``push.changes``; ``diagnostics:ping``
    as a ping; every other event ``ignored`` with a reason.

    A branch deletion has ``new: null``; a creation ``old: null``. Bitbucket sends short or full hashes; full
    40-hex hashes are required here (Bitbucket Cloud's ``target.hash`` is the full id). Several changes of one
    ref are one push (the first ``old``, the last ``new``), in the order the refs first appear: each push
    becomes a sync job.
    """
    repo_obj = _obj(data, "repository") if event == "repo:push" else (_opt_obj(data, "repository") or {})
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
    workspace = data.get("workspace") if isinstance(data.get("workspace"), dict) else {}
    owner = _name(workspace.get("slug")) or (name.split("/", 1)[0] if name and "/" in name else None)
    if event == "diagnostics:ping":  # Bitbucket Cloud's and Bitbucket Server's "test connection"
        return Parsed("ping", repo, owner=owner)
    if event != "repo:push":
        return Parsed("ignored", repo, reason=_unused("Bitbucket", event, "repo:push events"), owner=owner)
    push = _obj(data, "push")
    changes = push.get("changes")
    if not isinstance(changes, list):
        raise BadRequest("push has no changes list")
    out: dict[str, PushEvent] = {}  # one push per ref (hostile review 3: 500 changes of one ref were 500 jobs)
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

        ref = prefix + ref_of["name"]
        before = out[ref].before if ref in out else target(old, "old.target.hash")
        out[ref] = PushEvent(ref=ref, before=before, after=target(new, "new.target.hash"))  # the last change wins
    return Parsed("push", repo, tuple(out.values()), owner=owner)


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
