"""Skip rules, decoding, clone-URL validation and key scopes."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopekb import filetypes as ft
from scopekb.auth import ApiKey, ScopeDenied, ScopeMissing, hash_key, new_key, resolve_scope
from scopekb.sources import InvalidRepoUrl, normalise_repo, validate_repo_url
from scopekb.stores.opensearch import scope_clauses


def test_decode_variants() -> None:
    assert ft.decode_text(codecs.BOM_UTF8 + "héllo\r\nx\r".encode()) == "héllo\nx\n"
    assert ft.decode_text(codecs.BOM_UTF16_LE + "grüß".encode("utf-16-le")) == "grüß"
    assert ft.decode_text("café".encode("latin-1")) == "café"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b" ", b"\n", b"\t", b"\r", b"\x01", b"\x07", b"\x1b", b"\x1f", b"\x7f",
                                 b"\x0b", b"\x0c", b"\x08"]), max_size=200).map(b"".join),
       st.integers(min_value=0, max_value=9000))
def test_ascii_fast_path_matches_the_decoded_check(body: bytes, pad: int) -> None:
    """Issue 20: ASCII blobs are classified without decoding (controls counted on the bytes); the answer is the
    one the decode-and-count path gives, for every share of control characters and across the sniff window."""
    data = b"x" * pad + body
    assert ft._too_many_control_bytes(data) == ft._too_many_controls(data.decode("ascii"))
    want = None if not data.strip() else ("utf-8" if not ft._too_many_controls(data.decode()) else None)
    assert (ft.sniff_encoding(data) if data.strip() else None) == want
    assert (ft.content_skip_reason(data) == ft.SKIP_EMPTY) == (not data.strip())


def test_content_skip_reasons() -> None:
    assert ft.content_skip_reason(b"\x00\x01binary") == ft.SKIP_BINARY
    assert ft.content_skip_reason(b"version https://git-lfs.github.com/spec/v1\noid sha256:x\n") == ft.SKIP_LFS
    assert ft.content_skip_reason(b"  \n\t") == ft.SKIP_EMPTY
    assert ft.content_skip_reason(codecs.BOM_UTF16_LE + "a".encode("utf-16-le")) is None
    assert ft.content_skip_reason(b"print('hi')\n") is None


@pytest.mark.parametrize("path,reason", [
    (".env", ft.SKIP_SECRET), ("conf/.env.production", ft.SKIP_SECRET), ("keys/id_rsa", ft.SKIP_SECRET),
    ("certs/server.pem", ft.SKIP_SECRET), ("node_modules/x/index.js", ft.SKIP_VENDORED),
    ("static/app.min.js", ft.SKIP_VENDORED), ("src/app.py", None), ("docs/naïve file 'q'.md", None),
])
def test_path_skip_reasons(path: str, reason: str | None) -> None:
    assert ft.path_skip_reason(path) == reason


def test_include_exclude_globs() -> None:
    assert ft.path_skip_reason("a/b.py", include=["*.py"]) is None
    assert ft.path_skip_reason("a/b.md", include=["*.py"]) == ft.SKIP_EXCLUDED
    assert ft.path_skip_reason("tests/x.py", exclude=["tests/**"]) == ft.SKIP_EXCLUDED


@pytest.mark.parametrize("url", ["file:///etc", "ext::sh -c id", "http://example.com/r.git",
                                 "https://169.254.169.254/latest", "https://127.0.0.1/r.git",
                                 "https://user:pw@example.com/r.git", "/etc", "git@localhost:x/y.git"])
def test_refused_clone_urls(url: str) -> None:
    with pytest.raises(InvalidRepoUrl):
        validate_repo_url(url)


def test_allowlist_and_local_paths(tmp_path) -> None:
    assert validate_repo_url("https://127.0.0.1/r.git", host_allowlist=["127.0.0.1"])
    (tmp_path / ".git").mkdir()
    assert validate_repo_url(str(tmp_path), allow_local=True) == str(tmp_path)
    with pytest.raises(InvalidRepoUrl):
        validate_repo_url(str(tmp_path / "nope"), allow_local=True)
    with pytest.raises(InvalidRepoUrl, match="SCOPEKB_GIT__ALLOW_LOCAL_PATHS=true .*workers"):
        validate_repo_url(str(tmp_path))  # names the variable to set, and that the workers need it too


def test_normalise_repo_equivalences() -> None:
    a = normalise_repo("https://GitHub.com/Org/Repo.git")
    assert a == normalise_repo("git@github.com:Org/Repo.git") == normalise_repo("ssh://git@github.com/Org/Repo/")
    assert a == normalise_repo("https://github.com/Org/Repo.GIT")  # hostile review: the suffix in capitals


def _key(contexts: list[str] | None) -> ApiKey:
    return ApiKey(id="k", agent_name="Agent", context_ids=contexts, key_hash="h")


def test_scope_resolution_never_leaves_the_agent() -> None:
    assert resolve_scope(_key(["c1"]), None, False).context_ids == ("c1",)
    assert resolve_scope(_key(["c1", "c2"]), "c2", False).context_ids == ("c2",)
    assert resolve_scope(_key(["c1", "c2"]), None, True).context_ids == ("c1", "c2")
    s = resolve_scope(_key(None), None, True)
    assert s.agent_name == "Agent" and s.context_ids is None
    with pytest.raises(ScopeDenied):
        resolve_scope(_key(["c1"]), "c9", False)
    with pytest.raises(ScopeMissing):
        resolve_scope(_key(["c1", "c2"]), None, False)
    assert scope_clauses(s)[0] == {"term": {"agent_name": "Agent"}}


def test_a_key_names_each_context_once() -> None:
    """Hostile review: context_ids ["refs", "refs"] made a one-context key whose searches needed cross_context."""
    from scopekb.models import KeyCreate

    assert KeyCreate(agent_name="a", context_ids=["refs", "refs", "b", "refs"]).context_ids == ["refs", "b"]


def test_keys_are_random_and_hashed() -> None:
    k1, h1 = new_key()
    k2, _ = new_key()
    assert k1 != k2 and h1 == hash_key(k1) and k1 not in h1 and len(k1) > 40


def test_source_refs_follow_check_ref_format_and_stored_records_still_load() -> None:
    """Control characters (ESC, newline, DEL) are refused in a new source's ref and repository name (git's
    check-ref-format forbids them in refs); a record stored before the rule still loads as it was."""
    import pydantic

    from scopekb.models import Source, SourceCreate

    base = {"agent_name": "a", "context_id": "c", "repo_url": "https://example.invalid/r.git"}
    for bad in ({"ref": "ma\x1bin"}, {"ref": "main\nX"}, {"ref": "a\x7fb"}, {"repo_name": "x\n- forged"}):
        with pytest.raises(pydantic.ValidationError):
            SourceCreate(**base, **bad)
    assert SourceCreate(**base, ref="refs/heads/feature/x", repo_name="owner/[repo]").ref == "feature/x"
    # hostile review F5: option-like, reflog syntax and special refs name no branch (git check-ref-format)
    for bad_ref in ("-x", "--upload-pack=x", "@{-1}", "main@{1}", "HEAD", "FETCH_HEAD", "@", "a//b", "x/", "x.",
                    ".hidden", "b.lock", "refs/tags/HEAD"):
        with pytest.raises(pydantic.ValidationError, match="check-ref|special ref|'-'|'@{'|'//'|'/'|'.lock'"):
            SourceCreate(**base, refs=[bad_ref])
        with pytest.raises(pydantic.ValidationError):
            SourceCreate(**base, ref=bad_ref)
    ok = SourceCreate(**base, refs=["main", "feature/*", "v*", "refs/tags/v1.*", "release/1.0", "HEADS-up"])
    assert ok.refs == ["main", "feature/*", "v*", "refs/tags/v1.*", "release/1.0", "HEADS-up"]
    old = Source.model_validate({**base, "id": "src_1", "ref": "ma\x1bin", "repo_name": "x\ny"})
    assert old.ref == "ma\x1bin" and old.repo_name == "x\ny"


def test_source_locations_are_bounded_for_new_sources_only() -> None:
    """repo_url ≤ 2,048 characters, bucket ≤ 63, prefix ≤ 1,024 UTF-8 bytes for a new source; a stored record
    beyond them still loads (never lose a source by a new rule)."""
    import pydantic

    from scopekb.models import SOURCE_LOCATION_LIMITS, Source, SourceCreate

    base = {"agent_name": "a", "context_id": "c"}
    url = "https://example.invalid/" + "x" * 2048
    with pytest.raises(pydantic.ValidationError, match="repo_url is 2072 characters; at most 2048"):
        SourceCreate(**base, repo_url=url)
    ok = "https://example.invalid/" + "x" * (SOURCE_LOCATION_LIMITS["repo_url"] - 24)
    assert SourceCreate(**base, repo_url=ok).repo_url == ok
    with pytest.raises(pydantic.ValidationError, match="bucket is 64 characters"):
        SourceCreate(**base, kind="s3", bucket="b" * 64, prefix="p")
    with pytest.raises(pydantic.ValidationError, match="prefix is 1026 bytes"):
        SourceCreate(**base, kind="s3", prefix="é" * 513)
    assert SourceCreate(**base, kind="s3", prefix="é" * 512).prefix == "é" * 512
    assert Source.model_validate({**base, "id": "src_1", "repo_url": url}).repo_url == url
