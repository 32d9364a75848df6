"""Stable chunk ids (issue 20): a changed file rewrites only the chunks whose content or position changed.

Both profiles (SQLite + blob folder; OpenSearch + S3). A Python file of many functions is synced, one function
is edited in place (same line count) and the sync must write exactly the chunks whose (line range, content)
is new, delete exactly the vanished ones, keep every other chunk's id, and leave the index equal to a fresh full
index of the new commit. A file that only loses its last chunk writes at most one chunk (the one that records the
new blob), and a verifying sync (the reconcile) afterwards finds no drift and writes nothing.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scopekb import fields as F
from scopekb.blobs import LocalBlobStore, S3BlobStore, blob_key
from scopekb.indexing import SyncDeps, run_sync
from scopekb.models import Source
from scopekb.settings import Settings
from scopekb.stores.base import ScopeFilter, SearchFilter

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          env=GIT_ENV).stdout.decode().strip()


def commit(repo: Path) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "c")
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module", params=["embedded", "distributed"])
def deps(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncDeps]:
    if request.param == "embedded":
        from scopekb.stores.sqlite import SqliteChunkStore, SqliteRecordStore

        data = tmp_path_factory.mktemp("embedded")
        s = Settings(data_dir=data, profile="embedded", git={"allow_local_paths": True})
        chunks = SqliteChunkStore(data / "index.sqlite3")
        chunks.ensure_index()
        yield SyncDeps(settings=s, records=SqliteRecordStore(data / "records.sqlite3"), chunks=chunks,
                       blobs=LocalBlobStore(data / "blobs"))
        chunks.close()
        return
    from scopekb.stores.opensearch import OpenSearchChunkStore, make_client
    from scopekb.stores.records import OpenSearchRecordStore

    os_url, s3 = request.getfixturevalue("opensearch_url"), request.getfixturevalue("s3_config")
    run = uuid.uuid4().hex[:8]
    s = Settings(opensearch={"url": os_url, "alias": f"it-stable-{run}", "system_prefix": f"it-stable-{run}-sys"},
                 s3={**s3, "bucket": f"it-stable-{run}"}, profile="distributed",
                 git={"cache_dir": tmp_path_factory.mktemp("git"), "allow_local_paths": True})
    client = make_client(s.opensearch)
    chunks = OpenSearchChunkStore(client, alias=s.opensearch.alias)
    chunks.ensure_index()
    yield SyncDeps(settings=s, records=OpenSearchRecordStore(client, s.opensearch.system_prefix), chunks=chunks,
                   blobs=S3BlobStore(s.s3))
    client.indices.delete(index=f"it-stable-{run}*", params={"expand_wildcards": "open"})


def source(deps: SyncDeps, repo: Path, agent: str = "") -> Source:
    src = Source(id=Source.new_id(), agent_name=agent or "agent-" + uuid.uuid4().hex[:6], context_id="c",
                 repo_url=str(repo), ref="main")
    deps.records.put_source(src)
    return src


def sync(deps: SyncDeps, src: Source, **kw) -> dict:
    job = run_sync(deps, "job-" + uuid.uuid4().hex[:12], [src.id], trigger="cli", **kw)
    deps.chunks.refresh()
    return job.model_dump()


def chunks_of(deps: SyncDeps, src: Source, path: str) -> dict[str, tuple[int, int, str]]:
    """chunk id -> (start line, end line, content) of one path (every test chunk holds the word ``zzfn``)."""
    flt = SearchFilter(ScopeFilter(src.agent_name, (src.context_id,)), source_id=src.id)
    hits = deps.chunks.keyword_search("zzfn", flt, size=500)
    rows = {cid: (f[F.START_LINE], f[F.END_LINE], f[F.CONTENT]) for cid, _, f in hits if f[F.PATH] == path}
    assert set(rows) == set(deps.chunks.chunk_versions(src.agent_name, src.context_id, src.id, [path])[path])
    assert len(set(rows.values())) == len(rows), "duplicate chunks"
    return rows


def assert_blobs_stored(deps: SyncDeps, src: Source, paths: list[str]) -> None:
    """Every blob a chunk names is in the blob store when the sync has ended (the read path relies on it), although
    puts run concurrently with chunking and chunking reads straight from the git reader (issue 20)."""
    held = {b for v in deps.chunks.chunk_versions(src.agent_name, src.context_id, src.id, paths).values()
            for b, _ in v.values()}
    assert held and "" not in held
    for b in held:
        assert deps.blobs.get(blob_key(b))


def functions(n: int, edited: int | None = None) -> str:
    out = []
    for i in range(n):
        body = f"    return zzfn_value_{i}  # edited\n" if i == edited else f"    return zzfn_value_{i}\n"
        out.append(f"def zzfn_{i}(x):\n    y = x + {i}\n{body}\n\n")
    return "".join(out)


def test_one_function_edit_rewrites_only_changed_chunks(deps: SyncDeps, tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "mod.txt").write_text(functions(60))
    (repo / "other.txt").write_text("zzfn other file\n")
    commit(repo)
    src = source(deps, repo)
    first = sync(deps, src)
    assert first["state"] == "done", first["errors"]
    before = chunks_of(deps, src, "mod.txt")
    assert len(before) > 5

    (repo / "mod.txt").write_text(functions(60, edited=30))
    commit(repo)
    job = sync(deps, src)
    after = chunks_of(deps, src, "mod.txt")
    new = {v for v in after.values()} - set(before.values())
    gone = {v for v in before.values()} - set(after.values())
    assert job["state"] == "done", job["errors"]
    assert 1 <= len(new) <= 3 and job["chunks_written"] == len(new), (job["chunks_written"], new)
    assert job["chunks_deleted"] == len(gone)
    kept = set(before) & set(after)
    assert len(kept) == len(after) - len(new)  # every unchanged chunk kept its id
    assert_blobs_stored(deps, src, ["mod.txt", "other.txt"])

    fresh = source(deps, repo)
    sync(deps, fresh)
    assert set(chunks_of(deps, fresh, "mod.txt").values()) == set(after.values())

    check = sync(deps, src, verify=True)  # the reconcile: the mixed blob ids of mod.txt are not drift
    assert check["drift"] == {} and check["chunks_written"] == 0 and check["chunks_deleted"] == 0, check


def test_a_file_that_only_loses_chunks_records_its_new_blob(deps: SyncDeps, tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "mod.txt").write_text(functions(60))
    commit(repo)
    src = source(deps, repo)
    sync(deps, src)
    before = chunks_of(deps, src, "mod.txt")
    text = functions(60)
    cut = text.rstrip("\n").rsplit("\n", 40)[0] + "\n"  # the last lines gone: the tail chunk(s) vanish
    (repo / "mod.txt").write_text(cut)
    commit(repo)
    job = sync(deps, src)
    after = chunks_of(deps, src, "mod.txt")
    assert job["state"] == "done"
    assert job["chunks_deleted"] == len(set(before) - set(after)) >= 1
    assert job["chunks_written"] == len(set(after) - set(before)) + (0 if set(after) - set(before) else 1) <= 2
    fresh = source(deps, repo)
    sync(deps, fresh)
    assert set(chunks_of(deps, fresh, "mod.txt").values()) == set(after.values())
    check = sync(deps, src, verify=True)
    assert check["drift"] == {} and check["chunks_written"] == 0 and check["chunks_deleted"] == 0, check
