"""Which refs a source tracks (issue 23): its ``refs`` patterns matched against the repository's branches and tags.

A pattern is a branch or tag name or a glob (``main``, ``release/*``, ``v*``; ``*`` matches any characters, ``/``
included, ``?`` one). ``refs/heads/...`` asks for branches only, ``refs/tags/...`` for tags only, a bare pattern
for both; a branch and a tag of the same short name give the branch (the membership name is the short name, as a
hit's ``ref`` shows it; the tag is named in the sync's errors, and a search for ``refs/tags/<name>`` is refused
rather than answered from the branch). A branch or tag named like a full commit id is not tracked: a search's
``ref`` of that id means the commit. Patterns are compiled bounded (RE2, :mod:`scopekb.patterns`), never as a
backtracking regex: they come from API callers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scopekb.errors import NotFound, Refused
from scopekb.models import Source, ref_name_problem
from scopekb.overlays import source_overlays
from scopekb.patterns import SOURCE_LIMITS, PathGlob, compile_glob
from scopekb.stores.base import RecordStore, RefOverlay, ScopeFilter

HEADS = "refs/heads/"
TAGS = "refs/tags/"
_HEX = re.compile(r"^[0-9a-fA-F]{7,64}$")
#: A full SHA-1 or SHA-256 object id.
_FULL_ID = re.compile(r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$")
#: Why a branch or tag the patterns match is not tracked although its name is a fit ref name.
_LOOKS_LIKE_COMMIT = "named like a full commit id, which a search's ref means as that commit"
_SHADOWED_TAG = "a branch of the same name is tracked under that name"


class MatchedRefs(dict[str, str]):
    """:func:`match_refs`' answer: short name → commit, and :attr:`tags`, the names among them that are tags."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()


def short_name(full: str) -> str:
    """``refs/heads/main`` → ``main``, ``refs/tags/v1`` → ``v1``; other names unchanged."""
    return full.removeprefix(HEADS).removeprefix(TAGS)


def ref_matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """A test of one full ref name (``refs/heads/x``, ``refs/tags/v1``) against ``patterns``, compiled once: what
    :func:`match_refs` asks of each ref, for callers that test many refs (a webhook delivery naming thousands).

    Raises:
        scopekb.patterns.PatternRefused: a pattern over the source pattern limits.
    """
    matchers: list[tuple[str, PathGlob]] = []
    for pat in patterns:
        kinds = (HEADS,) if pat.startswith(HEADS) else (TAGS,) if pat.startswith(TAGS) else (HEADS, TAGS)
        glob = compile_glob("/" + short_name(pat), SOURCE_LIMITS)  # a leading "/" anchors it at the start
        matchers.extend((kind, glob) for kind in kinds)

    def matches(full: str) -> bool:
        kind = HEADS if full.startswith(HEADS) else TAGS if full.startswith(TAGS) else None
        return kind is not None and any(k == kind and g.match("/" + short_name(full)) for k, g in matchers)

    return matches


def match_refs(patterns: Sequence[str], refs: Mapping[str, str]) -> MatchedRefs:
    """The refs ``patterns`` match: short name → commit, for every branch/tag in ``refs`` (full name → commit, as
    :meth:`scopekb.gitrepo.Mirror.list_refs` gives) that one of them matches, branches before tags, each by name;
    the tags among them in ``.tags``. Left out (and named by :func:`unfit_refs`): names no source may track, names
    that are full commit ids (hostile review: a pushed branch named like a commit id answered searches "at" that
    commit with its own files), and a tag whose name a matched branch holds. Uncapped: :func:`cap_refs` chooses
    which of them a sync tracks.

    Raises:
        scopekb.patterns.PatternRefused: a pattern over the source pattern limits.
    """
    matches = ref_matcher(patterns)
    out = MatchedRefs()
    for full in sorted(refs, key=lambda n: (not n.startswith(HEADS), n)):
        if not full.startswith((HEADS, TAGS)):
            continue
        name = short_name(full)
        if name in out or ref_name_problem(name, glob=False) or _FULL_ID.match(name):
            continue  # a branch of that name came first, or a name no source may track (unfit_refs)
        if matches(full):
            out[name] = refs[full]
            if full.startswith(TAGS):
                out.tags.add(name)
    return out


def unfit_refs(patterns: Sequence[str], refs: Mapping[str, str]) -> list[tuple[str, str]]:
    """The branches and tags in ``refs`` (full name → commit) that ``patterns`` match but :func:`match_refs` leaves
    out because their names break the rules a registered ref follows (:func:`scopekb.models.ref_name_problem`: a
    host may hold ``refs/heads/--upload-pack=x``, which a registration refuses): ``(short name, why)`` each, by
    name, so a sync can say what it did not index."""
    matches = ref_matcher(patterns)
    out: list[tuple[str, str]] = []
    for full in sorted(refs):
        if full.startswith((HEADS, TAGS)) and matches(full):
            name = short_name(full)
            problem = ref_name_problem(name, glob=False) or (_LOOKS_LIKE_COMMIT if _FULL_ID.match(name) else None)
            if problem is None and full.startswith(TAGS) and HEADS + name in refs and matches(HEADS + name):
                problem = _SHADOWED_TAG
            if problem:
                out.append((TAGS + name if problem == _SHADOWED_TAG else name, problem))
    return out


def cap_refs(matched: Mapping[str, str], default: str, indexed: Collection[str],
             limit: int) -> tuple[dict[str, str], list[str]]:
    """Which of the ``matched`` refs (:func:`match_refs`: name → commit, in its order) a source tracks under its cap
    of ``limit`` refs (setting ``git.max_refs_per_source``; hostile review 3, H1): the source's own ``ref``
    (``default``) and every ref already ``indexed`` (names with a sync state) always, whatever their number, so the
    cap never drops an indexed ref; then new refs in ``matched`` order (branches before tags, by name) while fewer
    than ``limit`` are tracked. A ref git no longer has is not in ``matched`` and so not tracked (dropped as usual).

    Returns:
        ``(tracked, left_out)``: tracked name → commit, and the names of the new refs left out by the cap, in
        ``matched`` order.
    """
    keep = {n for n in matched if n == default or n in indexed}
    room = max(0, limit - len(keep))
    left_out: list[str] = []
    for name in matched:
        if name in keep:
            continue
        if room > 0:
            keep.add(name)
            room -= 1
        else:
            left_out.append(name)
    return {n: c for n, c in matched.items() if n in keep}, left_out


def source_tracks(src: Source, full_ref: str) -> bool:
    """True when a push to ``full_ref`` (``refs/heads/x``, ``refs/tags/v1``) concerns ``src``: one of its ref
    patterns matches it (a source without ``refs`` tracks its one branch ``ref``)."""
    if not full_ref.startswith((HEADS, TAGS)):
        return False
    return bool(match_refs(src.ref_patterns, {full_ref: ""}))


def ref_states(records: RecordStore, src: Source) -> dict[str, dict[str, Any]]:
    """A source's sync state per ref: name -> ``{"commit", "indexed_at", "writing"?, "failed"?, "pinned"?,
    "expires_at"?, "job_id"?}`` (a state from before issue 23 is the source's one ``ref``)."""
    return _states_of(records.get("state", src.id), src)


def _states_of(state: Mapping[str, Any] | None, src: Source) -> dict[str, dict[str, Any]]:
    state = state or {}
    refs = state.get("refs")
    if isinstance(refs, dict):
        return {k: dict(v) for k, v in refs.items() if isinstance(v, dict)}
    if state.get("commit") or state.get("writing"):
        return {src.ref: {k: state[k] for k in ("commit", "indexed_at", "writing") if state.get(k)}}
    return {}


def put_ref_state(records: RecordStore, src: Source, ref: str, value: dict[str, Any] | None) -> None:
    """Set (or, with None, drop) one ref's sync state; the record's top-level ``commit``/``indexed_at`` stay those
    of the source's ``ref`` for readers that know one ref only (status, CLI). The record is shared by every ref of
    the source and written by syncs (worker) and pins (query service) at once: the change is an atomic
    read-modify-write (:meth:`RecordStore.update`), so no other ref's concurrent write is lost (hostile review 2,
    H2). ``None`` values in ``value`` are left out."""
    update_ref_states(records, src, lambda refs: {ref: value})


def update_ref_states(records: RecordStore, src: Source,
                      change: Callable[[dict[str, dict[str, Any]]], Mapping[str, dict[str, Any] | None]]) -> None:
    """Atomically change refs of a source's sync state: ``change`` gets every ref's state (name -> dict, as
    :func:`ref_states` gives) and returns the refs to set (name -> new state, or None to drop the ref); it may
    raise to write nothing (and may run more than once on a concurrent write, so it must not have side effects)."""

    def apply(state: dict[str, Any] | None) -> dict[str, Any] | None:
        refs = _states_of(state, src)
        for name, value in change({k: dict(v) for k, v in refs.items()}).items():
            if value is None:
                refs.pop(name, None)
            else:
                refs[name] = {k: v for k, v in value.items() if v is not None}
        main = refs.get(src.ref, {})
        return {"source_id": src.id, "commit": main.get("commit"), "indexed_at": main.get("indexed_at"),
                "refs": refs}

    records.update("state", src.id, apply, wait=False)


def pin_ref_state(records: RecordStore, src: Source, commit: str, value: dict[str, Any],
                  limit: int) -> dict[str, Any]:
    """Record a pin of ``commit`` on ``src`` unless it is pinned already, checking ``limit`` (pins per source) in
    the same atomic write, so concurrent pins never exceed it. Returns the ref's state (the existing one when the
    commit was pinned already: compare its ``job_id``).

    Raises:
        scopekb.errors.Refused: (429) the source holds ``limit`` pinned commits.
    """
    out: dict[str, Any] = {}

    def change(refs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
        st = refs.get(commit)
        if st and st.get("pinned"):
            out.clear()
            out.update(st)
            return {}
        pins = [n for n, s in refs.items() if s.get("pinned")]
        if len(pins) >= limit:
            raise Refused(f"source {src.id} already holds {len(pins)} pinned commits (git.max_pins_per_source="
                          f"{limit}); search a branch or tag, or wait until a pin expires", 429)
        out.clear()
        out.update(value)
        return {commit: value}

    update_ref_states(records, src, change)
    return dict(out)


def ref_heads(state: Mapping[str, Any] | None, src: Source) -> dict[str, dict[str, Any]]:
    """The refs a source's sync state says are indexed: ``name -> {"commit", "indexed_at", "pinned"?}``.

    A state written before issue 23 (one ``commit``, no ``refs``) is the source's one ``ref`` at that commit.
    """
    if not state:
        return {}
    refs = state.get("refs")
    if isinstance(refs, dict):
        return {str(k): dict(v) for k, v in refs.items() if isinstance(v, dict) and v.get("commit")}
    if state.get("commit"):
        return {src.ref: {"commit": state["commit"], "indexed_at": state.get("indexed_at")}}
    return {}


class CommitNotIndexed(NotFound):
    """A search ``ref`` that looks like a commit id and is no indexed ref's head (HTTP 404 unless the caller pins
    it: :func:`scopekb.ops.pin_commit`). ``commit`` is the id as given, lowercased."""

    def __init__(self, commit: str) -> None:
        super().__init__(f"commit {commit[:64]!r} is not the indexed head of any ref of this scope's sources")
        self.commit = commit


@dataclass
class RefIndex:
    """The indexed refs of the sources a scope may see, to resolve a search's ``ref`` (issue 23).

    Attributes:
        heads: source id -> ref name -> indexed commit id (the refs with a commit).
        defaults: source id -> the source's own ``ref`` (its default branch).
        overlays: source id -> ref name -> :class:`scopekb.stores.base.RefOverlay` (refs held as overlays).
    """

    heads: dict[str, dict[str, str]] = field(default_factory=dict)
    #: source id -> ref name -> ``branch`` or ``tag`` (refs whose sync state records it; pins and older states
    #: do not).
    kinds: dict[str, dict[str, str]] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)
    overlays: dict[str, dict[str, RefOverlay]] = field(default_factory=dict)
    #: Names of the temporary pinned refs (commit ids) among the loaded sources' refs.
    pinned: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, records: RecordStore, scope: ScopeFilter, source_id: str | None = None,
             repo: str | None = None) -> RefIndex:
        """Read the sources of ``scope`` (narrowed to ``source_id``/``repo``) and their sync states."""
        out = cls()
        for src in records.list_sources(agent_name=scope.agent_name):
            if scope.context_ids is not None and src.context_id not in scope.context_ids:
                continue
            if (source_id and src.id != source_id) or (repo and (src.repo_name or src.repo_url) != repo):
                continue
            heads = ref_heads(records.get("state", src.id), src)
            out.heads[src.id] = {name: str(h["commit"]) for name, h in heads.items()}
            out.kinds[src.id] = {name: str(h["kind"]) for name, h in heads.items() if h.get("kind")}
            out.pinned.update(name for name, h in heads.items() if h.get("pinned"))
            out.defaults[src.id] = src.ref
            out.overlays[src.id] = source_overlays(records, src.id)
        return out

    def overlays_for(self, ref: str) -> tuple[RefOverlay, ...]:
        """The overlays of ``ref`` among the loaded sources (for :attr:`SearchFilter.overlays`)."""
        return tuple(ovs[ref] for _sid, ovs in sorted(self.overlays.items()) if ref in ovs)

    def member_refs(self, source_id: str | None, chunk_id: str | None, refs: list[str] | None) -> list[str] | None:
        """Every ref of ``source_id`` that holds the chunk ``chunk_id`` whose stored ``refs`` are ``refs``: those,
        then (sorted by name) each overlay ref that sees the chunk through its base - the base is among ``refs`` and
        the chunk is not hidden in it (:class:`scopekb.stores.base.RefOverlay`). ``refs`` unchanged when the
        source or chunk id is unknown or the source has no overlay."""
        ovs = self.overlays.get(source_id or "", {})
        if not refs or chunk_id is None or not ovs:
            return refs
        have = set(refs)
        extra = sorted(r for r, ov in ovs.items() if r not in have and ov.base in have and chunk_id not in ov.hidden)
        return [*refs, *extra] if extra else refs

    def attribute(self, source_id: str | None, refs: list[str] | None) -> tuple[str, str] | None:
        """The ref and commit a hit found without ``ref`` names (issue 23): the source's default ref when the chunk
        is a member of it, else the first of its other refs by name that is indexed; None when none is known
        (a chunk written before refs existed keeps its stored ref and commit). Branches held as overlays of the
        default ref see its chunks too, so a chunk shared with the default ref always names the default ref."""
        if source_id is None or not refs:
            return None
        heads = self.heads.get(source_id, {})
        default = self.defaults.get(source_id)
        order = ([default] if default in refs else []) + sorted(r for r in refs if r != default)
        for r in order:
            if r in heads:
                return r, heads[r]
        return None

    def resolve(self, ref: str) -> str:
        """The ref name a search's ``ref`` means: a branch or tag name indexed for one of the sources, or a commit
        id (full, or a prefix of at least 7 hex digits) that is the indexed head of such a ref; a commit that is the
        head of several refs resolves to one of them when they all point at it (:meth:`_one_commit_ref`).

        ``refs/tags/<name>`` (``refs/heads/<name>``) is refused when every source holding ``<name>`` holds a branch
        (a tag) of that name: the membership name is the short name, and a branch and a tag of one name are not
        the same files (hostile review).

        Raises:
            NotFound: (404) no source of the scope has that ref indexed, and no indexed head is that commit.
            Refused: (409) the id is a prefix of the heads of several refs at different commits.
        """
        name = ref.removeprefix(HEADS).removeprefix(TAGS)
        if any(name in h for h in self.heads.values()):
            want = "tag" if ref.startswith(TAGS) else "branch" if ref.startswith(HEADS) else None
            have = {self.kinds.get(sid, {}).get(name) for sid, h in self.heads.items() if name in h}
            if want is not None and want not in have and None not in have:
                raise NotFound(f"ref {ref[:200]!r} is not indexed for this scope: {name[:200]!r} is a tracked "
                               f"{'branch' if want == 'tag' else 'tag'} of that name, not a {want}")
            return name
        if _HEX.match(ref):
            low = ref.lower()
            found = sorted({n for h in self.heads.values() for n, c in h.items() if c.startswith(low)})
            if len(found) == 1:
                return found[0]
            same = self._one_commit_ref(found, low)
            if same is not None:
                return same
            if len(found) > 1:
                raise Refused(f"commit {ref[:40]!r} is the head of several refs ({', '.join(found[:5])}); name "
                              "the ref", 409)
            raise CommitNotIndexed(ref.lower())
        raise NotFound(f"ref {ref[:200]!r} is not indexed for this scope (not a tracked branch or tag of its "
                       "sources)")

    def _one_commit_ref(self, names: list[str], prefix: str) -> str | None:
        """The ref to search when every ref in ``names`` has its head at the same commit (e.g. a tag on the branch
        head, or a branch just created): a source's default ref among them, else the first by name that is not
        a pin, else the first. None when the heads differ, when a source holds the chosen name at another commit
        (searching that name would mix commits), or when a source holds the commit under other names only."""
        commits = {c for h in self.heads.values() for n, c in h.items() if n in names and c.startswith(prefix)}
        if len(commits) != 1 or not names:
            return None
        defaults = sorted(set(names) & set(self.defaults.values()))
        plain = [n for n in names if n not in self.pinned]
        chosen = (defaults or plain or names)[0]
        commit = next(iter(commits))
        for h in self.heads.values():
            holds = any(c == commit for c in h.values())
            if h.get(chosen, commit) != commit or (holds and h.get(chosen) != commit):
                return None  # searching the name would mix commits or miss a source holding the commit
        return chosen

    def commit(self, source_id: str | None, ref: str | None) -> str | None:
        """The indexed commit of ``ref`` in ``source_id``, or None."""
        if source_id is None or ref is None:
            return None
        return self.heads.get(source_id, {}).get(ref)
