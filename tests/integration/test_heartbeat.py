"""The worker heartbeat re-stamps only the unacknowledged messages it holds (real Redis, a private index key)."""

from __future__ import annotations

import time
import uuid

from scopekb_worker.heartbeat import Heartbeat, HeldTags, stamp


def test_stamp_refreshes_held_tags_and_never_revives_acked_ones(redis_client) -> None:
    key = f"it-unacked-index-{uuid.uuid4().hex[:8]}"
    old = time.time() - 3600
    redis_client.zadd(key, {"held": old, "other": old})
    try:
        assert stamp(redis_client, ["held", "acked-meanwhile"], key) == ["acked-meanwhile"]
        assert redis_client.zscore(key, "held") > time.time() - 5
        assert redis_client.zscore(key, "other") == old  # another worker's message is left to the timeout
        assert redis_client.zscore(key, "acked-meanwhile") is None  # XX: an acknowledged tag is not re-added
        assert stamp(redis_client, [], key) == []

        redis_client.zadd(key, {"held": old})
        held = HeldTags()
        held.add("held")
        held.add("acked")
        beat = Heartbeat(redis_client, interval_s=0.05, held=held, index_key=key)
        beat.start()
        deadline = time.monotonic() + 5
        while (redis_client.zscore(key, "held") == old or held.snapshot() != ["held"]) and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        beat.stop()
        beat.join(timeout=5)
        assert redis_client.zscore(key, "held") > time.time() - 5 and beat.beats >= 1
        assert held.snapshot() == ["held"]  # the acknowledged tag was forgotten
    finally:
        redis_client.delete(key)
