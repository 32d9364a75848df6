"""The sync read phase against ``git cat-file --batch``, side by side with another checkout (issue 20; not a test).

Each round runs :func:`scopekb_bench.gitread.measure` (what ``bench/run --phases gitread`` measures: the baseline
``git ls-tree -r`` + one ``git cat-file --batch``, then a sync stopped after its read phase) in a fresh process
per side, this checkout's code and, with ``--base``, another checkout's (its ``shared``, ``services``,
``workers`` and ``cli`` first on ``PYTHONPATH``); the sides alternate their order every round, so both see the
same machine load. Prints each run's ratio (baseline seconds ÷ sync seconds, the bench's files/s ratio) and the
median per side. With ``--profile`` one more run of this checkout's side is made under cProfile (the sync's read
phase only) and its top functions printed.

    .venv/bin/python bench/gitread_ab.py [--rounds 5] [--base /path/to/old/checkout] [--profile quick|full]
        [--cprofile]

Uses the services of the environment (``SCOPEKB_OPENSEARCH__URL`` ...); deletes what each run made.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench")]

_CHILD = r"""
import cProfile, io, json, pstats, sys, time
from pathlib import Path
from scopekb_bench import gitread
from scopekb_bench.services import endpoint_env
from scopekb_bench.stack import cleanup
args = json.loads(sys.argv[1])
endpoints = endpoint_env()
prof = None
if args["cprofile"]:
    import scopekb.indexing as ix
    prof = cProfile.Profile()
    real = ix.run_sync
    def run_sync(*a, **k):
        prof.enable()
        try:
            return real(*a, **k)
        finally:
            prof.disable()
    gitread.run_sync = run_sync
try:
    g = gitread.measure(endpoints, args["run_id"], Path(args["workdir"]), Path(args["repo"]), args["commit"])
finally:
    cleanup(endpoints, args["run_id"])
if prof is not None:
    buf = io.StringIO()
    for key in ("tottime", "cumulative"):
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(30)
    sys.stderr.write(buf.getvalue())
print("RESULT " + json.dumps(g))
"""


def _side_env(checkout: Path) -> dict[str, str]:
    paths = [str(checkout / d) for d in ("shared", "services", "workers", "cli")] + [str(REPO / "bench")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1"}


def run_side(checkout: Path, repo: Path, commit: str, workdir: Path, cprofile: bool = False) -> dict[str, float]:
    """One :func:`scopekb_bench.gitread.measure` in a fresh process with ``checkout``'s code; its result dict."""
    run_id = "gab" + secrets.token_hex(3)
    args = {"run_id": run_id, "workdir": str(workdir / run_id), "repo": str(repo), "commit": commit,
            "cprofile": cprofile}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], env=_side_env(checkout),
                          capture_output=True, text=True, check=False)
    if cprofile:
        print(proc.stderr)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"side {checkout} failed: {proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--base", type=Path, help="another checkout to compare with (e.g. a worktree of main)")
    ap.add_argument("--profile", default="quick", choices=["quick", "full"])
    ap.add_argument("--cprofile", action="store_true", help="one more run of this checkout under cProfile")
    args = ap.parse_args()

    from scopekb_bench import corpus, profiles

    prof = profiles.QUICK if args.profile == "quick" else profiles.FULL
    pkg, versions, prefer = prof.large
    built = corpus.release_repo(pkg, list(versions), prefer)
    sides = [("new", REPO)] + ([("base", args.base.resolve())] if args.base else [])
    ratios: dict[str, list[float]] = {name: [] for name, _ in sides}
    with tempfile.TemporaryDirectory(prefix="scopekb-gitread-ab-") as tmp:
        work = Path(tmp)
        bare = built.clone_bare(work / "repo.git")
        subprocess.run(["git", "-C", str(bare), "update-ref", "refs/heads/main", built.releases[0]], check=True)
        for r in range(args.rounds):
            for name, checkout in (sides if r % 2 == 0 else sides[::-1]):
                g = run_side(checkout, bare, built.releases[0], work)
                ratio = g["baseline_seconds"] / g["sync_seconds"]
                ratios[name].append(ratio)
                print(f"round {r + 1} {name}: sync {g['sync_files']} files in {g['sync_seconds']:.3f} s, baseline "
                      f"{g['baseline_seconds']:.3f} s, ratio {ratio:.3f}", flush=True)
        if args.cprofile:
            run_side(REPO, bare, built.releases[0], work, cprofile=True)
    for name, vals in ratios.items():
        print(f"{name}: median ratio {statistics.median(vals):.3f} over {len(vals)} runs "
              f"({', '.join(f'{v:.3f}' for v in vals)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
