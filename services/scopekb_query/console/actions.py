"""The admin actions the console's forms perform, written nowhere else.

:class:`EndpointActions` calls the query service's own REST endpoint functions (found on the app by method and
path), so a console form does exactly what the matching ``/v1`` request does — same validation, same queued
marker, same key-cache clearing — without a second copy of the logic and without an HTTP round trip. The
console checks the admin session before calling any of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import FastAPI, HTTPException
from fastapi.routing import APIRoute

from scopekb.models import DeadLetter, SourceCreate


class ActionRefused(Exception):
    """An action was refused; ``status`` is the HTTP status the API gives (404 unknown id, 422 invalid input)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ConsoleActions(Protocol):
    """What the console's admin forms can do. Every method raises :class:`ActionRefused` on refusal."""

    def add_source(self, body: SourceCreate) -> dict[str, Any]:
        """Register a source; returns its public record (with ``id``)."""
        ...

    def remove_source(self, source_id: str) -> dict[str, Any]:
        """Unregister a source and delete its chunks; returns ``{"chunks_deleted": n}``."""
        ...

    def sync_source(self, source_id: str) -> str:
        """Enqueue a sync now; returns the job id."""
        ...

    def create_key(self, agent_name: str, context_ids: list[str] | None, label: str | None) -> dict[str, Any]:
        """Create an agent key; returns ``{"id", "key", "agent_name", "context_ids"}`` (``key`` shown once)."""
        ...

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key (effective for the API at once)."""
        ...

    def replay_dead_letter(self, dl_id: str) -> str:
        """Enqueue a parked task again; returns the new job id."""
        ...

    def list_dead_letters(self, include_replayed: bool) -> list[DeadLetter]:
        """Parked tasks, newest first; replayed ones only when asked."""
        ...

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """A job record (or the queued marker of a job no worker has started), None when unknown."""
        ...


class EndpointActions:
    """:class:`ConsoleActions` through the app's ``/v1`` endpoint functions (called directly, in process)."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app

    def _endpoint(self, method: str, path: str) -> Callable[..., Any]:
        for route in self._app.router.routes:
            if isinstance(route, APIRoute) and route.path == path and method in route.methods:
                return route.endpoint
        raise LookupError(f"{method} {path} is not a route of this app")

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return self._endpoint(method, path)(**kwargs)
        except HTTPException as e:
            raise ActionRefused(e.status_code, str(e.detail)) from None

    def add_source(self, body: SourceCreate) -> dict[str, Any]:
        return dict(self._call("POST", "/v1/sources", body=body))

    def remove_source(self, source_id: str) -> dict[str, Any]:
        return dict(self._call("DELETE", "/v1/sources/{source_id}", source_id=source_id))

    def sync_source(self, source_id: str) -> str:
        return str(self._call("POST", "/v1/sources/{source_id}/sync", source_id=source_id)["job_id"])

    def create_key(self, agent_name: str, context_ids: list[str] | None, label: str | None) -> dict[str, Any]:
        endpoint = self._endpoint("POST", "/v1/keys")
        model = inspect.signature(endpoint).parameters["body"].annotation
        try:
            body = model(agent_name=agent_name, context_ids=context_ids, label=label)
        except ValueError as e:
            raise ActionRefused(422, str(e)) from None
        return dict(self._call("POST", "/v1/keys", body=body))

    def revoke_key(self, key_id: str) -> None:
        self._call("DELETE", "/v1/keys/{key_id}", key_id=key_id)

    def replay_dead_letter(self, dl_id: str) -> str:
        return str(self._call("POST", "/v1/deadletters/{dl_id}/replay", dl_id=dl_id)["job_id"])

    def list_dead_letters(self, include_replayed: bool) -> list[DeadLetter]:
        return [DeadLetter.model_validate(d) for d in self._call("GET", "/v1/deadletters",
                                                                 include_replayed=include_replayed)]

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        try:
            return dict(self._call("GET", "/v1/jobs/{job_id}", job_id=job_id))
        except ActionRefused as e:
            if e.status == 404:
                return None
            raise
