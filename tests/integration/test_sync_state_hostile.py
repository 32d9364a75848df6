"""Hostile review 2 (H1, H2) on both stores (SQLite + blob folder, OpenSearch + S3).

H1: a Markdown file whose front matter holds ``.nan``/``.inf`` is stored (the values as text), the ref advances
and the sync ends ``done``; a file that cannot be stored (here: its embedding is refused) no longer holds the ref
back - the ref advances with the path named in its state and in the status (PARTIAL), and the next sync writes it.

H2: pins written while a sync writes the same source's state record lose nothing and never exceed the limit.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from scopekb import fields as F
from scopekb.embedding.base import EmbedResult
from scopekb.errors import Refused
from scopekb.indexing import SyncDeps, run_sync
from scopekb.models import Source
from scopekb.refs import pin_ref_state, put_ref_state, ref_states
from scopekb.status import source_status
from tests.integration.test_multi_ref import CountingEmbedder, History, stored, world  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


class RefusingEmbedder(CountingEmbedder):
    """Refuses every text containing ``REFUSEME`` while ``refuse`` is set (as a provider refuses one input)."""

    refuse = True

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        res = super().embed(texts)
        if self.refuse:
            for i, t in enumerate(texts):
                if "REFUSEME" in t:
                    res.vectors[i] = None  # type: ignore[call-overload]
                    res.errors[i] = "input refused by the provider"
        return res


def _source(deps: SyncDeps, hist: History, ctx: str) -> Source:
    src = Source(id=Source.new_id(), agent_name="hstate", context_id=ctx, repo_url=str(hist.path), ref="main",
                 webhooks=False)
    deps.records.put_source(src)
    return src


def _status(w: dict[str, Any], deps: SyncDeps, src: Source) -> dict[str, Any]:
    if w["kind"] == "opensearch":  # job records are written without waiting for a refresh
        w["client"].indices.refresh(index=f"{deps.settings.opensearch.system_prefix}-*")
    return source_status(deps.records, deps.chunks, src)


def _sync(deps: SyncDeps, src: Source) -> Any:
    return run_sync(deps, f"hst-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")


def test_non_finite_front_matter_is_stored_and_the_ref_advances(world: dict[str, Any],  # noqa: F811
                                                                tmp_path_factory: Any) -> None:
    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("nan") / "repo.git")
    hist.commit("main", {"a.py": "def a():\n    return 1\n", "bom.md": "# bom\n\nold text\n"})
    src = _source(deps, hist, "nan")
    assert _sync(deps, src).state.value == "done"
    poison = "---\nx: .nan\ny: [.inf, -.inf, 2.5]\nz: {deep: -.inf}\n---\n# poison\n\nfmprobe poison\n"
    b = hist.commit("main", {"a.py": "def a():\n    return 1\n", "poison.md": poison,
                             "new.py": "def brand_new_func():\n    pass\n"})
    job = _sync(deps, src)
    assert job.state.value == "done", job.errors
    assert ref_states(deps.records, src)["main"]["commit"] == b
    docs = {d[F.PATH]: d for d in stored(world, src, "main")}
    assert set(docs) == {"a.py", "poison.md", "new.py"}
    assert docs["poison.md"][F.METADATA]["front_matter"] == {"x": "nan", "y": ["inf", "-inf", 2.5],
                                                             "z": {"deep": "-inf"}}
    st = _status(world, deps, src)
    assert st["status"] == "READY" and st["indexed_commit"] == b and not st["behind_last_push"]
    assert st["failed_paths"] == []


def test_a_file_that_cannot_be_stored_does_not_hold_the_ref_back(world: dict[str, Any],  # noqa: F811
                                                                 tmp_path_factory: Any) -> None:
    deps: SyncDeps = world["deps"]
    emb = RefusingEmbedder()
    deps = SyncDeps(settings=deps.settings, records=deps.records, chunks=deps.chunks, blobs=deps.blobs,
                    embedder=emb, embed_cache=None)
    hist = History(tmp_path_factory.mktemp("refuse") / "repo.git")
    hist.commit("main", {"a.py": "def a():\n    return 1\n"})
    src = _source(deps, hist, "refuse")
    assert _sync(deps, src).state.value == "done"
    b = hist.commit("main", {"a.py": "def a():\n    return 1\n", "bad.py": "REFUSEME = 1\n",
                             "good.py": "GOOD = 2\n"})
    job = _sync(deps, src)
    assert job.state.value == "partial" and any("bad.py" in e for e in job.errors), job.errors
    state = ref_states(deps.records, src)["main"]
    assert state["commit"] == b and state["failed"] == ["bad.py"] and not state.get("writing")
    st = _status(world, deps, src)
    assert st["status"] == "PARTIAL" and st["failed_paths"] == ["bad.py"]
    assert st["indexed_commit"] == b and not st["behind_last_push"]
    assert [r["failed"] for r in st["refs"]] == [["bad.py"]]
    # the next sync (same commit: nothing changed in git) writes the failed file again, with its vector this time
    emb.refuse = False
    job = _sync(deps, src)
    assert job.state.value == "done", job.errors
    state = ref_states(deps.records, src)["main"]
    assert state["commit"] == b and "failed" not in state
    docs = {d[F.PATH]: d for d in stored(world, src, "main")}
    assert docs["bad.py"][F.BLOB_SHA], "the retried file carries its blob id again"
    st = _status(world, deps, src)
    assert st["status"] == "READY" and st["failed_paths"] == []


def test_concurrent_pins_and_state_writes_lose_nothing(world: dict[str, Any],  # noqa: F811
                                                       tmp_path_factory: Any) -> None:
    """12 pins from 12 threads against a limit of 8 while another thread keeps rewriting the source's branch
    state (as a running sync does): exactly 8 pins are recorded, every accepted pin is in the record, the 4
    others are refused with 429, and the branch's last write is there too."""
    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("pins") / "repo.git")
    hist.commit("main", {"a.py": "x = 1\n"})
    src = _source(deps, hist, "pins")
    put_ref_state(deps.records, src, "main", {"commit": "0" * 40, "indexed_at": "2026-01-01T00:00:00+00:00"})
    commits = [f"{i:040x}" for i in range(1, 13)]
    accepted: list[str] = []
    refused: list[int] = []
    stop = threading.Event()
    start = threading.Barrier(len(commits) + 1)

    def pin(c: str) -> None:
        start.wait()
        try:
            st = pin_ref_state(deps.records, src, c, {"pinned": True, "job_id": f"job-{c[-4:]}"}, limit=8)
            if st.get("job_id") == f"job-{c[-4:]}":
                accepted.append(c)
        except Refused as e:
            refused.append(e.status)

    writes = [0]

    def worker() -> None:
        start.wait()
        while not stop.is_set() or writes[0] < 20:
            writes[0] += 1
            put_ref_state(deps.records, src, "main",
                          {"commit": f"{writes[0]:040x}", "indexed_at": "2026-01-02T00:00:00+00:00"})

    threads = [threading.Thread(target=pin, args=(c,)) for c in commits]
    w = threading.Thread(target=worker)
    for t in (*threads, w):
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    w.join(60)
    states = ref_states(deps.records, src)
    pinned = sorted(n for n, s in states.items() if s.get("pinned"))
    assert len(accepted) == 8 and refused == [429] * 4, (accepted, refused)
    assert pinned == sorted(accepted)
    assert states["main"]["commit"] == f"{writes[0]:040x}"
    assert deps.records.get("state", src.id)["commit"] == f"{writes[0]:040x}"
