"""Issue 20: the sync task's ``kwargsrepr`` header is written by :func:`scopekb.queue.plain_kwargs_repr` (one C
``repr``) only where that gives the text Celery's ``saferepr`` gives; elsewhere Celery computes it as before. And
the lone-surrogate scan of decoded JSON answers what the per-character scan it replaced answered."""

from __future__ import annotations

from typing import Any

from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st

from scopekb.http.unicode import lone_surrogate_at
from scopekb.queue import plain_kwargs_repr

LIMIT = 1024  # Celery's default kwargsrepr_maxsize
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from("'\"\\\n\x00é"),
               max_size=60)
plain = st.text(st.sampled_from("abcXYZ019 ._:{}/-@+=,!#$%&()*;<>?[]^`|~"), max_size=400)
values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), text, plain,
                   st.lists(plain | text, max_size=4), st.dictionaries(plain, plain, max_size=2))


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(plain | text, values, max_size=6))
def test_plain_repr_is_celerys_saferepr_whenever_it_answers(kwargs: dict[str, Any]) -> None:
    got = plain_kwargs_repr(kwargs, LIMIT)
    if got is not None:
        assert got == saferepr(kwargs, LIMIT, maxlevels=3)


def test_the_sync_task_arguments_get_the_plain_repr() -> None:
    kwargs = {"job_id": "0f8e-11ee.ab12cd34ef56", "source_ids": ["src_9c540d32f036406c", "src_2"],
              "trigger": "webhook", "delivery_id": "{0f8e-11ee}", "after": "a" * 40, "branch_deleted": False,
              "verify": None, "part": 3}
    assert plain_kwargs_repr(kwargs, LIMIT) == saferepr(kwargs, LIMIT, maxlevels=3) == repr(kwargs)
    assert plain_kwargs_repr({"job_id": "x" * 2000}, LIMIT) is None  # saferepr would cut it: left to Celery
    assert plain_kwargs_repr({"msg": "it's"}, LIMIT) is None


def _reference(value: Any, where: str = "body") -> str | None:
    """The per-character scan ``lone_surrogate_at`` was before issue 20."""
    def bad(s: str) -> bool:
        return any("\ud800" <= c <= "\udfff" for c in s)
    if isinstance(value, str):
        return where if bad(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            if bad(k):
                return where
            found = _reference(v, f"{where}.{k}")
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _reference(v, f"{where}.{i}")
            if found:
                return found
    return None


json_text = st.text(st.characters(blacklist_categories=()) | st.sampled_from("\ud800\udfff\ud83d"), max_size=8)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | json_text,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_text, inner, max_size=4),
                           max_leaves=20)


@settings(max_examples=800, deadline=None)
@given(json_values)
def test_the_surrogate_scan_answers_as_the_character_loop_did(value: Any) -> None:
    assert lone_surrogate_at(value) == _reference(value)
