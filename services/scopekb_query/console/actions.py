"""The admin actions the console's forms perform, written nowhere else.

:class:`OpsActions` calls :mod:`scopekb.ops`, the application layer the ``/v1`` routes, MCP and the CLI call,
so a console form does exactly what the matching ``/v1`` request does — same validation, same queued marker,
same key-cache clearing — without a second copy of the logic. The console checks the admin session before
calling any of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from pydantic import ValidationError

from scopekb import ops
from scopekb.errors import NotFound, Refused, Transient
from scopekb.models import DeadLetter, KeyCreate, SourceCreate
from scopekb.render import validation_message
from scopekb.runtime import Runtime


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


@contextmanager
def _refusals() -> Iterator[None]:
    """scopekb's :class:`~scopekb.errors.Refused` (4xx) and :class:`~scopekb.errors.Transient` (503, the queue
    or a store is down) become :class:`ActionRefused` with the same status and message."""
    try:
        yield
    except (Refused, Transient) as e:
        raise ActionRefused(e.status, str(e)) from None


class OpsActions:
    """:class:`ConsoleActions` through :mod:`scopekb.ops` on the query service's runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def add_source(self, body: SourceCreate) -> dict[str, Any]:
        with _refusals():
            return ops.registration_view(body, ops.register_source(self.rt, body))

    def remove_source(self, source_id: str) -> dict[str, Any]:
        with _refusals():
            return {"deleted": True, "chunks_deleted": ops.remove_source(self.rt, source_id)}

    def sync_source(self, source_id: str) -> str:
        with _refusals():
            return ops.sync_source(self.rt, source_id, "manual")

    def create_key(self, agent_name: str, context_ids: list[str] | None, label: str | None) -> dict[str, Any]:
        try:
            body = KeyCreate(agent_name=agent_name, context_ids=context_ids, label=label)
        except ValidationError as e:  # one bounded line, never pydantic's dump of the input
            raise ActionRefused(422, validation_message(e.errors(include_url=False))) from None
        with _refusals():
            rec, secret = ops.create_key(self.rt, body)
        return {"id": rec.id, "key": secret, "agent_name": rec.agent_name, "context_ids": rec.context_ids}

    def revoke_key(self, key_id: str) -> None:
        with _refusals():
            ops.revoke_key(self.rt, key_id)

    def replay_dead_letter(self, dl_id: str) -> str:
        with _refusals():
            return ops.replay_dead_letter(self.rt, dl_id)

    def list_dead_letters(self, include_replayed: bool) -> list[DeadLetter]:
        with _refusals():
            return ops.list_dead_letters(self.rt, include_replayed)

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        try:
            return ops.get_job(self.rt, job_id).model_dump(mode="json")
        except NotFound:
            return None
