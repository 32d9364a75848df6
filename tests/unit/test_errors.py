"""One error family (issue 17): adapters translate library errors into Transient (503, retried) and Refused (4xx),
and REST answers them alike; nothing here needs a running service (the backends are unreachable on purpose)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import TransportError

from scopekb.embedding import EmbeddingUnavailable
from scopekb.errors import NotFound, Refused, Transient, translating
from scopekb.gitrepo import GitError
from scopekb.indexing import StoreUnavailable, SyncError
from scopekb.search import SearchUnavailable
from scopekb.settings import Settings
from scopekb.sources import InvalidRepoUrl
from scopekb.stores.opensearch import translate_opensearch

ADMIN = "errors-admin-token"


def test_opensearch_errors_are_translated() -> None:
    down = translate_opensearch(OSConnectionError("N/A", "refused", None))
    assert isinstance(down, Transient) and str(down) == "search backend unavailable"
    too_many = translate_opensearch(TransportError(500, "search_phase_execution_exception", {
        "error": {"root_cause": [{"type": "too_many_clauses"}]}}))
    assert isinstance(too_many, Refused) and too_many.status == 400 and "too_many_clauses" in str(too_many)
    bad = translate_opensearch(TransportError(400, "parsing_exception", {}))
    assert isinstance(bad, Refused) and bad.status == 400
    busy = translate_opensearch(TransportError(429, "rejected", {}))
    assert isinstance(busy, Transient) and str(busy) == "search backend error"


def test_translating_wraps_public_methods_only_and_lets_scopekb_errors_pass() -> None:
    @translating(KeyError, lambda e: Transient(f"down {e}"))
    class Adapter:
        def public(self) -> None:
            raise KeyError("x")

        def refuses(self) -> None:
            raise NotFound("nope")

        def _private(self) -> None:
            raise KeyError("y")

    with pytest.raises(Transient, match="down") as info:
        Adapter().public()
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(NotFound):
        Adapter().refuses()
    with pytest.raises(KeyError):
        Adapter()._private()


@pytest.mark.parametrize("exc, family", [
    (GitError("fetch failed"), Transient), (EmbeddingUnavailable("429", 429), Transient),
    (StoreUnavailable("bulk"), Transient), (SyncError("no sources"), Refused),
    (SearchUnavailable("keyword-only"), Refused), (InvalidRepoUrl("ext::"), Refused)])
def test_scopekb_errors_belong_to_the_family(exc: Exception, family: type) -> None:
    assert isinstance(exc, family)


@pytest.fixture()
def unreachable(monkeypatch: pytest.MonkeyPatch) -> TestClient:
    """The query app with OpenSearch and Redis on a port nothing listens on."""
    from scopekb_query.app import create_app

    for k in list(__import__("os").environ):
        if k.startswith("SCOPEKB_"):
            monkeypatch.delenv(k)
    s = Settings(profile="distributed", opensearch={"url": "http://127.0.0.1:9"}, redis={"url": "redis://127.0.0.1:9"},
                 s3={"endpoint": "127.0.0.1:9", "access_key": "k", "secret_key": "s"},
                 embedding={"provider": "none"}, query={"admin_token": ADMIN}, log_format="json", log_level="WARNING")
    return TestClient(create_app(s), raise_server_exceptions=False)


def test_rest_answers_503_with_the_reason_when_backends_are_down(unreachable: TestClient) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    r = unreachable.get("/v1/sources", headers=admin)
    assert (r.status_code, r.json()) == (503, {"detail": "search backend unavailable"})
    r = unreachable.get("/v1/jobs/nope", headers=admin)
    assert r.status_code == 503
    r = unreachable.post("/v1/search", json={"query": "x"}, headers={"Authorization": "Bearer skb_unknown"})
    assert (r.status_code, r.json()["detail"]) == (503, "search backend unavailable")
    r = unreachable.get("/readyz")
    assert r.status_code == 503 and r.json()["checks"] == {"opensearch": "error: ConnectionError",
                                                           "redis": "error: ConnectionError",
                                                           "s3": "error: NewConnectionError"}
