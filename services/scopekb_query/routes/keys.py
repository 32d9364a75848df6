"""Agent API keys: create, list, revoke (admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from scopekb import ops
from scopekb.models import KeyCreate
from scopekb_query.deps import ADMIN, Rt

router = APIRouter(prefix="/v1/keys", tags=["keys"], dependencies=ADMIN)


@router.post("", status_code=201)
def create_key(body: KeyCreate, rt: Rt) -> dict[str, Any]:
    """Create an agent key; the key itself is returned once and only its hash is stored."""
    rec, secret = ops.create_key(rt, body)
    return {"id": rec.id, "key": secret, "agent_name": rec.agent_name, "context_ids": rec.context_ids}


@router.get("")
def list_keys(rt: Rt) -> list[dict[str, Any]]:
    """Every key without its hash."""
    return [k.model_dump(mode="json", exclude={"key_hash"}) for k in ops.list_keys(rt)]


@router.delete("/{key_id}")
def revoke_key(key_id: str, rt: Rt) -> dict[str, Any]:
    """Revoke a key; REST and MCP refuse it at once in this process."""
    ops.revoke_key(rt, key_id)
    return {"revoked": True}
