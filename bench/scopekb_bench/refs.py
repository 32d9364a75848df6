"""Many refs without copies (issue 23): index bytes and sync time of N one-file branches next to one ref, and a
commit pinned several releases back; phase ``refs`` of ``bench/run``.

The repository is built from released sdists (one commit per release, oldest first, cached like every bench
input). ``main`` points at the newest release and is indexed in full (keyword-only, in this process, on the
run's real OpenSearch and S3; private alias, system prefix and bucket, deleted by the run's cleanup). Then N
branches are created, each ``main`` plus one commit appending a line to one ``.py`` file, and synced in one job;
then the oldest release's commit is pinned and synced. Figures, as ratios within the run:

- ``refs.index_bytes``: primary store bytes with N+1 refs ÷ with ``main`` alone (after a refresh and a merge that
  expunges deleted documents), target ≤ 1.1 (issue 23);
- ``refs.branches_sync_time``: seconds of the N-branch sync ÷ seconds of the full index of ``main``, target ≤ 0.2;
- ``refs.pin_time``: seconds of the pin's sync ÷ the full index, with chunks reused (joined the pin without a
  write) and chunks written in the note.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from scopekb_bench import corpus
from scopekb_bench.gitread import settings_for
from scopekb_bench.util import Results, log


def _git(repo: Path, *args: str, data: bytes | None = None, env: dict[str, str] | None = None) -> str:
    base = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b",
            "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "--git-dir", str(repo), *args], input=data, check=True, capture_output=True,
                          env={**base, **(env or {})}).stdout.decode().strip()


def one_file_branch(repo: Path, base: str, name: str, path: str, n: int) -> None:
    """Branch ``name`` = ``base`` plus one commit appending a line to ``path`` (plumbing, no work tree)."""
    data = subprocess.run(["git", "--git-dir", str(repo), "cat-file", "blob", f"{base}:{path}"], check=True,
                          capture_output=True).stdout + f"\n# branch {n}\n".encode()
    new = _git(repo, "hash-object", "-w", "--stdin", data=data)
    idx = {"GIT_INDEX_FILE": str(repo / f"index-{n}")}
    _git(repo, "read-tree", base, env=idx)
    _git(repo, "update-index", "--cacheinfo", f"100644,{new},{path}", env=idx)
    tree = _git(repo, "write-tree", env=idx)
    (repo / f"index-{n}").unlink(missing_ok=True)
    _git(repo, "update-ref", f"refs/heads/{name}", _git(repo, "commit-tree", tree, "-p", base, "-m", f"branch {n}"))


def store_bytes(client: Any, alias: str) -> int:
    """Primary store bytes of ``alias`` after a refresh and a merge that expunges deleted documents."""
    client.indices.refresh(index=alias)
    client.indices.forcemerge(index=alias, params={"only_expunge_deletes": "true", "request_timeout": 900})
    stats = client.indices.stats(index=alias, metric="store")
    return int(stats["_all"]["primaries"]["store"]["size_in_bytes"])


def measure(res: Results, endpoints: dict[str, str], run_id: str, workdir: Path,
            project: tuple[str, tuple[str, ...], str], branches: int) -> dict[str, Any]:
    """Run the phase (see the module docstring) and record its metrics in ``res``; returns the raw figures."""
    from scopekb.indexing import run_sync
    from scopekb.models import Source
    from scopekb.refs import put_ref_state
    from scopekb.runtime import build_runtime

    package, versions, prefer = project
    built = corpus.release_repo(package, list(versions), prefer)
    bare = built.clone_bare(workdir / "refs.git")
    head, oldest = built.releases[-1], built.releases[0]
    _git(bare, "update-ref", "refs/heads/main", head)
    settings = settings_for(endpoints, run_id, "refs", workdir)
    rt = build_runtime(settings)
    rt.chunks.ensure_index()
    alias = settings.opensearch.alias
    src = Source(id=f"src_refs{run_id}", agent_name="bench", context_id="refs", repo_url=str(bare), ref="main",
                 refs=["main", "refsbench-*"], repo_name="bench/refs", webhooks=False)
    rt.records.put_source(src)
    t0 = time.perf_counter()
    full = run_sync(rt.sync_deps(), f"bench-{run_id}-refs-full", [src.id], trigger="bench")
    t_full = time.perf_counter() - t0
    b_one = store_bytes(rt.opensearch_client, alias)
    log(f"refs: main of {package} {versions[-1]}: {full.chunks_written} chunks in {t_full:.1f} s, "
        f"{b_one / 2**20:.1f} MiB")
    files = [p for p in _git(bare, "ls-tree", "-r", "--name-only", head).splitlines()
             if p.startswith(prefer) and p.endswith(".py")][:branches]
    for n, path in enumerate(files):
        one_file_branch(bare, head, f"refsbench-{n}", path, n)
    t0 = time.perf_counter()
    many = run_sync(rt.sync_deps(), f"bench-{run_id}-refs-branches", [src.id], trigger="bench")
    t_many = time.perf_counter() - t0
    b_many = store_bytes(rt.opensearch_client, alias)
    log(f"refs: {len(files)} branches in {t_many:.1f} s ({many.state.value}), {b_many / 2**20:.1f} MiB")
    put_ref_state(rt.records, src, oldest, {"pinned": True, "expires_at": "2999-01-01T00:00:00+00:00"})
    t0 = time.perf_counter()
    pin = run_sync(rt.sync_deps(), f"bench-{run_id}-refs-pin", [src.id], trigger="bench")
    t_pin = time.perf_counter() - t0
    back = len(built.releases) - 1
    log(f"refs: pin {versions[0]} ({back} releases back) in {t_pin:.1f} s: {pin.chunks_linked} chunks reused, "
        f"{pin.chunks_written} written")
    base_label = f"full index of main ({package} {versions[-1]}, keyword-only, same run)"
    res.add("refs", "refs.index_bytes", f"index bytes with main + {len(files)} one-file branches ÷ main alone",
            b_many, b_one, "bytes", "index bytes of main alone (same index, before the branches)", better="lower",
            target="≤ 1.1", note=f"{b_many / 2**20:.1f} MiB vs {b_one / 2**20:.1f} MiB after expunging deletes")
    res.add("refs", "refs.branches_sync_time", f"{len(files)} one-file branches, one sync ÷ full index of main",
            t_many, t_full, "s", base_label, better="lower", target="≤ 0.2",
            note=f"{t_many:.1f} s vs {t_full:.1f} s; {many.chunks_written} chunks written, {many.chunks_linked} "
                 f"joined a branch without a write; job {many.state.value}")
    res.add("refs", "refs.pin_time", f"pin the commit {back} releases back ({versions[0]}): seconds ÷ full index",
            t_pin, t_full, "s", base_label, better="lower",
            note=f"{t_pin:.1f} s; {pin.chunks_linked} chunks reused (joined the pin without a write), "
                 f"{pin.chunks_written} written; job {pin.state.value}")
    out = {"package": package, "versions": list(versions), "branches": len(files),
           "full_index_s": round(t_full, 2), "full_chunks": full.chunks_written, "full_files": full.files_indexed,
           "branches_sync_s": round(t_many, 2), "branches_chunks_written": many.chunks_written,
           "branches_chunks_linked": many.chunks_linked, "branches_state": many.state.value,
           "bytes_one_ref": b_one, "bytes_all_refs": b_many, "ratio_bytes": round(b_many / b_one, 3),
           "ratio_branches_sync": round(t_many / t_full, 3), "pin_releases_back": back, "pin_s": round(t_pin, 2),
           "pin_chunks_reused": pin.chunks_linked, "pin_chunks_written": pin.chunks_written,
           "pin_state": pin.state.value}
    res.series["refs"] = out
    return out
