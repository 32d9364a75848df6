"""ensure_bucket: SeaweedFS answered a bucket creation with NoSuchBucket once in a CI run ("PutBucketHandler:
failed to get bucket config"), which failed a test fixture; that answer is retried, asking first whether the bucket
now exists. Fake client: pure logic (the real S3 server is used by the integration tests)."""

from __future__ import annotations

from typing import Any

import pytest
from minio.error import S3Error

from scopekb import blobs


def _err(code: str) -> S3Error:
    return S3Error(None, code, "refused", "/b", "r", "h", bucket_name="b")  # type: ignore[arg-type]


class _Client:
    def __init__(self, answers: list[str | None], appears_after: int | None = None) -> None:
        self.answers, self.appears_after, self.made, self.asked = list(answers), appears_after, 0, 0

    def bucket_exists(self, bucket: str) -> bool:
        self.asked += 1
        return self.appears_after is not None and self.asked > self.appears_after

    def make_bucket(self, bucket: str) -> None:
        self.made += 1
        code = self.answers.pop(0) if self.answers else None
        if code:
            raise _err(code)


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobs.time, "sleep", lambda _s: None)


def test_a_racing_no_such_bucket_answer_is_retried_until_the_bucket_is_there() -> None:
    c: Any = _Client(["NoSuchBucket"], appears_after=1)
    blobs.ensure_bucket(c, "b")
    assert (c.made, c.asked) == (1, 2)  # created once; the second question finds it
    c = _Client(["NoSuchBucket", None])
    blobs.ensure_bucket(c, "b")
    assert c.made == 2


def test_other_refusals_and_a_lasting_no_such_bucket_are_raised() -> None:
    with pytest.raises(S3Error, match="AccessDenied"):
        blobs.ensure_bucket(_Client(["AccessDenied"]), "b")  # type: ignore[arg-type]
    c: Any = _Client(["NoSuchBucket"] * 10)
    with pytest.raises(S3Error, match="NoSuchBucket"):
        blobs.ensure_bucket(c, "b")
    assert c.made == blobs.BUCKET_CREATE_TRIES
    blobs.ensure_bucket(_Client(["BucketAlreadyOwnedByYou"]), "b")  # type: ignore[arg-type]
