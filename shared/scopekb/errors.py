"""scopekb's own error family: every adapter translates its library's errors into one of these two.

- :class:`Transient`: a dependency (OpenSearch, Redis, the broker, S3, a git host, an embedding API) is down or
  busy for now. The worker retries the task later; REST answers 503; MCP answers a tool error saying "try again".
- :class:`Refused`: the request itself cannot be served as asked (unknown id, invalid URL, a query the backend
  will not run). It carries the HTTP ``status`` (a 4xx) and a one-line message that is safe to show the caller;
  the worker never retries it.

Callers catch these two, never ``opensearchpy``/``redis``/git exception types (DESIGN §13 "one door per action").
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ScopekbError(Exception):
    """Base of scopekb's error family; the message is one line, safe to return to a caller."""


class Transient(ScopekbError):
    """A dependency is unavailable for now: retry later (worker), HTTP 503 (REST), a tool error (MCP)."""

    status = 503


class Refused(ScopekbError):
    """The caller's request cannot be served as asked. ``status`` is the HTTP status (4xx) services answer."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class NotFound(Refused):
    """No record with that id (HTTP 404)."""

    status = 404


def translating(errors: type[BaseException] | tuple[type[BaseException], ...],
                translate: Callable[[BaseException], ScopekbError]) -> Callable[[type[T]], type[T]]:
    """Class decorator for adapters: every public method of the class (and ``__init__``) raises ``translate(e)``
    (chained to ``e``) instead of a library error ``e`` of type ``errors``. Other exceptions, scopekb's own
    included, pass unchanged.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except errors as e:
                raise translate(e) from e
        return call

    def decorate(cls: type[T]) -> type[T]:
        for name, value in list(vars(cls).items()):
            if (not name.startswith("_") or name == "__init__") and inspect.isfunction(value):
                setattr(cls, name, wrap(value))
        return cls

    return decorate
