"""Blob stores: where document contents wait between the git reader and the indexers (DESIGN §1).

Keys are content-addressed (``blobs/<2 hex>/<blob id>``) so the same content is stored once, whatever path,
branch or scope it appears under, and a retried upload is a harmless overwrite.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import certifi
import urllib3
from minio import Minio
from minio.error import MinioException, S3Error
from urllib3.exceptions import HTTPError as Urllib3Error

from scopekb.errors import ScopekbError, Transient, translating
from scopekb.settings import S3Settings


class BlobNotFound(KeyError):
    """The requested blob key does not exist in the store."""


def blob_key(blob_id: str) -> str:
    """Content-addressed object key for a git blob id (or any hex content hash)."""
    return f"blobs/{blob_id[:2]}/{blob_id}"


class BlobStore(Protocol):
    """Put/get bytes by key. Implementations: :class:`S3BlobStore`, :class:`LocalBlobStore`."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...


def translate_s3(exc: BaseException) -> ScopekbError:
    """scopekb's error for an S3 failure (unreachable, refused, server error): :class:`Transient`."""
    return Transient(f"blob store unavailable ({type(exc).__name__})")


#: Seconds the readiness probe of S3 (:meth:`S3BlobStore.health`) waits to connect and for the answer: well inside
#: a Kubernetes probe's default 1 s timeout plus its period, so a stopped S3 is reported instead of hanging the probe.
HEALTH_TIMEOUT_S = 0.5

#: Connections the ``minio`` SDK's own HTTP client keeps per host (``urllib3.PoolManager(maxsize=10)``).
MINIO_POOL_MAXSIZE = 10


def s3_http_client(pool_maxsize: int) -> urllib3.PoolManager:
    """The HTTP client the ``minio`` SDK builds for itself (7.2: 5 min connect/read timeouts, certificates from
    ``SSL_CERT_FILE`` or certifi, 5 retries with 0.2 s backoff on 500/502/503/504) but keeping ``pool_maxsize``
    connections per host instead of 10: with more threads than that calling S3 at once (the query service's worker
    threads reading blobs) urllib3 closed the connection of each thread past the tenth after its request."""
    timeout = 5 * 60
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=timeout, read=timeout), maxsize=pool_maxsize, cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=urllib3.Retry(total=5, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]))


#: Tries of :func:`ensure_bucket` when the server answers a bucket creation with ``NoSuchBucket``.
BUCKET_CREATE_TRIES = 5


def ensure_bucket(client: Minio, bucket: str) -> None:
    """Create ``bucket`` when it does not exist (idempotent: one that exists, or is created meanwhile by another
    process, is fine).

    SeaweedFS answers a bucket creation that races its own metadata with ``NoSuchBucket`` ("PutBucketHandler:
    failed to get bucket config", seen once in a CI run of the whole suite); the bucket is there a moment later.
    So that answer is retried, up to :data:`BUCKET_CREATE_TRIES` times, 0.2-0.8 s apart, asking first whether the
    bucket now exists.

    Raises:
        minio.error.S3Error: any other refusal, or ``NoSuchBucket`` still after the last try.
    """
    for attempt in range(BUCKET_CREATE_TRIES):
        if client.bucket_exists(bucket):
            return
        try:
            client.make_bucket(bucket)
            return
        except S3Error as e:
            if e.code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return
            if e.code != "NoSuchBucket" or attempt == BUCKET_CREATE_TRIES - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


@translating((MinioException, Urllib3Error, OSError), translate_s3)
class S3BlobStore:
    """Blobs in an S3 bucket through the ``minio`` SDK (any S3-compatible server).

    ``pool_maxsize``: connections kept per host, at least the threads that may call the store at once
    (:func:`s3_http_client`; :func:`scopekb.runtime.build_runtime` gives the process's worker threads).

    Raises :class:`BlobNotFound` for a missing key; other S3 failures as :class:`scopekb.errors.Transient`;
    :class:`scopekb.settings.S3NotConfigured` when the settings carry no credentials.
    """

    def __init__(self, cfg: S3Settings, pool_maxsize: int = MINIO_POOL_MAXSIZE) -> None:
        access_key, secret_key = cfg.credentials()  # raises S3NotConfigured: never built-in credentials
        self.client = Minio(cfg.endpoint, access_key=access_key, secret_key=secret_key, secure=cfg.secure,
                            region=cfg.region, http_client=s3_http_client(pool_maxsize))
        self.bucket = cfg.bucket
        self._bucket_ok = False
        self._cfg = cfg
        self._probe: Minio | None = None

    def health(self) -> None:
        """Ask the server whether the bucket exists (one HEAD, :data:`HEALTH_TIMEOUT_S` for connect and read, no
        retries), for readiness: raises :class:`scopekb.errors.Transient` when S3 does not answer. A missing bucket
        is healthy (the first write creates it)."""
        if self._probe is None:
            access_key, secret_key = self._cfg.credentials()
            self._probe = Minio(self._cfg.endpoint, access_key=access_key, secret_key=secret_key,
                                secure=self._cfg.secure, region=self._cfg.region, http_client=urllib3.PoolManager(
                                    timeout=urllib3.Timeout(connect=HEALTH_TIMEOUT_S, read=HEALTH_TIMEOUT_S),
                                    maxsize=1, retries=False, cert_reqs="CERT_REQUIRED",
                                    ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where()))
        self._probe.bucket_exists(self.bucket)

    def ensure_bucket(self) -> None:
        """Create the bucket when missing (idempotent; :func:`ensure_bucket`)."""
        if self._bucket_ok:
            return
        ensure_bucket(self.client, self.bucket)
        self._bucket_ok = True

    def put(self, key: str, data: bytes) -> None:
        self.ensure_bucket()
        self.client.put_object(self.bucket, key, io.BytesIO(data), length=len(data),
                               content_type="application/octet-stream")

    def get(self, key: str) -> bytes:
        try:
            resp = self.client.get_object(self.bucket, key)
        except S3Error as e:
            if e.code in ("NoSuchKey", "NoSuchBucket"):
                raise BlobNotFound(key) from e
            raise
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    def delete(self, key: str) -> None:
        self.client.remove_object(self.bucket, key)


class LocalBlobStore:
    """Blobs as files under a folder (embedded mode). Writes are atomic (temp file + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root.resolve() not in p.parents:
            raise ValueError(f"blob key escapes the store: {key!r}")
        return p

    def put(self, key: str, data: bytes) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(p)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise BlobNotFound(key) from e

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class BlobUploads:
    """Blob-store puts sent concurrently while the sync goes on (issue 20).

    :meth:`put` hands a blob to a pool of ``workers`` threads and returns at once (the S3 client releases the GIL
    while it waits for the server); :meth:`wait` blocks until the named blobs (or all) are stored and re-raises the
    first failure. The sync waits for a batch's blobs before writing that batch's chunks, so every chunk in the
    index has its blob in the store (the read path and reindex rely on it), and for all of them before it ends.
    Puts of one key are sent once per :class:`BlobUploads` (content-addressed keys: the same bytes).

    Args:
        store: where blobs go.
        workers: puts in flight at most (8: enough to hide SeaweedFS/MinIO latency on small files without
            overloading a 2-core machine; measured in bench/ as part of the sync read phase).
    """

    def __init__(self, store: BlobStore, workers: int = 8) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="blob-put")
        self._futures: dict[str, Any] = {}

    def put(self, key: str, data: bytes) -> None:
        """Start storing ``data`` under ``key`` (no-op when already started)."""
        if key not in self._futures:
            self._futures[key] = self._pool.submit(self.store.put, key, data)

    def wait(self, keys: Iterable[str] | None = None) -> None:
        """Block until the puts of ``keys`` (all when None) finished. Raises the first put's error."""
        futures = list(self._futures.values()) if keys is None else [self._futures[k] for k in keys
                                                                     if k in self._futures]
        for f in futures:
            f.result()

    def close(self) -> None:
        """Stop the threads (puts still running finish first)."""
        self._pool.shutdown(wait=True)
