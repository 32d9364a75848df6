"""The coordination interface on Redis (distributed profile): one client per process, short timeouts.

Every ``redis`` exception is translated into :class:`scopekb.errors.Transient` here; callers never see redis-py
types.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from scopekb.coordination import Coordination
from scopekb.errors import Transient

T = TypeVar("T")

_EXTEND_IF_EQUAL = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
                    "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0")
_DELETE_IF_EQUAL = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
#: -1 without a write when ARGV[4] is not empty and GET KEYS[2] (missing: '0') differs from it; else SET KEYS[1]
#: ARGV[1] NX PX ARGV[2] (0 when it existed) and, when set, SET KEYS[i] ARGV[i+2] PX ARGV[3] for KEYS[3..] (1).
_SET_NX_WITH = ("if ARGV[4] ~= '' and (redis.call('get', KEYS[2]) or '0') ~= ARGV[4] then return -1 end "
                "if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end "
                "for i = 3, #KEYS do redis.call('set', KEYS[i], ARGV[i + 2], 'PX', ARGV[3]) end return 1")


class RedisCoordination(Coordination):
    """:class:`Coordination` over one ``redis.Redis`` client (thread-safe, pooled).

    Args:
        client: the process's Redis client (socket timeouts of a few seconds: a request never hangs on Redis).
    """

    kind = "redis"

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._set_nx_with_script = client.register_script(_SET_NX_WITH)  # EVALSHA, EVAL once when not cached

    @classmethod
    def from_url(cls, url: str) -> RedisCoordination:
        """A coordination on a new client for ``url`` (socket timeout 5 s, connect timeout 3 s)."""
        return cls(redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3))

    @staticmethod
    def _call(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except redis.RedisError as e:
            raise Transient(f"coordination backend unavailable (Redis: {type(e).__name__})") from e

    def ping(self) -> None:
        """Raise :class:`Transient` when Redis does not answer."""
        self._call(self.client.ping)

    def eviction_policy(self) -> tuple[str, int]:
        """``(maxmemory-policy, maxmemory)`` from ``CONFIG GET``."""
        def read() -> tuple[str, int]:
            policy = str(self.client.config_get("maxmemory-policy").get("maxmemory-policy", "?"))
            return policy, int(self.client.config_get("maxmemory").get("maxmemory", 0) or 0)
        return self._call(read)

    def _set(self, key: str, value: str, ttl_s: float | None = None, nx: bool = False) -> bool:
        px = int(ttl_s * 1000) if ttl_s else None
        return bool(self._call(lambda: self.client.set(key, value, px=px, nx=nx)))

    def _get(self, key: str) -> bytes | None:
        return self._call(lambda: self.client.get(key))  # type: ignore[return-value]  # bytes client

    def _delete(self, *names: str) -> None:
        if names:
            self._call(lambda: self.client.delete(*names))

    def _exists(self, key: str) -> bool:
        return bool(self._call(lambda: self.client.exists(key)))

    def _any(self, pattern: str) -> bool:
        return self._call(lambda: any(True for _ in self.client.scan_iter(pattern, count=100)))

    def _values(self, pattern: str) -> list[bytes]:
        def read() -> list[bytes]:
            names = list(self.client.scan_iter(pattern, count=500))
            out: list[bytes] = []
            for i in range(0, len(names), 500):
                out += [v for v in self.client.mget(names[i:i + 500]) if v is not None]
            return out
        return self._call(read)

    def _incr(self, key: str, ttl_s: float | None = None, forget: Sequence[str] = ()) -> int:
        def run() -> Any:
            pipe = self.client.pipeline(transaction=False)
            if forget:
                pipe.delete(*forget)
            pipe.incr(key)
            if ttl_s:
                pipe.expire(key, int(ttl_s))
            return pipe.execute()
        res = self._call(run)
        return int(res[1 if forget else 0])

    def _set_nx_with(self, key: str, value: str, ttl_s: float, others: Sequence[tuple[str, str]],
                     others_ttl_s: float, unless: tuple[str, str] | None = None) -> int:
        check_key, expected = unless or (key, "")
        names = [key, check_key, *(k for k, _ in others)]
        argv = [value, max(1, int(ttl_s * 1000)), max(1, int(others_ttl_s * 1000)), expected, *(v for _, v in others)]
        return int(self._call(lambda: self._set_nx_with_script(keys=names, args=argv)))

    def _extend_if(self, key: str, token: str, ttl_s: float) -> bool:
        return bool(self._call(lambda: self.client.eval(_EXTEND_IF_EQUAL, 1, key, token, int(ttl_s * 1000))))

    def _delete_if(self, key: str, token: str) -> bool:
        return bool(self._call(lambda: self.client.eval(_DELETE_IF_EQUAL, 1, key, token)))
