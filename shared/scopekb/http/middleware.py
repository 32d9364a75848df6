"""ASGI middleware shared by the query service and the ingester (issue 16): request bodies judged before and while
they are read, and security headers on every response.

- :class:`RequestLimitsMiddleware`: a per-route body cap (longest matching path prefix), checked against
  ``Content-Length`` before the app runs and counted while the body streams in, answered 413 without reading the
  rest; an optional *gate* (e.g. "a bearer credential is present and valid") answered before any body byte is
  read; JSON nesting measured while streaming (400 past ``json_max_depth``); and a bound on the time the body
  may take to arrive (408 for a client that sends it too slowly).
- :class:`SecurityHeadersMiddleware`: ``Content-Security-Policy`` (with ``frame-ancestors``),
  ``X-Content-Type-Options``, ``X-Frame-Options``, ``Referrer-Policy`` and ``Cross-Origin-Resource-Policy`` on
  every response, unless the app set them.

Both are pure ASGI (no request buffering) and add no work to a request that stays within its limits beyond
counting bytes. Errors are JSON ``{"detail": ...}`` like FastAPI's own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scopekb.http.jsonlimits import DEFAULT_MAX_DEPTH, DepthScanner, JsonTooDeep

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: A gate sees the request's scope (headers, path, method) before any body byte is read and returns None to let it
#: through, or ``(status, detail, extra headers)`` to answer at once.
Gate = Callable[[Scope], Awaitable[tuple[int, str, Mapping[str, str]] | None]]

#: Content types whose bodies are not scanned for JSON nesting (their parsers are not recursive or decode first).
_NOT_JSON = ("application/x-www-form-urlencoded", "multipart/form-data")


@dataclass(frozen=True)
class RouteLimit:
    """Limits of the routes under a path prefix.

    Attributes:
        prefix: path prefix (``/webhooks/``); the longest matching prefix wins.
        max_bytes: largest body accepted, in bytes.
        json: measure JSON nesting of the body (off for raw document uploads).
        methods: only these methods (upper case); empty means all.
        suffix: the path must also end with this (``/documents`` under ``/v1/sources/``).
    """

    prefix: str
    max_bytes: int
    json: bool = True
    methods: tuple[str, ...] = ()
    suffix: str = ""


@dataclass(frozen=True)
class RequestLimits:
    """What :class:`RequestLimitsMiddleware` enforces. Defaults are those of ``scopekb.settings.HttpSettings``.

    Attributes:
        default_max_bytes: cap of routes no :class:`RouteLimit` names.
        routes: per-route caps.
        json_max_depth: deepest JSON nesting accepted in a body.
        body_timeout_s: the whole body must arrive within this many seconds of the app's first read (a slow
            client gets 408). After the body, ``receive`` waits for a disconnect without a bound (streaming
            responses rely on that).
    """

    default_max_bytes: int = 1024 * 1024
    routes: Sequence[RouteLimit] = field(default_factory=tuple)
    json_max_depth: int = DEFAULT_MAX_DEPTH
    body_timeout_s: float = 30.0

    def route(self, path: str, method: str) -> RouteLimit:
        """The limit for a request (longest matching prefix; the default cap when none matches)."""
        best: RouteLimit | None = None
        for r in self.routes:
            if path.startswith(r.prefix) and path.endswith(r.suffix) and (not r.methods or method in r.methods):
                if best is None or len(r.prefix) + len(r.suffix) > len(best.prefix) + len(best.suffix):
                    best = r
        return best or RouteLimit("", self.default_max_bytes)


class _Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return v.decode("latin-1")
    return None


async def send_error(send: Send, status: int, detail: str, headers: Mapping[str, str] | None = None) -> None:
    """Send a complete JSON error response ``{"detail": detail}`` (closes the connection on 4xx for bodies)."""
    body = json.dumps({"detail": detail}).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status in (408, 413):
        hdrs.append((b"connection", b"close"))  # the rest of the body is never read
    hdrs += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class RequestLimitsMiddleware:
    """Judge a request before and while its body is read (see the module docstring).

    Args:
        app: the ASGI app.
        limits: caps, depth and timeouts.
        gate: checked before the body is read; its refusal is sent as is.
    """

    def __init__(self, app: ASGIApp, limits: RequestLimits, gate: Gate | None = None) -> None:
        self.app = app
        self.limits = limits
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rule = self.limits.route(scope.get("path", ""), scope.get("method", "GET"))
        if self.gate is not None:
            refusal = await self.gate(scope)
            if refusal is not None:
                await send_error(send, refusal[0], refusal[1], refusal[2])
                return
        clen = _header(scope, b"content-length")
        if clen is not None:
            if not clen.strip().isdigit():
                await send_error(send, 400, "invalid Content-Length")
                return
            if int(clen) > rule.max_bytes:
                await send_error(send, 413, f"body larger than {rule.max_bytes} bytes")
                return
        ctype = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        scanner = DepthScanner(self.limits.json_max_depth) if rule.json and ctype not in _NOT_JSON else None
        state: dict[str, Any] = {"read": 0, "refused": None, "started": False, "deadline": None}
        timeout = self.limits.body_timeout_s
        loop = asyncio.get_running_loop()

        async def limited_receive() -> Message:
            if state["refused"] is not None:
                raise state["refused"]
            if state.get("body_done"):  # waiting for a disconnect (streaming responses): no bound
                return await receive()
            if state["deadline"] is None:  # the whole body must arrive within body_timeout_s of the first read
                state["deadline"] = loop.time() + timeout
            try:  # asyncio.timeout_at, not wait_for: no extra task per body piece (issue 20)
                async with asyncio.timeout_at(state["deadline"]):
                    msg = await receive()
            except TimeoutError:
                state["refused"] = _Refused(408, f"request body not received within {timeout:g} s")
                raise state["refused"] from None
            if msg["type"] == "http.request":
                state["body_done"] = not msg.get("more_body", False)
                chunk = msg.get("body", b"")
                state["read"] += len(chunk)
                try:
                    if state["read"] > rule.max_bytes:
                        raise _Refused(413, f"body larger than {rule.max_bytes} bytes")
                    if scanner is not None:
                        scanner.feed(chunk)
                except JsonTooDeep as e:
                    state["refused"] = _Refused(400, str(e))
                    raise state["refused"] from None
                except _Refused as e:
                    state["refused"] = e
                    raise
            return msg

        async def guarded_send(msg: Message) -> None:
            refused = state["refused"]
            if refused is not None:
                # The app turned our refusal into its own answer (FastAPI maps body errors to 400 or 500):
                # answer with the refusal instead, once.
                if msg["type"] == "http.response.start" and not state["started"]:
                    state["started"] = True
                    await send_error(send, refused.status, refused.detail)
                return
            if msg["type"] == "http.response.start":
                state["started"] = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _Refused as e:
            if not state["started"]:
                state["started"] = True
                await send_error(send, e.status, e.detail)
        except Exception:
            if state["refused"] is None:
                raise
            if not state["started"]:
                state["started"] = True
                await send_error(send, state["refused"].status, state["refused"].detail)


#: CSP of API responses: nothing may load, nothing may frame.
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


@dataclass(frozen=True)
class SecurityHeaders:
    """Headers added to every response (values of ``scopekb.settings.HttpSettings``).

    Attributes:
        csp: ``Content-Security-Policy`` of responses whose path has no entry in ``csp_by_prefix``.
        csp_by_prefix: a CSP per path prefix (the longest wins), e.g. the API docs page's own-origin assets.
    """

    csp: str = API_CSP
    csp_by_prefix: Mapping[str, str] = field(default_factory=dict)
    frame_options: str = "DENY"
    referrer_policy: str = "no-referrer"
    content_type_options: str = "nosniff"
    corp: str = "same-origin"

    def for_path(self, path: str) -> list[tuple[bytes, bytes]]:
        """The header pairs for a response to ``path``."""
        csp = self.csp
        best = -1
        for prefix, value in self.csp_by_prefix.items():
            if path.startswith(prefix) and len(prefix) > best:
                csp, best = value, len(prefix)
        return [(b"content-security-policy", csp.encode()), (b"x-content-type-options", self.content_type_options
                                                            .encode()),
                (b"x-frame-options", self.frame_options.encode()), (b"referrer-policy", self.referrer_policy.encode()),
                (b"cross-origin-resource-policy", self.corp.encode())]


class SecurityHeadersMiddleware:
    """Add :class:`SecurityHeaders` to every HTTP response that does not set them itself."""

    def __init__(self, app: ASGIApp, headers: SecurityHeaders | None = None) -> None:
        self.app = app
        self.headers = headers or SecurityHeaders()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = self.headers.for_path(scope.get("path", ""))

        async def with_headers(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                present = {k.lower() for k, _ in msg.get("headers") or ()}
                msg = {**msg, "headers": [*(msg.get("headers") or ()), *((k, v) for k, v in extra
                                                                          if k not in present)]}
            await send(msg)

        await self.app(scope, receive, with_headers)
