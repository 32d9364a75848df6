"""Connection pools sized to the threads that use them (issue 20).

opensearch-py keeps one connection per node unless told otherwise (urllib3's ``maxsize=1``), and the minio SDK
ten: with more threads calling at once, urllib3 opened a connection for each extra request and closed it after the
answer ("Connection pool is full, discarding connection"). The query service runs its sync routes in
``http.worker_threads`` threads, and its clients keep as many connections.
"""

from __future__ import annotations

import anyio
import anyio.to_thread

from scopekb.blobs import S3BlobStore
from scopekb.http.server import apply_worker_threads
from scopekb.runtime import pool_size
from scopekb.settings import HttpSettings, OpenSearchSettings, S3Settings, Settings
from scopekb.stores.opensearch import DEFAULT_POOL_MAXSIZE, make_client


def _maxsizes(client: object) -> list[int]:
    return [c.pool.pool.maxsize for c in client.transport.connection_pool.connections]  # type: ignore[attr-defined]


def test_the_opensearch_pool_follows_the_setting_on_every_node() -> None:
    cfg = OpenSearchSettings(url="http://127.0.0.1:1,http://127.0.0.1:2", pool_maxsize=7)
    assert _maxsizes(make_client(cfg)) == [7, 7]
    assert _maxsizes(make_client(cfg, interactive=True)) == [7, 7]
    assert _maxsizes(make_client(cfg, pool_maxsize=13)) == [13, 13]  # the caller's thread count wins


def test_the_default_pool_matches_the_worker_threads() -> None:
    assert _maxsizes(make_client(OpenSearchSettings())) == [DEFAULT_POOL_MAXSIZE]
    s = Settings(http={"worker_threads": 12})
    assert pool_size(s) == 12
    assert _maxsizes(make_client(s.opensearch, interactive=True, pool_maxsize=pool_size(s))) == [12]
    assert pool_size(Settings(http={"worker_threads": 12}, opensearch={"pool_maxsize": 3})) == 3
    assert DEFAULT_POOL_MAXSIZE == HttpSettings().worker_threads == 40  # anyio's default thread limiter


def test_the_s3_pool_follows_the_thread_count() -> None:
    store = S3BlobStore(S3Settings(access_key="a", secret_key="b"), pool_maxsize=24)
    assert store.client._http.connection_pool_kw["maxsize"] == 24


def test_apply_worker_threads_sizes_anyios_thread_limiter() -> None:
    async def main() -> float:
        apply_worker_threads(HttpSettings(worker_threads=6))
        return anyio.to_thread.current_default_thread_limiter().total_tokens

    assert anyio.run(main) == 6


def test_the_ingester_app_sizes_its_thread_limiter_to_the_setting(tmp_path) -> None:  # noqa: ANN001
    """The webhook route runs its blocking part (parse, Redis, publish) in anyio's threads: the ingester app sizes
    them to ``http.worker_threads`` at startup, as the query app does."""
    from fastapi.testclient import TestClient

    from scopekb_ingester.app import create_app

    app = create_app(Settings(profile="embedded", data_dir=tmp_path, http={"worker_threads": 9}))

    async def limiter_size() -> dict[str, float]:
        return {"tokens": anyio.to_thread.current_default_thread_limiter().total_tokens}

    app.add_api_route("/limiter", limiter_size)
    with TestClient(app) as client:
        assert client.get("/limiter").json() == {"tokens": 9}
