"""The cap of refs per source (``git.max_refs_per_source``; hostile review 3, H1), on real OpenSearch + S3 and on
SQLite + a blob folder: new branches never push out the source's ref or a ref already indexed (their chunks stay
searchable), the refs the cap leaves out are named in the job's errors and make the status PARTIAL (the pushed ref
too when a push asked for one of them), and a deleted branch is still dropped, its slot going to a new ref.

The cap is 3 here (the default is 64), so a handful of branches is over it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from scopekb.errors import NotFound
from scopekb.indexing import SyncDeps, run_sync
from scopekb.models import Job, JobState, SearchRequest, Source
from scopekb.search import run_search
from scopekb.settings import QuerySettings
from scopekb.status import source_status
from scopekb.stores.base import ScopeFilter
from tests.integration.test_multi_ref import History, git, stored, world  # noqa: F401 - the two-store fixture

CAP = 3
FILES = {"a.py": "def alpha():\n    return 1\n", "b.md": "# notes\n"}


@pytest.fixture
def capped(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:  # noqa: F811
    monkeypatch.setattr(world["deps"].settings.git, "max_refs_per_source", CAP)
    return world


def _sync(deps: SyncDeps, src: Source, pushed: str | None = None) -> Job:
    job_id = f"cap-{uuid.uuid4().hex[:8]}"
    if pushed:  # the queued record a webhook delivery writes names the pushed ref (scopekb.ops.enqueue_sync)
        deps.records.put_job(Job(id=job_id, source_ids=[src.id], ref=pushed, trigger="webhook"))
    return run_sync(deps, job_id, [src.id], trigger="webhook" if pushed else "test")


def _status(w: dict[str, Any], src: Source) -> dict[str, Any]:
    deps: SyncDeps = w["deps"]
    if w["kind"] == "opensearch":  # the newest job is found by a search: make the last job's write visible
        w["client"].indices.refresh(index=f"{deps.settings.opensearch.system_prefix}-*")
    return source_status(deps.records, deps.chunks, src)


def _status_refs(w: dict[str, Any], src: Source) -> dict[str, str]:
    return {r["ref"]: r["commit"] for r in _status(w, src)["refs"]}


def _search(deps: SyncDeps, src: Source, ref: str) -> int:
    """Hits of a search of ``ref`` (raises NotFound when the ref is not indexed)."""
    res = run_search(deps.chunks, SearchRequest(query="alpha notes", ref=ref, source_id=src.id, max_results=20),
                     ScopeFilter(src.agent_name, (src.context_id,)), QuerySettings(revocation_bound_s=0),
                     records=deps.records)
    return len(res.hits)


def test_new_refs_over_the_cap_never_push_out_indexed_refs(capped: dict[str, Any], tmp_path_factory: Any) -> None:
    deps: SyncDeps = capped["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    main = hist.commit("main", FILES)
    git(hist.path, "update-ref", "refs/heads/zz1", main)
    zz1 = hist.commit("zz1", {**FILES, "c.txt": "text line\n"})
    git(hist.path, "tag", "v0", main)
    src = Source(id=Source.new_id(), agent_name="refcap", context_id=uuid.uuid4().hex[:8], repo_url=str(hist.path),
                 ref="main", refs=["*"], webhooks=False)
    deps.records.put_source(src)
    job = _sync(deps, src)
    assert job.state == JobState.done, job.errors
    assert _status_refs(capped, src) == {"main": main, "zz1": zz1, "v0": main}

    # Five new branches that all sort before main and zz1: none of the indexed refs is pushed out.
    for n in range(1, 6):
        git(hist.path, "update-ref", f"refs/heads/aa{n}", main)
    job = _sync(deps, src, pushed="aa3")
    assert job.state == JobState.partial
    assert job.chunks_deleted == 0
    (error,) = job.errors
    assert f"5 refs its refs patterns match are not indexed, over git.max_refs_per_source={CAP}" in error
    assert "'aa1', 'aa2', 'aa3', 'aa4', 'aa5'" in error and "the pushed ref 'aa3' is one of them" in error
    assert _status_refs(capped, src) == {"main": main, "zz1": zz1, "v0": main}
    status = _status(capped, src)
    assert status["status"] == "PARTIAL" and status["indexed_commit"] == main
    assert status["last_job"]["errors"] == [error]
    assert _search(deps, src, "main") > 0 and _search(deps, src, "zz1") > 0 and _search(deps, src, "v0") > 0
    assert {d["path"] for d in stored(capped, src, "main")} == set(FILES)
    with pytest.raises(NotFound):
        _search(deps, src, "aa1")

    # A commit on main still syncs main; the left-out refs are reported again.
    main2 = hist.commit("main", {**FILES, "d.py": "def delta():\n    return 4\n"})
    job = _sync(deps, src)
    assert job.state == JobState.partial and "5 refs" in job.errors[0] and "pushed" not in job.errors[0]
    assert _status_refs(capped, src) == {"main": main2, "zz1": zz1, "v0": main}

    # A deleted branch is dropped as before; its slot goes to the first new ref by name.
    git(hist.path, "update-ref", "-d", "refs/heads/zz1")
    job = _sync(deps, src)
    assert job.state == JobState.partial and "4 refs" in job.errors[0] and "'aa1'" not in job.errors[0]
    assert _status_refs(capped, src) == {"main": main2, "aa1": main, "v0": main}
    assert {d["path"] for d in stored(capped, src, "zz1")} == set()
    with pytest.raises(NotFound):
        _search(deps, src, "zz1")
    assert _search(deps, src, "aa1") > 0

    # Back under the cap: every ref indexed, the job done without errors.
    for n in range(2, 6):
        git(hist.path, "update-ref", "-d", f"refs/heads/aa{n}")
    job = _sync(deps, src)
    assert job.state == JobState.done, job.errors
    assert _status(capped, src)["status"] == "READY"


def test_the_source_ref_is_tracked_first_when_many_refs_sort_before_it(capped: dict[str, Any],
                                                                        tmp_path_factory: Any) -> None:
    """A first sync of a source whose ``ref`` sorts after more matching branches than the cap: the ref is indexed
    (before, the first refs by name filled the cap and it was left out - or dropped when it was indexed)."""
    deps: SyncDeps = capped["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    main = hist.commit("main", FILES)
    for n in range(1, 6):
        git(hist.path, "update-ref", f"refs/heads/many/b{n}", main)
    src = Source(id=Source.new_id(), agent_name="refcap", context_id=uuid.uuid4().hex[:8], repo_url=str(hist.path),
                 ref="main", refs=["*"], webhooks=False)
    deps.records.put_source(src)
    job = _sync(deps, src)
    assert job.state == JobState.partial and "3 refs" in job.errors[0]
    assert _status_refs(capped, src) == {"main": main, "many/b1": main, "many/b2": main}
    status = _status(capped, src)
    assert status["status"] == "PARTIAL" and status["indexed_commit"] == main
    assert _search(deps, src, "main") > 0


def test_refs_a_registration_refuses_are_not_indexed_by_a_glob(world: dict[str, Any],  # noqa: F811
                                                                tmp_path_factory: Any) -> None:
    """Hostile review 4: ``refs: ["*"]`` indexed a branch named ``--upload-pack=evil`` that registering it as a
    ref refuses (``starts with '-'``). Now a glob leaves such refs out the way a registration would, and the job
    names them (bounded); the refs that follow the rules are indexed."""
    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    main = hist.commit("main", FILES)
    for ref in ("refs/heads/--upload-pack=evil", "refs/tags/-v1", "refs/heads/fine/b1", "refs/heads/HEAD"):
        git(hist.path, "update-ref", ref, main)
    src = Source(id=Source.new_id(), agent_name="refcap", context_id=uuid.uuid4().hex[:8], repo_url=str(hist.path),
                 ref="main", refs=["*"], webhooks=False)
    deps.records.put_source(src)
    job = _sync(deps, src)
    assert _status_refs(world, src) == {"main": main, "fine/b1": main}
    said = " ".join(job.errors)
    assert "3 refs its refs patterns match are not indexed" in said, job.errors
    assert "'--upload-pack=evil' (starts with '-')" in said and "'-v1'" in said and "'HEAD'" in said, said
    assert job.state == JobState.partial, job
    with pytest.raises(NotFound):
        _search(deps, src, "--upload-pack=evil")
