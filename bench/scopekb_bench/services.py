"""The backing services (OpenSearch, Redis, S3) for a run: use them when up, else start them and stop only those.

Endpoints come from the ``SCOPEKB_*`` settings in the environment, or from ``scripts/services env`` when those are
not set. A service that does not answer is started with ``scripts/services up NAME`` and stopped with
``scripts/services down NAME`` when the run ends; a service that was already up is left alone.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
from collections.abc import Iterator

import httpx
import redis
from minio import Minio

from scopekb_bench.util import REPO, log

SERVICES_SCRIPT = REPO / "scripts" / "services"
ENDPOINT_VARS = ("SCOPEKB_OPENSEARCH__URL", "SCOPEKB_REDIS__URL", "SCOPEKB_S3__ENDPOINT", "SCOPEKB_S3__ACCESS_KEY",
                 "SCOPEKB_S3__SECRET_KEY", "SCOPEKB_S3__SECURE")


def endpoint_env() -> dict[str, str]:
    """The ``SCOPEKB_*`` endpoint settings: from the environment when set, else from ``scripts/services env``."""
    if os.environ.get("SCOPEKB_OPENSEARCH__URL"):
        return {k: os.environ[k] for k in ENDPOINT_VARS if k in os.environ}
    out = subprocess.run([str(SERVICES_SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    env: dict[str, str] = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            k, _, v = line[len("export "):].partition("=")
            env[k] = shlex.split(v)[0] if v else ""
    return {k: v for k, v in env.items() if k in ENDPOINT_VARS}


def _up(name: str, env: dict[str, str]) -> bool:
    try:
        if name == "opensearch":
            return httpx.get(env["SCOPEKB_OPENSEARCH__URL"], timeout=3).status_code == 200
        if name == "redis":
            return bool(redis.Redis.from_url(env["SCOPEKB_REDIS__URL"], socket_timeout=3).ping())
        if name == "s3":
            Minio(env["SCOPEKB_S3__ENDPOINT"], access_key=env.get("SCOPEKB_S3__ACCESS_KEY", ""),
                  secret_key=env.get("SCOPEKB_S3__SECRET_KEY", ""),
                  secure=env.get("SCOPEKB_S3__SECURE", "false").lower() == "true").list_buckets()
            return True
    except Exception:  # noqa: BLE001 - any failure means "not answering"
        return False
    return False


@contextlib.contextmanager
def services(start_missing: bool = True) -> Iterator[dict[str, str]]:
    """Yield the endpoint environment with every service answering; stop on exit only what was started here.

    Raises:
        RuntimeError: a service is down and ``start_missing`` is False, or it did not come up.
    """
    env = endpoint_env()
    down = [n for n in ("opensearch", "redis", "s3") if not _up(n, env)]
    started: list[str] = []
    try:
        if down:
            if not start_missing:
                raise RuntimeError(f"services not answering: {', '.join(down)} (run scripts/services up)")
            log(f"starting services that are down: {', '.join(down)}")
            subprocess.run([str(SERVICES_SCRIPT), "up", *down], check=True)
            started = down
            env = endpoint_env()
            still = [n for n in down if not _up(n, env)]
            if still:
                raise RuntimeError(f"services did not come up: {', '.join(still)}")
        yield env
    finally:
        if started:
            log(f"stopping the services this run started: {', '.join(started)}")
            subprocess.run([str(SERVICES_SCRIPT), "down", *started], check=False)
