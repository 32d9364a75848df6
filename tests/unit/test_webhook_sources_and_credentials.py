"""Issue 16, items 1 and 6 (library side): a webhook-driven source always has a secret (generated and shown once
when none is given), a source without one never takes a delivery, and no built-in S3 credentials exist; the
embedded profile keeps object-store documents in its own folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from scopekb.blobs import S3BlobStore
from scopekb.documents import FolderPrefix, ObjectPrefix, document_prefix
from scopekb.models import Source, SourceCreate
from scopekb.settings import S3NotConfigured, S3Settings, Settings
from scopekb.sources import delivery_targets, webhook_secret_for


@pytest.fixture(autouse=True)
def _no_scopekb_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings built here see only what the test gives (scripts/services env exports S3 settings)."""
    import os

    for name in list(os.environ):
        if name.startswith("SCOPEKB_"):
            monkeypatch.delenv(name)


BASE = {"agent_name": "a", "context_id": "c", "repo_url": "https://example.com/o/r.git"}


def test_a_webhook_driven_source_without_a_secret_gets_one_shown_once() -> None:
    secret, shown = webhook_secret_for(SourceCreate(**BASE))
    assert shown is not None and len(shown) >= 40 and secret is not None and secret.get_secret_value() == shown
    again, shown2 = webhook_secret_for(SourceCreate(**BASE))
    assert shown2 != shown  # fresh each time
    given, not_shown = webhook_secret_for(SourceCreate(**BASE, webhook_secret="mine"))
    assert given is not None and given.get_secret_value() == "mine" and not_shown is None
    assert webhook_secret_for(SourceCreate(**BASE, webhooks=False, webhook_secret="x")) == (None, None)


def _src(**kw: object) -> Source:
    return Source(**{**BASE, **kw}, id=Source.new_id())


def test_unsigned_or_not_webhook_driven_sources_never_take_a_delivery() -> None:
    legacy = _src()  # registered before issue 16: webhook-driven but no secret
    off = _src(webhooks=False, webhook_secret=SecretStr("s"))
    assert off.secrets() == []
    always = lambda secrets: True  # noqa: E731 - even a verifier that accepts anything
    assert delivery_targets([legacy, off], always) == ([], 404)
    signed = _src(webhook_secret=SecretStr("s"))
    assert delivery_targets([legacy, signed], lambda secrets: "s" in secrets) == ([signed], None)
    assert delivery_targets([legacy, signed], lambda secrets: False) == ([], 401)
    assert delivery_targets([], always) == ([], 404)


def test_no_built_in_s3_credentials_in_any_profile() -> None:
    cfg = S3Settings()
    assert cfg.access_key is None and cfg.secret_key is None
    with pytest.raises(S3NotConfigured, match="SCOPEKB_S3__ACCESS_KEY"):
        S3BlobStore(cfg)
    with pytest.raises(S3NotConfigured):
        ObjectPrefix(S3Settings(access_key="k", secret_key=SecretStr("")), "b", "p")
    assert S3Settings(access_key="k", secret_key=SecretStr("s")).credentials() == ("k", "s")


def test_embedded_profile_keeps_documents_in_its_folder(tmp_path: Path) -> None:
    from scopekb.blobs import LocalBlobStore
    from scopekb.indexing import SyncDeps

    s = Settings(profile="embedded", data_dir=tmp_path)
    deps = SyncDeps(settings=s, records=None, chunks=None,  # type: ignore[arg-type]
                    blobs=LocalBlobStore(tmp_path / "blobs"))
    assert deps.documents_dir == tmp_path / "documents"
    store = document_prefix(s, None, "agents/a/docs", deps.documents_dir)
    assert isinstance(store, FolderPrefix)
    key = store.put("runbooks/restart.md", b"# Restart\n")
    assert key == "agents/a/docs/runbooks/restart.md"
    assert (tmp_path / "documents" / "scopekb" / "agents/a/docs/runbooks/restart.md").read_bytes() == b"# Restart\n"
    tree = store.tree()
    assert list(tree) == ["runbooks/restart.md"]
    assert store.read_blob(tree["runbooks/restart.md"].sha) == b"# Restart\n"
    # symlinks are never followed, traversal is refused
    (tmp_path / "outside.md").write_text("secret")
    (tmp_path / "documents/scopekb/agents/a/docs/link.md").symlink_to(tmp_path / "outside.md")
    assert list(document_prefix(s, None, "agents/a/docs", deps.documents_dir).tree()) == ["runbooks/restart.md"]
    for bad in ("../x.md", "a/../../x.md", "", "a//b"):
        with pytest.raises(ValueError):
            store.put(bad, b"x")


def test_s3_documents_only_with_explicit_settings(tmp_path: Path) -> None:
    from scopekb.blobs import LocalBlobStore
    from scopekb.indexing import SyncDeps

    explicit = Settings(profile="embedded", data_dir=tmp_path,
                        s3={"endpoint": "127.0.0.1:1", "access_key": "k", "secret_key": "s"})
    deps = SyncDeps(settings=explicit, records=None, chunks=None,  # type: ignore[arg-type]
                    blobs=LocalBlobStore(tmp_path / "blobs"))
    assert deps.documents_dir is None
    assert isinstance(document_prefix(explicit, "b", "p", deps.documents_dir), ObjectPrefix)
    with pytest.raises(S3NotConfigured):
        document_prefix(Settings(profile="distributed", data_dir=tmp_path), "b", "p")
