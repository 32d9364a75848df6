"""How scopekb's HTTP processes are served (issue 16, item 7): uvicorn with read/idle timeouts and connection limits.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for a request's headers: a
client that opens a connection and sends a header byte now and then holds it open indefinitely.
:class:`HeaderTimeoutH11Protocol` closes a connection that has not completed a request's headers within
``http.header_timeout_s`` of opening (or of its previous response). Slow bodies are bounded by
:class:`scopekb.http.middleware.RequestLimitsMiddleware` (408).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from scopekb.settings import HttpSettings, get_settings

#: uvicorn's ``http`` option naming the protocol class (a string, so it survives uvicorn's worker processes).
PROTOCOL = "scopekb.http.server:HeaderTimeoutH11Protocol"


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a bound on the time a connection may take to send a request's headers, and on
    the size of a request head that arrives whole (:meth:`data_received`).

    The bound is ``header_timeout_s`` when set on a subclass, else ``http.header_timeout_s`` of the settings.
    """

    header_timeout_s: float | None = None

    def data_received(self, data: bytes) -> None:
        """Refuse (431, connection closed) a request head longer than ``h11_max_incomplete_event_size``
        (``http.max_header_bytes``) even when it arrives whole: h11 bounds only a head still incomplete, so a
        100 KB head sent in one write was served (hostile review 3; up to asyncio's 256 KiB read size)."""
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            limit = self.config.h11_max_incomplete_event_size
            if limit is not None:
                buffered = self.conn.trailing_data[0]
                if len(buffered) + len(data) > limit:
                    head = buffered + data
                    end = head.find(b"\r\n\r\n")
                    if end > limit:
                        self._refuse_head(limit)
                        return
        super().data_received(data)

    def _refuse_head(self, limit: int) -> None:
        body = f"request head larger than {limit} bytes (http.max_header_bytes)".encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
                             b"charset=utf-8\r\nconnection: close\r\ncontent-length: " + str(len(body)).encode()
                             + b"\r\n\r\n" + body)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        old = getattr(self, "_header_timer", None)
        if old is not None:
            old.cancel()
        timeout = self.header_timeout_s if self.header_timeout_s is not None else get_settings().http.header_timeout_s
        self._cycle_at_arm = self.cycle
        self._header_timer = self.loop.call_later(timeout, self._header_timeout)

    def _header_timeout(self) -> None:
        """No new request started since the timer was armed: the headers are late (or the connection idles)."""
        if self.cycle is self._cycle_at_arm and not self.transport.is_closing():
            self.transport.close()


def apply_worker_threads(http: HttpSettings | None = None) -> int:
    """Size anyio's default thread limiter, which runs sync routes and dependencies, to ``http.worker_threads``
    (default: the settings'); returns the size. Call it on the event loop that serves (an app's lifespan): the
    limiter is per loop."""
    import anyio.to_thread

    http = http or get_settings().http
    anyio.to_thread.current_default_thread_limiter().total_tokens = http.worker_threads
    return http.worker_threads


def uvicorn_options(http: HttpSettings | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` applying ``http`` (default: the settings'):
    the header-timeout protocol, keep-alive timeout, concurrency limit, backlog and request-head size cap."""
    http = http or get_settings().http
    return {"http": PROTOCOL, "timeout_keep_alive": http.keep_alive_timeout_s,
            "limit_concurrency": http.limit_concurrency, "backlog": http.backlog,
            "h11_max_incomplete_event_size": http.max_header_bytes}
