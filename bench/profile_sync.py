"""Profile a full keyword-only sync of the large benchmark repository (not a test; issue 20).

Runs :func:`scopekb.indexing.run_sync` in this process, under cProfile, on the first release of the full bench
profile's large repository (django 4.2.13, built from its sdist into the bench's cache like ``bench/run`` does),
against the services ``bench/run`` uses (OpenSearch, S3; a private alias, system prefix and bucket, deleted at
the end). Prints the wall time, the job's counts and the functions with the most own time and cumulative time,
and writes the raw profile to ``bench/results/profile-sync-<stamp>.pstats``.

    .venv/bin/python bench/profile_sync.py [--top 25] [--package django --versions 4.2.13,4.2.14]
    .venv/bin/python bench/profile_sync.py --py-spy /path/to/py-spy   # sample every thread instead (issue 20)

With ``--py-spy`` the sync is sampled by py-spy (``record --threads --format raw``, 100 Hz, active samples only)
instead of cProfile: every thread counts (the writer thread, blob uploads), with no per-call overhead; the
script prints each function's share of the samples as own time (leaf frame) and inclusive, and writes the
collapsed stacks to ``bench/results/profile-sync-<stamp>.txt``.

To profile another checkout's pipeline with the same environment, put its ``shared`` folder first on the path:
``PYTHONPATH=/path/to/checkout/shared .venv/bin/python bench/profile_sync.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[1:1] = [str(REPO / "bench")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default="django")
    ap.add_argument("--versions", default="4.2.13,4.2.14")
    ap.add_argument("--prefer", default="django/")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--py-spy", dest="py_spy", help="py-spy executable: sample every thread instead of cProfile")
    args = ap.parse_args()

    from scopekb_bench import corpus
    from scopekb_bench.gitread import settings_for
    from scopekb_bench.services import services
    from scopekb_bench.stack import cleanup

    import scopekb
    from scopekb.indexing import run_sync
    from scopekb.models import Source
    from scopekb.runtime import build_runtime

    print(f"scopekb from {Path(scopekb.__file__).parent}")
    built = corpus.release_repo(args.package, args.versions.split(","), args.prefer)
    run_id = "prof" + secrets.token_hex(3)
    with tempfile.TemporaryDirectory(prefix="scopekb-profile-") as tmp, services() as endpoints:
        work = Path(tmp)
        bare = built.clone_bare(work / "repo.git")
        subprocess.run(["git", "-C", str(bare), "update-ref", "refs/heads/main", built.releases[0]], check=True)
        settings = settings_for(endpoints, run_id, "profile", work)
        rt = build_runtime(settings)
        try:
            rt.chunks.ensure_index()
            src = Source(id=f"src_{run_id}", agent_name="bench", context_id="profile", repo_url=str(bare),
                         ref="main", repo_name="bench/profile")
            rt.records.put_source(src)
            prof = cProfile.Profile()
            spy_out = REPO / "bench" / "results" / f"profile-sync-{time.strftime('%Y%m%d-%H%M%S')}.txt"
            spy = _start_py_spy(args.py_spy, spy_out) if args.py_spy else None
            t0 = time.perf_counter()
            if spy is None:
                prof.enable()
            job = run_sync(rt.sync_deps(), f"{run_id}-full", [src.id], trigger="bench")
            if spy is None:
                prof.disable()
            wall = time.perf_counter() - t0
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=120)
        finally:
            cleanup(endpoints, run_id)
    print(f"full sync of {args.package} {built.versions[0]}: {wall:.1f} s wall; files {job.files_indexed}, "
          f"chunks written {job.chunks_written}, state {job.state.value}")
    if args.py_spy:
        _summarise_py_spy(spy_out, args.top)
        print(f"collapsed stacks written to {spy_out.relative_to(REPO)}")
        return 0
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"profile-sync-{time.strftime('%Y%m%d-%H%M%S')}.pstats"
    prof.dump_stats(str(path))
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(args.top)
        print(f"--- top {args.top} by {key} ---")
        print("\n".join(ln for ln in buf.getvalue().splitlines() if ln.strip() and not ln.startswith("   Ordered")))
    print(f"profile written to {path.relative_to(REPO)}")
    return 0


def _start_py_spy(exe: str, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling this process (every thread, active samples only) into ``out`` (collapsed stacks)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([exe, "record", "--pid", str(os.getpid()), "--threads", "--rate", "100", "--format", "raw",
                             "--nonblocking", "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(2)  # py-spy attaches
    return proc


def _summarise_py_spy(path: Path, top: int) -> None:
    """Print the functions with the largest share of samples: own (leaf frame) and inclusive (anywhere on the
    stack, counted once per sample), and the share per thread kind told by the stack (the sync's thread, the
    writer, blob uploads, opensearch-py's bulk threads)."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = stack.split(";")
        total += count
        kind = ("writer" if "_write_batch" in stack else "blob uploads" if "blobs.py" in stack
                else "sync" if "run_sync" in stack else "bulk threads" if "helpers" in stack else "other")
        threads[kind] += count
        funcs = [_func(f) for f in frames[1:]]
        if funcs:
            own[funcs[-1]] += count
        for f in set(funcs):
            incl[f] += count
    print(f"py-spy: {total} active samples (100 Hz, all threads)")
    print("by thread: " + ", ".join(f"{k} {v / total:.0%}" for k, v in threads.most_common()))
    for title, c in (("own time (leaf frame)", own), ("inclusive", incl)):
        print(f"--- top {top} by {title}: share of samples ---")
        for f, v in c.most_common(top):
            print(f"{v / total:6.1%}  {f}")


def _func(frame: str) -> str:
    """``fn (path/to/file.py:12)`` → ``file.py:fn`` (line numbers dropped so a function adds up)."""
    name, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    return f"{file}:{name.strip()}"


if __name__ == "__main__":
    sys.exit(main())
