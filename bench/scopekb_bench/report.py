"""The run's Markdown report with PNG plots (matplotlib), the summary table on the terminal (rich), publishing."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

GROUP_ORDER = ["ingest", "git", "incremental", "refs", "embedder", "query", "cost", "webhook", "embedded", "quality"]
QUALITY_MODES = ["keyword", "vector", "hybrid", "rrf"]


def fmt(x: float) -> str:
    """A number with sensible precision for a table."""
    if x is None or not isinstance(x, int | float) or not math.isfinite(x):
        return "n/a"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _sorted(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(metrics, key=lambda m: (GROUP_ORDER.index(m["group"]) if m["group"] in GROUP_ORDER else 99,))


def standard_notes(profile: Any) -> list[str]:
    """What every report says about how it was measured and which subsets were used."""
    notes = [
        "Every figure is a ratio against a baseline measured in the same run on the same machine; absolute numbers "
        "depend on the machine and on whatever else runs on it, ratios much less so.",
        "Pipeline = the real processes: signed GitHub push webhook → ingester → Redis/Celery → worker (git mirror, "
        "S3 blobs, chunking, embedding, bulk write, stale-chunk delete, refresh) → query service. Time runs from "
        "the webhook POST until a search through the query service finds the change.",
        "The large repository is indexed keyword-only. With the local model (all-MiniLM-L6-v2 on CPU) its tens of "
        "thousands of chunks would take about an hour on this machine, so the local-model pipeline, re-embedding, "
        "quality and query figures use the evaluation corpus (the package sources of the evaluation projects, "
        "docstrings removed).",
        "Retrieval quality follows CodeSearchNet: functions and methods with a docstring; query = the docstring's "
        "first paragraph; the indexed code has every docstring removed; pairs with fewer than three query words, "
        "functions shorter than three lines, test functions, dunder methods, and duplicate queries or duplicate "
        "function bodies are dropped. Relevant = the hit's lines overlap the function in its file; only the "
        "best-ranked relevant hit counts. RRF (k = 60) fuses the service's keyword and vector lists (40 deep, the "
        "depth hybrid uses) in the benchmark, since the search API has no RRF mode.",
        "Re-embedded ÷ changed: re-embedded = the job's embeddings_computed; changed = distinct embedding inputs "
        "(chunk content plus its path/symbol header, the embedding cache's key) of the new tree that the old tree "
        "did not have, computed from both whole trees by a reference path in the benchmark (git ls-tree + "
        "cat-file, chunk, embedding text) that shares none of the pipeline's diff, plan or cache. Chunks written "
        "÷ changed (keyword-only) counts distinct new chunk contents of the changed files.",
    ]
    notes.append("Services run as `scopekb serve` starts them (one uvicorn worker each) and the worker with "
                 "concurrency 1; the query and webhook load generators (asyncio + httpx) run in the benchmark process "
                 "on the same machine, so requests/s figures are bounded by the shared CPUs on both sides.")
    notes.append("Memory, on both sides the same way: the peak of the summed proportional set size (PSS) of the "
                 "process tree, sampled every 0.2 s over the measured window (the worker's processes from the "
                 "webhook POST to searchable; the helpers.bulk process, which streams the documents from a file, "
                 "from its start to its exit). CPU is user + system time of the worker's processes plus OpenSearch's "
                 "process CPU (node stats) over the same window.")
    if profile.name == "quick":
        notes.append("QUICK profile: a small 'large' repository (click), two small evaluation projects, sampled "
                     "queries and fewer requests: a smoke run, not numbers to quote.")
    return notes


# ---- plots -------------------------------------------------------------------------------------------------

def _plots(out: Path, data: dict[str, Any]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[tuple[str, str]] = []
    metrics = [m for m in _sorted(data["metrics"]) if m["group"] != "quality" and math.isfinite(m["ratio"])
               and m["ratio"] > 0]
    if metrics:
        fig, ax = plt.subplots(figsize=(10, 0.34 * len(metrics) + 1.2))
        colors = {"higher": "#2b8cbe", "lower": "#e6550d"}
        ax.barh(range(len(metrics)), [m["ratio"] for m in metrics], color=[colors[m["better"]] for m in metrics])
        ax.set_yticks(range(len(metrics)), [m["id"] for m in metrics], fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", linewidth=0.8)
        for i, m in enumerate(metrics):
            ax.text(m["ratio"], i, f" {fmt(m['ratio'])}", va="center", fontsize=7)
        ax.set_xlabel("ratio scopekb ÷ baseline (log scale); blue: higher is better, orange: lower is better")
        ax.set_title("Every figure against its baseline, same run")
        fig.tight_layout()
        fig.savefig(out / "ratios.png", dpi=110)
        plt.close(fig)
        made.append(("ratios.png", "All ratios"))

    q = data["series"].get("quality")
    if q:
        names = [("ndcg10", "NDCG@10"), ("mrr10", "MRR@10"), ("recall1", "recall@1"), ("recall10", "recall@10")]
        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.2
        for j, mode in enumerate(QUALITY_MODES):
            vals = [q["modes"][mode][k] for k, _ in names]
            ax.bar([i + (j - 1.5) * width for i in range(len(names))], vals, width, label=mode)
        ax.set_xticks(range(len(names)), [n for _, n in names])
        ax.set_ylim(0, 1)
        ax.legend()
        ax.set_title(f"Docstring → function retrieval, {q['n']} queries")
        fig.tight_layout()
        fig.savefig(out / "quality.png", dpi=110)
        plt.close(fig)
        made.append(("quality.png", "Retrieval quality per mode"))

    ql = data["series"].get("query")
    if ql:
        s = ql["latency_summary"]
        modes = list(s)
        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.2
        for j, (side, p) in enumerate([("service", "p50"), ("raw", "p50"), ("service", "p95"), ("raw", "p95")]):
            ax.bar([i + (j - 1.5) * width for i in range(len(modes))], [s[m][side][p] * 1000 for m in modes], width,
                   label=f"{side} {p}")
        ax.set_xticks(range(len(modes)), modes)
        ax.set_ylabel("ms")
        ax.legend()
        ax.set_title("Query service vs the raw OpenSearch queries it issues")
        fig.tight_layout()
        fig.savefig(out / "query_latency.png", dpi=110)
        plt.close(fig)
        made.append(("query_latency.png", "Query latency per mode"))

    w = data["series"].get("webhook")
    if w:
        fig, ax = plt.subplots(figsize=(8, 4))
        for name in ("scopekb", "bare"):
            xs = sorted(x * 1000 for x in w[name]["latencies"])
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{name} ({fmt(w[name]['rps'])} req/s)")
        ax.set_xscale("log")
        ax.set_xlabel("latency, ms (log scale)")
        ax.set_ylabel("fraction of requests")
        ax.legend()
        ax.set_title(f"Push webhook latency, {w['concurrency']} in flight")
        fig.tight_layout()
        fig.savefig(out / "webhook.png", dpi=110)
        plt.close(fig)
        made.append(("webhook.png", "Webhook latency distribution"))

    ing = [(k, data["series"][f"ingest_{k}"]) for k in ("keyword", "local_model") if f"ingest_{k}" in data["series"]]
    if ing:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [k for k, _ in ing]
        pipe = [v["chunks"] / v["pipeline_seconds"] for _, v in ing]
        base = [v["baseline"]["documents"] / v["baseline"]["seconds"] for _, v in ing]
        ax.bar([i - 0.2 for i in range(len(ing))], pipe, 0.4, label="pipeline, webhook to searchable")
        ax.bar([i + 0.2 for i in range(len(ing))], base, 0.4, label="helpers.bulk of the same chunks")
        ax.set_xticks(range(len(ing)), labels)
        ax.set_ylabel("chunks/s")
        ax.set_yscale("log")
        ax.legend()
        ax.set_title("Ingest throughput")
        fig.tight_layout()
        fig.savefig(out / "ingest.png", dpi=110)
        plt.close(fig)
        made.append(("ingest.png", "Ingest throughput"))
    return made


# ---- Markdown ----------------------------------------------------------------------------------------------

def summary_rows(data: dict[str, Any]) -> list[list[str]]:
    """Rows of the summary table: group, metric, scopekb, baseline, unit, ratio, target."""
    rows = []
    for m in _sorted(data["metrics"]):
        rows.append([m["group"], m["label"], fmt(m["value"]), fmt(m["baseline"]), m["unit"], fmt(m["ratio"]),
                     m["target"] or ("↑" if m["better"] == "higher" else "↓")])
    return rows


def markdown(data: dict[str, Any], plots: list[tuple[str, str]]) -> str:
    """The whole report as Markdown."""
    meta, inp = data["meta"], data["inputs"]
    mach = meta["machine"]
    lines = [f"# scopekb benchmark report ({meta['profile']})", "",
             f"Run `{meta['run_id']}`, {meta['started']} → {meta.get('finished', '')}, {meta.get('seconds', 0):.0f} s. "
             f"scopekb commit `{mach.get('scopekb_commit', '')}`.", "",
             f"Machine: {mach['cpu']}, {mach['logical_cpus']} logical CPUs, {mach['memory_gb']} GB RAM, "
             f"{mach['os']}, Python {mach['python']}, OpenSearch {meta.get('opensearch', '?')}. Load average "
             f"{mach['load_average_at_start']} at start, {meta.get('load_average_at_end')} at end (the machine is "
             "shared).", ""]
    if "large" in inp:
        lg = inp["large"]
        lines += [f"Inputs: large repository **{lg['package']}** releases {' → '.join(lg['releases'])} (PyPI "
                  f"sdists, one commit each): {lg['files']:,} files, {lg['text_bytes'] / 2**20:.1f} MiB of text "
                  f"indexed; one-file edit in `{lg['edit']['path']}` (`{lg['edit']['function']}`)."]
    if "eval" in inp:
        ev = inp["eval"]
        projs = ", ".join(f"{p['project']} {p['version']} ({p['files']} files, {p['pairs']} pairs)"
                          for p in ev["projects"])
        lines += ["", f"Evaluation corpus (docstrings removed): {projs}; releases {'; '.join(ev['releases'])}; "
                  f"{ev['pairs']} docstring→function pairs."]
    lines += ["", "## Summary", "", "Every figure next to a baseline measured in the same run; ratio = scopekb ÷ "
              "baseline (↑: higher is better, ↓: lower is better).", "",
              "| group | metric | scopekb | baseline | unit | ratio | target |", "|---|---|---:|---:|---|---:|---|"]
    for r in summary_rows(data):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    lines += ["", "### Baselines", ""]
    seen = set()
    for m in _sorted(data["metrics"]):
        if (m["group"], m["baseline_label"]) not in seen:
            seen.add((m["group"], m["baseline_label"]))
            lines.append(f"- **{m['group']}**: {m['baseline_label']}")
    notes = [m for m in _sorted(data["metrics"]) if m["note"]]
    if notes:
        lines += ["", "### Details", ""] + [f"- `{m['id']}`: {m['note']}" for m in notes]
    q = data["series"].get("quality")
    if q:
        lines += ["", "## Retrieval quality", "", f"{q['n']} docstring→function queries.", "",
                  "| mode | NDCG@10 | MRR@10 | recall@1 | recall@10 | ΔNDCG@10 vs keyword (95% CI) |",
                  "|---|---:|---:|---:|---:|---|"]
        for mode in QUALITY_MODES:
            m = q["modes"][mode]
            d = m.get("ndcg10_minus_keyword")
            delta = f"{d['mean']:+.3f} ({d['ci95'][0]:+.3f} … {d['ci95'][1]:+.3f})" if d else ""
            lines.append(f"| {mode} | {m['ndcg10']:.3f} | {m['mrr10']:.3f} | {m['recall1']:.3f} | "
                         f"{m['recall10']:.3f} | {delta} |")
        hyb, kw = q["modes"]["hybrid"]["ndcg10"], q["modes"]["keyword"]["ndcg10"]
        lines += ["", f"Hybrid {'beats' if hyb > kw else 'does NOT beat'} keyword on NDCG@10 ({hyb:.3f} vs {kw:.3f})."]
        lines += ["", "| project | queries | " + " | ".join(f"{m} NDCG@10" for m in QUALITY_MODES) + " |",
                  "|---|---:|" + "---:|" * len(QUALITY_MODES)]
        for proj, v in q["projects"].items():
            lines.append(f"| {proj} | {v['n']} | " + " | ".join(f"{v[m]['ndcg10']:.3f}" for m in QUALITY_MODES) + " |")
    conc = {k: v for k, v in (("distributed query service", data["series"].get("concurrency_distributed")),
                              ("embedded (scopekb up)", data["series"].get("concurrency_embedded"))) if v}
    if conc:
        lines += ["", "## Concurrent searches", "", "Requests in flight through `POST /v1/search` (asyncio + httpx, "
                  "one connection each); latency per request, requests/s over the level's wall time.", "",
                  "| profile | mode | in flight | requests/s | p50 ms | p95 ms | non-200 |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for name, t in conc.items():
            for mode, rows in t.items():
                lines += [f"| {name} | {mode} | {r['in_flight']} | {r['rps']:.1f} | {r['p50'] * 1000:.1f} | "
                          f"{r['p95'] * 1000:.1f} | {r['non_200']} |" for r in rows]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{title}]({name})" for name, title in plots]
    lines += ["", "## How it was measured", ""] + [f"- {n}" for n in data["notes"]]
    if data["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in data["errors"]]
    lines += ["", "## Phase timings", "", "| phase | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in data["phase_seconds"].items()]
    lines += ["", "Reproduce: `scripts/services up && bench/run" + (" --quick" if meta["profile"] == "quick" else "")
              + "` (see docs/benchmarks.md).", ""]
    return "\n".join(lines)


def write(out: Path, data: dict[str, Any]) -> None:
    """Plots and report.md in ``out`` (a plotting failure still leaves the report)."""
    try:
        plots = _plots(out, data)
    except Exception as e:  # noqa: BLE001 - the numbers matter more than the pictures
        data["errors"].append(f"plots: {type(e).__name__}: {e}")
        plots = []
    (out / "report.md").write_text(markdown(data, plots))


def print_summary(data: dict[str, Any]) -> None:
    """The summary table on the terminal."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"scopekb benchmarks ({data['meta']['profile']}): scopekb ÷ baseline, same run", show_lines=False)
    for col, just in (("group", "left"), ("metric", "left"), ("scopekb", "right"), ("baseline", "right"),
                      ("unit", "left"), ("ratio", "right"), ("target", "left")):
        t.add_column(col, justify=just, overflow="fold")
    for r in summary_rows(data):
        t.add_row(*r)
    console = Console(width=160)
    console.print(t)
    for e in data["errors"]:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)


def publish_sets(dest: Path, data: dict[str, Any]) -> None:
    """Merge a ``--phases sets`` run into the committed ``dest/results.json``: its ``sets.*`` metrics, the
    ``quality_sets`` series and its meta (as ``meta.sets_run``) replace those of the committed run; everything
    else (the full run's figures) is kept as it was."""
    path = dest / "results.json"
    committed = json.loads(path.read_text(encoding="utf-8"))
    committed["metrics"] = [m for m in committed["metrics"] if not m["id"].startswith("sets.")] + [
        m for m in json.loads(json.dumps(data["metrics"], default=str)) if m["id"].startswith("sets.")]
    committed.setdefault("series", {})["quality_sets"] = data["series"].get("quality_sets")
    committed["meta"]["sets_run"] = json.loads(json.dumps(data["meta"], default=str))
    path.write_text(json.dumps(committed, indent=1) + "\n")


def publish(out: Path, dest: Path, data: dict[str, Any]) -> None:
    """Copy report.md and the plots to ``dest`` (replacing the committed run's report.md, results.json and
    plots; a plot this run did not make is removed), with results.json minus the raw per-request latencies and
    per-query scores (they stay in bench/results/). Other files there (the reports of single issues,
    ``issue*``, and folders) are kept: a full run used to delete them."""
    dest.mkdir(parents=True, exist_ok=True)
    made = {p.name for p in out.iterdir() if p.suffix in (".md", ".png")}
    for old in dest.glob("*.png"):
        if old.name not in made:
            old.unlink()
    for p in out.iterdir():
        if p.suffix in (".md", ".png"):
            shutil.copy2(p, dest / p.name)
    slim = json.loads(json.dumps(data, default=str))
    series = slim.get("series", {})
    series.pop("quality_per_query_ndcg10", None)
    series.get("query", {}).pop("latencies", None)
    for side in ("scopekb", "bare"):
        series.get("webhook", {}).get(side, {}).pop("latencies", None)
    (dest / "results.json").write_text(json.dumps(slim, indent=1) + "\n")
