"""Pure logic of issue 23: which refs a source's patterns track, how a search's ``ref`` resolves, and how ``read``
splits a blob into the chunkers' lines with their original line ends."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scopekb.errors import NotFound, Refused
from scopekb.filetypes import decode_text
from scopekb.reading import split_lines
from scopekb.refs import RefIndex, cap_refs, match_refs, unfit_refs

REFS = {"refs/heads/main": "a" * 40, "refs/heads/release/1.0": "b" * 40, "refs/heads/release/2.0": "c" * 40,
        "refs/heads/feature/main": "d" * 40, "refs/tags/v1.0": "e" * 40, "refs/tags/v2.0": "f" * 40,
        "refs/tags/main": "1" * 40, "refs/heads/vendor": "2" * 40}


def test_patterns_match_branches_and_tags_anchored_at_the_start() -> None:
    assert match_refs(["main"], REFS) == {"main": "a" * 40}  # the branch wins over the tag; not feature/main
    assert match_refs(["release/*"], REFS) == {"release/1.0": "b" * 40, "release/2.0": "c" * 40}
    assert match_refs(["v*"], REFS) == {"vendor": "2" * 40, "v1.0": "e" * 40, "v2.0": "f" * 40}
    assert match_refs(["refs/tags/v*"], REFS) == {"v1.0": "e" * 40, "v2.0": "f" * 40}
    assert match_refs(["refs/tags/main"], REFS) == {"main": "1" * 40}
    assert match_refs(["nothing"], REFS) == {}
    assert list(match_refs(["*"], REFS)) == ["feature/main", "main", "release/1.0", "release/2.0", "vendor",
                                             "v1.0", "v2.0"]  # branches by name, then tags (main is a branch)


def test_a_shadowed_tag_and_refs_named_like_commit_ids_are_left_out_and_named() -> None:
    """Hostile review: the tag of a branch's name, and a branch or tag named like a full commit id, are not tracked;
    unfit_refs names them with the reason; the tags among the matched refs are known."""
    refs = {**REFS, "refs/heads/" + "ab" * 20: "3" * 40, "refs/tags/" + "cd" * 32: "4" * 40}
    matched = match_refs(["*"], refs)
    assert "ab" * 20 not in matched and "cd" * 32 not in matched and matched["main"] == "a" * 40
    assert matched.tags == {"v1.0", "v2.0"}
    unfit = dict(unfit_refs(["*"], refs))
    assert "named like a full commit id" in unfit["ab" * 20] and "named like a full commit id" in unfit["cd" * 32]
    assert "branch of the same name" in unfit["refs/tags/main"]
    assert "refs/tags/main" not in dict(unfit_refs(["refs/tags/*"], refs))  # the branch is not matched: the tag is
    assert match_refs(["refs/tags/*"], refs).tags == {"main", "v1.0", "v2.0"}


def test_a_search_of_refs_tags_is_refused_where_the_name_is_a_branch() -> None:
    idx = RefIndex(heads={"s1": {"v2": "a" * 40, "old": "b" * 40}}, kinds={"s1": {"v2": "branch"}})
    assert idx.resolve("v2") == "v2" and idx.resolve("refs/heads/v2") == "v2"
    with pytest.raises(NotFound, match="tracked branch of that name, not a tag"):
        idx.resolve("refs/tags/v2")
    assert idx.resolve("refs/tags/old") == "old"  # a state without a kind (written before kinds): as before
    tags = RefIndex(heads={"s1": {"v2": "a" * 40}, "s2": {"v2": "c" * 40}}, kinds={"s1": {"v2": "tag"},
                                                                                       "s2": {"v2": "branch"}})
    assert tags.resolve("refs/tags/v2") == "v2" and tags.resolve("refs/heads/v2") == "v2"


def test_the_cap_keeps_the_default_ref_and_indexed_refs_then_new_ones_by_name() -> None:
    """Hostile review 3, H1: the cap of refs per source never pushes out the source's ref or an indexed ref."""
    matched = match_refs(["*"], REFS)
    kept, out = cap_refs(matched, "main", set(), 2)
    assert list(kept) == ["feature/main", "main"] and out == ["release/1.0", "release/2.0", "vendor", "v1.0", "v2.0"]
    kept, out = cap_refs(matched, "vendor", {"v2.0"}, 3)  # the default and an indexed tag first, then one new ref
    assert list(kept) == ["feature/main", "vendor", "v2.0"] and out == ["main", "release/1.0", "release/2.0", "v1.0"]
    kept, out = cap_refs(matched, "main", {"v1.0", "v2.0", "vendor"}, 2)  # over the cap already: none dropped
    assert list(kept) == ["main", "vendor", "v1.0", "v2.0"] and out == ["feature/main", "release/1.0", "release/2.0"]
    kept, out = cap_refs(matched, "gone", {"gone", "v1.0"}, 8)  # a ref git no longer has is not kept
    assert list(kept) == list(matched) and out == []


def test_a_search_ref_resolves_to_a_name_or_an_indexed_head() -> None:
    idx = RefIndex(heads={"s1": {"main": "a" * 40, "v1.0": "e" * 40}, "s2": {"dev": "e" * 40}})
    assert idx.resolve("main") == "main" and idx.resolve("refs/heads/main") == "main"
    assert idx.resolve("a" * 40) == "main" and idx.resolve("aaaaaaa") == "main"
    with pytest.raises(Refused) as many:
        idx.resolve("e" * 12)
    assert many.value.status == 409 and "v1.0" in str(many.value)
    with pytest.raises(NotFound, match="not the indexed head"):
        idx.resolve("9" * 40)
    with pytest.raises(NotFound, match="not indexed for this scope"):
        idx.resolve("nope")
    assert idx.commit("s1", "v1.0") == "e" * 40 and idx.commit("s2", "main") is None
    # one source whose branch and tag share a head: the commit resolves to its default ref, else the first by name
    one = RefIndex(heads={"s1": {"main": "b" * 40, "v1": "b" * 40, "v0": "c" * 40}}, defaults={"s1": "main"})
    assert one.resolve("b" * 40) == "main" and one.resolve("bbbbbbbb") == "main"
    two = RefIndex(heads={"s1": {"v2": "b" * 40, "v1": "b" * 40}, "s2": {"v1": "b" * 40}}, pinned=set())
    assert two.resolve("b" * 40) == "v1"
    with pytest.raises(Refused):  # s2 holds v1 at another commit: searching v1 would mix commits
        RefIndex(heads={"s1": {"v2": "b" * 40, "v1": "b" * 40}, "s2": {"v1": "c" * 40}}).resolve("b" * 40)


LINE_BYTES = st.lists(st.sampled_from([b"a", b"\xc3\xa9", b" ", b"\r", b"\n", b"\r\n", b"x\ty", b"\xe2\x80\xa8"]),
                      max_size=30).map(b"".join)


@given(LINE_BYTES)
def test_split_lines_are_the_chunkers_lines_with_their_ends(data: bytes) -> None:
    lines = split_lines(data)
    assert b"".join(lines) == data
    assert len(lines) == len(decode_text(data).split("\n"))


def test_split_lines_of_utf16_keep_the_bom_on_line_one() -> None:
    data = codecs.BOM_UTF16_LE + "one\r\ntwo\nthree".encode("utf-16-le")
    lines = split_lines(data)
    assert b"".join(lines) == data and len(lines) == 3
    assert lines[1] == "two\n".encode("utf-16-le")
