"""The coordination interface behaves the same on Redis (distributed) and in memory (embedded): delivery claims,
queued markers, the repository lock with renewal and dead-holder detection, file attempts, sources version and
the reindex lock."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from scopekb.coordination import Coordination, LockHeld, keys
from scopekb.coordination.memory import MemoryCoordination
from scopekb.coordination.rediscoord import RedisCoordination
from scopekb.errors import Transient
from scopekb.models import Job


@pytest.fixture(params=["memory", "redis"])
def coord(request: pytest.FixtureRequest) -> Iterator[Coordination]:
    if request.param == "memory":
        yield MemoryCoordination()
        return
    c = RedisCoordination.from_url(request.getfixturevalue("redis_url"))
    yield c
    c.client.close()


def _ids() -> list[str]:
    return [f"src_{uuid.uuid4().hex[:8]}"]


def test_a_delivery_is_claimed_once_until_released(coord: Coordination) -> None:
    d = uuid.uuid4().hex
    assert coord.claim_delivery("github", d, 60) and not coord.claim_delivery("github", d, 60)
    coord.release_delivery("github", d)
    assert coord.claim_delivery("github", d, 60)
    coord.release_delivery("github", d)


def test_a_claim_writes_its_queued_markers_in_the_same_step_and_a_repeat_writes_nothing(coord: Coordination
                                                                                        ) -> None:
    d = uuid.uuid4().hex
    jobs = [Job(id=f"{d}:{n}", source_ids=[f"s{n}"], ref="main", trigger="webhook") for n in range(2)]
    queued = [(j, {"job_id": j.id, "source_ids": j.source_ids, "after": "a" * 40}) for j in jobs]
    assert coord.claim_delivery("github", d, 60, queued=queued, queued_ttl_s=60)
    found = {j.id: (j, kw) for j, kw in coord.queued_markers()}
    for job, kwargs in queued:
        assert found[job.id][0].model_dump() == job.model_dump() and found[job.id][1] == kwargs
    other = [(Job(id=jobs[0].id, source_ids=["elsewhere"]), {"job_id": jobs[0].id}),
             (Job(id=f"{d}:new", source_ids=["s9"]), {})]
    assert not coord.claim_delivery("github", d, 60, queued=other, queued_ttl_s=60)  # a repeat writes nothing
    assert coord.queued_job(jobs[0].id).model_dump() == jobs[0].model_dump()
    assert coord.queued_job(f"{d}:new") is None
    coord.release_delivery("github", d, queued=[jobs[1].id])  # forgets the claim and the markers named
    assert coord.queued_job(jobs[1].id) is None and coord.queued_job(jobs[0].id) is not None
    assert coord.claim_delivery("github", d, 60, queued=queued[1:], queued_ttl_s=60)
    assert coord.queued_job(jobs[1].id) is not None
    coord.release_delivery("github", d, queued=[j.id for j in jobs])
    assert [coord.queued_job(j.id) for j in jobs] == [None, None]


def test_queued_marker_round_trips_a_job(coord: Coordination) -> None:
    job = Job(id="j-" + uuid.uuid4().hex[:8], source_ids=["s1"], ref="main", trigger="s3-event")
    assert coord.queued_job(job.id) is None
    coord.mark_queued(job, ttl_s=60)
    got = coord.queued_job(job.id)
    assert got is not None and got.model_dump() == job.model_dump()


def test_queued_markers_list_jobs_with_their_task_arguments(coord: Coordination) -> None:
    job = Job(id="j-" + uuid.uuid4().hex[:8], source_ids=["s1"], ref="main")
    coord.mark_queued(job, ttl_s=60, task_kwargs={"job_id": job.id, "source_ids": ["s1"], "verify": True})
    found = {j.id: (j, kw) for j, kw in coord.queued_markers()}
    assert found[job.id][0].model_dump() == job.model_dump()
    assert found[job.id][1] == {"job_id": job.id, "source_ids": ["s1"], "verify": True}
    assert coord.queued_job(job.id).model_dump() == job.model_dump()  # the arguments stay out of the job


def test_sources_version_moves_on_bump(coord: Coordination) -> None:
    before = coord.sources_version()
    coord.bump_sources_version()
    assert coord.sources_version() == before + 1


def test_file_attempts_count_and_forget(coord: Coordination) -> None:
    a, b = keys.file_attempts(_ids(), "a.py", "f" * 40), keys.file_attempts(_ids(), "b.py", "e" * 40)
    assert coord.count_attempt(a, 60) == 1 and coord.count_attempt(a, 60) == 2
    assert coord.count_attempt(b, 60, forget=[a]) == 1
    assert coord.count_attempt(a, 60) == 1  # forgotten with b's round trip
    coord.forget_attempts([a, b, "not:an:attempt"])
    assert coord.count_attempt(b, 60) == 1
    coord.forget_attempts([b])


def test_repo_lock_excludes_a_second_sync_and_is_renewed(coord: Coordination) -> None:
    ids = _ids()
    with coord.repo_lock(ids, wait_s=5, ttl_s=1.5):
        assert coord.repo_locked(ids) and coord.any_repo_locked()
        time.sleep(2.0)  # longer than the TTL: held only because the keeper renews it
        assert coord.repo_locked(ids)
        with pytest.raises(LockHeld), coord.repo_lock(ids, wait_s=0.3, ttl_s=5):
            pass
    assert not coord.repo_locked(ids)
    assert issubclass(LockHeld, Transient)


def test_a_waiting_sync_gets_the_lock_when_it_is_released(coord: Coordination) -> None:
    ids, got = _ids(), []
    with coord.repo_lock(ids, wait_s=5, ttl_s=10):
        t = threading.Thread(target=lambda: got.append(_hold(coord, ids)))
        t.start()
        time.sleep(0.3)
    t.join(10)
    assert got == [True] and not coord.repo_locked(ids)


def _hold(coord: Coordination, ids: list[str]) -> bool:
    with coord.repo_lock(ids, wait_s=5, ttl_s=10):
        return True


def test_a_lock_held_by_a_dead_process_of_this_host_is_broken(coord: Coordination) -> None:
    ids = _ids()
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    assert coord._set(keys.repo_lock(ids), f"{socket.gethostname()}:{dead}:x", ttl_s=60, nx=True)
    with coord.repo_lock(ids, wait_s=0.5, ttl_s=10):
        assert coord.repo_locked(ids)
    assert not coord.repo_locked(ids)


def test_reindex_lock(coord: Coordination) -> None:
    if coord.reindex_running():
        pytest.skip("a reindex of another run holds the shared lock")
    assert coord.begin_reindex(60) and not coord.begin_reindex(60) and coord.reindex_running()
    coord.end_reindex()
    assert not coord.reindex_running()


def test_eviction_policy_and_ping(coord: Coordination) -> None:
    coord.ping()
    policy, maxmemory = coord.eviction_policy()
    assert policy and maxmemory >= 0


def test_an_unreachable_redis_is_transient() -> None:
    c = RedisCoordination.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(Transient):
        c.ping()
    with pytest.raises(Transient):
        c.claim_delivery("github", "x", 60)
