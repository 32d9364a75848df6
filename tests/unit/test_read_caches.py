"""Per-request reads the query path caches (issue 20), each with its stated bound: the keys version (revocation
within ``query.revocation_bound_s``), the embedded key lookup TTL, and the scope's pinned refs."""

from __future__ import annotations

import time
from typing import Any

from scopekb.auth import ApiKey, KeyLookup, hash_key
from scopekb.models import Source
from scopekb.search import _pinned_refs, forget_pinned
from scopekb.stores.base import ScopeFilter


class _Keys:
    """A record store holding keys (a fake for pure cache logic; the real stores are tested in integration)."""

    def __init__(self) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.finds = 0

    def add(self, token: str, revoked: bool = False) -> None:
        k = ApiKey(id="key_" + token, agent_name="a", key_hash=hash_key(token))
        d = k.model_dump(mode="json")
        if revoked:
            d["revoked_at"] = "2026-01-01T00:00:00+00:00"
        self.docs[k.key_hash] = d

    def find(self, kind: str, size: int, key_hash: str) -> list[dict[str, Any]]:
        self.finds += 1
        return [self.docs[key_hash]] if key_hash in self.docs else []


def test_keys_version_is_read_at_most_once_per_bound_and_a_change_applies_within_it() -> None:
    store, version, reads = _Keys(), [0], [0]

    def v() -> int:
        reads[0] += 1
        return version[0]

    store.add("t1")
    look = KeyLookup(store, version=v, check_s=0.2)
    assert look("t1") is not None
    for _ in range(50):
        assert look("t1") is not None
    assert reads[0] == 1 and store.finds == 1  # no I/O per request
    assert look.answered("t1")[0] and look.answered("t1")[1] is not None
    store.add("t1", revoked=True)
    version[0] += 1  # another replica revoked it
    deadline = time.monotonic() + 0.2 + 0.05
    while look("t1") is not None:
        assert time.monotonic() < deadline, "revocation not applied within the bound"
        time.sleep(0.01)
    assert look.answered("t1") == (True, None)


def test_embedded_lookup_ttl_bounds_a_revocation_by_another_process() -> None:
    store = _Keys()
    store.add("t2")
    look = KeyLookup(store, ttl_s=0.1)
    assert look("t2") is not None
    store.add("t2", revoked=True)
    time.sleep(0.11)
    assert look("t2") is None
    assert look.answered("unknown") == (False, None)  # never looked up: the caller must do the I/O


def test_live_checks_a_key_looked_up_earlier_through_the_same_cache() -> None:
    """``KeyLookup.live`` (a request that waited for a thread after its lookup, issue 20 hostile review): the cached
    answer without I/O, the revocation once the cache forgets, and a key without its hash is never live."""
    store = _Keys()
    store.add("t3")
    look = KeyLookup(store, ttl_s=60)
    key = look("t3")
    assert key is not None and look.live(key) and store.finds == 1  # answered from memory
    store.add("t3", revoked=True)
    look.forget()  # what ops.revoke_key does in this process
    assert not look.live(key)
    assert not look.live(key.model_copy(update={"key_hash": ""}))


class _Records:
    def __init__(self, sources: list[Source], states: dict[str, dict[str, Any]]) -> None:
        self.sources, self.states, self.lists = sources, states, 0

    def list_sources(self, agent_name: str | None = None) -> list[Source]:
        self.lists += 1
        return [s for s in self.sources if agent_name is None or s.agent_name == agent_name]

    def get(self, kind: str, rid: str) -> dict[str, Any] | None:
        return self.states.get(rid)


def test_pinned_refs_are_cached_for_the_bound_and_forgotten_on_a_local_pin() -> None:
    forget_pinned()
    src = Source(id="src_p", agent_name="ag", context_id="c", repo_url="https://example.invalid/r.git", ref="main")
    rec = _Records([src], {"src_p": {"refs": {"main": {"commit": "1" * 40}}}})
    scope = ScopeFilter("ag", ("c",))
    assert _pinned_refs(rec, scope, 0.2) == ()
    assert _pinned_refs(rec, scope, 0.2) == () and rec.lists == 1
    pin = "2" * 40
    rec.states["src_p"]["refs"][pin] = {"pinned": True}
    forget_pinned()  # what ops.pin_commit does after writing the pin
    assert _pinned_refs(rec, scope, 0.2) == (pin,)
    rec.states["src_p"]["refs"]["3" * 40] = {"pinned": True}  # a pin by another process: seen within the bound
    time.sleep(0.21)
    assert _pinned_refs(rec, scope, 0.2) == (pin, "3" * 40)
    assert _pinned_refs(rec, ScopeFilter("ag", ("other",)), 0.2) == ()
