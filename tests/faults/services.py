"""A private set of real services (Redis, OpenSearch + k-NN, SeaweedFS S3) for the fault suite.

Other test runs use the default instance of ``scripts/services`` (ports 6379/9200/8333) at the same time, so
faults are never injected there. This module starts a second, independent instance through the same script
with its own state folder (``SCOPEKB_SERVICES_DIR``) and its own ports (``SCOPEKB_SERVICES_*_PORT``), and
stops, kills or restarts only the processes of that instance (by the pid files in its state folder).

The download and build cache (Maven jars, the OpenSearch layout, the SeaweedFS wheel) is shared with the
default instance through a symlink, so a private instance costs no downloads.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "services"
HOST = "127.0.0.1"

_PORT_VARS = ("REDIS_PORT", "OPENSEARCH_PORT", "OPENSEARCH_TRANSPORT_PORT", "S3_PORT", "WEED_MASTER_PORT",
              "WEED_VOLUME_PORT", "WEED_FILER_PORT", "WEED_ADMIN_PORT")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    with contextlib.closing(socket.socket()) as c:
        c.settimeout(0.2)
        return c.connect_ex((HOST, port)) != 0


def pick_ports(n: int, span: int = 1) -> list[int]:
    """``n`` free ports in 20000-29999, each with its +10000 neighbour free too (SeaweedFS gRPC ports) and, with
    ``span`` > 1, the ``span - 1`` ports after it (the nodes of an OpenSearch cluster: port + i)."""
    rng = random.Random()
    out: list[int] = []
    taken: set[int] = set()
    while len(out) < n:
        p = rng.randrange(20000, 30000 - span)
        block = {q for i in range(span) for q in (p + i, p + i + 10000)}
        if block & taken or not all(_port_free(q) for q in block):
            continue
        out.append(p)
        taken |= block
    return out


def shared_cache() -> Path:
    """The default instance's cache folder (created when missing, then filled by the first ``up``)."""
    base = Path(os.environ.get("SCOPEKB_SERVICES_DIR") or ROOT / ".services").resolve()
    cache = base / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    return cache.resolve()


class PrivateServices:
    """One private instance of ``scripts/services`` in ``state`` on randomly chosen free ports."""

    def __init__(self, state: Path, java_opts: str = "-Xms512m -Xmx1g", opensearch_nodes: int = 1) -> None:
        self.state = state
        self.state.mkdir(parents=True, exist_ok=True)
        link = self.state / "cache"
        if not link.exists():
            link.symlink_to(shared_cache(), target_is_directory=True)
        ports_file = self.state / "ports.json"  # a reused state folder keeps its ports (its services may run)
        if ports_file.exists():
            self.ports = {k: int(v) for k, v in json.loads(ports_file.read_text()).items()}
        else:
            self.ports = dict(zip(_PORT_VARS, pick_ports(len(_PORT_VARS), span=opensearch_nodes), strict=True))
            ports_file.write_text(json.dumps(self.ports))
        self.script_env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_SERVICES_")}
        self.script_env.update({"SCOPEKB_SERVICES_DIR": str(self.state), "SCOPEKB_OPENSEARCH_JAVA_OPTS": java_opts})
        self.script_env.update({f"SCOPEKB_SERVICES_{k}": str(v) for k, v in self.ports.items()})
        self.nodes = opensearch_nodes
        self.script_env["SCOPEKB_SERVICES_OPENSEARCH_NODES"] = str(opensearch_nodes)

    # ---- addresses ---------------------------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.ports['REDIS_PORT']}/0"

    @property
    def opensearch_url(self) -> str:
        return f"http://{HOST}:{self.ports['OPENSEARCH_PORT']}"

    @property
    def opensearch_urls(self) -> list[str]:
        """Every node's URL (one for a single node)."""
        return [f"http://{HOST}:{self.ports['OPENSEARCH_PORT'] + i}" for i in range(self.nodes)]

    def node_url(self, i: int) -> str:
        return f"http://{HOST}:{self.ports['OPENSEARCH_PORT'] + i}"

    @staticmethod
    def node_service(i: int) -> str:
        """The ``scripts/services`` name of node ``i`` of a cluster (``up``/``down`` one node)."""
        return f"opensearch-{i}"

    @staticmethod
    def node_pid_name(i: int) -> str:
        """The pid file name of node ``i`` (node 0 keeps the single-node name)."""
        return "opensearch" if i == 0 else f"opensearch-{i}"

    def client_env(self) -> dict[str, str]:
        """``SCOPEKB_*`` settings of scopekb processes talking to this instance (``scripts/services env``)."""
        out = self._run("env", capture=True).stdout
        env: dict[str, str] = {}
        for line in out.splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export "):].partition("=")
                env[key] = value.strip("'")
        return env

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def _run(self, *args: str, capture: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=self.script_env, cwd=ROOT, text=True,
                              capture_output=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"scripts/services {' '.join(args)} failed ({proc.returncode}):\n"
                               f"{proc.stderr[-3000:]}")
        return proc

    def up(self, *names: str) -> float:
        """Start (and wait until healthy) the named services, or all; returns the seconds it took."""
        t0 = time.monotonic()
        self._run("up", *names)
        return time.monotonic() - t0

    def down(self, *names: str) -> float:
        """Stop the named services (SIGTERM, then SIGKILL after 40 s), or all; returns the seconds it took."""
        t0 = time.monotonic()
        self._run("down", *names)
        return time.monotonic() - t0

    def pid(self, name: str) -> int | None:
        """Pid of this instance's live ``name`` process (pid file checked against the process start time)."""
        try:
            pid_s, start = (self.state / "run" / f"{name}.pid").read_text().split()
            stat = Path(f"/proc/{int(pid_s)}/stat").read_text()
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None
        fields = stat[stat.rindex(")") + 2:].split()
        return int(pid_s) if fields[0] != "Z" and fields[19] == start else None

    def kill(self, name: str) -> int:
        """SIGKILL this instance's ``name`` process (a crash: nothing is flushed); returns the pid killed."""
        pid = self.pid(name)
        if pid is None:
            raise RuntimeError(f"{name} of the private instance is not running")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while self.pid(name) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        (self.state / "run" / f"{name}.pid").unlink(missing_ok=True)
        return pid

    def cluster_report(self, index: str = "*", log_lines: int = 12) -> str:
        """What the cluster says about ``index`` now, for a failure message (a fault test's failure explains itself):
        health (the local view of the first node that answers), shard copies not started, active recoveries, the
        allocation explanation of the first unassigned copy, primary terms and in-sync copies, tasks running over 5 s,
        and each node's last WARN/ERROR log lines. Best effort: what does not answer in 5 s is said so."""
        import httpx

        out: list[str] = []
        base = next((u for u in self.opensearch_urls if _answers(u)), None)
        if base is None:
            out.append("no node answers")
        else:
            asks = (("health", "/_cluster/health?local=true"),
                    ("shards not started", f"/_cat/shards/{index}?h=index,shard,prirep,state,node,unassigned.reason"),
                    ("active recoveries", f"/_cat/recovery/{index}?active_only=true&h=index,shard,stage,type,"
                                          "source_node,target_node,time"),
                    ("allocation explain", "/_cluster/allocation/explain"),
                    ("primary terms, in-sync copies", f"/_cluster/state/metadata/{index}?filter_path=metadata."
                                                      "indices.*.primary_terms,metadata.indices.*.in_sync_allocations"),
                    ("tasks", "/_tasks?detailed=true&group_by=none"))
            for what, path in asks:
                try:
                    r = httpx.get(base + path, timeout=5)
                    text = r.text
                    if what == "shards not started":
                        text = "\n".join(line for line in text.splitlines() if " STARTED" not in line)
                    elif what == "tasks" and r.status_code == 200:
                        text = "\n".join(f"{t['running_time_in_nanos'] / 1e9:.0f}s {t['action']} "
                                         f"{t.get('description', '')[:160]}" for t in r.json().get("tasks", [])
                                         if t["running_time_in_nanos"] > 5e9)
                except Exception as e:  # noqa: BLE001 - a diagnostic: say what failed and go on
                    text = f"({type(e).__name__})"
                out.append(f"-- {what} ({base}{path}):\n{text[:3000]}")
        for i in range(self.nodes):
            lines = [line for line in self.log_tail(self.node_pid_name(i), 400_000).splitlines()
                     if ("[WARN " in line or "[ERROR" in line) and not any(n in line for n in _LOG_NOISE)]
            out.append(f"-- node {i} log, last WARN/ERROR lines:\n" + "\n".join(x[:400] for x in lines[-log_lines:]))
        return "\n".join(out)

    def primaries(self, index: str) -> dict[tuple[str, int], tuple[str, str, int]]:
        """``{(index, shard): (node id of the primary, its state, the index metadata's primary term)}`` from the cluster
        manager's state (``index`` may be a pattern); raises when no cluster manager answers."""
        import httpx

        base = next(u for u in self.opensearch_urls if _answers(u))
        state = httpx.get(f"{base}/_cluster/state/routing_table,metadata/{index}", timeout=10).json()
        out: dict[tuple[str, int], tuple[str, str, int]] = {}
        for name, table in state.get("routing_table", {}).get("indices", {}).items():
            terms = state["metadata"]["indices"][name]["primary_terms"]
            for shard, copies in table["shards"].items():
                for copy in copies:
                    if copy["primary"]:
                        out[(name, int(shard))] = (str(copy["node"]), str(copy["state"]), int(terms[shard]))
        return out

    def repair_unpromoted_primaries(self, index: str, before: dict[tuple[str, int], tuple[str, str, int]],
                                    timeout: float = 90) -> list[str]:
        """Work around an OpenSearch 2.19 state seen after two of three nodes came back from a crash (issue 24): a
        replica made primary on another node while the cluster manager's metadata kept the shard's primary term
        (``before``: :meth:`primaries` taken while the cluster was green). Such a copy never enters primary mode -
        every write, refresh or replica recovery of the shard fails with ``shard_not_in_primary_mode_exception``
        for as long as it lives (over 4 min seen, never ending by itself). An operator's fix is failing that copy
        (``_cluster/reroute`` ``cancel`` with ``allow_primary``): the cluster manager then allocates the primary
        again from an in-sync copy on disk, with a new term. Watches for ``timeout`` seconds while the cluster is not
        green (primaries only relocate, keeping their term, once it is) and fails each such copy once; returns what
        it failed (``index[shard] on node``), empty when the cluster came back as it should."""
        import httpx

        base = next(u for u in self.opensearch_urls if _answers(u))
        fixed: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/_cluster/health", timeout=10).json().get("status") == "green":
                    break
                now = self.primaries(index)
            except Exception:  # noqa: BLE001 - a cluster still electing or restarting: look again
                time.sleep(2)
                continue
            for key, (node, state, term) in now.items():
                old = before.get(key)
                what = f"{key[0]}[{key[1]}] on {node}"
                if (old is None or state != "STARTED" or node == old[0] or term != old[2] or what in fixed):
                    continue
                cmd = {"commands": [{"cancel": {"index": key[0], "shard": key[1], "node": node,
                                                "allow_primary": True}}]}
                r = httpx.post(f"{base}/_cluster/reroute", json=cmd, timeout=30)
                fixed.append(what if r.status_code == 200 else f"{what}: reroute {r.status_code} {r.text[:200]}")
            time.sleep(3)
        return fixed

    def log_tail(self, name: str, chars: int = 3000) -> str:
        try:
            return (self.state / "logs" / f"{name}.log").read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"


#: WARN lines every node logs in normal operation (OpenSearch 2.19), left out of :meth:`PrivateServices.cluster_report`.
_LOG_NOISE = ("Falling back to single shard assignment", "QueryGroup _id can't be null", "r.suppressed")


def _answers(url: str) -> bool:
    """Whether an OpenSearch node answers its root URL within 2 s."""
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
