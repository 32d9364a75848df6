"""Matching a push to registered sources with remembered URL keys (issue 20: 1,000 sources cost 16 ms a webhook)."""

import os
from pathlib import Path

from scopekb.models import Source
from scopekb.sources import _remote_key, matching_sources, normalise_repo, repo_key, sources_of_owner

URLS = ["https://github.com/Org/Repo.git", "git@github.com:Org/Repo.git", "ssh://git@GitHub.com/Org/Repo/",
        "https://gitlab.example.com/group/sub/proj", "  https://github.com/Other/x.git  "]


def src(url: str, name: str | None = None) -> Source:
    return Source(id=Source.new_id(), agent_name="a", context_id="c", repo_url=url, ref="main", repo_name=name)


def test_the_remembered_key_is_the_normalised_url() -> None:
    for u in URLS:
        assert repo_key(u) == repo_key(u) == normalise_repo(u).lower()


def test_many_sources_match_as_before_and_payload_urls_are_not_remembered() -> None:
    sources = [src(f"https://github.com/Org{i % 7}/Repo{i}.git") for i in range(500)] + [src(URLS[1], "org/repo")]
    _remote_key.cache_clear()
    hostile = [f"https://evil.example/{i}/" + "x" * 1000 for i in range(50)]
    found = matching_sources(sources, ["https://github.com/org/repo", *hostile], ["nobody/else"])
    assert [s.repo_url for s in found] == [URLS[1]]
    assert _remote_key.cache_info().currsize == len(sources)  # the registered URLs only
    found = matching_sources(sources, [], ["ORG/REPO"])  # by repo_name, without case
    assert [s.repo_url for s in found] == [URLS[1]]
    assert len(sources_of_owner(sources, "org3")) == len([i for i in range(500) if i % 7 == 3])


def test_a_local_path_is_resolved_on_every_match(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    link = tmp_path / "link"
    os.symlink(a, link)
    s = src(str(link))
    assert matching_sources([s], [str(a)], []) == [s]
    link.unlink()
    os.symlink(b, link)  # the same registered path now names another folder
    assert matching_sources([s], [str(a)], []) == [] and matching_sources([s], [str(b)], []) == [s]
