"""Shards and replicas of the chunk index come from settings, and the cluster must be able to place them.

Runs on whatever ``scripts/services`` started: one node (CI) or a cluster (``up --opensearch-nodes 3``). An index
asking for as many replicas as there are data nodes cannot place its copies (OpenSearch never puts two copies
of a shard on one node): ``check_placement`` and ``ensure_index`` refuse it with the numbers and the setting to
change, and create nothing. One replica fewer is accepted and the index is created with the shards asked for.
"""

from __future__ import annotations

import uuid

import pytest

from scopekb.stores.base import IndexPlacementError
from scopekb.stores.opensearch import OpenSearchChunkStore


def test_replicas_the_cluster_cannot_place_are_refused(opensearch_client) -> None:
    nodes = int(opensearch_client.cluster.health()["number_of_data_nodes"])
    alias = f"it-place-{uuid.uuid4().hex[:8]}"
    too_many = OpenSearchChunkStore(opensearch_client, alias=alias, shards=2, replicas=nodes)
    with pytest.raises(IndexPlacementError, match=rf"{nodes + 1} copies .* {nodes} data node") as err:
        too_many.check_placement()
    assert "SCOPEKB_OPENSEARCH__REPLICAS" in str(err.value)
    with pytest.raises(IndexPlacementError):
        too_many.ensure_index()
    assert opensearch_client.indices.get(index=f"{alias}*") == {}  # nothing created

    fits = OpenSearchChunkStore(opensearch_client, alias=alias, shards=2, replicas=nodes - 1)
    try:
        before = fits.check_placement()
        assert before["index"] is None and before["data_nodes"] == nodes
        name = fits.ensure_index()
        placed = fits.check_placement()
        assert placed["index"] == name and placed["shards"] == 2 and placed["replicas"] == nodes - 1
        assert placed["status"] in ("green", "yellow")
    finally:
        opensearch_client.indices.delete(index=f"{alias}*", params={"expand_wildcards": "open,closed"})
