"""Per-provider webhook verification and payload parsing (GitHub so far; DESIGN §4.1).

Pure functions over headers and raw bytes: no I/O, so they are unit-tested directly.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from scopekb.models import ZERO_SHA


class BadRequest(ValueError):
    """Malformed webhook (HTTP 400); the message is safe to return."""


@dataclass(frozen=True)
class PushEvent:
    """What a push tells us. ``ref`` is the full ref (``refs/heads/main``); shas are 40-hex or zeros."""

    ref: str
    before: str
    after: str
    repo_urls: tuple[str, ...]
    repo_full_name: str | None

    @property
    def branch(self) -> str | None:
        """Branch name for ``refs/heads/*`` refs, None for tags and others."""
        return self.ref.removeprefix("refs/heads/") if self.ref.startswith("refs/heads/") else None

    @property
    def deleted(self) -> bool:
        return self.after == ZERO_SHA


def github_signature(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends: ``sha256=`` + hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify_github(secrets: list[str], body: bytes, header: str | None) -> bool:
    """True when ``header`` is a valid signature of ``body`` under any of ``secrets`` (constant-time compare)."""
    if not header or not header.startswith("sha256="):
        return False
    ok = False
    for s in secrets:
        ok |= hmac.compare_digest(github_signature(s, body).encode(), header.encode("utf-8", "replace"))
    return ok


def parse_github_body(body: bytes, content_type: str | None) -> dict[str, Any]:
    """Decode a GitHub webhook body: JSON, or form-encoded with the JSON in ``payload=``.

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
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        if isinstance(e, BadRequest):
            raise
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return data


def github_repository(data: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
    """Clone URLs and ``full_name`` of the payload's repository.

    Raises:
        BadRequest: no ``repository`` object.
    """
    repo = data.get("repository")
    if not isinstance(repo, dict):
        raise BadRequest("payload has no repository object")
    urls = tuple(str(repo[k]) for k in ("clone_url", "ssh_url", "html_url", "git_url", "url")
                 if isinstance(repo.get(k), str))
    name = repo.get("full_name") if isinstance(repo.get("full_name"), str) else None
    return urls, name


def parse_github_push(data: dict[str, Any]) -> PushEvent:
    """A push event from a decoded payload.

    Raises:
        BadRequest: ``ref``, ``before`` or ``after`` missing or of the wrong type/shape.
    """
    ref, before, after = data.get("ref"), data.get("before"), data.get("after")
    if not isinstance(ref, str) or not ref.startswith("refs/"):
        raise BadRequest("push payload needs a string 'ref' starting with refs/")
    for name, v in (("before", before), ("after", after)):
        if not isinstance(v, str) or len(v) != 40 or any(c not in "0123456789abcdef" for c in v):
            raise BadRequest(f"push payload needs '{name}' as a 40-hex commit id")
    urls, full_name = github_repository(data)
    return PushEvent(ref=ref, before=str(before), after=str(after), repo_urls=urls, repo_full_name=full_name)
