"""FastAPI dependencies of the query service: the runtime, the caller behind a bearer key, admin-only access."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from scopekb.auth import ApiKey, tokens_equal
from scopekb.http.middleware import Gate
from scopekb.runtime import Runtime


class Caller(BaseModel):
    """Who is calling: the admin (``query.admin_token``) or an agent key."""

    admin: bool = False
    key: ApiKey | None = None


async def runtime(request: Request) -> Runtime:
    """The runtime the app was built with (``app.state.runtime``). Async, as every dependency here that does no
    blocking I/O: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hand-off each way per
    request (issue 20)."""
    return request.app.state.runtime  # type: ignore[no-any-return]


Rt = Annotated[Runtime, Depends(runtime)]


#: Where :func:`bearer_gate` leaves the caller it resolved for this request (``scope["state"]``), so the route's
#: :func:`caller` dependency does not look the key up a second time (issue 20: one key lookup, and so at most
#: one keys-version read, per request).
_GATED_CALLER = "scopekb_caller"


async def caller(request: Request, rt: Rt) -> Caller:
    """The caller of ``Authorization: Bearer <key>``: the admin token, or a live agent key (the runtime's cached
    :class:`scopekb.auth.KeyLookup`, shared with MCP). 401 without a bearer key or for an unknown/revoked key.
    Reuses the caller :func:`bearer_gate` resolved for the same request and header; otherwise answered on the
    event loop when the key cache can (:func:`cached_caller`), else looked up in a worker thread."""
    authorization = request.headers.get("authorization", "")
    gated = request.scope.get("state", {}).get(_GATED_CALLER)
    if gated is not None and gated[0] == authorization:
        return gated[1]  # type: ignore[no-any-return]
    return cached_caller(rt, authorization) or await run_in_threadpool(caller_of, rt, authorization)


def unknown_key(rt: Runtime) -> HTTPException:
    """The 401 for a bearer token that is neither a live key nor the admin token. Without an admin token set it
    also says the admin API is off: an operator trying the admin routes with the token they meant to configure
    read "unknown or revoked key" and only the server log said why (README newcomer run)."""
    detail = "unknown or revoked key"
    if rt.settings.query.admin_token is None:
        detail += "; the admin API is off (SCOPEKB_QUERY__ADMIN_TOKEN is not set)"
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def caller_of(rt: Runtime, authorization: str) -> Caller:
    """:func:`caller` on an ``Authorization`` header value (also used before a body is read, see
    :func:`bearer_gate`). Raises ``HTTPException`` 401."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(401, "missing bearer key", headers={"WWW-Authenticate": "Bearer"})
    admin = rt.settings.query.admin_token
    if admin is not None and tokens_equal(token, admin.get_secret_value()):
        return Caller(admin=True)
    key = rt.keys(token)
    if key is None:
        raise unknown_key(rt)
    return Caller(key=key)


def cached_caller(rt: Runtime, authorization: str) -> Caller | None:
    """:func:`caller_of` when it can answer without I/O (a bad header, the admin token, or a key the
    :class:`scopekb.auth.KeyLookup` answers from memory, :meth:`~scopekb.auth.KeyLookup.answered`), else None:
    for the event loop, which hands only the other lookups to a thread (issue 20). Raises ``HTTPException`` 401."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    admin = rt.settings.query.admin_token
    if scheme.lower() != "bearer" or not token or (admin is not None and tokens_equal(token, admin.get_secret_value())):
        return caller_of(rt, authorization)
    known, key = rt.keys.answered(token)
    if not known:
        return None
    if key is None:
        raise unknown_key(rt)
    return Caller(key=key)


CallerDep = Annotated[Caller, Depends(caller)]


def agent_key_of(c: Caller, rt: Runtime, what: str) -> ApiKey:
    """The agent key of ``c``, checked again (:meth:`scopekb.auth.KeyLookup.live`) where the blocking body of a
    route starts: a request may wait for a worker thread after :func:`caller` looked its key up, and a key revoked
    meanwhile must not be served (issue 20 hostile review). ``what``: the request kind, for the 403 naming it
    ("searches", "reads"). Raises ``HTTPException`` 403 for the admin token, 401 for a key revoked meanwhile."""
    if c.key is None:
        raise HTTPException(403, f"{what} need an agent key, not the admin token")
    if not rt.keys.live(c.key):
        raise HTTPException(401, "unknown or revoked key", headers={"WWW-Authenticate": "Bearer"})
    return c.key


async def admin_only(c: CallerDep, rt: Rt) -> Caller:
    """The admin caller; 403 when the admin API is disabled or the caller holds an agent key."""
    if rt.settings.query.admin_token is None:
        raise HTTPException(403, "admin API disabled: set SCOPEKB_QUERY__ADMIN_TOKEN")
    if not c.admin:
        raise HTTPException(403, "admin key required")
    return c


ADMIN = [Depends(admin_only)]


#: Paths whose every route needs a bearer key (the console signs in with a cookie; webhooks carry signatures).
GATED_PREFIXES = ("/v1/", "/mcp")


def bearer_gate(rt: Runtime) -> Gate:
    """A gate for :class:`scopekb.http.RequestLimitsMiddleware`: requests under :data:`GATED_PREFIXES` without a
    live bearer key (or the admin token) get 401 before a byte of their body is read (issue 16: three
    unauthenticated 200 MB searches were read whole). A key store that cannot answer lets the request through to
    the route, which answers 503 itself."""

    async def gate(scope: dict[str, Any]) -> tuple[int, str, dict[str, str]] | None:
        if not str(scope.get("path", "")).startswith(GATED_PREFIXES):
            return None
        authorization = next((v.decode("latin-1") for k, v in scope.get("headers") or () if k == b"authorization"),
                             "")
        try:  # on the event loop when the key cache answers (issue 20), else in a thread
            who = cached_caller(rt, authorization) or await run_in_threadpool(caller_of, rt, authorization)
        except HTTPException as e:
            return e.status_code, str(e.detail), dict(e.headers or {})
        except Exception:  # noqa: BLE001 - the key store is down: the route itself answers 503
            return None
        scope.setdefault("state", {})[_GATED_CALLER] = (authorization, who)
        return None

    return gate
