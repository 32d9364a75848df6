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


def test_init_refuses_in_one_line_and_reports_placement(opensearch_client, opensearch_url) -> None:
    import os
    import subprocess
    import sys

    nodes = int(opensearch_client.cluster.health()["number_of_data_nodes"])
    alias = f"it-init-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SCOPEKB_PROFILE": "distributed", "SCOPEKB_OPENSEARCH__URL": opensearch_url,
           "SCOPEKB_OPENSEARCH__ALIAS": alias, "SCOPEKB_OPENSEARCH__SYSTEM_PREFIX": f"{alias}-sys",
           "SCOPEKB_EMBEDDING__PROVIDER": "none", "SCOPEKB_OPENSEARCH__SHARDS": "2"}
    cmd = [sys.executable, "-m", "scopekb_cli.main", "init"]
    try:
        bad = subprocess.run(cmd, env={**env, "SCOPEKB_OPENSEARCH__REPLICAS": str(nodes)}, capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode == 1, bad.stderr
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: the chunk index asks for"), bad.stderr
        assert opensearch_client.indices.get(index=f"{alias}*") == {}

        good = subprocess.run(cmd, env={**env, "SCOPEKB_OPENSEARCH__REPLICAS": str(nodes - 1)},
                              capture_output=True, text=True, timeout=120)
        assert good.returncode == 0, good.stderr
        assert f"2 shard(s), {nodes - 1} replica(s) on {nodes} data node(s)" in " ".join(good.stdout.split())
    finally:
        opensearch_client.indices.delete(index=f"{alias}*", params={"expand_wildcards": "open,closed"})
