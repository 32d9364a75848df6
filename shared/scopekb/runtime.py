"""Wiring: build the stores and clients a process needs from :class:`scopekb.settings.Settings`."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from scopekb.blobs import S3BlobStore
from scopekb.indexing import SyncDeps
from scopekb.settings import Settings
from scopekb.stores.opensearch import OpenSearchChunkStore, make_client
from scopekb.stores.records import OpenSearchRecordStore, RecordStore


@dataclass
class Runtime:
    """The long-lived clients of one process."""

    settings: Settings
    records: RecordStore
    chunks: OpenSearchChunkStore
    blobs: S3BlobStore

    def sync_deps(self) -> SyncDeps:
        return SyncDeps(settings=self.settings, records=self.records, chunks=self.chunks, blobs=self.blobs)


def build_runtime(settings: Settings) -> Runtime:
    """Clients for OpenSearch (chunks + records) and S3. Nothing is contacted until first use."""
    client = make_client(settings.opensearch)
    os_cfg = settings.opensearch
    chunks = OpenSearchChunkStore(client, alias=os_cfg.alias, dimension=None, model=None,
                                  shards=os_cfg.shards, replicas=os_cfg.replicas,
                                  bulk_max_bytes=os_cfg.bulk_max_bytes)
    return Runtime(settings=settings, records=OpenSearchRecordStore(client, os_cfg.system_prefix), chunks=chunks,
                   blobs=S3BlobStore(settings.s3))


def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client for dedupe keys and locks (short timeouts: a request never hangs on Redis)."""
    return redis.Redis.from_url(settings.redis.url, socket_timeout=5, socket_connect_timeout=3)
