"""A chunk index lost behind the sync state's back is indexed again by the next sync, on both profiles.

The sync state (records store) says which commit each ref was indexed at; the chunks live elsewhere (the
OpenSearch index behind the alias, or ``index.sqlite3``). When the chunk index is deleted and made again (an
operator's ``DELETE``, a lost or replaced SQLite file) the state's commit no longer says what the index holds:
before, the next sync found nothing to do at that commit (or indexed only a push's diff) and the source stayed
empty until a verifying reconcile. Each state now records the index's generation
(:meth:`scopekb.stores.base.ChunkStore.generation`); a state of another generation is compared with the index
again, like a verifying sync, and the job reports what it found missing (``job.drift``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scopekb import fields as F
from scopekb.blobs import LocalBlobStore, S3BlobStore
from scopekb.indexing import SyncDeps, run_sync
from scopekb.models import Source
from scopekb.settings import Settings
from scopekb.stores.base import ScopeFilter, SearchFilter
from tests.integration.test_stable_ids import commit, git


class Profile:
    """One profile's sync dependencies, and a way to lose its chunk index as an operator or a disk would."""

    def __init__(self, name: str, tmp: Path, request: pytest.FixtureRequest) -> None:
        self.name, self.tmp, self.cleanup = name, tmp, None
        if name == "embedded":
            from scopekb.stores.sqlite import SqliteChunkStore, SqliteRecordStore

            self.settings = Settings(data_dir=tmp, profile="embedded", git={"allow_local_paths": True})
            self.path = tmp / "index.sqlite3"
            self._sqlite = SqliteChunkStore
            chunks = SqliteChunkStore(self.path)
            chunks.ensure_index()
            self.deps = SyncDeps(settings=self.settings, records=SqliteRecordStore(tmp / "records.sqlite3"),
                                 chunks=chunks, blobs=LocalBlobStore(tmp / "blobs"))
            return
        from scopekb.stores.opensearch import OpenSearchChunkStore, make_client
        from scopekb.stores.records import OpenSearchRecordStore

        run = "it-lost-" + uuid.uuid4().hex[:8]
        self.settings = Settings(opensearch={"url": request.getfixturevalue("opensearch_url"), "alias": run,
                                             "system_prefix": f"{run}-sys"},
                                 s3={**request.getfixturevalue("s3_config"), "bucket": run}, profile="distributed",
                                 git={"cache_dir": tmp / "git", "allow_local_paths": True})
        self.client = make_client(self.settings.opensearch)
        chunks = OpenSearchChunkStore(self.client, alias=run)
        chunks.ensure_index()
        self.deps = SyncDeps(settings=self.settings, records=OpenSearchRecordStore(self.client, f"{run}-sys"),
                             chunks=chunks, blobs=S3BlobStore(self.settings.s3))
        self.cleanup = lambda: self.client.indices.delete(index=f"{run}*", params={"expand_wildcards": "open"})

    def lose_chunk_index(self) -> None:
        """Delete the chunk index and make it again empty, as the next process (or worker sync) would."""
        if self.name == "embedded":
            self.deps.chunks.close()
            for p in self.tmp.glob("index.sqlite3*"):
                if not p.name.endswith(".lock"):
                    p.unlink()
            self.deps.chunks = self._sqlite(self.path)
        else:
            live = self.deps.chunks.live_index()
            self.client.indices.delete(index=live)
        self.deps.chunks.ensure_index()


@pytest.fixture(params=["embedded", "distributed"])
def profile(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Profile]:
    p = Profile(request.param, tmp_path, request)
    yield p
    if p.name == "embedded":
        p.deps.chunks.close()
    elif p.cleanup:
        p.cleanup()


def paths_held(deps: SyncDeps, src: Source) -> set[str]:
    flt = SearchFilter(ScopeFilter(src.agent_name, (src.context_id,)), source_id=src.id)
    return {f[F.PATH] for _, _, f in deps.chunks.keyword_search("zzlost", flt, size=100)}


def sync(deps: SyncDeps, src: Source) -> dict[str, Any]:
    job = run_sync(deps, "job-" + uuid.uuid4().hex[:12], [src.id], trigger="cli")
    deps.chunks.refresh()
    assert job.state.value == "done", job.errors
    return job.model_dump()


def test_a_lost_chunk_index_is_indexed_again_at_the_same_commit_and_after_a_push(profile: Profile,
                                                                                 tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for i in range(3):
        (repo / f"m{i}.py").write_text(f"def zzlost_{i}():\n    return {i}\n")
    commit(repo)
    deps = profile.deps
    src = Source(id=Source.new_id(), agent_name="agent-" + uuid.uuid4().hex[:6], context_id="c",
                 repo_url=str(repo), ref="main")
    deps.records.put_source(src)
    first = sync(deps, src)
    assert first["chunks_written"] == 3 and paths_held(deps, src) == {"m0.py", "m1.py", "m2.py"}
    assert sync(deps, src)["chunks_written"] == 0  # same index, same commit: nothing to do

    # Lost at the indexed commit: the next sync (nothing pushed) writes everything again and says so.
    profile.lose_chunk_index()
    assert paths_held(deps, src) == set()
    again = sync(deps, src)
    assert paths_held(deps, src) == {"m0.py", "m1.py", "m2.py"}
    assert again["chunks_written"] == 3
    assert again["drift"] == {src.id: {"missing": 3, "changed": 0, "stale": 0}}
    assert sync(deps, src)["chunks_written"] == 0  # the state now names this index: trusted again

    # Lost, then a push of one file: the sync indexes the whole tree, not only the push's diff.
    profile.lose_chunk_index()
    (repo / "m1.py").write_text("def zzlost_1():\n    return 'one'\n")
    commit(repo)
    pushed = sync(deps, src)
    assert paths_held(deps, src) == {"m0.py", "m1.py", "m2.py"}
    assert pushed["chunks_written"] == 3
    assert sync(deps, src)["chunks_written"] == 0


def test_a_rebuild_keeps_the_generation_so_the_next_sync_trusts_its_states(profile: Profile, tmp_path: Path) -> None:
    """``scopekb reindex`` copies every chunk into a new index (OpenSearch) or new tables (SQLite): the same chunks,
    so the states recorded before stay trusted and the next sync has nothing to compare or write."""
    from scopekb.reindex import reindex

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "r.py").write_text("def zzlost_r():\n    return 1\n")
    commit(repo)
    deps = profile.deps
    src = Source(id=Source.new_id(), agent_name="agent-" + uuid.uuid4().hex[:6], context_id="c",
                 repo_url=str(repo), ref="main")
    deps.records.put_source(src)
    assert sync(deps, src)["chunks_written"] == 1
    before, index_before = deps.chunks.generation(), deps.chunks.live_index()
    assert before
    rep = reindex(deps.chunks, None, None, profile.settings.chunking)
    assert rep.chunks >= 1
    if profile.name == "distributed":
        assert deps.chunks.live_index() != index_before  # a new index behind the alias, same generation
    assert deps.chunks.generation() == before
    again = sync(deps, src)
    assert again["chunks_written"] == 0 and again["drift"] == {}
    assert paths_held(deps, src) == {"r.py"}
