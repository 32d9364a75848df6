"""GitHub webhook verification and parsing (pure functions)."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from scopekb_ingester.providers import (
    BadRequest,
    github_signature,
    parse_github,
    parse_github_body,
    parse_github_push,
    verify_github,
)

BODY = b'{"ref": "refs/heads/main",  "before": "' + b"0" * 40 + b'", "after": "' + b"a" * 40 + \
    b'", "repository": {"full_name": "o/r\\u00e9", "clone_url": "https://h/o/r.git"}}'


def test_signature_known_vector() -> None:
    # HMAC-SHA256("secret", "hello") — a published test vector of the construction.
    assert github_signature("secret", b"hello") == (
        "sha256=88aab3ede8d3adf94d26ab90d3bafd4a2083070c3bcce9c014ee04a443847c0b")


def test_verify_accepts_any_of_rotated_secrets_and_rejects_tampering() -> None:
    sig = github_signature("new", BODY)
    assert verify_github(["old", "new"], BODY, sig)
    assert not verify_github(["old"], BODY, sig)
    assert not verify_github(["new"], BODY + b" ", sig)
    assert not verify_github(["new"], BODY, None)
    assert not verify_github(["new"], BODY, sig.removeprefix("sha256="))


def test_json_and_form_bodies_with_unicode_escapes() -> None:
    parsed = parse_github("push", parse_github_body(BODY, "application/json"))
    (push,) = parsed.pushes
    assert push.branch == "main" and not push.deleted and parsed.repository.full_name == "o/ré"
    form = b"payload=" + quote(BODY.decode()).encode()
    assert parse_github("push", parse_github_body(form, "application/x-www-form-urlencoded")) == parsed


@pytest.mark.parametrize("body", [b"", b"{", b"[1]", b"\xff\xfe", b"payload=%7B"])
def test_malformed_bodies(body: bytes) -> None:
    with pytest.raises(BadRequest):
        ctype = "application/x-www-form-urlencoded" if body.startswith(b"payload") else "application/json"
        parse_github_body(body, ctype)


@pytest.mark.parametrize(("body", "ctype", "reason"), [
    (b"payload=%7B", "application/x-www-form-urlencoded", "form field 'payload' is not valid JSON"),
    (b"payload=%FF", "application/x-www-form-urlencoded", "not valid UTF-8"),
    (b"\xff{}", "application/json", "body is not valid UTF-8"),
    (b"{", "application/json", "body is not valid JSON"),
])
def test_malformed_body_reasons_name_what_is_wrong(body: bytes, ctype: str, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        parse_github_body(body, ctype)


@pytest.mark.parametrize("patch", [{"ref": 3}, {"ref": "main"}, {"after": "xyz"}, {"before": None},
                                   {"repository": "x"}])
def test_bad_push_fields(patch: dict) -> None:
    data = json.loads(BODY)
    data.update(patch)
    with pytest.raises(BadRequest):
        parse_github("push", data)


def test_tag_and_branch_deletion() -> None:
    data = json.loads(BODY)
    data["ref"] = "refs/tags/v1"
    assert parse_github_push(data).branch is None
    data["ref"], data["after"] = "refs/heads/x", "0" * 40
    assert parse_github_push(data).deleted
