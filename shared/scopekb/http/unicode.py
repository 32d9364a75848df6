"""Input that is not valid Unicode never becomes a 5xx (issue 15 item 2).

JSON allows ``"\\ud800"``: a lone UTF-16 surrogate, which Python decodes into a ``str`` that cannot be encoded
as UTF-8. Echoed in an error body (FastAPI's 422 carries the input), written to SQLite or rendered in a 200
answer, it raised ``UnicodeEncodeError`` and the client got a 500. Likewise a body that is not UTF-8, sent with a
content type FastAPI does not parse as JSON, reached FastAPI's 422 as ``bytes`` and failed to decode. Three parts,
each used by the query service and the ingester (which may not import each other):

- :class:`LoneSurrogateMiddleware`: a JSON request body whose strings hold a lone surrogate is answered 400
  naming where (``body.query``) before any route sees it;
- :func:`safe_validation_response`: FastAPI's 422 without the echoed ``input`` and ``ctx`` (``type``, ``loc``,
  ``msg`` only, printable and bounded, at most 10 errors);
- :class:`SafeJSONResponse`: the apps' default response class, whose encoding cannot fail on a lone surrogate
  (written as the JSON escape ``\\ud800`` it came in as).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: A JSON escape of a surrogate code point (paired or not): only bodies containing one are parsed here.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
#: Request bodies never scanned: forms (parsed by their routes) and raw uploads.
_NOT_JSON = ("application/x-www-form-urlencoded", "multipart/form-data", "application/octet-stream", "text/")
#: Longest string :func:`printable` keeps, in characters.
MAX_ECHO_CHARS = 200
#: Most validation errors a 422 answer lists (then one line counting the rest).
MAX_VALIDATION_ERRORS = 10
LONE_SURROGATE = "text has a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode"


#: One UTF-16 surrogate code point (U+D800-U+DFFF): what a lone ``\\ud800`` escape decodes to.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _is_surrogate(ch: str) -> bool:
    return "\ud800" <= ch <= "\udfff"


def _has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate code point: ASCII text answered by one C check, other text by a compiled
    search (the per-character loop here cost a webhook about 0.05 ms; issue 20)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def _surrogate_path(value: Any) -> list[str] | None:
    """The keys and indices leading to the first string (or the mapping whose key) holding a surrogate; None."""
    if isinstance(value, str):
        return [] if _has_surrogate(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            if _has_surrogate(str(k)):
                return []
            found = _surrogate_path(v)
            if found is not None:
                return [str(k), *found]
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _surrogate_path(v)
            if found is not None:
                return [str(i), *found]
    return None


def lone_surrogate_at(value: Any, where: str = "body") -> str | None:
    """Where the first string (value or key) of decoded JSON ``value`` holding a lone surrogate is
    (``body.query``, ``body.items.2``), or None."""
    path = _surrogate_path(value)
    return None if path is None else ".".join([where, *path])


def printable(value: Any, max_chars: int = MAX_ECHO_CHARS) -> Any:
    """``value`` made safe to echo in JSON: bytes decoded as UTF-8 with ``\\xNN`` escapes, lone surrogates as
    ``\\udNNN`` escapes, strings cut at ``max_chars`` (``…``), containers bounded to 20 items, recursively;
    a non-finite float (``1e999``, ``NaN`` in a JSON body) as its text, since JSON cannot carry it."""
    if isinstance(value, bytes):
        value = value[: max_chars * 4].decode("utf-8", "backslashreplace")
    if isinstance(value, str):
        cut = len(value) > max_chars
        s = value[:max_chars]
        if _has_surrogate(s):
            s = "".join(f"\\u{ord(c):04x}" if _is_surrogate(c) else c for c in s)
        return s + ("…" if cut else "")
    if isinstance(value, dict):
        return {printable(str(k), 100): printable(v, max_chars) for k, v in list(value.items())[:20]}
    if isinstance(value, list | tuple | set):
        return [printable(v, max_chars) for v in list(value)[:20]]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan: 1e999 or NaN in a body is echoed as "inf"/"nan"
    if value is None or isinstance(value, bool | int | float):
        return value
    return printable(str(value), max_chars)


class SafeJSONResponse(JSONResponse):
    """FastAPI's JSON response whose encoding never fails: a lone surrogate in the content is written as its JSON
    escape (``\\ud800``) instead of raising ``UnicodeEncodeError``."""

    def render(self, content: Any) -> bytes:
        """JSON text of ``content`` as UTF-8 (compact, no NaN)."""
        return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                          separators=(",", ":")).encode("utf-8", "backslashreplace")


def _json_content_type(ctype: str) -> bool:
    """Whether FastAPI parses a body of this ``Content-Type`` as JSON (``application/json``, ``*/*+json``)."""
    main = ctype.split(";")[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


async def safe_validation_response(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 answer as ``{"detail": [{"type", "loc", "msg"}]}``: what was wrong and where, never the
    input. FastAPI's own answer echoes each error's ``input`` (the whole body for a missing field) and ``ctx``,
    so a hostile 1 MiB body came back as 1.4 MiB (hostile review 6); here neither is echoed, ``loc`` and ``msg``
    are made :func:`printable` (100 and 300 characters) and at most :data:`MAX_VALIDATION_ERRORS` errors are
    listed, then one ``{"type": "too_many_errors", "loc": [], "msg": "<N> more errors not shown"}``. Register it
    with ``app.add_exception_handler(RequestValidationError, safe_validation_response)``.

    A JSON body sent with another ``Content-Type`` (``text/plain``, a form type) reaches the route unparsed and
    fails as a whole; that is answered 415 with one error naming the content type to send (FastAPI's own message,
    "Input should be a valid dictionary", did not say why)."""
    found = exc.errors()
    ctype = request.headers.get("content-type")
    if ctype and not _json_content_type(ctype) and any(tuple(e.get("loc", ())) == ("body",) for e in found):
        return SafeJSONResponse({"detail": [{
            "type": "unsupported_media_type", "loc": ["header", "content-type"],
            "msg": f"send the body as JSON with Content-Type: application/json (got {printable(ctype, 100)!r})"}]},
            status_code=415)
    errors: list[dict[str, Any]] = [
        {"type": printable(e.get("type"), 100), "loc": [printable(x, 100) for x in list(e.get("loc", ()))[:10]],
         "msg": printable(e.get("msg"), 300)} for e in found[:MAX_VALIDATION_ERRORS]]
    if len(found) > MAX_VALIDATION_ERRORS:
        errors.append({"type": "too_many_errors", "loc": [],
                       "msg": f"{len(found) - MAX_VALIDATION_ERRORS} more errors not shown"})
    return SafeJSONResponse({"detail": errors}, status_code=422)


class LoneSurrogateMiddleware:
    """Answer 400 to a JSON request body whose strings hold a lone surrogate (see the module docstring).

    Bodies of forms and raw uploads pass untouched; other bodies are read (the caps of
    :class:`scopekb.http.RequestLimitsMiddleware`, placed outside this one, bound them) and handed to the app
    unchanged. Only a body containing a ``\\uD8xx``-``\\uDFxx`` escape is parsed here.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the body of POST/PUT/PATCH requests, then pass the request on."""
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        ctype = ""
        for k, v in scope.get("headers") or ():
            if k.lower() == b"content-type":
                ctype = v.decode("latin-1").split(";")[0].strip().lower()
        if ctype.startswith(_NOT_JSON):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = bytearray()
        while True:
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            if not msg.get("more_body", False):
                break
        if _ESCAPED_SURROGATE.search(body):
            try:
                where = lone_surrogate_at(json.loads(bytes(body)))
            except ValueError:
                where = None  # not JSON: the route answers it
            if where:
                data = json.dumps({"detail": f"{where}: {LONE_SURROGATE}"}).encode()
                await send({"type": "http.response.start", "status": 400, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return
        pending = iter(messages)

        async def replay() -> Message:
            msg = next(pending, None)
            return msg if msg is not None else await receive()

        await self.app(scope, replay, send)


def install_unicode_safety(app: FastAPI) -> None:
    """Wire the three parts into ``app``: :class:`SafeJSONResponse` as the default response class of routes
    included *after* this call, :func:`safe_validation_response` for FastAPI's 422, and
    :class:`LoneSurrogateMiddleware` (call it before ``include_router``)."""
    app.router.default_response_class = SafeJSONResponse
    app.add_exception_handler(RequestValidationError, safe_validation_response)  # type: ignore[arg-type]
    app.add_middleware(LoneSurrogateMiddleware)
