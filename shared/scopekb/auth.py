"""API keys and the scope a caller may search (DESIGN §5, issue 8; the aimon seed's tenancy rules).

A key is bound to one agent and optionally to a set of its context ids. Only the key's sha256 is stored. The
scope of a search comes from the key; the request may only narrow it (``context_id``) or widen it to every
allowed context of the same agent (``cross_context``), never to another agent.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from scopekb.errors import Refused
from scopekb.models import utcnow
from scopekb.stores.base import ScopeFilter

KEY_PREFIX = "skb_"


class AuthError(Refused):
    """Base of the errors below; ``status`` is the HTTP status the services answer with."""

    status = 401


class Unauthenticated(AuthError):
    """No key, or an unknown or revoked key (HTTP 401)."""

    status = 401


class ScopeDenied(AuthError):
    """The request names a context outside the key's allowed set (HTTP 403)."""

    status = 403


class ScopeMissing(AuthError):
    """The request resolves to no single scope (HTTP 400)."""

    status = 400


class ApiKey(BaseModel):
    """A stored API key (no secret in it: ``key_hash`` is sha256 of the key)."""

    id: str
    agent_name: str
    context_ids: list[str] | None = Field(default=None, description="None: every context of the agent")
    key_hash: str
    role: str = "agent"
    label: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None


def new_key() -> tuple[str, str]:
    """Return ``(key, key_hash)``: a fresh random key (``skb_`` + 43 url-safe chars) and its sha256 hex."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


def hash_key(key: str) -> str:
    """sha256 hex of a key; keys are random 256-bit strings, so no salt or slow hash is needed."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def tokens_equal(a: str, b: str) -> bool:
    """Constant-time string comparison."""
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def resolve_scope(key: ApiKey, context_id: str | None, cross_context: bool) -> ScopeFilter:
    """The scope a search with this key may see.

    Raises:
        ScopeDenied: ``context_id`` is not one of the key's contexts.
        ScopeMissing: no ``context_id``, no ``cross_context`` and the key is not bound to exactly one context.
    """
    allowed = tuple(key.context_ids) if key.context_ids is not None else None
    if context_id is not None:
        if allowed is not None and context_id not in allowed:
            raise ScopeDenied(f"context_id {context_id!r} is not allowed for this key")
        if cross_context:
            return ScopeFilter(key.agent_name, allowed)
        return ScopeFilter(key.agent_name, (context_id,))
    if cross_context:
        return ScopeFilter(key.agent_name, allowed)
    if allowed is not None and len(allowed) == 1:
        return ScopeFilter(key.agent_name, allowed)
    raise ScopeMissing("name a context_id or set cross_context=true")


#: Seconds a key lookup is cached when the keys version cannot be read; revoking a key through
#: :func:`scopekb.ops.revoke_key` clears the cache at once.
KEY_CACHE_TTL_S = 30.0


class KeyLookup:
    """Resolve a bearer key to its stored :class:`ApiKey` - the one lookup REST and MCP share.

    Lookups are cached for ``ttl_s`` seconds (``sha256 -> (monotonic time, key)``) so most requests do no store
    I/O; :meth:`forget` empties the cache. With ``version`` (the coordination's keys version, bumped by every
    revocation) the version is read at most every ``check_s`` seconds (issue 20: not once per request) and a
    change empties the cache first: a revocation made anywhere applies on every replica within ``check_s``
    seconds (issue 16; ``check_s=0`` reads it on every lookup). If ``version`` fails (Redis unreachable) the cache
    falls back to ``ttl_s``. Without ``version`` (the embedded profile, whose coordination is in-process) ``ttl_s``
    alone bounds how long a revocation made by another process takes.
    """

    def __init__(self, records: Any, ttl_s: float = KEY_CACHE_TTL_S,
                 version: Callable[[], int] | None = None, check_s: float = 0.0) -> None:
        self.records = records
        self.ttl_s = ttl_s
        self.version = version
        self.check_s = check_s
        self._seen_version: int | None = None
        self._checked_at = float("-inf")
        self._cache: dict[str, tuple[float, ApiKey | None]] = {}
        self._mu = threading.Lock()

    def _follow_version(self) -> None:
        if self.version is None:
            return
        now = time.monotonic()
        if now - self._checked_at < self.check_s:
            return
        try:
            v = self.version()
        except Exception:  # noqa: BLE001 - the version store is down: the TTL bounds staleness instead
            return
        with self._mu:
            self._checked_at = now
            if v != self._seen_version:
                self._cache.clear()
                self._seen_version = v

    def __call__(self, token: str) -> ApiKey | None:
        """The live key for ``token``, or None for an empty, unknown or revoked key. Store errors propagate."""
        if not token:
            return None
        return self._by_hash(hash_key(token))

    def live(self, key: ApiKey) -> bool:
        """Whether ``key`` (as an earlier lookup of this or another replica returned it, with its ``key_hash``) is
        still live: the same cached check as :meth:`__call__`, for a request that waited (e.g. for a search thread,
        :class:`scopekb.searchlimit.SearchLimiter`) after its key was looked up, so a key revoked meanwhile is not
        served (issue 20 hostile review). Store errors propagate."""
        return bool(key.key_hash) and self._by_hash(key.key_hash) is not None

    def _by_hash(self, h: str) -> ApiKey | None:
        self._follow_version()
        now = time.monotonic()
        with self._mu:
            cached = self._cache.get(h)
        if cached is None or now - cached[0] >= self.ttl_s:
            docs = self.records.find("keys", size=1, key_hash=h)
            cached = (now, ApiKey.model_validate(docs[0]) if docs else None)
            with self._mu:
                self._cache[h] = cached
        key = cached[1]
        if key is None or key.revoked_at is not None:
            return None
        return key

    def answered(self, token: str) -> tuple[bool, ApiKey | None]:
        """``(True, key or None)`` when :meth:`__call__` would answer ``token`` from memory (a fresh cache entry
        and no version read due), else ``(False, None)``: a check without I/O that an event loop may make
        before handing the lookup to a thread."""
        if not token or (self.version is not None and time.monotonic() - self._checked_at >= self.check_s):
            return False, None
        with self._mu:
            cached = self._cache.get(hash_key(token))
        if cached is None or time.monotonic() - cached[0] >= self.ttl_s:
            return False, None
        key = cached[1]
        return True, None if key is None or key.revoked_at is not None else key

    def forget(self) -> None:
        """Drop every cached lookup."""
        with self._mu:
            self._cache.clear()
