#!/usr/bin/env python3
"""Container health check for every scopekb process (the image's ``HEALTHCHECK``; standard library only).

    scopekb-healthcheck          find the container's ``scopekb`` command and check it (below)
    scopekb-healthcheck URL      GET URL instead; healthy on HTTP 200

What "healthy" means, by the command the container runs:
    serve ingester|query   GET http://127.0.0.1:<--port>/healthz answers 200 (default ports 8001 / 8000)
    worker, beat           the process is running and the Celery broker (SCOPEKB_REDIS__URL) answers PING
    init and others        the process is running

Exit 0 when healthy, 1 otherwise, with one line on stdout saying why (Docker keeps it in the health log).
Kubernetes ignores HEALTHCHECK; the Helm chart declares its own probes on the same endpoints.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_PORTS = {"ingester": 8001, "query": 8000}
TIMEOUT_S = 4.0


def scopekb_args(cmdline: list[str]) -> list[str] | None:
    """The arguments after the ``scopekb`` console script in one process's argv, or None if it is not one."""
    for i, arg in enumerate(cmdline):
        if os.path.basename(arg) == "scopekb":
            return cmdline[i + 1:]
    return None


def find_command(proc: Path = Path("/proc")) -> list[str] | None:
    """Arguments of the running ``scopekb`` command in this container (the deepest such process wins)."""
    found: list[str] | None = None
    me = os.getpid()
    for entry in sorted(proc.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # the process ended while we looked
            continue
        args = scopekb_args([a.decode(errors="replace") for a in raw.split(b"\0") if a])
        if args is not None:
            found = args
    return found


def option(args: list[str], name: str) -> str | None:
    """Value of ``--name VALUE`` or ``--name=VALUE`` in args."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def health_url(args: list[str]) -> str | None:
    """The local health endpoint of a ``serve`` command, or None for processes without HTTP."""
    if len(args) >= 2 and args[0] == "serve" and args[1] in DEFAULT_PORTS:
        port = option(args, "--port") or str(DEFAULT_PORTS[args[1]])
        return f"http://127.0.0.1:{port}/healthz"
    return None


def check_http(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 (a local, fixed URL)
            return resp.status == 200, f"{url} answered {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url} answered {exc.code}"
    except (OSError, ValueError) as exc:
        return False, f"{url} unreachable: {exc}"


def check_redis(url: str) -> tuple[bool, str]:
    """The broker answers a RESP PING (``-NOAUTH`` also proves it is up; we hold no password here)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if parts.scheme == "unix":
        return True, "broker on a unix socket: not checked"
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
            if parts.scheme == "rediss":
                return True, f"broker {host}:{port} accepts connections (TLS)"
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError as exc:
        return False, f"broker {host}:{port} unreachable: {exc}"
    ok = reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR operation not permitted"))
    return ok, f"broker {host}:{port} replied {reply[:20]!r}"


def main(argv: list[str]) -> int:
    if argv:
        ok, why = check_http(argv[0])
    else:
        args = find_command()
        if args is None:
            ok, why = False, "no scopekb process found"
        elif (url := health_url(args)) is not None:
            ok, why = check_http(url)
        elif args and args[0] in ("worker", "beat"):
            ok, why = check_redis(os.environ.get("SCOPEKB_REDIS__URL", "redis://127.0.0.1:6379/0"))
            why = f"scopekb {args[0]} running; {why}"
        else:
            ok, why = True, f"scopekb {' '.join(args[:1])} running"
    print(("healthy: " if ok else "unhealthy: ") + why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
