"""Retrieval quality on more sets than the docstring corpus (issue 21), with ``scopekb eval``'s own code.

Sets (each mined without labels by :mod:`scopekb.evalsets`, indexed and searched by
:func:`scopekb.evaluation.build_and_search` in this process, on the distributed profile's stores: OpenSearch,
S3, the local model with an embedding cache under ``.services/cache``):

- ``history`` — scopekb's own repository: commit subject (+ the body's first paragraph) → the definitions the commit
  changed, on the parent commit's index;
- ``tuning`` — docstring → function on httpx 0.28.1 and starlette 1.10.0 (released sdists), the set ranking
  choices of issue 21 were made on;
- ``held-aside`` — docstring → function on werkzeug 3.1.9 and jinja2 3.1.6, never used to choose anything: the
  set whose figures say whether a choice generalises;
- ``held-aside-bge`` — the same set with bge-small-en-v1.5, the second local model (``scopekb model fetch``).

The bench's first quality set (requests, click, flask, itsdangerous through the query service) stays in
:mod:`scopekb_bench.quality`. Each figure is a mean over queries with its 95% bootstrap interval; the ratio is
the mode's NDCG@10 ÷ keyword's on the same queries.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scopekb import evaluation
from scopekb.models import Source
from scopekb.realrepo import fetch_sdist, git
from scopekb_bench.corpus import REPO_CACHE, SDISTS
from scopekb_bench.util import REPO, Results, log

EMBED_CACHE = REPO / ".services" / "cache" / "bench-embcache.sqlite3"
#: Where fetched models are kept between runs (``scopekb model fetch``'s folder layout).
MODELS_DIR = REPO / ".services" / "cache" / "models-fetched"


@dataclass(frozen=True)
class QualitySet:
    """One set: ``id``, the kind mined (history or docstring), where the code comes from (``packages``: PyPI name,
    version, package folder in the sdist; none: this repository), whether it is held aside, and a description."""

    id: str
    kind: str
    packages: tuple[tuple[str, str, str], ...]
    held_aside: bool
    about: str
    #: the local model it is evaluated with (all modes) in the full profile: ``default`` (all-MiniLM-L6-v2) or a
    #: name of :data:`scopekb.embedding.catalog.FETCHABLE`; None: keyword-only always (the history set indexes the
    #: repository at every sampled parent commit: about an hour with the local model here)
    model: str | None = "default"


HELD_ASIDE = (("werkzeug", "3.1.9", "src/werkzeug"), ("jinja2", "3.1.6", "src/jinja2"))
SETS = (
    QualitySet("history", "history", (), False, "scopekb's own commits: subject → changed definitions", model=None),
    QualitySet("tuning", "docstring", (("httpx", "0.28.1", "httpx"), ("starlette", "1.10.0", "starlette")),
               False, "httpx + starlette: docstring → function (choices were made on it)", model=None),
    QualitySet("held-aside", "docstring", HELD_ASIDE, True, "werkzeug + jinja2: docstring → function (never tuned on)"),
    QualitySet("held-aside-bge", "docstring", HELD_ASIDE, True,
               "the held-aside set with bge-small-en-v1.5 (SCOPEKB_EMBEDDING__LOCAL_MODEL), not the default model",
               model="bge-small-en-v1.5"),
)
#: Every model some set is evaluated with (``default``: the default local model).
MODELS = tuple(dict.fromkeys(qs.model for qs in SETS if qs.model is not None))


def _package_repo(qs: QualitySet) -> Path:
    """A one-commit repository of the sets' package sources (cached under ``.services/cache/bench-repos``)."""
    key = "set-" + "-".join(f"{n}{v}" for n, v, _ in qs.packages)
    dest = REPO_CACHE / key
    if (dest / ".git").is_dir():
        return dest
    log(f"building {key} from sdists (cached afterwards)")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name, version, folder in qs.packages:
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(fetch_sdist(name, version, SDISTS)) as t:
                t.extractall(tmp, filter="data")
            tops = [p for p in Path(tmp).iterdir() if p.is_dir()]
            root = tops[0] if len(tops) == 1 else Path(tmp)
            for f in sorted((root / folder).rglob("*.py")):
                out = dest / name / f.relative_to(root / folder)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, out)
    git(dest, "init", "--quiet", "--initial-branch", "main")
    git(dest, "add", "--all", "--force")
    git(dest, "commit", "--quiet", "-m", "sources of " + ", ".join(f"{n} {v}" for n, v, _ in qs.packages))
    return dest


def _self_repo(workdir: Path) -> Path:
    """A clone of this repository (its history is the history set)."""
    dest = workdir / "self-history"
    if not dest.exists():
        subprocess.run(["git", "clone", "--quiet", "--no-local", str(REPO), str(dest)], check=True)
        git(dest, "checkout", "--quiet", "-B", "main")
    return dest


def evaluate_sets(res: Results, runtimes: dict[str | None, Any], workdir: Path, sample: int) -> dict[str, Any]:
    """Evaluate every set of :data:`SETS` (at most ``sample`` queries each) with ``runtimes[qs.model]`` (a local
    model) when that runtime is given, else ``runtimes[None]`` (keyword-only); a set of a fetched model without its
    runtime (the keyword-only quick profile) is skipped, its keyword figures being those of the set it repeats; record
    ``sets.<id>.<mode>.<metric>`` metrics (value: the mode's mean; baseline: keyword's). Returns the reports."""
    reports: dict[str, Any] = {}
    for qs in SETS:
        if qs.model is not None and qs.model != "default" and qs.model not in runtimes:
            continue  # keyword-only profile: the held-aside keyword figures are the default model's set's
        rt = runtimes.get(qs.model) or runtimes[None]
        repo = _self_repo(workdir) if not qs.packages else _package_repo(qs)
        src = Source(agent_name="bench", context_id=qs.id, repo_url=str(repo), ref="main", webhooks=False,
                     id=Source.new_id())
        head, sets = evaluation.build_and_search(rt, src, sample=sample, kinds=(qs.kind,))
        model = rt.embedder.model_id if rt.embedder is not None else None
        rep = evaluation.report(src, head, sets, store=rt.chunks.kind, model=model)
        s = rep["sets"].get(qs.kind)
        if s is None:
            raise RuntimeError(f"set {qs.id}: no query could be mined")
        reports[qs.id] = {"about": qs.about, "held_aside": qs.held_aside, "kind": qs.kind, **s}
        kw = s["modes"]["keyword"]
        for mode, met in s["modes"].items():
            for metric, name in (("ndcg10", "NDCG@10"), ("mrr10", "MRR@10"), ("hit1", "Hit@1"), ("hit10", "Hit@10")):
                lo, hi = met[metric]["ci95"]
                res.add("quality sets", f"sets.{qs.id}.{mode}.{metric}",
                        f"{qs.id} ({qs.kind}, {s['queries']} queries): {mode} {name}", met[metric]["mean"],
                        kw[metric]["mean"], "score", "keyword on the same queries",
                        note=f"95% CI {lo:.3f} … {hi:.3f}")
        log(f"set {qs.id}: " + ", ".join(f"{m} {v['ndcg10']['mean']:.3f}" for m, v in s["modes"].items()))
    return reports
