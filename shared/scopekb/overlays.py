"""Ref overlays (issue 23): a ref first indexed from a nearby indexed ref holds that ref's chunks without one
membership write per chunk.

A ref ``R`` of a source that starts from the nearest indexed ref ``N`` becomes an *overlay* of a *base* ref ``B``
(``N`` itself, or ``N``'s base when ``N`` is an overlay): its members are the chunks whose ``refs`` name ``R``
(explicit members) plus the chunks of the source whose ``refs`` name ``B`` and whose id is not in ``R``'s
``hidden`` set (:class:`scopekb.stores.base.RefOverlay`). Adding a branch that differs from ``B`` by one file then
costs the membership of that file's chunks, not a rewrite of every chunk (django: 40,000 partial updates a
branch before). The overlays of a source are one record (kind ``overlays``, id = the source id), read by id.

Invariants kept by the sync (:mod:`scopekb.indexing`), each step safe to die after:

- a chunk that joins ``B`` is hidden first in every overlay of ``B`` that does not name it (:func:`hide_joining`);
- a chunk that leaves ``B`` first becomes an explicit member of every overlay of ``B`` that sees it, then leaves
  ``B``, then is dropped from their hidden sets (:func:`materialize_leaving`);
- a chunk that leaves an overlay ``R`` is hidden in ``R`` when ``B`` holds it (even when it names ``R`` too: it
  joined ``B`` after ``R``), and loses ``R`` from its ``refs`` when it names ``R``;
- before ``B`` itself is dropped, each overlay of ``B`` gets every chunk it sees through ``B`` as explicit
  members and stops being an overlay (:func:`dissolve`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scopekb.errors import Transient
from scopekb.stores.base import ChunkStore, RecordStore, RefOverlay

#: Record kind of overlays in the record store.
KIND = "overlays"


def source_overlays(records: RecordStore, source_id: str) -> dict[str, RefOverlay]:
    """ref name -> overlay, for every overlay of ``source_id``."""
    return _load(records, source_id)


def _load(records: RecordStore, source_id: str) -> dict[str, RefOverlay]:
    d = records.get(KIND, source_id) or {}
    out: dict[str, RefOverlay] = {}
    for ref, v in (d.get("refs") or {}).items():
        if isinstance(v, dict) and v.get("base"):
            out[str(ref)] = RefOverlay(source_id=source_id, base=str(v["base"]),
                                       hidden=frozenset(v.get("hidden") or ()))
    return out


def _save(records: RecordStore, source_id: str, ovs: Mapping[str, RefOverlay]) -> None:
    if not ovs:
        records.delete(KIND, source_id)
        return
    # Read back by id (real-time in both record stores), so no refresh is waited for.
    records.put(KIND, source_id, {"source_id": source_id, "refs": {
        ref: {"base": ov.base, "hidden": sorted(ov.hidden)} for ref, ov in sorted(ovs.items())}}, wait=False)


def get_overlay(records: RecordStore, source_id: str, ref: str) -> RefOverlay | None:
    """The overlay of ``ref`` in ``source_id``, or None when ``ref`` holds its chunks by explicit membership."""
    return _load(records, source_id).get(ref)


def put_overlay(records: RecordStore, source_id: str, ref: str, ov: RefOverlay | None) -> None:
    """Store (or, with None, drop) the overlay of ``ref`` in ``source_id``."""
    ovs = _load(records, source_id)
    if ov is None and ref not in ovs:
        return
    if ov is None:
        ovs.pop(ref)
    else:
        ovs[ref] = ov
    _save(records, source_id, ovs)


def overlays_of(records: RecordStore, source_id: str, base: str) -> dict[str, RefOverlay]:
    """ref name -> overlay, for the overlays of ``source_id`` whose base is ``base``."""
    return {ref: ov for ref, ov in _load(records, source_id).items() if ov.base == base}


def hide_joining(records: RecordStore, source_id: str, ref: str, refs_before: Mapping[str, Sequence[str]]) -> None:
    """Before chunks join ``ref`` (``id -> refs`` they have now; ``[]`` for a chunk not stored yet): hide each one
    that does not name it in every overlay based on ``ref``, so their members stay the same."""
    joining = {cid: set(refs) for cid, refs in refs_before.items() if ref not in refs}
    if not joining:
        return
    for name, ov in overlays_of(records, source_id, ref).items():
        add = {cid for cid, refs in joining.items() if name not in refs} - ov.hidden
        if add:
            put_overlay(records, source_id, name, RefOverlay(source_id, ov.base, ov.hidden | add))


def materialize_leaving(chunks: ChunkStore, records: RecordStore, source_id: str, ref: str,
                        refs_before: Mapping[str, Sequence[str]]) -> dict[str, RefOverlay]:
    """Before chunks leave ``ref`` (``id -> refs`` they have now): every overlay based on ``ref`` that sees one of
    them (names neither it nor hides it) gets it as an explicit member. Returns the overlays based on ``ref``, for
    :func:`forget_left` once the chunks have left.

    Raises:
        scopekb.errors.Transient: the store refused some of the membership updates.
    """
    leaving = {cid: set(refs) for cid, refs in refs_before.items() if ref in refs}
    deps = overlays_of(records, source_id, ref) if leaving else {}
    updates: dict[str, set[str]] = {}
    for name, ov in deps.items():
        for cid, refs in leaving.items():
            if name not in refs and cid not in ov.hidden:
                updates.setdefault(cid, set(refs)).add(name)
    if updates:
        report = chunks.set_refs({cid: sorted(r) for cid, r in updates.items()})
        if report.errors:
            raise Transient(f"{len(report.errors)} chunks did not keep their overlay refs: "
                                   f"{report.errors[0][2][:300]}")
    return deps


def forget_left(records: RecordStore, source_id: str, deps: Mapping[str, RefOverlay], left: Sequence[str]) -> None:
    """After chunks ``left`` left the base of ``deps``: drop them from the overlays' hidden sets (they no longer
    need hiding)."""
    gone = set(left)
    for name, ov in deps.items():
        if ov.hidden & gone:
            put_overlay(records, source_id, name, RefOverlay(source_id, ov.base, ov.hidden - gone))


def hide_in_overlay(records: RecordStore, source_id: str, ref: str, refs_before: Mapping[str, Sequence[str]]) -> None:
    """Chunks leaving the overlay ``ref`` (``id -> refs`` now): every one its base holds is hidden in it - also one
    that names ``ref`` too (it joined the base after it joined ``ref``), which would otherwise still be seen through
    the base once :meth:`ChunkStore.remove_ref` drops the name."""
    ov = get_overlay(records, source_id, ref)
    if ov is None:
        return
    add = {cid for cid, refs in refs_before.items() if ov.base in refs} - ov.hidden
    if add:
        put_overlay(records, source_id, ref, RefOverlay(source_id, ov.base, ov.hidden | add))


def dissolve(chunks: ChunkStore, records: RecordStore, agent: str, context: str, source_id: str, base: str) -> int:
    """Before ``base`` is dropped: each overlay based on it takes every chunk it sees through ``base`` as explicit
    members and is no overlay any more. Returns the chunks that joined."""
    joined = 0
    for name, ov in overlays_of(records, source_id, base).items():
        joined += chunks.copy_ref(agent, context, source_id, base, name, exclude_ids=sorted(ov.hidden))
        put_overlay(records, source_id, name, None)
    return joined


def start_overlay(chunks: ChunkStore, records: RecordStore, agent: str, context: str, source_id: str, ref: str,
                  near: str, exclude_paths: Sequence[str]) -> int:
    """Make the never-indexed ``ref`` start as the nearest indexed ref ``near`` minus the chunks of
    ``exclude_paths``: an overlay of ``near``'s base (or of ``near``), hiding the base's chunks of those paths;
    ``near``'s explicit members outside them join ``ref`` (none when ``near`` is the base). Returns the chunks
    that joined by a write."""
    near_ov = get_overlay(records, source_id, near)
    base = near_ov.base if near_ov else near
    hidden = set(near_ov.hidden) if near_ov else set()
    if exclude_paths:
        held = chunks.chunk_versions(agent, context, source_id, list(exclude_paths), ref=base)
        hidden |= {cid for ids in held.values() for cid in ids}
    put_overlay(records, source_id, ref, RefOverlay(source_id, base, frozenset(hidden)))
    if near_ov is None:
        return 0
    return chunks.copy_ref(agent, context, source_id, near, ref, exclude_paths=exclude_paths)


def overlay_dict(ov: RefOverlay | None) -> dict[str, Any] | None:
    """The overlay as a small JSON-able summary (base and hidden count) for logs and status."""
    return None if ov is None else {"base": ov.base, "hidden": len(ov.hidden)}


def drop_source_overlays(records: RecordStore, source_id: str) -> None:
    """Forget every overlay of ``source_id`` (its chunks were deleted with it)."""
    records.delete(KIND, source_id)
