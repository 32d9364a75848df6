"""``scopekb eval``: retrieval quality of one git source measured on sets mined from the repository itself.

The sets are those of :mod:`scopekb.evalsets` (history and docstring). Each is indexed by the ordinary sync
(:func:`scopekb.indexing.run_sync`, in this process, with the runtime's stores and embedder) into a transient
source under a private agent ``scopekb-eval-<id>``, so no agent ever sees it and the source's own index is never
touched; it is removed at the end, also after a failure.

- history: the transient source is pointed at each selected commit's parent in turn, oldest first, and synced
  (incrementally: nearby commits differ by a few files, and the embedding cache makes unchanged chunks free);
  the commits of one parent are queried right after that sync.
- docstring: the Python files of the source's commit with every docstring removed are committed to a temporary
  local repository, which the transient source indexes once.

Every query is searched with ``run_search`` by keyword and by vector at the hybrid candidate depth (the
``query.candidate_factor`` × 10 lists the service fuses); hybrid (weighted) and RRF are fused from the same two
lists with :mod:`scopekb.scoring`, exactly as :func:`scopekb.search.run_search` does (min-max is invariant to the
by-maximum normalisation of the keyword list). That also lets :mod:`scopekb.tuning` try other weights without
searching again.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scopekb import evalsets, overlays, scoring
from scopekb import fields as F
from scopekb.errors import Refused
from scopekb.evalsets import EvalQuery, Target
from scopekb.gitrepo import Mirror
from scopekb.logging import get_logger
from scopekb.models import SearchMode, SearchRequest, Source
from scopekb.realrepo import git
from scopekb.rerank import hit_text
from scopekb.runtime import Runtime
from scopekb.search import run_search
from scopekb.settings import git_cache_dir
from scopekb.stores.base import ScopeFilter, SearchFilter

log = get_logger(__name__)

KINDS = ("history", "docstring")
#: Modes reported; ``vector``, ``hybrid`` and ``rrf`` need an embedding model.
MODES = ("keyword", "vector", "hybrid", "rrf")
#: Evaluation runs only under agents with this prefix (never an agent's own scope).
EVAL_AGENT_PREFIX = "scopekb-eval-"
#: At most this many commits are read from the history (newest first) to find the sample.
SCAN_COMMITS = 3000

Progress = Callable[[str, int, int], None]


class EvalRefused(Refused, ValueError):
    """The source cannot be evaluated (an object-store source, no commit yet, nothing to build a set from)."""


@dataclass
class Lists:
    """The keyword and vector lists of one query (``(id, score)`` best first) and the hits by id."""

    keyword: list[tuple[str, float]] = field(default_factory=list)
    vector: list[tuple[str, float]] = field(default_factory=list)
    hits: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: keyword lists with other field boosts (:data:`scopekb.tuning.BOOST_CANDIDATES`), when asked for
    keyword_by_boosts: dict[tuple[float, ...], list[tuple[str, float]]] = field(default_factory=dict)


@dataclass
class EvalSet:
    """One evaluated set: its queries and the lists each query got."""

    kind: str
    queries: list[EvalQuery]
    lists: list[Lists]


def ranked(lists: Lists, mode: str, keyword_weight: float = 0.3, vector_weight: float = 0.7,
           k: int = 10) -> list[dict[str, Any]]:
    """The top ``k`` hits of ``mode`` (keyword, vector, hybrid, rrf) fused from one query's two lists."""
    if mode == "keyword":
        ids = [i for i, _ in lists.keyword]
    elif mode == "vector":
        ids = [i for i, _ in lists.vector]
    elif mode == "rrf":
        ids = [i for i, _ in scoring.rrf_fusion(lists.keyword, lists.vector)]
    else:
        ids = [i for i, _ in scoring.weighted_fusion(lists.keyword, lists.vector, keyword_weight, vector_weight)]
    return [lists.hits[i] for i in ids[:k]]


def per_query(es: EvalSet, mode: str, keyword_weight: float = 0.3,
              vector_weight: float = 0.7) -> list[dict[str, float]]:
    """Per-query metrics (:func:`scopekb.evalsets.rank_metrics`) of ``mode`` over a set."""
    return [evalsets.rank_metrics(ranked(ls, mode, keyword_weight, vector_weight), q.targets)
            for q, ls in zip(es.queries, es.lists, strict=True)]


def _search_lists(rt: Runtime, scope: ScopeFilter, query: str, depth: int,
                  boosts: tuple[tuple[float, ...], ...] = ()) -> Lists:
    out = Lists()
    with_text = rt.settings.query.rerank != "off"
    for b in boosts:
        lst = []
        for _id, score, doc in rt.chunks.keyword_search(query[:4096], SearchFilter(scope=scope), depth, boosts=b):
            hid = f"{doc[F.PATH]}#{doc[F.CHUNK_INDEX]}"
            out.hits.setdefault(hid, {"path": doc[F.PATH], "start_line": doc[F.START_LINE],
                                      "end_line": doc[F.END_LINE]})
            lst.append((hid, score))
        out.keyword_by_boosts[tuple(b)] = lst
    modes = [SearchMode.keyword] + ([SearchMode.vector] if rt.embedder is not None else [])
    for mode in modes:
        req = SearchRequest(query=query[:4096], mode=mode, max_results=depth)
        resp = run_search(rt.chunks, req, scope, rt.settings.query.model_copy(update={"max_results_cap": depth}),
                          embed=rt.embed_query if rt.embedder is not None else None)
        lst = []
        for h in resp.hits:
            hid = f"{h.path}#{h.chunk_index}"
            out.hits[hid] = {"path": h.path, "start_line": h.start_line, "end_line": h.end_line}
            if with_text:  # for choose_rerank
                out.hits[hid]["text"] = hit_text(h.path, h.symbol, h.content)
            lst.append((hid, h.score))
        setattr(out, mode.value, lst)
    return out


def _commits(mirror: Mirror, head: str, scan: int) -> list[evalsets.CommitInfo]:
    raw = mirror.repo.git.log("--first-parent", f"-n{scan}", "--format=%H%x1f%P%x1f%s%x1f%b%x1e", head)
    out = []
    for rec in raw.split("\x1e"):
        parts = rec.strip("\n").split("\x1f")
        if len(parts) < 4:
            continue
        sha, parents, subject, body = parts[0].strip(), parts[1].split(), parts[2], parts[3]
        out.append(evalsets.CommitInfo(sha=sha, parent=parents[0] if parents else None, subject=subject,
                                       body=body, merge=len(parents) > 1))
    return out


def history_queries(mirror: Mirror, head: str, n: int, scan: int = SCAN_COMMITS) -> list[EvalQuery]:
    """Up to ``n`` history queries from the newest qualifying commits reachable from ``head`` (first parents)."""
    g = mirror.repo.git

    def show(commit: str, path: str) -> str | None:
        try:
            return str(g.show(f"{commit}:{path}"))
        except Exception:  # noqa: BLE001 - an unreadable blob disqualifies the commit
            return None

    out: list[EvalQuery] = []
    for c in _commits(mirror, head, scan):
        if c.merge or not c.parent:
            continue
        try:
            diff = str(g.diff("-U0", "--no-color", "--no-ext-diff", "--no-renames", c.parent, c.sha))
        except Exception:  # noqa: BLE001 - e.g. a shallow history
            continue
        q = evalsets.history_query(c, diff, show)
        if q is not None:
            out.append(q)
            if len(out) >= n:
                break
    return out


def _no_history_reason(mirror: Mirror, head: str) -> str:
    """Why :func:`history_queries` found nothing from ``head``, in one line."""
    commits = _commits(mirror, head, SCAN_COMMITS)
    with_parent = [c for c in commits if c.parent and not c.merge]
    if not with_parent:
        return (f"the ref has {len(commits)} commit(s) and none with one parent: a history query is a commit "
                "subject and the definitions it changed from its parent")
    return (f"none of the {len(with_parent)} newest non-merge commits qualifies: a subject of at least "
            f"{evalsets.MIN_QUERY_WORDS} words that is not release noise, 1-{evalsets.MAX_TARGETS} definitions or "
            "files changed, no test file")


def _transient_source(rt: Runtime, agent: str, context: str, url: str, ref: str) -> Source:
    src = Source(agent_name=agent, context_id=context, repo_url=url, ref=ref, repo_name=f"eval {context}",
                 webhooks=False, id=Source.new_id())
    rt.records.put_source(src)
    return src


def _sync(rt: Runtime, src: Source, allow_local: bool) -> None:
    from scopekb.indexing import run_sync

    deps = rt.sync_deps()
    if allow_local and not deps.settings.git.allow_local_paths:
        s = deps.settings
        deps.settings = s.model_copy(update={"git": s.git.model_copy(update={"allow_local_paths": True})})
    job = run_sync(deps, "eval-" + uuid.uuid4().hex[:16], [src.id], trigger="eval")
    if job.state.value == "failed":
        raise EvalRefused(f"indexing for the evaluation failed: {'; '.join(job.errors[:3])}")


def _remove(rt: Runtime, src: Source) -> None:
    try:
        rt.chunks.delete_source(src.id)
        rt.records.delete("state", src.id)
        rt.records.delete(overlays.KIND, src.id)
        rt.records.delete("sources", src.id)
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the first error
        log.warning("eval_cleanup_failed", source_id=src.id, error=str(e))


def build_and_search(rt: Runtime, source: Source, sample: int = 100, kinds: tuple[str, ...] = KINDS,
                     progress: Progress | None = None, seed: int = 11,
                     boosts: tuple[tuple[float, ...], ...] = (), empty: dict[str, str] | None = None
                     ) -> tuple[str, list[EvalSet]]:
    """Mine the sets of ``source`` at its ref's head, index them transiently and search every query.

    Returns ``(head commit, sets)``; a kind with no qualifying query is left out, and ``empty`` (when given)
    receives why, per kind (README newcomer run: ``--set history`` on a one-commit repository said nothing).
    ``boosts``: keyword field boost candidates each query is also searched with (``Lists.keyword_by_boosts``,
    for ``--tune``).

    Raises:
        EvalRefused: not a git source, its ref does not resolve, or ``sample`` < 1.
        scopekb.gitrepo.GitError: the repository cannot be fetched.
    """
    if source.kind != "git":
        raise EvalRefused("scopekb eval needs a git source (an object-store source has no history)")
    if sample < 1:
        raise EvalRefused("the sample size must be at least 1")
    s = rt.settings
    rt.chunks.ensure_index()
    mirror = Mirror(git_cache_dir(s), source.repo_url, allow_local=s.git.allow_local_paths,
                    timeout_s=s.git.fetch_timeout_s)
    agent = EVAL_AGENT_PREFIX + uuid.uuid4().hex[:10]
    depth = max(10 * s.query.candidate_factor, 10)
    made: list[Source] = []
    tmp = Path(tempfile.mkdtemp(prefix="scopekb-eval-"))
    sets: list[EvalSet] = []
    try:
        mirror.fetch()
        head = mirror.resolve(source.ref)
        if head is None:
            raise EvalRefused(f"ref {source.ref!r} not found in the repository")
        if "history" in kinds:
            qs = history_queries(mirror, head, sample)
            if not qs and empty is not None:
                empty["history"] = _no_history_reason(mirror, head)
            if qs:
                src = _transient_source(rt, agent, "history", source.repo_url, qs[0].at or head)
                made.append(src)
                order = list(dict.fromkeys(q.at for q in reversed(qs)))  # parents, oldest first
                lists: dict[int, Lists] = {}
                for n, parent in enumerate(order):
                    src = src.model_copy(update={"ref": parent})
                    rt.records.put_source(src)
                    _sync(rt, src, allow_local=False)
                    for i, q in enumerate(qs):
                        if q.at == parent:
                            lists[i] = _search_lists(rt, ScopeFilter(agent, ("history",)), q.query, depth, boosts)
                    if progress:
                        progress("history", n + 1, len(order))
                sets.append(EvalSet("history", qs, [lists[i] for i in range(len(qs))]))
        if "docstring" in kinds:
            files = []
            for entry in mirror.tree(head):
                if entry.path.endswith(".py") and entry.size is not None and entry.size <= 1024 * 1024:
                    files.append((entry.path, mirror.read_blob(entry.sha).decode("utf-8", errors="replace")))
            stripped, all_qs = evalsets.docstring_set(files)
            qs = evalsets.sample(all_qs, sample, seed)
            if not qs and empty is not None:
                rule = (f"a query comes from a function of 3 or more lines, not a test or dunder method, whose "
                        f"docstring's first paragraph has {evalsets.MIN_QUERY_WORDS} or more words")
                empty["docstring"] = (f"no documented Python function at {head[:12]} ({len(files)} Python file(s) "
                                      f"read): {rule}")
            if qs:
                repo = tmp / "docstring"
                for path, text in stripped.items():
                    f = repo / path
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text(text, encoding="utf-8")
                git(repo, "init", "--quiet", "--initial-branch", "main")
                git(repo, "add", "--all", "--force")
                git(repo, "commit", "--quiet", "-m", "docstrings removed")
                src = _transient_source(rt, agent, "docstring", str(repo), "main")
                made.append(src)
                _sync(rt, src, allow_local=True)
                dl = []
                for n, q in enumerate(qs):
                    dl.append(_search_lists(rt, ScopeFilter(agent, ("docstring",)), q.query, depth, boosts))
                    if progress and (n % 10 == 9 or n == len(qs) - 1):
                        progress("docstring", n + 1, len(qs))
                sets.append(EvalSet("docstring", qs, dl))
    finally:
        mirror.close()
        for src in made:
            _remove(rt, src)
        shutil.rmtree(tmp, ignore_errors=True)
    return head, sets


def report(source: Source, head: str, sets: list[EvalSet], store: str, model: str | None) -> dict[str, Any]:
    """The JSON report: per set and mode, each metric's mean with its 95% bootstrap interval.

    ``store`` is the chunk store's kind (``sqlite``: the embedded profile, ``opensearch``: distributed). Shape:
    ``{"source", "scope", "commit", "store", "model", "sets": {kind: {"queries": n, "modes": {mode:
    {metric: {"mean", "ci95": [low, high]}}}}}}``; modes needing a model are absent in keyword-only mode.
    """
    modes = MODES if model else ("keyword",)
    out: dict[str, Any] = {"source": source.id, "scope": f"{source.agent_name}/{source.context_id}",
                           "commit": head, "store": store, "model": model,
                           "sets": {}}
    for es in sets:
        out["sets"][es.kind] = {"queries": len(es.queries),
                                "modes": {m: evalsets.summarise(per_query(es, m)) for m in modes}}
    return out


__all__ = ["KINDS", "MODES", "EvalRefused", "EvalSet", "Lists", "Target", "build_and_search", "history_queries",
           "per_query", "ranked", "report"]
