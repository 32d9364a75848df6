"""Many refs without copies (issue 23): index bytes and sync time of 20 branches next to one, and a pinned release.

Builds the bench's django repository (releases as commits, from the bench's sdist cache like ``bench/run``),
indexes ``main`` at the newest release (keyword-only, real OpenSearch and S3 from ``bench/run``'s services; a
private alias, system prefix and bucket, deleted at the end), then adds 20 branches that each change one file and
syncs them in one job, then pins the oldest release's commit. Prints, as ratios in the same run:

- index bytes with 21 refs / with one (primary store size after a refresh and a merge of deleted documents);
- seconds of the 20-branch sync / seconds of the full index of one;
- the pin: seconds, chunks reused (joined the pin's ref without a write) and chunks written.

    .venv/bin/python bench/refs.py [--package django --versions 4.2.13,4.2.14] [--branches 20]
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[1:1] = [str(REPO / "bench")]


def _git(repo: Path, *args: str, data: bytes | None = None) -> str:
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b",
           "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "--git-dir", str(repo), *args], input=data, check=True, capture_output=True,
                          env=env).stdout.decode().strip()


def _one_file_branch(repo: Path, base: str, name: str, path: str, n: int) -> None:
    """Branch ``name`` = ``base`` plus one commit appending a line to ``path`` (plumbing, no work tree)."""
    blob = _git(repo, "rev-parse", f"{base}:{path}")
    data = subprocess.run(["git", "--git-dir", str(repo), "cat-file", "blob", blob], check=True,
                          capture_output=True).stdout + f"\n# branch {n}\n".encode()
    new = _git(repo, "hash-object", "-w", "--stdin", data=data)
    idx = repo / f"index-{n}"
    env_idx = {"GIT_INDEX_FILE": str(idx)}
    run = {"check": True, "capture_output": True, "env": {**env_idx, "PATH": "/usr/bin:/bin"}}
    subprocess.run(["git", "--git-dir", str(repo), "read-tree", base], **run)  # type: ignore[call-overload]
    subprocess.run(["git", "--git-dir", str(repo), "update-index", "--cacheinfo", f"100644,{new},{path}"],
                   **run)  # type: ignore[call-overload]
    tree = subprocess.run(["git", "--git-dir", str(repo), "write-tree"], **run).stdout.decode().strip()  # type: ignore[call-overload]
    idx.unlink(missing_ok=True)
    commit = _git(repo, "commit-tree", tree, "-p", base, "-m", f"branch {n}")
    _git(repo, "update-ref", f"refs/heads/{name}", commit)


def _store_bytes(client: object, alias: str) -> int:
    client.indices.refresh(index=alias)  # type: ignore[attr-defined]
    client.indices.forcemerge(index=alias, params={"only_expunge_deletes": "true", "request_timeout": 600})  # type: ignore[attr-defined]
    stats = client.indices.stats(index=alias, metric="store")  # type: ignore[attr-defined]
    return int(stats["_all"]["primaries"]["store"]["size_in_bytes"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default="django")
    ap.add_argument("--versions", default="4.2.13,4.2.14")
    ap.add_argument("--prefer", default="django/")
    ap.add_argument("--branches", type=int, default=20)
    args = ap.parse_args()

    from scopekb_bench import corpus
    from scopekb_bench.gitread import settings_for
    from scopekb_bench.services import services
    from scopekb_bench.stack import cleanup

    from scopekb.indexing import run_sync
    from scopekb.models import Source
    from scopekb.refs import put_ref_state
    from scopekb.runtime import build_runtime

    built = corpus.release_repo(args.package, args.versions.split(","), args.prefer)
    run_id = "refs" + secrets.token_hex(3)
    out: dict[str, object] = {"package": args.package, "versions": built.versions, "branches": args.branches}
    with tempfile.TemporaryDirectory(prefix="scopekb-refs-") as tmp, services() as endpoints:
        work = Path(tmp)
        bare = built.clone_bare(work / "repo.git")
        head, oldest = built.releases[-1], built.releases[0]
        _git(bare, "update-ref", "refs/heads/main", head)
        settings = settings_for(endpoints, run_id, "refs", work)
        rt = build_runtime(settings)
        try:
            rt.chunks.ensure_index()
            src = Source(id=f"src_{run_id}", agent_name="bench", context_id="refs", repo_url=str(bare), ref="main",
                         refs=["main", "refsbench-*"], repo_name="bench/refs", webhooks=False)
            rt.records.put_source(src)
            t0 = time.perf_counter()
            full = run_sync(rt.sync_deps(), f"{run_id}-full", [src.id], trigger="bench")
            t_full = time.perf_counter() - t0
            b_one = _store_bytes(rt.opensearch_client, settings.opensearch.alias)
            files = [p for p in _git(bare, "ls-tree", "-r", "--name-only", head).splitlines()
                     if p.startswith(args.prefer) and p.endswith(".py")][:args.branches]
            for n, path in enumerate(files):
                _one_file_branch(bare, head, f"refsbench-{n}", path, n)
            t0 = time.perf_counter()
            many = run_sync(rt.sync_deps(), f"{run_id}-branches", [src.id], trigger="bench")
            t_many = time.perf_counter() - t0
            b_many = _store_bytes(rt.opensearch_client, settings.opensearch.alias)
            put_ref_state(rt.records, src, oldest, {"pinned": True, "expires_at": "2999-01-01T00:00:00+00:00"})
            t0 = time.perf_counter()
            pin = run_sync(rt.sync_deps(), f"{run_id}-pin", [src.id], trigger="bench")
            t_pin = time.perf_counter() - t0
        finally:
            cleanup(endpoints, run_id)
    out.update({
        "full_index_s": round(t_full, 2), "full_chunks": full.chunks_written, "full_files": full.files_indexed,
        "branches_sync_s": round(t_many, 2), "branches_chunks_written": many.chunks_written,
        "branches_chunks_linked": many.chunks_linked, "branches_state": many.state.value,
        "bytes_one_ref": b_one, "bytes_all_refs": b_many,
        "ratio_bytes": round(b_many / b_one, 3), "ratio_branches_sync": round(t_many / t_full, 3),
        "pin_releases_back": len(built.releases) - 1, "pin_s": round(t_pin, 2),
        "pin_chunks_reused": pin.chunks_linked, "pin_chunks_written": pin.chunks_written,
        "pin_state": pin.state.value})
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
