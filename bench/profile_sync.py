"""Profile a full keyword-only sync of the large benchmark repository (not a test; issue 20).

Runs :func:`scopekb.indexing.run_sync` in this process, under cProfile, on the first release of the full bench
profile's large repository (django 4.2.13, built from its sdist into the bench's cache like ``bench/run`` does),
against the services ``bench/run`` uses (OpenSearch, S3; a private alias, system prefix and bucket, deleted at
the end). Prints the wall time, the job's counts and the functions with the most own time and cumulative time,
and writes the raw profile to ``bench/results/profile-sync-<stamp>.pstats``.

    .venv/bin/python bench/profile_sync.py [--top 25] [--package django --versions 4.2.13,4.2.14]

To profile another checkout's pipeline with the same environment, put its ``shared`` folder first on the path:
``PYTHONPATH=/path/to/checkout/shared .venv/bin/python bench/profile_sync.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[1:1] = [str(REPO / "bench")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default="django")
    ap.add_argument("--versions", default="4.2.13,4.2.14")
    ap.add_argument("--prefer", default="django/")
    ap.add_argument("--top", type=int, default=25)
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
            t0 = time.perf_counter()
            prof.enable()
            job = run_sync(rt.sync_deps(), f"{run_id}-full", [src.id], trigger="bench")
            prof.disable()
            wall = time.perf_counter() - t0
        finally:
            cleanup(endpoints, run_id)
    print(f"full sync of {args.package} {built.versions[0]}: {wall:.1f} s wall; files {job.files_indexed}, "
          f"chunks written {job.chunks_written}, state {job.state.value}")
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


if __name__ == "__main__":
    sys.exit(main())
