"""The embedded in-process key store behaves like the Redis calls scopekb makes (dedupe, markers, locks)."""

from __future__ import annotations

import threading
import time

from scopekb.kv import MemoryKV


def test_set_nx_expiry_incr_and_scan() -> None:
    kv = MemoryKV()
    assert kv.set("d:1", "1", nx=True, ex=1) and not kv.set("d:1", "2", nx=True)
    assert kv.get("d:1") == b"1" and kv.exists("d:1") == 1
    assert kv.incr("v") == 1 and kv.incr("v") == 2 and kv.get("v") == b"2"
    assert sorted(kv.scan_iter("d:*")) == [b"d:1"]
    kv.expire("d:1", 0)
    time.sleep(0.01)
    assert kv.get("d:1") is None and kv.set("d:1", "3", nx=True)
    res = kv.pipeline(transaction=False).incr("n").expire("n", 60).execute()
    assert res == [1, True] and kv.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"


def test_lock_excludes_other_holders_and_only_the_owner_releases() -> None:
    kv = MemoryKV()
    a = kv.lock("L", timeout=5, blocking_timeout=0.2, thread_local=False)
    b = kv.lock("L", timeout=5, blocking_timeout=0.2)
    assert a.acquire(token="host:1:a") and not b.acquire(blocking=False)
    assert a.extend(5, replace_ttl=True) and not b.extend(5)
    b.release()  # not the owner: nothing happens
    assert kv.get("L") == b"host:1:a"
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.acquire(blocking_timeout=2)))
    t.start()
    a.release()
    t.join()
    assert got == [True] and kv.exists("L") == 1
