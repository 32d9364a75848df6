"""Git read rate: files/s read by a sync ÷ ``git ls-tree -r`` + ``git cat-file --batch`` on the same commit.

The sync is :func:`scopekb.indexing.run_sync` in this process on a keyword-only runtime with its own source,
indices and bucket; it is stopped through its progress callback the moment its read phase (tree listing, plan,
reading every blob, skip checks, blob-store upload) has handled the last file, before any chunking. The mirror is
cloned beforehand, so neither side pays for a clone. A breakdown also times scopekb's git reader alone
(:class:`scopekb.gitrepo.Mirror` ``tree`` + ``read_blob`` for every blob, without skip checks or the blob store).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from scopekb.gitrepo import MODE_GITLINK, MODE_SYMLINK, Mirror
from scopekb.indexing import run_sync
from scopekb.models import Source
from scopekb.runtime import build_runtime
from scopekb.settings import GitSettings, OpenSearchSettings, RedisSettings, S3Settings, Settings
from scopekb_bench.util import log


class _ReadDone(Exception):
    """Raised from the progress callback to stop the sync after its read phase."""


def git_baseline(repo: Path, commit: str) -> tuple[int, float, int]:
    """``git ls-tree -r`` then every blob through one ``git cat-file --batch``: (blobs, seconds, bytes)."""
    t0 = time.perf_counter()
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-z", commit], capture_output=True,
                         check=True).stdout
    shas = []
    for rec in out.split(b"\0"):
        if rec:
            mode, typ, sha = rec.split(b"\t", 1)[0].split()
            if typ == b"blob" and mode != b"120000":
                shas.append(sha)
    proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=1 << 20)
    assert proc.stdin and proc.stdout

    def feed() -> None:
        assert proc.stdin
        proc.stdin.write(b"".join(s + b"\n" for s in shas))
        proc.stdin.close()

    th = threading.Thread(target=feed)
    th.start()
    total = 0
    for _ in shas:
        header = proc.stdout.readline().split()
        size = int(header[2])
        total += len(proc.stdout.read(size + 1)) - 1
    th.join()
    proc.wait()
    return len(shas), time.perf_counter() - t0, total


def settings_for(endpoints: dict[str, str], run_id: str, name: str, workdir: Path) -> Settings:
    """Keyword-only settings for an in-process runtime with indices, bucket and git cache private to this run."""
    return Settings(
        profile="distributed",
        opensearch=OpenSearchSettings(url=endpoints["SCOPEKB_OPENSEARCH__URL"], alias=f"bench-{run_id}-{name}-chunks",
                                      system_prefix=f"bench-{run_id}-{name}-sys"),
        redis=RedisSettings(url=endpoints["SCOPEKB_REDIS__URL"]),
        s3=S3Settings(endpoint=endpoints["SCOPEKB_S3__ENDPOINT"], access_key=endpoints["SCOPEKB_S3__ACCESS_KEY"],
                      secret_key=endpoints["SCOPEKB_S3__SECRET_KEY"],
                      secure=endpoints.get("SCOPEKB_S3__SECURE", "false").lower() == "true", bucket=f"bench-{run_id}"),
        git=GitSettings(cache_dir=workdir / f"git-{name}", allow_local_paths=True),
        embedding={"provider": "none"}, log_level="WARNING", log_format="console")


def measure(endpoints: dict[str, str], run_id: str, workdir: Path, repo: Path, commit: str) -> dict[str, Any]:
    """Time the baseline, scopekb's reader alone, and a sync's read phase on ``commit`` (``main`` must point at it).

    Returns files and seconds of each; the sync leaves a failed job record in its private system index.
    """
    n_base, t_base, nbytes = git_baseline(repo, commit)
    log(f"git read baseline: {n_base} blobs, {nbytes / 1e6:.1f} MB in {t_base:.2f} s")

    settings = settings_for(endpoints, run_id, "gitread", workdir)
    mirror = Mirror(settings.git.cache_dir, str(repo), allow_local=True)
    mirror.fetch()  # the clone is not part of either measurement
    t0 = time.perf_counter()
    entries = [e for e in mirror.tree(commit) if e.mode not in (MODE_GITLINK, MODE_SYMLINK)]
    for e in entries:
        mirror.read_blob(e.sha)
    t_reader = time.perf_counter() - t0
    mirror.close()
    log(f"scopekb git reader alone: {len(entries)} blobs in {t_reader:.2f} s")

    rt = build_runtime(settings)
    rt.chunks.ensure_index()
    src = Source(id=f"src_bench{run_id}", agent_name="bench", context_id="gitread", repo_url=str(repo), ref="main",
                 repo_name="bench/gitread")
    rt.records.put_source(src)
    # the system indices a deployment has from `scopekb init` (the sync reads overlays while planning; creating it
    # there is a once-per-deployment cost, not the read phase's)
    for kind in ("jobs", "state", "overlays"):
        rt.records.ensure(kind)  # type: ignore[attr-defined]
    marks: dict[str, Any] = {}

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "read" and done >= total:
            marks["end"], marks["files"] = time.perf_counter(), total
            raise _ReadDone
        if phase != "read":
            raise _ReadDone

    t0 = time.perf_counter()
    try:
        run_sync(rt.sync_deps(), f"bench-{run_id}-gitread", [src.id], trigger="bench", progress=progress)
    except _ReadDone:
        pass
    if "end" not in marks:
        raise RuntimeError("the sync's read phase did not report completion")
    t_sync = marks["end"] - t0
    log(f"sync read phase: {marks['files']} files in {t_sync:.2f} s")
    return {"baseline_files": n_base, "baseline_seconds": t_base, "baseline_bytes": nbytes,
            "reader_files": len(entries), "reader_seconds": t_reader,
            "sync_files": marks["files"], "sync_seconds": t_sync}
