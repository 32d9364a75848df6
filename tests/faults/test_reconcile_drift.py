"""The reconcile finds and repairs drift that the sync state cannot see.

A source is fully synced (its state is at the ref), then its index is damaged behind scopekb's back: the chunks
of three files deleted, a chunk of another file altered, chunks of a file git does not have added. A reconcile
pass (what beat runs) compares the index's documents with git's tree by content id, repairs the difference
(recorded in the job as ``drift``) and leaves the index equal to a fresh full index; a second pass finds nothing.
"""

from __future__ import annotations

from scopekb import queue

from .harness import generate_repo, wait_until


def _reconcile(stack, src: str, after: set[str]) -> dict:
    stack.send_task(queue.TASK_RECONCILE)
    return wait_until(lambda: next((j for j in stack.jobs(src) if j["trigger"] == "reconcile" and j["id"] not in after
                                    and j["state"] in ("done", "partial", "failed")), None),
                      timeout=120, interval=0.5, what="reconcile sync")


def test_reconcile_repairs_index_drift(make_stack, tmp_path, report) -> None:
    stack = make_stack("drift")
    repo = tmp_path / "repo"
    generate_repo(repo, files=80)
    stack.start_query()
    worker = stack.start_worker()
    src = stack.add_source(repo, agent="drift-agent")
    first = stack.wait_job(stack.sync(src), timeout=120, procs=[worker])
    assert first["state"] == "done"
    expected, _ = stack.fresh(repo)

    gone = ["src/pkg01/module_0001.py", "src/pkg02/module_0002.py", "docs/guide-1.md"]
    deleted = stack.os.delete_by_query(index=stack.alias, refresh=True, body={"query": {"bool": {"filter": [
        {"term": {"source_id": src}}, {"terms": {"path": gone}}]}}})["deleted"]
    hits = stack.os.search(index=stack.alias, body={"size": 2, "query": {"bool": {"filter": [
        {"term": {"source_id": src}}, {"term": {"path": "src/pkg03/module_0003.py"}}]}}})["hits"]["hits"]
    altered = hits[0]
    stack.os.update(index=stack.alias, id=altered["_id"], body={"doc": {"content": "tampered", "blob_sha": "0" * 40}})
    ghost = {**hits[1]["_source"], "path": "src/ghost.py"}
    stack.os.index(index=stack.alias, id="ghost-" + hits[1]["_id"], body=ghost, refresh=True)
    damaged = stack.compare(src, expected)
    report("injected", fault="index damaged behind scopekb's back", deleted_paths=gone, chunks_deleted=deleted,
           altered_chunk=(altered["_source"]["path"], altered["_source"]["start_line"]), ghost_path="src/ghost.py",
           comparison=damaged.summary(), sync_state_commit=stack.state(src).get("commit", "")[:10])
    assert not damaged.equal

    job = _reconcile(stack, src, set())
    repaired = stack.compare(src, expected)
    again = _reconcile(stack, src, {job["id"]})
    report("checked", reconcile_job=job["id"], state=job["state"], drift=job["drift"],
           chunks_written=job["chunks_written"], chunks_deleted=job["chunks_deleted"], comparison=repaired.summary(),
           second_pass=(again["state"], again["drift"], again["chunks_written"], again["chunks_deleted"]))
    assert job["state"] == "done", job
    assert job["drift"] == {src: {"missing": 3, "changed": 1, "stale": 1}}, job["drift"]
    assert repaired.equal and repaired.duplicates == 0, repaired.summary()
    assert again["state"] == "done" and again["drift"] == {} and again["chunks_written"] == 0
    assert again["chunks_deleted"] == 0
