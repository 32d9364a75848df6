"""FastAPI dependencies of the query service: the runtime, the caller behind a bearer key, admin-only access."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from pydantic import BaseModel

from scopekb.auth import ApiKey, tokens_equal
from scopekb.runtime import Runtime


class Caller(BaseModel):
    """Who is calling: the admin (``query.admin_token``) or an agent key."""

    admin: bool = False
    key: ApiKey | None = None


def runtime(request: Request) -> Runtime:
    """The runtime the app was built with (``app.state.runtime``)."""
    return request.app.state.runtime  # type: ignore[no-any-return]


Rt = Annotated[Runtime, Depends(runtime)]


def caller(request: Request, rt: Rt) -> Caller:
    """The caller of ``Authorization: Bearer <key>``: the admin token, or a live agent key (the runtime's cached
    :class:`scopekb.auth.KeyLookup`, shared with MCP). 401 without a bearer key or for an unknown/revoked key."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(401, "missing bearer key", headers={"WWW-Authenticate": "Bearer"})
    admin = rt.settings.query.admin_token
    if admin is not None and tokens_equal(token, admin.get_secret_value()):
        return Caller(admin=True)
    key = rt.keys(token)
    if key is None:
        raise HTTPException(401, "unknown or revoked key", headers={"WWW-Authenticate": "Bearer"})
    return Caller(key=key)


CallerDep = Annotated[Caller, Depends(caller)]


def admin_only(c: CallerDep, rt: Rt) -> Caller:
    """The admin caller; 403 when the admin API is disabled or the caller holds an agent key."""
    if rt.settings.query.admin_token is None:
        raise HTTPException(403, "admin API disabled: set SCOPEKB_QUERY__ADMIN_TOKEN")
    if not c.admin:
        raise HTTPException(403, "admin key required")
    return c


ADMIN = [Depends(admin_only)]
