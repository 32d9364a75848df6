"""Input that is not valid Unicode gets a 4xx with a reason, never a 5xx (issue 15 item 2), on a small FastAPI app
wired like the services (LoneSurrogateMiddleware, SafeJSONResponse, safe_validation_response).

The services' own routes are covered by tests/integration/test_api_profiles.py-style replays in
tests/integration/test_unicode_inputs.py on both profiles.
"""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from scopekb.http.unicode import (
    LoneSurrogateMiddleware,
    SafeJSONResponse,
    lone_surrogate_at,
    printable,
    safe_validation_response,
)
from scopekb_ingester.providers import BadRequest, decode_body


class Body(BaseModel):
    query: str = Field(min_length=1, max_length=5)
    n: int = 1


def make_app() -> FastAPI:
    app = FastAPI(default_response_class=SafeJSONResponse)
    app.add_exception_handler(RequestValidationError, safe_validation_response)
    app.add_middleware(LoneSurrogateMiddleware)

    @app.post("/echo")
    def echo(body: Body) -> dict:
        return {"query": body.query}

    @app.post("/raw")
    def raw(body: dict) -> dict:
        return {"got": body}

    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(make_app(), raise_server_exceptions=False)


@pytest.mark.parametrize("text", [
    '{"query": "\\ud800"}',  # the input
    '{"query": "\\udfff"}',
    '{"query": "ok\\udc80"}',
    '{"query": "\\ud83d"}',  # high half of an emoji, alone
    '{"query": "ab", "extra": ["x", "\\uDBFF"]}',
    '{"\\ud800": 1, "query": "ab"}',
    '{"query": "abcdefgh\\ud800"}',  # would also fail max_length: the surrogate is reported first
])
@pytest.mark.parametrize("path", ["/echo", "/raw"])
def test_lone_surrogates_in_json_are_400_naming_where(client: TestClient, text: str, path: str) -> None:
    r = client.post(path, content=text.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert "lone UTF-16 surrogate" in r.json()["detail"] and r.json()["detail"].startswith("body")


def test_paired_surrogates_and_plain_text_pass(client: TestClient) -> None:
    r = client.post("/echo", content=b'{"query": "\\ud83d\\ude00"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json() == {"query": "\U0001f600"}
    r = client.post("/raw", content=b'{"query": "\\\\ud800"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json() == {"got": {"query": "\\ud800"}}  # an escaped backslash: text


@pytest.mark.parametrize("body,ctype", [
    (b"\xff\xfe\xfd", "text/plain"),  # bytes that are not UTF-8, not parsed as JSON: FastAPI's 422 echoes them
    (b"\xff" * 5000, "application/x-www-form-urlencoded"),
    (b'{"query": "' + b"x" * 10000 + b'"}', "application/json"),  # a long input is echoed bounded
    (b'{"query": 5', "application/json"),
    (b"\x00\x01", None),
])
def test_validation_errors_echo_input_safely(client: TestClient, body: bytes, ctype: str | None) -> None:
    headers = {"Content-Type": ctype} if ctype else {}
    r = client.post("/echo", content=body, headers=headers)
    assert 400 <= r.status_code < 500, r.text
    assert len(r.content) < 5000
    json.loads(r.content.decode("utf-8"))


def test_safe_json_response_encodes_surrogates_as_escapes() -> None:
    body = SafeJSONResponse({"q": "a\ud800b"}).body
    assert body == b'{"q":"a\\ud800b"}' and json.loads(body) == {"q": "a\ud800b"}


def test_printable_and_where() -> None:
    assert printable(b"\xff ok") == "\\xff ok"
    assert printable("a\udc80") == "a\\udc80"
    assert printable("x" * 300) == "x" * 200 + "…"
    assert lone_surrogate_at({"a": [1, {"b": "\ud800"}]}) == "body.a.1.b"
    assert lone_surrogate_at({"a": "\U0001f600"}) is None


@pytest.mark.parametrize("body,ctype", [
    (b'{"ref": "refs/heads/\\ud800", "repository": {}}', "application/json"),
    (b"payload=%7B%22ref%22%3A%20%22%5Cud800%22%7D", "application/x-www-form-urlencoded"),
])
def test_webhook_bodies_with_lone_surrogates_are_bad_requests(body: bytes, ctype: str) -> None:
    with pytest.raises(BadRequest, match="surrogate"):
        decode_body(body, ctype)


def test_printable_gives_non_finite_numbers_as_text() -> None:
    """1e999 and NaN in a JSON body parse to inf/nan, which JSON cannot carry: the 422 echo gives them as text
    (hostile review: the echo raised ValueError in the response and the caller got a 500)."""
    out = printable({"a": float("inf"), "b": [float("nan"), -float("inf")], "c": 1.5})
    assert out == {"a": "inf", "b": ["nan", "-inf"], "c": 1.5}
    json.dumps(out, allow_nan=False)
