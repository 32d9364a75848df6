"""Small helpers shared by the benchmark phases: results, percentiles, process CPU/RSS, machine facts."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    """One progress line on stderr, prefixed with the wall clock."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True, file=sys.stderr)


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for an empty list."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] if lo == hi else xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def ratio(value: float, baseline: float) -> float:
    """``value / baseline``; NaN when the baseline is zero or either side is not finite."""
    if not (math.isfinite(value) and math.isfinite(baseline)) or baseline == 0:
        return math.nan
    return value / baseline


@dataclass
class Metric:
    """One reported figure next to its baseline.

    Attributes:
        group: section of the report (``ingest``, ``git``, ``incremental``, ``embedder``, ``query``, ``cost``,
            ``webhook``, ``quality``).
        id: stable dotted id, e.g. ``ingest.keyword.chunks_per_s``.
        label: what is measured, for people.
        value: scopekb's figure; baseline: the baseline's figure (same unit); ratio: value / baseline.
        unit: unit of value and baseline.
        better: ``higher`` or ``lower`` (for reading the ratio); target: a goal for the ratio, if any.
        baseline_label: what the baseline is.
    """

    group: str
    id: str
    label: str
    value: float
    baseline: float
    unit: str
    baseline_label: str
    better: str = "higher"
    target: str = ""
    note: str = ""
    ratio: float = field(init=False)

    def __post_init__(self) -> None:
        self.value = float(self.value)
        self.baseline = float(self.baseline)
        self.ratio = ratio(self.value, self.baseline)


class Results:
    """Everything one run measured: metrics (each a ratio), raw series for plots, inputs and notes."""

    def __init__(self) -> None:
        self.metrics: list[Metric] = []
        self.series: dict[str, Any] = {}
        self.inputs: dict[str, Any] = {}
        self.notes: list[str] = []
        self.errors: list[str] = []
        self.phase_seconds: dict[str, float] = {}

    def add(self, group: str, id: str, label: str, value: float, baseline: float, unit: str,
            baseline_label: str, **kw: Any) -> Metric:
        """Record one metric (replacing an earlier one with the same id)."""
        m = Metric(group, id, label, value, baseline, unit, baseline_label, **kw)
        self.metrics = [x for x in self.metrics if x.id != id] + [m]
        return m

    def get(self, id: str) -> Metric | None:
        """The metric with this id, if recorded."""
        return next((m for m in self.metrics if m.id == id), None)

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict of the whole run."""
        return {"metrics": [asdict(m) for m in self.metrics], "series": self.series, "inputs": self.inputs,
                "notes": self.notes, "errors": self.errors, "phase_seconds": self.phase_seconds}


class Timer:
    """``with Timer() as t: ...``; then ``t.seconds``."""

    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        self.seconds = math.nan
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0


def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    total = 0.0
    for p in _tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def stop_processes(procs: Iterable[subprocess.Popen[Any]], timeout_s: float = 20) -> None:
    """Terminate the given processes (by their own pids), then kill any still running after ``timeout_s``."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def _pss(p: psutil.Process) -> int:
    """Proportional set size of a process (shared pages split between their users), from ``smaps_rollup``; the
    RSS where that file cannot be read."""
    try:
        for line in Path(f"/proc/{p.pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return p.memory_info().rss


def tree_rss(pid: int) -> int:
    """Memory of a process and its live descendants in bytes: the sum of their proportional set sizes, so pages
    shared after a fork (Celery's prefork pool) are not counted twice."""
    total = 0
    for p in _tree(pid):
        try:
            total += _pss(p)
        except psutil.NoSuchProcess:
            pass
    return total


class RssSampler:
    """Samples the RSS of process trees every ``interval`` seconds in a thread; ``peak`` is the largest sum seen.

    The first sample is taken at start, so a short window still has one.
    """

    def __init__(self, pids: Iterable[int], interval: float = 0.2) -> None:
        self.pids = list(pids)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, sum(tree_rss(p) for p in self.pids))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def machine_info() -> dict[str, Any]:
    """CPU model, logical CPUs, memory, OS, Python and the load average at start."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        git_rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, check=False).stdout.strip()
    except OSError:
        git_rev = ""
    return {"cpu": model, "logical_cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "os": platform.platform(), "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "scopekb_commit": git_rev}


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean/n of a latency list (same unit as the input)."""
    return {"p50": pct(values, 50), "p95": pct(values, 95), "p99": pct(values, 99),
            "mean": statistics.fmean(values) if values else math.nan, "n": len(values)}
