"""Console sign-in state: a signed session cookie and CSRF tokens (issue 25).

The cookie holds no credential: for the admin it says ``admin``; for an agent it names the key's record id,
which is looked up again on every request, so a revoked key ends its console sessions at once. The cookie is
signed with :mod:`itsdangerous` (HMAC-SHA1 over a timestamped payload) under a secret derived from the admin
token, so every replica of the query service accepts it and rotating the admin token signs everybody out. With
no admin token configured the secret is random per process (agent sessions then last one process).

Cookies are ``HttpOnly``, ``SameSite=Strict``, ``Path=/console`` and ``Secure`` when the request came over TLS.
Every state-changing form carries the session's CSRF token (synchronizer token); the sign-in form, which has no
session yet, carries a token that must equal the one in a short-lived signed pre-session cookie (double submit).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

from scopekb.auth import tokens_equal

SESSION_COOKIE = "scopekb_console"
LOGIN_COOKIE = "scopekb_console_login"
COOKIE_PATH = "/console"
#: A session lasts 8 hours (one working day), then the operator signs in again.
SESSION_MAX_AGE_S = 8 * 3600
#: The sign-in form must be posted within 30 minutes of being shown.
LOGIN_MAX_AGE_S = 30 * 60


@dataclass(frozen=True)
class SessionData:
    """What a valid session cookie says: ``role`` is ``admin`` or ``agent``; ``key_id`` names the agent's key
    record (None for the admin); ``csrf`` is the token every form of this session must send back."""

    role: str
    key_id: str | None
    csrf: str


class SessionCodec:
    """Signs and reads the console cookies.

    Args:
        admin_token: the configured admin token, or None (then a random per-process secret is used).
    """

    def __init__(self, admin_token: str | None) -> None:
        if admin_token:
            secret = hmac.new(admin_token.encode(), b"scopekb console session v1", hashlib.sha256).hexdigest()
        else:
            secret = secrets.token_hex(32)
        self._sessions = URLSafeTimedSerializer(secret, salt="scopekb-console-session")
        self._login = URLSafeTimedSerializer(secret, salt="scopekb-console-login")

    def read(self, request: Request) -> SessionData | None:
        """The request's session, or None when the cookie is missing, forged, malformed or expired."""
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            return None
        try:
            data: Any = self._sessions.loads(raw, max_age=SESSION_MAX_AGE_S)
        except BadSignature:
            return None
        if not isinstance(data, dict) or data.get("role") not in ("admin", "agent"):
            return None
        if not isinstance(data.get("csrf"), str) or (data["role"] == "agent" and not isinstance(data.get("k"), str)):
            return None
        return SessionData(role=data["role"], key_id=data.get("k"), csrf=data["csrf"])

    def start(self, response: Response, request: Request, role: str, key_id: str | None) -> None:
        """Set a fresh session cookie (new CSRF token) and drop the pre-session cookie."""
        value = self._sessions.dumps({"role": role, "k": key_id, "csrf": secrets.token_urlsafe(24)})
        _set(response, request, SESSION_COOKIE, value, SESSION_MAX_AGE_S)
        response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)

    def end(self, response: Response) -> None:
        """Sign out: delete the session cookie."""
        response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)

    @staticmethod
    def new_login_token() -> str:
        """A fresh CSRF token for the sign-in form (192 random bits)."""
        return secrets.token_urlsafe(24)

    def set_login_cookie(self, request: Request, response: Response, token: str) -> None:
        """Put ``token``, signed, in the pre-session cookie of ``response``."""
        _set(response, request, LOGIN_COOKIE, self._login.dumps(token), LOGIN_MAX_AGE_S)

    def login_token_ok(self, request: Request, sent: str) -> bool:
        """True when ``sent`` equals the token in a valid, unexpired pre-session cookie."""
        raw = request.cookies.get(LOGIN_COOKIE)
        if not raw or not sent:
            return False
        try:
            token = self._login.loads(raw, max_age=LOGIN_MAX_AGE_S)
        except BadSignature:
            return False
        return isinstance(token, str) and tokens_equal(token, sent)


def csrf_ok(session: SessionData, sent: str) -> bool:
    """Constant-time check of a form's CSRF token against the session's."""
    return bool(sent) and tokens_equal(session.csrf, sent)


def _set(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path=COOKIE_PATH, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
