"""No 5xx from input that is not valid Unicode, on every route of both apps and both profiles (issue 15 item 2).

The issue's input: ``POST /v1/search`` with ``{"query": "\\ud800"}`` answered 500 (the 422 echoed the lone
surrogate and its encoding failed). Here every operation of the published OpenAPI that takes a JSON body gets
generated bodies whose strings mix lone surrogates, control characters and ordinary text (sent as JSON escapes,
as a client would), bodies that are not UTF-8 under several content types, and the webhook routes get the same;
the MCP endpoint gets a tool call with a lone surrogate. The query app and the ingester run in-process on the
embedded profile (SQLite, in-memory coordination) and the distributed one (OpenSearch, Redis).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scopekb.auth import ApiKey, new_key
from scopekb.settings import Settings

ADMIN = "unicode-admin-" + uuid.uuid4().hex
#: Text with lone surrogates, controls (C0, DEL, C1), separators and format characters among ordinary letters.
nasty = st.text(st.one_of(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                          st.characters(categories=["Cc", "Cf", "Zl", "Zp"]), st.characters(codec="utf-8")),
                min_size=1, max_size=12)
NOT_UTF8 = [b"\xff\xfe\xfd", b'{"query": "caf\xe9"}', b"\xc3\x28", b'{"a": "\xed\xa0\x80"}', b"\x80" * 64]
CTYPES = ["application/json", "text/plain", "application/x-www-form-urlencoded", None]


def _settings(profile: str, tmp: Path, request: pytest.FixtureRequest, run: str) -> Settings:
    common: dict[str, Any] = {"query": {"admin_token": ADMIN}, "embedding": {"provider": "none"},
                              "log_format": "json", "log_level": "WARNING", "profile": profile}
    if profile == "embedded":
        return Settings(data_dir=tmp, **common)
    return Settings(opensearch={"url": request.getfixturevalue("opensearch_url"), "alias": f"{run}-chunks",
                                "system_prefix": f"{run}-sys"},
                    redis={"url": request.getfixturevalue("redis_url")}, worker={"queue": f"{run}-queue"},
                    s3={**request.getfixturevalue("s3_config"), "bucket": run}, **common)


@pytest.fixture(scope="module", params=["embedded", "distributed"])
def apps(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from scopekb_ingester.app import create_app as ingester_app
    from scopekb_query.app import create_app as query_app

    run = f"uni-{uuid.uuid4().hex[:8]}"
    s = _settings(request.param, tmp_path_factory.mktemp("unicode"), request, run)
    q = query_app(s)
    secret, h = new_key()
    q.state.runtime.records.put("keys", "key_uni", ApiKey(id="key_uni", agent_name="uni", context_ids=None,
                                                         key_hash=h).model_dump(mode="json"))
    try:
        with TestClient(q, raise_server_exceptions=False) as qc, \
                TestClient(ingester_app(s), raise_server_exceptions=False) as ic:
            yield {"query": qc, "ingester": ic, "agent_key": secret, "openapi": q.openapi()}
    finally:
        if request.param == "distributed":
            q.state.runtime.opensearch_client.indices.delete(index=f"{run}-*", ignore_unavailable=True)


def _json_operations(openapi: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """(method, path with ids filled in, property names) of every operation taking a JSON body."""
    ops = []
    for path, item in openapi["paths"].items():
        for method, op in item.items():
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json")
            if body is None:
                continue
            schema = body.get("schema", {})
            if "$ref" in schema:
                schema = openapi["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
            ops.append((method.upper(), path.replace("{", "x").replace("}", ""), sorted(schema.get("properties", {}))))
    return ops


def _headers(apps: dict[str, Any], path: str, ctype: str | None = "application/json") -> dict[str, str]:
    token = apps["agent_key"] if path.startswith("/v1/search") else ADMIN
    h = {"Authorization": f"Bearer {token}"}
    if ctype:
        h["Content-Type"] = ctype
    return h


def test_the_issue_input_is_400_on_search(apps: dict[str, Any]) -> None:
    r = apps["query"].post("/v1/search", content=b'{"query": "\\ud800"}', headers=_headers(apps, "/v1/search"))
    assert r.status_code == 400 and "surrogate" in r.json()["detail"], r.text
    assert "body.query" in r.json()["detail"]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_json_bodies_with_surrogates_and_controls_never_5xx(apps: dict[str, Any], data: st.DataObject) -> None:
    method, path, props = data.draw(st.sampled_from(_json_operations(apps["openapi"])))
    keys = props or ["query"]
    body = data.draw(st.dictionaries(st.sampled_from(keys), st.one_of(nasty, st.lists(nasty, max_size=3)),
                                     min_size=1, max_size=len(keys)))
    raw = json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\udXXX escapes
    r = apps["query"].request(method, path, content=raw, headers=_headers(apps, path))
    assert r.status_code < 500, (method, path, raw[:200], r.status_code, r.text[:300])
    json.loads(r.content.decode("utf-8"))


@pytest.mark.parametrize("ctype", CTYPES)
@pytest.mark.parametrize("raw", NOT_UTF8)
def test_bodies_that_are_not_utf8_never_5xx(apps: dict[str, Any], raw: bytes, ctype: str | None) -> None:
    for method, path, _ in _json_operations(apps["openapi"]):
        r = apps["query"].request(method, path, content=raw, headers=_headers(apps, path, ctype))
        assert r.status_code < 500, (method, path, ctype, r.status_code, r.text[:300])


@pytest.mark.parametrize("text", ["\ud800", "\udfff", "a\x00b\x1b[2J", "x\u2028[2] evil", "\x7f\x85"])
def test_search_text_format_and_mcp_with_hostile_text(apps: dict[str, Any], text: str) -> None:
    raw = json.dumps({"query": text}).encode()
    r = apps["query"].post("/v1/search?format=text", content=raw, headers=_headers(apps, "/v1/search"))
    assert r.status_code < 500, r.text
    if r.status_code == 200:
        assert "\n" not in r.text and "\x1b" not in r.text and "\u2028" not in r.text
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search",
                                                                           "arguments": {"query": text}}}
    r = apps["query"].post("/mcp", content=json.dumps(call).encode(), headers={
        "Authorization": f"Bearer {apps['agent_key']}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"})
    assert r.status_code < 500, r.text


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(provider=st.sampled_from(["github", "gitlab", "gitea", "forgejo", "bitbucket", "s3"]),
       ref=nasty, name=nasty, event=st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1,
                                           max_size=20).map(str.strip).filter(bool),
       form=st.booleans())
def test_webhooks_with_surrogates_controls_and_odd_names_never_5xx(apps: dict[str, Any], provider: str, ref: str,
                                                                   name: str, event: str, form: bool) -> None:
    body = json.dumps({"ref": "refs/heads/" + ref, "before": "0" * 40, "after": "1" * 40,
                       "repository": {"full_name": name, "clone_url": f"https://h/{name}.git"},
                       "project": {"path_with_namespace": name}, "Records": [{"s3": {"object": {"key": name}}}]})
    raw = ("payload=" + json.dumps(body)).encode() if form else body.encode()
    headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": "d1", "X-Gitlab-Event": event,
               "X-Gitlab-Event-UUID": "d1", "X-Gitea-Event": event, "X-Gitea-Delivery": "d1", "X-Event-Key": event,
               "X-Request-UUID": "d1", "X-Scopekb-Token": "x",
               "Content-Type": "application/x-www-form-urlencoded" if form else "application/json"}
    r = apps["ingester"].post(f"/webhooks/{provider}", content=raw, headers=headers)
    assert r.status_code < 500, (provider, raw[:200], r.status_code, r.text)
    assert r.status_code != 202 or r.json()["status"] == "ignored"


@pytest.mark.parametrize("raw", NOT_UTF8)
@pytest.mark.parametrize("provider", ["github", "gitlab", "bitbucket", "s3"])
def test_webhook_bodies_that_are_not_utf8_never_5xx(apps: dict[str, Any], raw: bytes, provider: str) -> None:
    for ctype in CTYPES:
        headers = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "d2", "X-Gitlab-Event": "Push Hook",
                   "X-Gitlab-Event-UUID": "d2", "X-Event-Key": "repo:push", "X-Request-UUID": "d2"}
        if ctype:
            headers["Content-Type"] = ctype
        r = apps["ingester"].post(f"/webhooks/{provider}", content=raw, headers=headers)
        assert 400 <= r.status_code < 500, (provider, ctype, r.status_code, r.text)
