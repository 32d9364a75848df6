"""Every published example payload parses (issue 15 item 7): pings name their hook, pushes are pushes, every
other event is ``ignored`` with a reason; nothing raises but :class:`BadRequest` for a malformed body.

The corpora are under tests/data/webhooks (see its README for sources and licences); the HTTP replay, signed,
JSON and form-encoded, is tests/integration/test_webhook_corpus.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from scopekb_ingester.providers import PROVIDERS, BadRequest

DATA = Path(__file__).resolve().parents[1] / "data" / "webhooks"


def corpus(host: str) -> list[dict]:
    """The examples of one host: ``[{"event", "sets", "body"}]``."""
    if host == "github":
        raw = gzip.decompress((DATA / "github" / "octokit-webhooks-examples-7.6.1.json.gz").read_bytes())
        return json.loads(raw)
    return json.loads((DATA / host / "examples.json").read_text())


PUSH_EVENTS = {"github": {"push"}, "gitea": {"push"}, "bitbucket": {"repo:push"},
               "gitlab": {"Push Hook", "Tag Push Hook"}}
PING_EVENTS = {"github": {"ping"}, "gitea": {"ping"}, "bitbucket": {"diagnostics:ping"}, "gitlab": {"Test Hook"}}


def test_github_corpus_is_the_published_one() -> None:
    data = corpus("github")
    assert len(data) == 404 and sum(len(d["sets"]) for d in data) == 726
    assert {s for d in data for s in d["sets"]} == {"api.github.com", "ghes-31", "ghes-32", "ghes-33", "ghes-34",
                                                   "ghes-35"}


@pytest.mark.parametrize("host", ["github", "gitlab", "gitea", "bitbucket"])
def test_every_example_parses_to_push_ping_or_ignored(host: str) -> None:
    prov = PROVIDERS[host]
    kinds: dict[str, int] = {}
    for d in corpus(host):
        try:
            parsed = prov.parse(d["event"], d["body"])
        except BadRequest as e:  # only a push may be refused, and only for a malformed body
            pytest.fail(f"{host} {d['event']} {d['sets']}: {e}")
        kinds[parsed.kind] = kinds.get(parsed.kind, 0) + 1
        if d["event"] in PING_EVENTS[host]:
            assert parsed.kind == "ping", d["sets"]
        elif d["event"] in PUSH_EVENTS[host] or (host == "gitlab" and d["body"].get("event_name") == "push"):
            assert parsed.kind == "push" and parsed.pushes, d["sets"]
        else:
            assert parsed.kind == "ignored" and parsed.reason and d["event"][:20] in parsed.reason, d["sets"]
    assert {"push", "ignored"} <= set(kinds) and (host == "gitea" or "ping" in kinds), kinds  # Gitea tests with a push


def test_github_pings_name_their_hook_for_repository_and_organisation_hooks() -> None:
    pings = [PROVIDERS["github"].parse("ping", d["body"]) for d in corpus("github") if d["event"] == "ping"]
    assert {p.hook for p in pings} >= {"Repository hook 109948940", "Organization hook 109948940"}
    org = [p for p in pings if p.hook == "Organization hook 109948940"]
    assert org and org[0].repository.full_name is None and org[0].owner == "Octocoders"


@pytest.mark.parametrize("body", [{"hook_id": "1; DROP", "hook": {"type": "Repo\nsitory"}},
                                  {"hook_id": True, "hook": {"type": "x" * 40}}, {"hook": "x"}, {}])
def test_hook_names_come_from_validated_fields_only(body: dict) -> None:
    parsed = PROVIDERS["github"].parse("ping", body)
    assert parsed.kind == "ping" and parsed.hook is None
