"""Chunk index sizing from settings: shards from the expected chunk count unless set, several node URLs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scopekb.settings import OpenSearchSettings


def test_shards_follow_expected_chunks_unless_set() -> None:
    assert OpenSearchSettings().shards == 1  # 1 M chunks expected, 2 M a shard
    assert OpenSearchSettings(expected_chunks=2_000_000).shards == 1
    assert OpenSearchSettings(expected_chunks=2_000_001).shards == 2
    assert OpenSearchSettings(expected_chunks=20_000_000, chunks_per_shard=2_000_000).shards == 10
    assert OpenSearchSettings(expected_chunks=0).shards == 1
    assert OpenSearchSettings(expected_chunks=50_000_000, shards=3).shards == 3  # an explicit value wins


@pytest.mark.parametrize("bad", [{"replicas": -1}, {"shards": 0}, {"chunks_per_shard": 0}, {"expected_chunks": -5}])
def test_bad_sizes_are_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        OpenSearchSettings(**bad)


def test_url_names_every_node_of_a_cluster() -> None:
    cfg = OpenSearchSettings(url="http://a:9200, http://b:9200,,http://c:9200")
    assert cfg.hosts() == ["http://a:9200", "http://b:9200", "http://c:9200"]
    assert OpenSearchSettings().hosts() == ["http://127.0.0.1:9200"]
