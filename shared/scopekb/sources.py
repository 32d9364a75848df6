"""Source registration rules: which clone URLs are accepted, and how webhook payloads find their sources.

The clone URL always comes from the registered source, never from a payload (SSRF, DESIGN §4.2).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import socket
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr

from scopekb.errors import Refused
from scopekb.models import Source, SourceCreate

_SCP_RE = re.compile(r"^(?P<user>[A-Za-z0-9._-]+)@(?P<host>[A-Za-z0-9.-]+):(?P<path>[^:].*)$")


class InvalidRepoUrl(Refused, ValueError):
    """A clone URL that registration refuses (HTTP 422); the message says why in one line."""

    status = 422


def _host_of(url: str) -> str | None:
    m = _SCP_RE.match(url)
    if m:
        return m.group("host")
    return urlsplit(url).hostname


def validate_repo_url(url: str, allow_local: bool = False, host_allowlist: Iterable[str] = ()) -> str:
    """Check a clone URL and return it normalised (whitespace stripped).

    Accepted: ``https://`` and ``ssh://`` URLs and scp-like ``git@host:path``; local repository paths only when
    ``allow_local``. Refused: other schemes (``file://``, ``ext::``, ``http://``), credentials in the URL, and
    hosts resolving to loopback, private, link-local, reserved or metadata addresses unless allowlisted.

    Raises:
        InvalidRepoUrl: with the reason.
    """
    url = url.strip()
    if not url:
        raise InvalidRepoUrl("repo_url is empty")
    if "::" in url.split("/", 1)[0] or url.startswith("ext::"):
        raise InvalidRepoUrl("git remote helpers (ext::, fd::, ...) are not allowed")
    if url.startswith("/") or url.startswith("file://"):
        if not allow_local:
            raise InvalidRepoUrl("local paths are only allowed in embedded mode, or with "
                                 "SCOPEKB_GIT__ALLOW_LOCAL_PATHS=true (git.allow_local_paths) set for the ingester "
                                 "and for the workers, which clone the path too")
        p = Path(url.removeprefix("file://"))
        if not ((p / ".git").exists() or (p / "HEAD").exists()):
            raise InvalidRepoUrl(f"{p} is not a git repository")
        return str(p)
    m = _SCP_RE.match(url)
    if m:
        host = m.group("host")
    else:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "ssh"):
            raise InvalidRepoUrl(f"scheme {parts.scheme or '(none)'!r} is not allowed; use https or ssh")
        if parts.password:
            raise InvalidRepoUrl("credentials in the URL are not allowed; configure them on the worker")
        host = parts.hostname or ""
    if not host:
        raise InvalidRepoUrl("repo_url has no host")
    if host.lower() in {h.lower() for h in host_allowlist}:
        return url
    _check_public_host(host)
    return url


def _check_public_host(host: str) -> None:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise InvalidRepoUrl(f"host {host!r} does not resolve") from None
    for info in infos:
        ip = ipaddress.ip_address(info[4][0])
        if (ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_reserved or ip.is_multicast
                or ip.is_unspecified or str(ip) == "169.254.169.254"):
            raise InvalidRepoUrl(f"host {host!r} resolves to a non-public address ({ip}); "
                                 "add it to the host allowlist to permit it")


def normalise_repo(url: str) -> str:
    """A comparison key for clone URLs: host + path, lower-case host, no ``.git``, no trailing slash.

    ``https://github.com/Org/Repo.git``, ``git@github.com:Org/Repo.git`` and ``ssh://git@github.com/Org/Repo``
    all give ``github.com/Org/Repo``. Local paths are returned resolved.
    """
    url = url.strip()
    if url.startswith("/"):
        return str(Path(url).resolve())
    m = _SCP_RE.match(url)
    if m:
        host, path = m.group("host"), m.group("path")
    else:
        parts = urlsplit(url)
        host, path = parts.hostname or "", parts.path
    path = path.strip("/")
    if path.lower().endswith(".git"):  # hosts answer Repo.GIT as Repo.git (hostile review)
        path = path[:-4]
    return f"{host.lower()}/{path}"


@lru_cache(maxsize=1 << 16)
def _remote_key(url: str) -> str:
    return normalise_repo(url).lower()


def repo_key(url: str) -> str:
    """:func:`normalise_repo` lower-cased: what a registered source's clone URL is matched on. Remembered per URL
    for remote URLs (at most 65,536), so matching a push against many registered sources is a dict lookup per
    source instead of a parse (1,000 sources: 16 ms a webhook before, 0.7 ms after; issue 20). Only for URLs of
    registered sources (validated when registered): a delivery's own URLs are sender-chosen and never remembered.
    Local paths are resolved every time (the file system may have changed)."""
    return normalise_repo(url).lower() if url.lstrip().startswith("/") else _remote_key(url)


def matching_sources(sources: Iterable[Source], urls: Iterable[str | None],
                     full_names: Iterable[str | None]) -> list[Source]:
    """Sources whose clone URL or ``repo_name`` matches a payload's repository URLs or full names.

    Compared without case: git hosts resolve owner and repository names case-insensitively, and their payloads
    spell them as the owner last did (``octocoders/hello-world`` for ``Octocoders/Hello-World``).
    """
    keys = {normalise_repo(u).lower() for u in urls if u}  # the payload's: never remembered (sender-chosen)
    names = {n.lower() for n in full_names if n}
    return [s for s in sources if repo_key(s.repo_url) in keys
            or (s.repo_name is not None and s.repo_name.lower() in names)]


def webhook_secret_for(body: SourceCreate) -> tuple[SecretStr | None, str | None]:
    """The webhook secret a new source is stored with, and the secret to show once (issue 16).

    A webhook-driven source always has a secret: the given one, or a fresh random one (256 bits, url-safe) that is
    returned as the second value so the caller shows it exactly once (it is stored, never listed again). A source
    registered with ``webhooks=False`` keeps no secret and refuses every delivery.
    """
    if not body.webhooks:
        return None, None
    if body.webhook_secret is not None and body.webhook_secret.get_secret_value():
        return body.webhook_secret, None
    fresh = secrets.token_urlsafe(32)
    return SecretStr(fresh), fresh


def delivery_targets(found: Iterable[Source],
                     verify: Callable[[list[str]], bool]) -> tuple[list[Source], int | None]:
    """The sources a webhook delivery may act on, or the HTTP status refusing it (issue 16, item 1).

    Only webhook-driven sources with a secret that verifies the delivery (``verify(secrets)``, constant-time) take
    part; a source without a secret never does (an unsigned delivery changes nothing). Returns ``(targets, None)``
    when at least one source verified, ``([], 401)`` when some source could have verified but none did, and
    ``([], 404)`` when no matching source takes deliveries at all (the same answer as an unknown repository).
    """
    signed = [s for s in found if s.secrets()]
    if not signed:
        return [], 404
    targets = [s for s in signed if verify(s.secrets())]
    return (targets, None) if targets else ([], 401)


def sources_of_owner(sources: Iterable[Source], owner: str | None) -> list[Source]:
    """Sources whose repository belongs to ``owner``, an organisation, group (``parent/sub``) or workspace named
    by an event that has no repository (a GitHub organisation hook's ``ping``, a GitLab group hook): the path of
    the registered clone URL or ``repo_name`` starts with ``owner/``, compared without case (hosts treat owner
    names case-insensitively). An empty ``owner`` matches nothing."""
    if not owner:
        return []
    prefix = owner.strip("/").lower() + "/"

    def url_path(url: str) -> str:  # "host/Org/Repo" -> "org/repo"; local paths have no owner
        return "" if url.startswith("/") else repo_key(url).split("/", 1)[-1]

    return [s for s in sources
            if url_path(s.repo_url).startswith(prefix) or (s.repo_name or "").lower().startswith(prefix)]
