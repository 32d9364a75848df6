"""What a run measures on: the full profile (~15 minutes here) and the quick smoke profile (~5 minutes)."""

from __future__ import annotations

from dataclasses import dataclass

from scopekb_bench.corpus import Project


@dataclass(frozen=True)
class Profile:
    """Inputs and sample sizes of a run.

    Attributes:
        large: (PyPI name, releases oldest first, folder the one-file edit is made under) of the large repository,
            indexed keyword-only through the pipeline (ingest, git read, incremental).
        eval_projects: projects of the evaluation corpus, indexed with the local model through the pipeline
            (ingest with the model, quality, query latency, re-embedding).
        quality_pairs: docstring→function pairs evaluated (None: all).
        query_n: sequential requests per mode for latency; query_tp_n: requests per mode for requests/s.
        webhook_n: requests per endpoint for webhook latency; embed_texts: texts for the embedder comparison;
        ann_queries: queries for ANN fidelity; embed_block: texts per encode call in the embedder comparison
            (sentence-transformers sorts a call's texts by length, so bigger calls pad less, as in a sync).
        sets_sample: queries per set of the quality-sets phase (:mod:`scopekb_bench.sets`); sets_model: evaluate
            them with the local model (all modes) rather than keyword-only.
        refs: (PyPI name, releases oldest first, folder of the branches' edits) of the many-refs phase
            (:mod:`scopekb_bench.refs`): ``main`` at the newest release, the oldest one pinned; refs_branches: how
            many one-file branches it adds (issue 23 asks for 20 on django 4.2.13).
    """

    name: str
    large: tuple[str, tuple[str, ...], str]
    eval_projects: tuple[Project, ...]
    quality_pairs: int | None
    query_n: int
    query_tp_n: int
    webhook_n: int
    embed_texts: int
    ann_queries: int
    embed_block: int
    sets_sample: int = 150
    sets_model: bool = True
    refs: tuple[str, tuple[str, ...], str] = ("click", ("8.0.4", "8.1.0"), "src/")
    refs_branches: int = 5


REQUESTS = Project("requests", ("2.32.2", "2.32.3"), "src/requests")
CLICK = Project("click", ("8.1.6", "8.1.7"), "src/click")
FLASK = Project("flask", ("3.0.2", "3.0.3"), "src/flask")
ITSDANGEROUS = Project("itsdangerous", ("2.1.1", "2.1.2"), "src/itsdangerous")

FULL = Profile(name="full", large=("django", ("4.2.13", "4.2.14"), "django/"),
               eval_projects=(REQUESTS, CLICK, FLASK, ITSDANGEROUS), quality_pairs=None, query_n=150,
               query_tp_n=200, webhook_n=2000, embed_texts=256, ann_queries=200, embed_block=128,
               refs=("django", tuple(f"4.2.{i}" for i in range(3, 14)), "django/"), refs_branches=20)
QUICK = Profile(name="quick", large=("click", ("8.0.4", "8.1.0"), "src/"), eval_projects=(REQUESTS, ITSDANGEROUS),
                quality_pairs=60, query_n=30, query_tp_n=60, webhook_n=300, embed_texts=64, ann_queries=40,
                embed_block=32, sets_sample=3, sets_model=False)
