"""S3 object metadata (issue 22): the ``x-amz-meta-*`` headers of an object normalised for chunk metadata, and the
object version id that sees a metadata-only change. The integration side (real S3, both stores, every mode) is
tests/integration/test_object_metadata.py."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from scopekb.documents import META_MAX_KEYS, META_MAX_VALUE_CHARS, etag_id, object_metadata
from scopekb.fields import flatten_metadata


def test_keys_lower_cased_prefix_removed_other_headers_ignored() -> None:
    got = object_metadata([("X-Amz-Meta-Team", "Docs"), ("x-amz-meta-owner-email", "a@b.example"),
                           ("Content-Type", "text/markdown"), ("X-Amz-Request-Id", "1"), ("ETag", '"x"'),
                           ("X-Amz-Meta-review_state", " approved ")])
    assert got == {"team": "Docs", "owner-email": "a@b.example", "review_state": "approved"}


def test_keys_that_would_nest_or_are_odd_are_dropped() -> None:
    """A ``.`` would read as nesting in the metadata filter (``s3.a.b``); other token characters are dropped too."""
    got = object_metadata([("x-amz-meta-a.b", "1"), ("x-amz-meta-", "2"), ("x-amz-meta--lead", "3"),
                           ("x-amz-meta-a*b", "4"), ("x-amz-meta-" + "k" * 65, "5"), ("x-amz-meta-ok", "6")])
    assert got == {"ok": "6"}


def test_values_decoded_and_bounded() -> None:
    got = object_metadata([("x-amz-meta-enc", "=?UTF-8?B?Y2Fmw6k=?="),
                           ("x-amz-meta-raw", "café".encode().decode("latin-1")), ("x-amz-meta-latin", "caf\xe9"),
                           ("x-amz-meta-ctl", "a\x00b\x1bc\x7f"),
                           ("x-amz-meta-long", "v" * 5000), ("x-amz-meta-odd", "=?nonexistent?B?YQ==?="),
                           ("x-amz-meta-rep", "one"), ("X-Amz-Meta-Rep", "two")])
    assert got["enc"] == got["raw"] == got["latin"] == "café"
    assert got["ctl"] == "abc" and len(got["long"]) == META_MAX_VALUE_CHARS
    assert got["odd"] == "=?nonexistent?B?YQ==?=" and got["rep"] == "one,two"


def test_at_most_so_many_keys_first_by_name() -> None:
    got = object_metadata([(f"x-amz-meta-k{i:03d}", str(i)) for i in reversed(range(100))])
    assert list(got) == [f"k{i:03d}" for i in range(META_MAX_KEYS)]


@given(st.lists(st.tuples(st.text(max_size=80), st.text(max_size=300)), max_size=60))
def test_any_headers_give_flat_bounded_metadata(headers: list[tuple[str, str]]) -> None:
    """Whatever the headers, the result is a flat str -> str map whose keys never nest in the filter and whose
    values carry no control character (a line break cannot reach anything that prints them)."""
    got = object_metadata([("x-amz-meta-" + k, v) for k, v in headers])
    assert len(got) <= META_MAX_KEYS
    for k, v in got.items():
        assert k == k.lower() and "." not in k and 1 <= len(k) <= 64
        assert len(v) <= META_MAX_VALUE_CHARS and not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in v)
    assert sorted(flatten_metadata({"s3": got})) == sorted((f"s3.{k}", v) for k, v in got.items())


def test_version_id_changes_with_last_modified_not_only_etag() -> None:
    """S3 keeps the ETag (MD5 of the bytes) when a copy replaces only the metadata; the last-modified time moves."""
    t1, t2 = datetime(2026, 11, 30, 19, 0, 0, tzinfo=UTC), datetime(2026, 11, 30, 19, 0, 1, tzinfo=UTC)
    assert etag_id('"abc"', t1) == etag_id("abc", t1)
    assert etag_id("abc", t1) != etag_id("abc", t2) != etag_id("abc")
    assert len(etag_id("abc", t1)) == 40 and etag_id("abc") == etag_id('"abc"')
