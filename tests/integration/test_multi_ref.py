"""Many refs per source without copies (issue 23), on real OpenSearch + S3 and on SQLite + a blob folder.

A hypothesis property test drives random histories of a bare repository: commits on several branches, new branches,
tags, force pushes (a branch moved to another branch's tip) and branch deletions, with syncs in between, of one
source tracking ``["main", "b*", "v*"]``. After every sync, for every ref git has:

- the chunks the index holds for that ref (path, lines, content), and the hits of the product's search with that
  ``ref``, are exactly those of a fresh single-ref index of the ref's commit built by the product (a new source
  tracking one branch at that commit), which itself holds what chunking the tree gives;
- every hit lists in ``refs`` every ref that holds its chunk, overlay refs included (with and without ``ref``);
- the source's chunk documents are the distinct (path, lines, chunk identity) over all its refs - no copies;
- ``read`` returns byte-exact lines of git's blob for every chunk of every ref;
- the embedder never saw the same text twice (embeddings once per distinct content, through the cache);
- the status lists each ref with its indexed commit;

and after every ref is deleted and a last sync runs, nothing of the source is left.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scopekb import fields as F
from scopekb.chunking import chunk_document
from scopekb.embedding.base import EmbedResult
from scopekb.embedding.cache import SQLiteEmbeddingCache
from scopekb.errors import NotFound
from scopekb.filetypes import decode_text, language_for
from scopekb.indexing import SyncDeps, run_sync
from scopekb.models import ReadRequest, SearchRequest, Source
from scopekb.reading import read_lines, result_bytes, split_lines
from scopekb.refs import RefIndex, put_ref_state, ref_states
from scopekb.search import run_search
from scopekb.settings import QuerySettings, Settings
from scopekb.status import source_status
from scopekb.stores.base import ScopeFilter, SearchFilter

pytestmark = pytest.mark.slow

FILES = ("a.py", "b.md", "c.txt")
#: Line pool: few distinct lines so that branches share most chunks and differ in some.
LINES = ("def alpha():", "    return 1", "def beta(x):", "    return x * 2", "# notes", "value = 3", "print(value)",
         "class Gamma:", "    pass", "text line")
BRANCHES = ("main", "b1", "b2", "b3")
TAGS = ("v1", "v2")


class CountingEmbedder:
    """A deterministic 3-d embedder that records every text it is asked to embed."""

    model_id = "count:3"
    dimension = 3
    max_input_tokens = 10_000

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        self.seen.extend(texts)
        vecs = [[float(len(t)), float(sum(map(ord, t)) % 97) + 1.0, 0.5] for t in texts]
        return EmbedResult(vectors=vecs, token_counts=[len(t) for t in texts], errors={},
                           total_tokens=sum(map(len, texts)), requests=1)

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text]).vectors[0]  # type: ignore[return-value]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]

    def close(self) -> None:
        pass


def git(repo: Path, *args: str, data: bytes | None = None) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "--git-dir", str(repo), *args], input=data, check=True, capture_output=True,
                          env=env).stdout.decode().strip()


class History:
    """A bare repository whose branches are written with plumbing (no work tree)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
        self.n = 0

    def commit(self, branch: str, files: dict[str, str]) -> str:
        entries = []
        for name in sorted(files):
            sha = git(self.path, "hash-object", "-w", "--stdin", data=files[name].encode())
            entries.append(f"100644 blob {sha}\t{name}")
        tree = git(self.path, "mktree", data=("\n".join(entries) + "\n").encode() if entries else b"")
        self.n += 1
        parent = self.head(branch)
        commit = git(self.path, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", f"c{self.n}")
        git(self.path, "update-ref", f"refs/heads/{branch}", commit)
        return commit

    def head(self, ref: str) -> str | None:
        try:
            return git(self.path, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        except subprocess.CalledProcessError:
            return None

    def refs(self) -> dict[str, str]:
        out = git(self.path, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads", "refs/tags")
        return {name: self.head(name) or sha for name, sha in (ln.split() for ln in out.splitlines())}

    def files(self, commit: str) -> dict[str, bytes]:
        out = {}
        for ln in git(self.path, "ls-tree", commit).splitlines():
            meta, name = ln.split("\t")
            out[name] = subprocess.run(["git", "--git-dir", str(self.path), "cat-file", "blob", meta.split()[2]],
                                       check=True, capture_output=True).stdout
        return out


# --------------------------------------------------------------------------------------------------- stores


@pytest.fixture(scope="module", params=["sqlite", "opensearch"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("multiref")
    emb = CountingEmbedder()
    chunking = {"window_lines": 4, "overlap_lines": 1, "syntax": False}
    cache = SQLiteEmbeddingCache(tmp / "emb.sqlite3")
    if request.param == "sqlite":
        from scopekb.blobs import LocalBlobStore
        from scopekb.stores.sqlite import SqliteChunkStore, SqliteRecordStore

        s = Settings(data_dir=tmp / "data", git={"cache_dir": str(tmp / "git"), "allow_local_paths": True},
                     chunking=chunking)
        chunks = SqliteChunkStore(tmp / "index.sqlite3", dimension=3, model=emb.model_id)
        chunks.ensure_index()
        deps = SyncDeps(settings=s, records=SqliteRecordStore(tmp / "records.sqlite3"), chunks=chunks,
                        blobs=LocalBlobStore(tmp / "blobs"), embedder=emb, embed_cache=cache)
        yield {"deps": deps, "kind": "sqlite", "emb": emb}
        chunks.close()
        return
    from scopekb.blobs import S3BlobStore
    from scopekb.stores.opensearch import OpenSearchChunkStore, make_client
    from scopekb.stores.records import OpenSearchRecordStore

    run = f"it-mref-{uuid.uuid4().hex[:8]}"
    s = Settings(opensearch={"url": request.getfixturevalue("opensearch_url"), "alias": run,
                             "system_prefix": f"{run}-sys"},
                 s3={**request.getfixturevalue("s3_config"), "bucket": run},
                 git={"cache_dir": str(tmp / "git"), "allow_local_paths": True}, chunking=chunking)
    client = make_client(s.opensearch)
    chunks = OpenSearchChunkStore(client, alias=run, dimension=3, model=emb.model_id)
    chunks.ensure_index()
    deps = SyncDeps(settings=s, records=OpenSearchRecordStore(client, s.opensearch.system_prefix), chunks=chunks,
                    blobs=S3BlobStore(s.s3), embedder=emb, embed_cache=cache)
    yield {"deps": deps, "kind": "opensearch", "emb": emb, "client": client}
    client.indices.delete(index=f"{run}*", params={"expand_wildcards": "open"})


def stored(world: dict[str, Any], src: Source, ref: str | None = None) -> list[dict[str, Any]]:
    """Every chunk document of a source (of one ref when given: through the stores' own ref filter, overlays
    included, as a search with that ``ref`` sees them), read straight from the store."""
    deps: SyncDeps = world["deps"]
    deps.chunks.refresh()
    scope = ScopeFilter(src.agent_name, (src.context_id,))
    flt = SearchFilter(scope=scope, source_id=src.id, ref=ref,
                       overlays=RefIndex.load(deps.records, scope, src.id).overlays_for(ref) if ref else ())
    if world["kind"] == "sqlite":
        from scopekb.stores.sqlite.chunks import _filter_sql

        where, args = _filter_sql(flt)
        sql = f"SELECT d.doc FROM chunks c JOIN chunk_docs d ON d.rowid = c.rowid WHERE {where}"
        with sqlite3.connect(deps.chunks.path) as conn:  # type: ignore[attr-defined]
            conn.create_function("scopekb_glob", 2, lambda p, g: 0)
            return [json.loads(r[0]) for r in conn.execute(sql, args)]
    from opensearchpy import helpers

    from scopekb.stores.opensearch import filter_clauses

    return [h["_source"] for h in helpers.scan(world["client"], index=deps.chunks.alias,  # type: ignore[attr-defined]
                                               query={"query": {"bool": {"filter": filter_clauses(flt)}}},
                                               _source_excludes=[F.EMBEDDING])]


def expected(deps: SyncDeps, files: dict[str, bytes]) -> set[tuple[str, int, int, str]]:
    """What a fresh index of one tree holds: the chunker's output on each text file (no file here is skipped)."""
    out = set()
    for path, data in files.items():
        for c in chunk_document(path, decode_text(data), language_for(path), deps.settings.chunking, deps.counter):
            out.add((path, c.start_line, c.end_line, c.content))
    return out


#: One keyword query (BM25, any term) that every line of LINES matches, so a search returns every chunk of a ref.
EVERYTHING = "alpha return beta notes value print gamma pass text line"

Key = tuple[str, int, int, str]


def searched(deps: SyncDeps, scope: ScopeFilter, source_id: str, ref: str | None = None) -> dict[Key, list[str]]:
    """(path, lines, content) -> the hit's ``refs``, for every hit of the product's search of ``ref`` (or of no
    ref) in one source (at most 50 hits: more than any ref here has chunks)."""
    # revocation_bound_s=0: a search without ref reads the refs and overlays now, not from a cache up to 1 s old
    res = run_search(deps.chunks, SearchRequest(query=EVERYTHING, ref=ref, source_id=source_id, max_results=50),
                     scope, QuerySettings(revocation_bound_s=0), records=deps.records)
    return {(h.path, h.start_line, h.end_line, h.content): list(h.refs or []) for h in res.hits}


def fresh_index(world: dict[str, Any], hist: History, src: Source, commit: str,
                memo: dict[str, tuple[set[Key], set[Key]]]) -> tuple[set[Key], set[Key]]:
    """What a fresh single-ref index of ``commit``, built by the product, holds and finds: a new source (own
    context) tracking one branch ``freshN`` at that commit, synced, read (stored chunks, search hits for
    :data:`EVERYTHING`), then removed with its branch. Memoised per commit in ``memo`` (one history)."""
    if commit in memo:
        return memo[commit]
    deps: SyncDeps = world["deps"]
    name = f"fresh{len(memo)}"  # not tracked by the source under test (main, b*, v*)
    git(hist.path, "update-ref", f"refs/heads/{name}", commit)
    one = Source(id=Source.new_id(), agent_name=src.agent_name, context_id=uuid.uuid4().hex[:8],
                 repo_url=src.repo_url, ref=name, webhooks=False)
    deps.records.put_source(one)
    seen = len(world["emb"].seen)
    try:
        job = run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [one.id], trigger="test")
        assert job.state.value == "done", job.errors
        docs = stored(world, one)
        memo[commit] = ({(d[F.PATH], d[F.START_LINE], d[F.END_LINE], d[F.CONTENT]) for d in docs},
                        set(searched(deps, ScopeFilter(one.agent_name, (one.context_id,)), one.id)))
    finally:
        deps.chunks.delete_source(one.id)
        deps.records.delete("state", one.id)
        deps.records.delete("sources", one.id)
        git(hist.path, "update-ref", "-d", f"refs/heads/{name}")
        del world["emb"].seen[seen:]  # the fresh index is another scope: its embeddings are not the source's
    return memo[commit]


def check(world: dict[str, Any], hist: History, src: Source, pins: set[str] = frozenset(),  # type: ignore[assignment]
          memo: dict[str, tuple[set[Key], set[Key]]] | None = None) -> int:
    deps: SyncDeps = world["deps"]
    refs = {r: c for r, c in hist.refs().items() if r.startswith(("main", "b", "v"))}
    refs.update({p: p for p in pins})
    distinct: set[tuple[str, int, int, str]] = set()
    scope = ScopeFilter(src.agent_name, (src.context_id,))
    found: dict[str, set[Key]] = {}
    for ref, commit in refs.items():
        files = hist.files(commit)
        docs = stored(world, src, ref)
        got = {(d[F.PATH], d[F.START_LINE], d[F.END_LINE], d[F.CONTENT]) for d in docs}
        fresh_docs, fresh_hits = fresh_index(world, hist, src, commit, {} if memo is None else memo)
        assert fresh_docs == expected(deps, files)  # the fresh index itself holds what the chunker gives
        assert got == fresh_docs, (ref, sorted(got ^ fresh_docs)[:6])
        hits = searched(deps, scope, src.id, ref)  # the product's search of that ref = the fresh index's
        assert set(hits) == fresh_hits, (ref, sorted(set(hits) ^ fresh_hits)[:6])
        assert all(ref in r for r in hits.values()), (ref, hits)  # overlay refs too list themselves on hits
        found[ref] = set(hits)
        assert len(docs) == len(got), f"{ref}: two documents for one chunk"
        distinct |= got
        for d in docs:  # read is byte-exact for every chunk of every ref
            res = read_lines(deps.chunks, deps.blobs, scope, ReadRequest(
                path=d[F.PATH], blob_sha=d[F.BLOB_SHA], start_line=d[F.START_LINE], end_line=d[F.END_LINE]))
            want = b"".join(split_lines(files[d[F.PATH]])[d[F.START_LINE] - 1:d[F.END_LINE]])
            assert result_bytes(res) == want
    everything = stored(world, src)
    # no copies: one document per distinct chunk identity (path, lines, content and what the chunker derived:
    # kind, symbol, metadata - scopekb.fields.chunk_sha) over all refs
    idents = {(d[F.PATH], d[F.START_LINE], d[F.END_LINE], d[F.CONTENT], d.get(F.KIND), d.get(F.SYMBOL),
               json.dumps(d.get(F.METADATA), sort_keys=True)) for d in everything}
    assert len(everything) == len(idents), "chunk documents are not the distinct chunks of the refs"
    assert {(p, a, b, c) for p, a, b, c, *_ in idents} == distinct
    assert {r for d in everything for r in d[F.REFS]} <= set(refs)
    for key, hit_refs in searched(deps, scope, src.id).items():  # without ref: a hit lists every ref holding it
        assert sorted(hit_refs) == sorted(r for r, keys in found.items() if key in keys), (key, hit_refs)
    status = {r["ref"]: r["commit"] for r in source_status(deps.records, deps.chunks, src)["refs"]}
    assert status == refs
    seen = world["emb"].seen
    assert len(seen) == len(set(seen)), "a text was embedded twice"
    return len(refs)


OPS = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.sampled_from(BRANCHES),
              st.dictionaries(st.sampled_from(FILES), st.one_of(st.none(), st.lists(st.sampled_from(LINES),
                                                                                  min_size=1, max_size=9)),
                              min_size=1, max_size=3)),
    st.tuples(st.just("branch"), st.sampled_from(BRANCHES), st.sampled_from(BRANCHES)),
    st.tuples(st.just("delete"), st.sampled_from(BRANCHES[1:]), st.just(None)),
    st.tuples(st.just("force"), st.sampled_from(BRANCHES), st.sampled_from(BRANCHES)),
    st.tuples(st.just("tag"), st.sampled_from(TAGS), st.sampled_from(BRANCHES)),
    st.tuples(st.just("sync"), st.just(None), st.just(None)),
    st.tuples(st.just("pin"), st.sampled_from(BRANCHES), st.integers(min_value=0, max_value=3)),
), min_size=3, max_size=14)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(ops=OPS)
def test_every_ref_equals_a_fresh_index_without_copies(world: dict[str, Any], tmp_path_factory: Any,
                                                       ops: list[tuple[str, Any, Any]]) -> None:
    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    trees: dict[str, dict[str, str]] = {"main": {"a.py": "def alpha():\n    return 1\n", "b.md": "# notes\n"}}
    first = hist.commit("main", trees["main"])
    for name in ("b1", "b2"):  # every history starts with three branches and a tag, the ops change them from there
        git(hist.path, "update-ref", f"refs/heads/{name}", first)
    hist.commit("b2", {**trees["main"], "c.txt": "text line\nvalue = 3\n"})
    git(hist.path, "tag", "v1", first)
    src = Source(id=Source.new_id(), agent_name="mref", context_id=uuid.uuid4().hex[:8], repo_url=str(hist.path),
                 ref="main", refs=["main", "b*", "v*"], webhooks=False)
    deps.records.put_source(src)
    most = 0
    pins: set[str] = set()
    memo: dict[str, tuple[set[Key], set[Key]]] = {}
    for op, a, b in [*ops, ("sync", None, None)]:
        heads = hist.refs()
        if op == "commit" and a in heads:
            tree = {**hist_tree(hist, heads[a])}
            for name, lines in b.items():
                if lines is None:
                    tree.pop(name, None)
                else:
                    tree[name] = "\n".join(lines) + "\n"
            hist.commit(a, tree)
        elif op == "branch" and b in heads and a not in heads:
            git(hist.path, "update-ref", f"refs/heads/{a}", heads[b])
        elif op == "delete" and a in heads:
            git(hist.path, "update-ref", "-d", f"refs/heads/{a}")
        elif op == "force" and a in heads and b in heads and a != b:
            git(hist.path, "update-ref", f"refs/heads/{a}", heads[b])  # history rewritten to another tip
        elif op == "pin" and a in heads:  # any commit of the history, indexed on demand as a temporary ref
            commit = hist.head(f"{a}~{b}")
            if commit and commit not in pins:
                pins.add(commit)
                put_ref_state(deps.records, src, commit, {"pinned": True, "expires_at": "2999-01-01T00:00:00+00:00"})
        elif op == "tag" and b in heads:
            git(hist.path, "tag", "-f", a, heads[b])
        elif op == "sync":
            job = run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
            assert job.state.value == "done", job.errors
            most = max(most, check(world, hist, src, pins, memo))
    event(f"most refs at a sync: {most}")
    event(f"pins: {len(pins)}")
    # Every ref deleted and every pin past its TTL: the last sync (and the gc) leaves nothing of the source.
    for name in hist.refs():
        kind = "tags" if name in TAGS else "heads"
        git(hist.path, "update-ref", "-d", f"refs/{kind}/{name}")
    for pin in pins:
        st = ref_states(deps.records, src)[pin]
        put_ref_state(deps.records, src, pin, {**st, "expires_at": "2000-01-01T00:00:00+00:00"})
    run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
    assert stored(world, src) == []
    assert source_status(deps.records, deps.chunks, src)["refs"] == []


def hist_tree(hist: History, commit: str) -> dict[str, str]:
    return {k: v.decode() for k, v in hist.files(commit).items()}


def test_a_new_branch_reuses_every_unchanged_chunk(world: dict[str, Any], tmp_path_factory: Any) -> None:
    """20 branches that differ from main by one file each: each joins main's chunks and writes only its file's."""
    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    base = {f"f{i}.py": "\n".join(f"def f{i}_{j}():\n    return {j}" for j in range(6)) + "\n" for i in range(10)}
    main = hist.commit("main", base)
    src = Source(id=Source.new_id(), agent_name="mref", context_id="twenty", repo_url=str(hist.path), ref="main",
                 refs=["main", "b*"], webhooks=False)
    deps.records.put_source(src)
    first = run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
    one_branch = len(stored(world, src))
    for n in range(20):
        git(hist.path, "update-ref", f"refs/heads/b{n}", main)
        hist.commit(f"b{n}", {**base, "f0.py": base["f0.py"] + f"def extra_{n}():\n    return {n}\n"})
    job = run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
    assert job.state.value == "done", job.errors
    assert set(job.ref_commits) == {"main", *(f"b{n}" for n in range(20))}
    total = len(stored(world, src))
    # each branch adds only the chunk(s) of its changed tail of f0.py; everything else is shared
    assert one_branch < total <= one_branch + 20 * 3, (one_branch, total)
    assert job.chunks_written <= 20 * 3 < first.chunks_written * 2
    # each branch is an overlay of main (scopekb.overlays): no membership write for the chunks it shares with main
    assert job.chunks_linked <= 20 * 3, job.chunks_linked
    assert np.isfinite(job.chunks_linked)
    check(world, hist, src)


def test_a_file_an_overlay_drops_after_its_base_gained_it_leaves_the_overlay(world: dict[str, Any],
                                                                             tmp_path_factory: Any) -> None:
    """Regression (hypothesis seed 94216921201143823339090198570126782646 on OpenSearch): ``b1`` is an overlay of
    ``main`` holding ``c.txt`` by its own membership; ``main`` then gains the same ``c.txt`` (the chunk names both),
    and ``b1`` deletes it. ``b1`` must stop seeing it, although ``main`` still holds it: the chunk it leaves is
    hidden in ``b1``, not only unnamed."""
    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    base = {"a.py": "def alpha():\n    return 1\n", "b.md": "# notes\n"}
    first = hist.commit("main", base)
    git(hist.path, "update-ref", "refs/heads/b1", first)
    shared = hist.commit("b1", {**base, "c.txt": "text line\nvalue = 3\n"})
    src = Source(id=Source.new_id(), agent_name="mref", context_id=uuid.uuid4().hex[:8], repo_url=str(hist.path),
                 ref="main", refs=["main", "b*"], webhooks=False)
    deps.records.put_source(src)
    for step in ("both", "main gains c.txt", "b1 drops c.txt", "b1 drops everything"):
        if step == "main gains c.txt":
            git(hist.path, "update-ref", "refs/heads/main", shared)
        elif step == "b1 drops c.txt":
            hist.commit("b1", base)
        elif step == "b1 drops everything":
            hist.commit("b1", {})
        job = run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
        assert job.state.value == "done", job.errors
        check(world, hist, src)


def test_one_blob_at_paths_of_two_languages_is_chunked_for_each(world: dict[str, Any],
                                                                 tmp_path_factory: Any) -> None:
    """Regression (CI on main at d1a6203, shrunk by hand from the property test above): ``a.py`` and ``b.md`` hold
    the same bytes, so one git blob. A sync chunked that blob once and reused its chunks for every path holding it
    (a cache keyed by blob sha), so ``b.md`` got ``a.py``'s line windows (1-4, 4-7, 7-9) instead of its markdown
    sections (1-8, 9 ``# notes``); the index (and a fresh index) of the commit differed from what the chunker gives
    each file. Each path gets its own language's chunks, on a first sync, on a branch's copy of main, and on a push
    that makes the files equal."""
    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    body = "\n".join(["text line"] * 8 + ["# notes"]) + "\n"
    first = hist.commit("main", {"a.py": body, "b.md": body, "c.txt": body})
    git(hist.path, "update-ref", "refs/heads/b1", first)
    src = Source(id=Source.new_id(), agent_name="mref", context_id=uuid.uuid4().hex[:8], repo_url=str(hist.path),
                 ref="main", refs=["main", "b*"], webhooks=False)
    deps.records.put_source(src)
    for step in ("first sync", "b1: b.md and c.txt become equal to a new a.py"):
        if step.startswith("b1"):
            other = "\n".join(["value = 3"] * 6 + ["# notes", "print(value)"]) + "\n"
            hist.commit("b1", {"a.py": other, "b.md": other, "c.txt": other})
        job = run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
        assert job.state.value == "done", job.errors
        for ref, commit in hist.refs().items():
            got = {(d[F.PATH], d[F.START_LINE], d[F.END_LINE], d[F.CONTENT], d[F.KIND])
                   for d in stored(world, src, ref)}
            want = {(p, c.start_line, c.end_line, c.content, c.kind) for p, data in hist.files(commit).items()
                    for c in chunk_document(p, decode_text(data), language_for(p), deps.settings.chunking,
                                            deps.counter)}
            # the case holds: one blob, and the two languages cut it at other lines
            assert {k[1:3] for k in want if k[0] == "b.md"} != {k[1:3] for k in want if k[0] == "a.py"}
            assert got == want, (step, ref, sorted(got ^ want))
        check(world, hist, src)


def test_a_tag_and_a_branch_of_one_name_and_a_branch_named_like_a_commit(world: dict[str, Any],
                                                                        tmp_path_factory: Any) -> None:
    """Hostile review: a branch and a tag of one short name collapsed into one ref, so a search of
    ``refs/tags/v2`` answered with the branch's files; and a pushed branch named like a commit id answered searches
    "at" that commit with its own files. The branch keeps the name, the tag is named in the job's errors and a
    search of ``refs/tags/v2`` is a 404; a branch named like a full commit id is not tracked (a search's ref of that
    id means the commit), and is named in the job's errors too."""
    from scopekb.refs import CommitNotIndexed

    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    first = hist.commit("main", {"a.py": "def zzkind_first():\n    return 1\n"})
    git(hist.path, "tag", "v2", first)
    hist.commit("v2", {"a.py": "def zzkind_first():\n    return 1\n", "b.py": "def zzkind_branch_only():\n    pass\n"})
    src = Source(id=Source.new_id(), agent_name="mref", context_id="kinds-" + uuid.uuid4().hex[:6],
                 repo_url=str(hist.path), ref="main", refs=["main", "v*", "*"], webhooks=False)
    deps.records.put_source(src)
    job = run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
    assert job.state.value == "partial" and set(job.ref_commits) == {"main", "v2"}, (job.state, job.ref_commits)
    assert any("'refs/tags/v2' (a branch of the same name is tracked" in e for e in job.errors), job.errors
    scope = ScopeFilter(src.agent_name, (src.context_id,))

    def paths(ref: str) -> set[str]:
        res = run_search(deps.chunks, SearchRequest(query="zzkind_first zzkind_branch_only", ref=ref,
                                                    source_id=src.id, max_results=20),
                         scope, QuerySettings(revocation_bound_s=0), records=deps.records)
        return {h.path for h in res.hits}

    assert paths("v2") == paths("refs/heads/v2") == {"a.py", "b.py"}
    with pytest.raises(NotFound, match="tracked branch of that name, not a tag"):
        paths("refs/tags/v2")

    # A branch named like the first commit's id, at another commit: not tracked; that id means the commit.
    git(hist.path, "update-ref", f"refs/heads/{first}", hist.head("refs/heads/v2"))
    job = run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
    assert first not in job.ref_commits, job.ref_commits
    assert any(f"{first!r} (named like a full commit id" in e for e in job.errors), job.errors
    assert paths(first[:12]) == {"a.py"}  # main's head is that commit: its files, not the branch's
    hist.commit("main", {"a.py": "def zzkind_first():\n    return 2\n"})
    run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
    with pytest.raises(CommitNotIndexed):  # no indexed ref is at that commit now: a pin, never the branch
        paths(first)


def test_a_refused_pin_fails_its_own_job_whichever_sync_refuses_it(world: dict[str, Any],
                                                                   tmp_path_factory: Any) -> None:
    """Hostile review: with several pins at once (a query replica without mirrors accepts any commit id), the sync
    that ran first refused every bogus pin and filed their errors under its own job; each refused pin's own job
    later found nothing to do and said ``done``. Now the refused pin's job is failed with the reason, and that job
    ends at once when its turn comes; a pin job whose own pin is refused is failed, not partial."""
    from scopekb.models import Job, JobState
    from scopekb.refs import pin_ref_state

    deps: SyncDeps = world["deps"]
    hist = History(tmp_path_factory.mktemp("hist") / "repo.git")
    first = hist.commit("main", {"a.py": "def zzpin_first():\n    return 1\n"})
    hist.commit("main", {"a.py": "def zzpin_first():\n    return 2\n"})
    src = Source(id=Source.new_id(), agent_name="mref", context_id="pins-" + uuid.uuid4().hex[:6],
                 repo_url=str(hist.path), ref="main", webhooks=False)
    deps.records.put_source(src)
    assert run_sync(deps, f"mref-{uuid.uuid4().hex[:8]}", [src.id], trigger="test").state.value == "done"
    bogus, good_job, bogus_job = "b" * 40, f"pin-good-{uuid.uuid4().hex[:6]}", f"pin-bogus-{uuid.uuid4().hex[:6]}"
    for commit, job_id in ((first, good_job), (bogus, bogus_job)):  # as ops.pin_commit writes them
        pin_ref_state(deps.records, src, commit, {"pinned": True, "pinned_at": "2026-12-07T00:00:00+00:00",
                                                  "expires_at": "2999-01-01T00:00:00+00:00", "job_id": job_id}, 10)
        deps.records.put_job(Job(id=job_id, trigger="pin", source_ids=[src.id], ref=commit,
                                 state=JobState.queued))
    good = run_sync(deps, good_job, [src.id], trigger="pin")
    assert good.state.value == "done" and good.errors == [] and first in good.ref_commits, (good.state, good.errors)
    refused = deps.records.get_job(bogus_job)
    assert refused is not None and refused.state.value == "failed", refused
    assert any(f"commit {bogus} is not in the repository" in e for e in refused.errors), refused.errors
    again = run_sync(deps, bogus_job, [src.id], trigger="pin")  # its own turn: ends at once, still failed
    assert again.state.value == "failed" and again.errors == refused.errors

    # one bogus pin alone: its own job is failed, not partial
    lone = f"pin-lone-{uuid.uuid4().hex[:6]}"
    pin_ref_state(deps.records, src, "c" * 40, {"pinned": True, "pinned_at": "2026-12-07T00:00:00+00:00",
                                                "expires_at": "2999-01-01T00:00:00+00:00", "job_id": lone}, 10)
    deps.records.put_job(Job(id=lone, trigger="pin", source_ids=[src.id], ref="c" * 40, state=JobState.queued))
    alone = run_sync(deps, lone, [src.id], trigger="pin")
    assert alone.state.value == "failed" and any("is not in the repository" in e for e in alone.errors), alone
