"""The embedded profile's document folder (:class:`scopekb.documents.FolderPrefix`): names one folder cannot hold
side by side are refused with 409 (hostile review 4: a 500 before), and nothing stored is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from scopekb.documents import FolderPrefix
from scopekb.errors import Refused


@pytest.mark.parametrize(("first", "second", "said"), [
    ("a.md", "a.md/b.md", "'a.md' is a document, not a folder"),
    ("a.md", "a.md/x/y/b.md", "'a.md' is a document, not a folder"),
    ("d/x.md", "d", "a folder of documents has this name"),
    ("e/f.md", "e/f.md/g.md", "'e/f.md' is a document, not a folder"),
])
def test_a_name_the_folder_cannot_hold_is_409_and_keeps_what_is_stored(tmp_path: Path, first: str, second: str,
                                                                        said: str) -> None:
    docs = FolderPrefix(tmp_path, "b", "p")
    assert docs.put(first, b"one") == "p/" + first
    with pytest.raises(Refused) as e:
        docs.put(second, b"two")
    assert e.value.status == 409 and said in str(e.value), str(e.value)
    tree = docs.tree()
    assert list(tree) == [first] and docs.read_blob(tree[first].sha) == b"one"
    assert not any((tmp_path / ".partial").iterdir())  # no partial write left behind


def test_a_symlinked_folder_is_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    docs = FolderPrefix(tmp_path / "root", "b", "p")
    docs.put("keep.md", b"k")
    (docs.base / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(Refused):
        docs.put("link/x.md", b"x")
    assert not any(outside.iterdir())


def test_overwriting_a_document_and_nesting_under_a_new_folder_work(tmp_path: Path) -> None:
    docs = FolderPrefix(tmp_path, "b", "")
    docs.put("a/b.md", b"1")
    docs.put("a/b.md", b"2")
    docs.put("a/c/d.md", b"3")
    tree = docs.tree()
    assert sorted(tree) == ["a/b.md", "a/c/d.md"] and docs.read_blob(tree["a/b.md"].sha) == b"2"
