"""A keyword-only index searched by a process with an embedding provider configured (README newcomer): the index
was created without ``SCOPEKB_EMBEDDING__PROVIDER`` (``...-kw``), the query service now runs with
``SCOPEKB_EMBEDDING__PROVIDER=local``. ``vector``/``hybrid`` must be refused up front (400, naming
``scopekb reindex``) from what the live index holds - before this, OpenSearch answered
``search_phase_execution_exception`` (a kNN query on an index without the field) and SQLite silently answered
hybrid from the keyword list alone - while ``keyword`` still answers. Both profiles, the real local model, the real
OpenSearch of ``scripts/services``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scopekb.stores.base import ChunkStore
from tests.integration.test_store_contract import mkdoc
from tests.profiles import profile_settings

ADMIN = "kwonly-admin-" + uuid.uuid4().hex
PROFILES = ["embedded", "distributed"]


@contextlib.contextmanager
def _served(request: pytest.FixtureRequest, tmp_path: Path, vectors: bool, provider: str) -> Iterator[Any]:
    """One chunk of agent ``kwonly`` in a keyword-only index (``vectors`` False) or in one holding vectors of the
    8-dimension fake model, and a client of the query app of the request's profile with embedding ``provider``,
    holding an agent key of ``kwonly``. Yields ``(app, client)``."""
    from scopekb.runtime import make_client
    from scopekb.stores.opensearch import OpenSearchChunkStore
    from scopekb.stores.sqlite import SqliteChunkStore
    from scopekb_query.app import create_app
    from tests.integration.test_store_contract import DIM, MODEL

    profile = request.param
    run = f"kwonly-{uuid.uuid4().hex[:8]}"
    services = {name: request.getfixturevalue(name) for name in ("opensearch_url", "redis_url", "s3_config")
                } if profile == "distributed" else {}
    kw = profile_settings(profile, tmp_path, services, run, ADMIN)  # provider "none"
    shape: dict[str, Any] = {"dimension": DIM, "model": MODEL} if vectors else {}
    store: ChunkStore
    if profile == "embedded":
        Path(kw.data_dir).mkdir(parents=True)
        store = SqliteChunkStore(Path(kw.data_dir) / "index.sqlite3", **shape)
    else:
        store = OpenSearchChunkStore(make_client(kw.opensearch), alias=kw.opensearch.alias, **shape)
    name = store.ensure_index()
    assert name.endswith("-kw") != vectors, name
    store.bulk_write([mkdoc("kwonly", "c", "src_kwonly", "lib.py", "def kwonly_marker_function():\n    return 1\n",
                            vector=vectors)], refresh=True)
    app = create_app(kw.model_copy(update={"embedding": kw.embedding.model_copy(update={"provider": provider})}))
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            made = client.post("/v1/keys", json={"agent_name": "kwonly", "context_ids": ["c"], "label": "t"},
                               headers={"Authorization": f"Bearer {ADMIN}"})
            assert made.status_code == 201, made.text
            client.headers["Authorization"] = f"Bearer {made.json()['key']}"
            yield app, client
    finally:
        if profile == "distributed":
            make_client(kw.opensearch).indices.delete(index=f"{run}-*", ignore_unavailable=True)


@pytest.fixture(params=PROFILES)
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A keyword-only index holding one chunk of agent ``kwonly``, and the query app of that profile with the
    ``local`` embedding provider configured."""
    with _served(request, tmp_path, vectors=False, provider="local") as (app, client):
        assert app.state.runtime.chunks.dimension  # the provider is configured: the process has a model
        yield {"client": client, "profile": request.param}


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
def test_vector_modes_on_a_keyword_only_index_are_400_naming_reindex(api: dict[str, Any], mode: str) -> None:
    r = api["client"].post("/v1/search", json={"query": "kwonly_marker_function", "mode": mode})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "keyword-only" in detail and "scopekb reindex" in detail and "SCOPEKB_EMBEDDING__PROVIDER" in detail, detail
    assert "search_phase_execution_exception" not in detail


def test_keyword_still_answers_and_mcp_default_is_keyword(api: dict[str, Any]) -> None:
    r = api["client"].post("/v1/search", json={"query": "kwonly_marker_function", "mode": "keyword"})
    assert r.status_code == 200, r.text
    assert [h["path"] for h in r.json()["hits"]] == ["lib.py"]
    from scopekb.search import best_mode

    app_rt = api["client"].app.state.runtime
    assert best_mode(app_rt.chunks, lambda q: [0.0]).value == "keyword"  # what the MCP tool picks by default


@pytest.fixture(params=PROFILES)
def no_model(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The other way round (README newcomer): an index holding vectors, and the query app of that profile started
    without an embedding provider (a query service restarted without ``SCOPEKB_EMBEDDING__PROVIDER`` after the
    ``scopekb reindex`` that added the vectors)."""
    with _served(request, tmp_path, vectors=True, provider="none") as (app, client):
        assert app.state.runtime.embedder is None
        yield {"client": client, "profile": request.param}


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
def test_vector_modes_without_a_model_in_the_process_say_so_not_keyword_only(no_model: dict[str, Any],
                                                                              mode: str) -> None:
    r = no_model["client"].post("/v1/search", json={"query": "kwonly_marker_function", "mode": mode})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "keyword-only" not in detail and "holds vectors (8 dimensions)" in detail, detail
    assert "started without one" in detail and "SCOPEKB_EMBEDDING__PROVIDER" in detail, detail
    r = no_model["client"].post("/v1/search", json={"query": "kwonly_marker_function", "mode": "keyword"})
    assert r.status_code == 200 and [h["path"] for h in r.json()["hits"]] == ["lib.py"], r.text
