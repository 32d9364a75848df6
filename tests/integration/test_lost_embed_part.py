"""Issue #19: a job in its embedding stage whose part message the broker lost is settled by the reconcile instead
of staying ``running`` forever, on real Redis (the Celery broker and the coordination backend) and real
OpenSearch (the job records).

No worker consumes the queues here: the sync stage's record and its three ``scopekb.embed_chunks`` part messages
are what a sync worker leaves behind (``stage: embedding``, parts on ``worker.embed_queue``), part 0 is recorded
done, and part 2's message is deleted from the queue's Redis list (a Redis failover without persistence, an
eviction, an operator's ``DEL``). The reconcile pass (:func:`scopekb.ops.settle_lost_jobs`, what beat runs) must
see that part 2 is neither done nor held by the broker, and enqueue the sync again under the same job id (its run
re-sends the parts of the chunks without vectors); lost again, the job is failed with the reason. A job whose
missing parts are all still queued is left alone: it is waiting for an embedding worker, not lost.
"""

from __future__ import annotations

import json
import uuid

import redis

from scopekb import ops, queue
from scopekb.models import Job, JobStage, JobState, Source
from scopekb.runtime import build_control_runtime
from scopekb.settings import Settings


def _embedding_job(rt, source_id: str, parts: int, done: set[int]) -> tuple[str, str]:
    """A job as its sync stage leaves it: marker, record in stage ``embedding``, part messages, parts done."""
    job_id, run = f"it-lost-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:16]
    kwargs = {"job_id": job_id, "source_ids": [source_id], "trigger": "webhook"}
    rt.coord.mark_queued(Job(id=job_id, source_ids=[source_id]), ttl_s=600, task_kwargs=kwargs)
    rt.records.put_job(Job(id=job_id, source_ids=[source_id], state=JobState.running, stage=JobStage.embedding,
                           embed_run=run, embed_parts=parts))
    for part in range(parts):
        rt.tasks.app.send_task(queue.TASK_EMBED_CHUNKS, task_id=queue.embed_task_id(job_id, run, part),
                               kwargs={"job_id": job_id, "run": run, "part": part, "items": []},
                               queue=rt.settings.worker.embed_queue)
    for part in done:
        rt.coord.embed_part_done(job_id, run, part, {"part": part, "computed": 0}, ttl_s=600)
    return job_id, run


def _drop(r: redis.Redis, name: str, task_id: str) -> int:
    for raw in r.lrange(name, 0, -1):
        if json.loads(raw)["headers"]["id"] == task_id:
            return int(r.lrem(name, 1, raw))
    return 0


def test_lost_embedding_part_settles_the_job(opensearch_url: str, redis_url: str) -> None:
    run = uuid.uuid4().hex[:8]
    s = Settings(profile="distributed", opensearch={"url": opensearch_url, "system_prefix": f"it-lep-{run}-sys"},
                 redis={"url": redis_url}, worker={"queue": f"it-lep-{run}-sync", "embed_queue": f"it-lep-{run}-embed"})
    rt = build_control_runtime(s, name="it-lost-part")
    r = redis.Redis.from_url(redis_url)
    try:
        src = Source(id=f"src_{run}", agent_name="a", context_id="c", repo_url="/nowhere", ref="main")
        rt.records.put_source(src)
        lost_id, lost_run = _embedding_job(rt, src.id, parts=3, done={0})
        waiting_id, _ = _embedding_job(rt, src.id, parts=2, done=set())
        assert _drop(r, s.worker.embed_queue, queue.embed_task_id(lost_id, lost_run, 2)) == 1

        out = ops.settle_lost_jobs(rt, grace_s=0, confirm_s=0.2)
        assert out.requeued == [lost_id] and out.failed == []
        job = rt.records.get_job(lost_id)
        assert job is not None and job.state == JobState.queued and job.retries["requeued"] == 1
        assert "embedding part 2 of 3 lost by the broker" in job.errors[-1]
        assert rt.tasks.held([lost_id]) == {lost_id}  # the sync is in the sync queue again
        waiting = rt.records.get_job(waiting_id)
        assert waiting is not None and waiting.state == JobState.running and not waiting.errors

        # the re-run's sync stage ended the same way (its own run, part 0 of 1 lost): failed with the reason
        assert _drop(r, s.worker.queue, lost_id) == 1
        again = uuid.uuid4().hex[:16]
        rt.records.put_job(job.model_copy(update={"state": JobState.running, "stage": JobStage.embedding,
                                                  "embed_run": again, "embed_parts": 1}))
        out = ops.settle_lost_jobs(rt, grace_s=0, confirm_s=0.2)
        assert out.failed == [lost_id] and out.requeued == []
        job = rt.records.get_job(lost_id)
        assert job is not None and job.state == JobState.failed and job.finished_at is not None
        assert "embedding part 0 of 1 lost by the broker" in job.errors[-1] and "failed by the reconcile" in \
            job.errors[-1]
        assert rt.records.get_job(waiting_id).state == JobState.running
    finally:
        r.delete(s.worker.queue, s.worker.embed_queue)
        for key in r.scan_iter("scopekb:job:it-lost-*"):
            r.delete(key)
        r.close()
        client = rt.records.client
        client.indices.delete(index=f"it-lep-{run}-sys*", params={"expand_wildcards": "open"})
