"""Finding a task's message in the Redis broker's layout (kombu's queue lists and unacknowledged hash), on a
fake of the three Redis calls used; the real broker is exercised by tests/faults/test_lost_message.py."""

from __future__ import annotations

import json

from celery import Celery

from scopekb.queue import PRIORITY_SEP, queue_names, task_ids_in_redis


def _msg(task_id: str) -> bytes:
    return json.dumps({"body": "e30=", "headers": {"id": task_id, "task": "scopekb.sync_sources"},
                       "properties": {"delivery_tag": "t-" + task_id}}).encode()


class FakeRedis:
    def __init__(self, lists: dict[str, list[bytes]], unacked: dict[str, bytes]) -> None:
        self.lists, self.unacked = lists, unacked
        self.calls = 0

    def lrange(self, name: str, start: int, end: int) -> list[bytes]:
        self.calls += 1
        return self.lists.get(name, [])[start:end + 1]

    def hscan_iter(self, name: str, count: int = 10):
        assert name == "unacked"
        return iter(self.unacked.items())


def test_finds_messages_in_every_priority_list_and_the_unacked_hash() -> None:
    r = FakeRedis({"q": [_msg("a"), b"not json"], f"q{PRIORITY_SEP}6": [_msg("b")], "other": [_msg("c")]},
                  {"tag1": json.dumps([json.loads(_msg("d")), "", "q"]).encode(), "tag2": b"[]"})
    assert task_ids_in_redis(r, ["q"], ["a", "b", "c", "d", "e"]) == {"a", "b", "d"}


def test_reads_lists_in_pages_and_stops_when_everything_is_found() -> None:
    r = FakeRedis({"q": [_msg(str(i)) for i in range(25)]}, {})
    assert task_ids_in_redis(r, ["q"], ["3", "12"], page=5) == {"3", "12"}
    assert r.calls == 3  # pages 0-4, 5-9, 10-14; never the rest, nor the other priority lists


def test_queue_names_cover_the_default_queue_and_routes() -> None:
    app = Celery("t")
    app.conf.update(task_default_queue="sync", task_routes={"x": {"queue": "embed"}, "y": {"queue": "sync"}})
    assert queue_names(app) == {"sync", "embed"}
