"""Webhook deliveries per provider, written from each provider's documented formats (not captured traffic).

``delivery(provider, repo_name, clone_url, before, after, secret, ...)`` returns ``(body, headers)`` for a
push of ``refs/heads/<branch>``; ``sign=False`` leaves the signature/token header out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid

ZERO = "0" * 40


def _hex(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def delivery(provider: str, repo_name: str, clone_url: str, before: str, after: str, secret: str,
             branch: str = "main", sign: bool = True, delivery_id: str | None = None) -> tuple[bytes, dict[str, str]]:
    did = delivery_id or str(uuid.uuid4())
    if provider == "github":
        body = json.dumps({"ref": f"refs/heads/{branch}", "before": before, "after": after, "commits": [],
                           "repository": {"full_name": repo_name, "clone_url": clone_url}}).encode()
        h = {"X-GitHub-Event": "push", "X-GitHub-Delivery": did}
        if sign:
            h["X-Hub-Signature-256"] = "sha256=" + _hex(secret, body)
    elif provider == "gitlab":
        body = json.dumps({"object_kind": "push", "ref": f"refs/heads/{branch}", "before": before, "after": after,
                           "checkout_sha": after, "total_commits_count": 0, "commits": [],
                           "project": {"path_with_namespace": repo_name, "git_http_url": clone_url,
                                       "web_url": "https://gitlab.invalid/" + repo_name},
                           "repository": {"git_http_url": clone_url}}).encode()
        h = {"X-Gitlab-Event": "Push Hook", "X-Gitlab-Event-UUID": did}
        if sign:
            h["X-Gitlab-Token"] = secret
    elif provider in ("gitea", "forgejo"):
        body = json.dumps({"ref": f"refs/heads/{branch}", "before": before, "after": after, "commits": [],
                           "repository": {"full_name": repo_name, "clone_url": clone_url}}).encode()
        name = "Gitea" if provider == "gitea" else "Forgejo"
        h = {f"X-{name}-Event": "push", f"X-{name}-Delivery": did}
        if sign:
            h[f"X-{name}-Signature"] = _hex(secret, body)
    elif provider == "bitbucket":
        new = None if after == ZERO else {"type": "branch", "name": branch, "target": {"hash": after}}
        old = None if before == ZERO else {"type": "branch", "name": branch, "target": {"hash": before}}
        body = json.dumps({"push": {"changes": [{"new": new, "old": old, "created": old is None,
                                                 "closed": new is None, "forced": False}]},
                           "repository": {"full_name": repo_name, "links": {
                               "html": {"href": "https://bitbucket.invalid/" + repo_name}}}}).encode()
        h = {"X-Event-Key": "repo:push", "X-Request-UUID": did}
        if sign:
            h["X-Hub-Signature"] = "sha256=" + _hex(secret, body)
    else:
        raise ValueError(provider)
    h["Content-Type"] = "application/json"
    return body, h
