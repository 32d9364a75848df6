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

from scopekb.documents import FolderPrefix
from scopekb.models import SourceCreate

BASE = {"agent_name": "a", "context_id": "c", "kind": "s3", "prefix": "docs"}


@pytest.mark.parametrize("bucket", ["b\x00b", "Bad Bucket!", "/tmp", "..", "a/../../etc"])
def test_a_bucket_that_is_no_s3_bucket_name_is_refused(bucket: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="bucket"):
        SourceCreate(**BASE, bucket=bucket)


def test_embedded_documents_stay_under_the_data_folder(tmp_path: Path) -> None:
    root, outside = tmp_path / "documents", tmp_path / "elsewhere"
    root.mkdir()
    folder = FolderPrefix(root, str(outside), "docs")  # what a source with bucket=<absolute path> gets
    try:
        folder.put("planted.md", b"# planted\n")
    except ValueError:
        pass  # refusing is fine
    assert not (outside / "docs" / "planted.md").exists(), "an upload wrote outside <data_dir>/documents"
