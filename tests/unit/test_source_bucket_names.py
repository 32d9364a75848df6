"""Hostile review (hostile3, around 39d1dc9): a new source's bucket is bounded in length only, so any text of up to 63
characters is a bucket: NUL, spaces, upper case, '/', '..'. Over REST that is a 201; then
``POST /v1/sources/{id}/documents`` is a 500 on both profiles (S3: minio ``ValueError: invalid bucket name``;
embedded: ``ValueError: embedded null byte``), and in the embedded profile the bucket is a path component of
``<data_dir>/documents/<bucket>/<prefix>``, so ``bucket="/tmp"`` makes uploads write, and syncs read and index, files
anywhere on the host. Fails on main 2ce190d (and before it).
"""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from scopekb.documents import document_prefix
from scopekb.models import SourceCreate

BASE = {"agent_name": "a", "context_id": "c", "kind": "s3", "prefix": "docs"}


@pytest.mark.parametrize("bucket", ["b\x00b", "Bad Bucket!", "/tmp", "..", "a/../../etc"])
def test_a_bucket_that_is_no_s3_bucket_name_is_refused(bucket: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="bucket"):
        SourceCreate(**BASE, bucket=bucket)


def test_embedded_documents_stay_under_the_data_folder(tmp_path: Path) -> None:
    """A source stored before the rule, with an absolute path as its bucket: document_prefix (the one way to a
    source's documents, both profiles) refuses it, 409 naming the rule, and nothing is written outside."""
    from scopekb.errors import Refused
    from scopekb.settings import Settings

    root, outside = tmp_path / "documents", tmp_path / "elsewhere"
    root.mkdir()
    for local_root in (root, None):  # embedded folder, distributed S3 (refused before any client call)
        with pytest.raises(Refused, match="location cannot be used \\(its bucket is a path") as e:
            document_prefix(Settings(), str(outside), "docs", local_root).put("planted.md", b"# planted\n")
        assert e.value.status == 409
    for bucket, prefix in (("..", "docs"), (".", "docs"), ("b\x00b", "docs"), (None, "do\x00cs")):
        with pytest.raises(Refused, match="NUL|path"):
            document_prefix(Settings(), bucket, prefix, root)
    assert not (outside / "docs" / "planted.md").exists(), "an upload wrote outside <data_dir>/documents"
    assert document_prefix(Settings(), "it-docs.1", "docs", root).base == root / "it-docs.1" / "docs/"
