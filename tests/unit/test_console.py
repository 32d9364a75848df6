"""Console building blocks without a browser: hit highlighting escapes indexed text; session cookies and CSRF
tokens are signed, bound to the admin token and refused when forged or expired (issue 25)."""

from __future__ import annotations

import time

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient

from scopekb_query.console.highlight import MAX_TERMS, highlight, query_terms
from scopekb_query.console.session import SESSION_COOKIE, SessionCodec, csrf_ok


def test_highlight_escapes_content_and_marks_terms() -> None:
    lines = highlight("x = '<script>alert(1)</script>'\ndef Widget_maker(a<b):\n  pass", 10, "widget_maker script")
    assert [ln.number for ln in lines] == [10, 11, 12]
    assert "<script>" not in "".join(ln.html for ln in lines)
    assert lines[0].html == "x = &#39;&lt;<mark>script</mark>&gt;alert(1)&lt;/<mark>script</mark>&gt;&#39;"
    assert lines[1].html == "def <mark>Widget_maker</mark>(a&lt;b):" and lines[1].matched
    assert not lines[2].matched


def test_highlight_terms_are_literal_and_bounded() -> None:
    assert query_terms("a.*b (c|d)+ ee") == ["ee"]  # regex syntax is never a pattern; 1-char words dropped
    many = " ".join(f"term{i}" for i in range(100))
    assert len(query_terms(many)) == MAX_TERMS
    assert highlight("(.*)+", 1, "(.*)+")[0].html == "(.*)+"  # nothing to mark, nothing interpreted


def _app(codec: SessionCodec) -> FastAPI:
    app = FastAPI()

    @app.get("/console/start")
    def start(request: Request, role: str = "admin") -> Response:
        resp = Response("ok")
        codec.start(resp, request, role, "key_1" if role == "agent" else None)
        return resp

    @app.get("/console/me")
    def me(request: Request) -> dict:
        s = codec.read(request)
        return {"role": s.role, "key": s.key_id, "csrf": s.csrf} if s else {}

    return app


def test_session_round_trip_flags_and_csrf() -> None:
    client = TestClient(_app(SessionCodec("admin-token")))
    r = client.get("/console/start")
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Path=/console" in cookie
    assert "Secure" not in cookie  # plain http here; https sets Secure
    assert "admin-token" not in cookie
    me = client.get("/console/me").json()
    assert me["role"] == "admin" and len(me["csrf"]) >= 32
    client.get("/console/start", params={"role": "agent"})
    assert client.get("/console/me").json()["key"] == "key_1"


def test_secure_flag_over_tls() -> None:
    client = TestClient(_app(SessionCodec("t")), base_url="https://console.example")
    assert "Secure" in client.get("/console/start").headers["set-cookie"]


@pytest.mark.parametrize("tamper", ["flip", "other_token", "garbage"])
def test_forged_sessions_are_refused(tamper: str) -> None:
    client = TestClient(_app(SessionCodec("admin-token")))
    client.get("/console/start")
    value = client.cookies[SESSION_COOKIE]
    forged = {"flip": value[:-2] + ("A" if value[-2] != "A" else "B") + value[-1],
              "garbage": "eyJyb2xlIjoiYWRtaW4ifQ.x.y"}.get(tamper)
    if tamper == "other_token":  # signed under another admin token (e.g. before a rotation)
        other = TestClient(_app(SessionCodec("previous-token")))
        other.get("/console/start")
        forged = other.cookies[SESSION_COOKIE]
    fresh = TestClient(_app(SessionCodec("admin-token")))
    fresh.cookies.set(SESSION_COOKIE, forged)
    assert fresh.get("/console/me").json() == {}
    fresh.cookies.set(SESSION_COOKIE, value)  # the genuine cookie, as a control
    assert fresh.get("/console/me").json()["role"] == "admin"


def test_expired_sessions_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    client = TestClient(_app(SessionCodec("admin-token")))
    client.get("/console/start")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 9 * 3600)
    assert client.get("/console/me").json() == {}


def test_csrf_check() -> None:
    codec = SessionCodec("t")
    client = TestClient(_app(codec))
    client.get("/console/start")
    token = client.get("/console/me").json()["csrf"]
    from scopekb_query.console.session import SessionData

    s = SessionData("admin", None, token)
    assert csrf_ok(s, token) and not csrf_ok(s, "") and not csrf_ok(s, token + "x")
