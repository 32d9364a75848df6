"""The tables of ``docs/benchmarks.md``, generated from the committed run in ``bench/report/results.json``.

The document's figures live only between markers::

    <!-- generated: NAME (bench/run --docs; do not edit) -->
    ...
    <!-- end generated: NAME -->

``bench/run --docs`` rewrites those sections from ``bench/report/results.json`` (``bench/run --publish`` does it
after a run), and ``tests/unit/test_bench.py`` fails when the document and the committed results disagree, so the
document cannot quote a run that is not committed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from scopekb_bench.report import GROUP_ORDER, QUALITY_MODES, fmt

SECTIONS = ("run", "quality", "sets", "performance")
_BLOCK = re.compile(r"(<!-- generated: (\w+) \(bench/run --docs; do not edit\) -->\n)(.*?)(<!-- end generated: \2 -->)",
                    re.S)


def _run(data: dict[str, Any]) -> str:
    meta, mach = data["meta"], data["meta"]["machine"]
    la0, la1 = mach.get("load_average_at_start") or [0], meta.get("load_average_at_end") or [0]
    return (f"{meta['profile'].capitalize()} run `{meta['run_id']}` of {meta['started']} (scopekb "
            f"`{mach.get('scopekb_commit', '')}`), {meta.get('seconds', 0):.0f} s. Machine: {mach['cpu']} "
            f"({mach['logical_cpus']} logical CPUs, {mach['memory_gb']} GB RAM), {mach['os']}, Python "
            f"{mach['python']}; OpenSearch {meta.get('opensearch', '?')}; all services on the same machine, shared "
            f"with other work (load average {la0[0]} at start, {la1[0]} at end). Its `results.json`, report and "
            "plots are committed in [bench/report/](../bench/report/report.md)."
            + _inputs(data)
            + (f" Errors in this run: {'; '.join(data['errors'])}." if data.get("errors") else ""))


def _inputs(data: dict[str, Any]) -> str:
    inp, series, out = data.get("inputs", {}), data.get("series", {}), ""
    if "large" in inp:
        lg, n = inp["large"], series.get("ingest_keyword", {}).get("chunks")
        out += (f" Large repository {lg['package']} {' → '.join(lg['releases'])}: {lg['files']:,} files, "
                f"{lg['text_bytes'] / 2**20:.1f} MiB of text indexed" + (f", {n:,} chunks." if n else "."))
    if "eval" in inp:
        ev, n = inp["eval"], series.get("ingest_local_model", {}).get("chunks")
        out += (f" Evaluation corpus: {ev['files']:,} files, {ev['pairs']} docstring→function pairs"
                + (f", {n:,} chunks." if n else "."))
    return out


def _quality(data: dict[str, Any]) -> str:
    q = data["series"].get("quality")
    if not q:
        return "No quality figures in this run."
    lines = [f"{q['n']} queries over {len(q['projects'])} projects.", "",
             "| mode | NDCG@10 | MRR@10 | recall@1 | recall@10 | ΔNDCG@10 vs keyword (95% bootstrap CI) |",
             "|---|---:|---:|---:|---:|---|"]
    for mode in QUALITY_MODES:
        m = q["modes"][mode]
        d = m.get("ndcg10_minus_keyword")
        delta = f"{d['mean']:+.3f} ({d['ci95'][0]:+.3f} … {d['ci95'][1]:+.3f})" if d else ""
        lines.append(f"| {mode} | {m['ndcg10']:.3f} | {m['mrr10']:.3f} | {m['recall1']:.3f} | {m['recall10']:.3f} "
                     f"| {delta} |")
    lines += ["", "| project | queries | " + " | ".join(f"{m} NDCG@10" for m in QUALITY_MODES) + " |",
              "|---|---:|" + "---:|" * len(QUALITY_MODES)]
    for proj, v in q["projects"].items():
        lines.append(f"| {proj} | {v['n']} | " + " | ".join(f"{v[m]['ndcg10']:.3f}" for m in QUALITY_MODES) + " |")
    ann = data["series"].get("ann")
    if ann:
        lines += ["", f"ANN fidelity: recall@10 of the k-NN (HNSW) query against exact search {ann['recall_at_k']:.3f} "
                      f"({ann['queries']} queries, {ann['vectors']} vectors)."]
    return "\n".join(lines)


def _performance(data: dict[str, Any]) -> str:
    lines = ["| group | metric | scopekb | baseline | unit | ratio | target |", "|---|---|---:|---:|---|---:|---|"]
    order = {g: i for i, g in enumerate(GROUP_ORDER)}
    shown = (m for m in data["metrics"] if not m["group"].startswith("quality"))
    for m in sorted(shown, key=lambda m: order.get(m["group"], 99)):
        cells = [m["group"], m["label"], fmt(m["value"]), fmt(m["baseline"]), m["unit"], fmt(m["ratio"]),
                 m["target"] or ("↑" if m["better"] == "higher" else "↓")]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _sets(data: dict[str, Any]) -> str:
    sets = data["series"].get("quality_sets")
    if not sets:
        return "No quality-set figures in the committed run."
    run = data["meta"].get("sets_run") or data["meta"]
    lines = [f"Run `{run.get('run_id', '?')}` of {run.get('started', '?')} (`bench/run --phases sets`; "
             f"{run.get('profile', '?')} profile). Mean over queries with its 95% bootstrap interval.", "",
             "| set | kind | queries | mode | NDCG@10 | MRR@10 | Hit@1 | Hit@10 |",
             "|---|---|---:|---|---|---|---|---|"]
    for sid, s in sets.items():
        name = f"{sid} (held aside)" if s.get("held_aside") else sid
        for mode, met in s["modes"].items():
            cells = [f"{met[k]['mean']:.3f} ({met[k]['ci95'][0]:.3f}–{met[k]['ci95'][1]:.3f})"
                     for k in ("ndcg10", "mrr10", "hit1", "hit10")]
            lines.append(f"| {name} | {s['kind']} | {s['queries']} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sections(data: dict[str, Any]) -> dict[str, str]:
    """``name -> Markdown`` of every generated section, from one run's ``results.json`` data."""
    return {"run": _run(data), "quality": _quality(data), "sets": _sets(data), "performance": _performance(data)}


def blocks(doc: str) -> dict[str, str]:
    """The generated sections currently in ``doc`` (``name -> body``, without the markers)."""
    return {m.group(2): m.group(3).rstrip("\n") for m in _BLOCK.finditer(doc)}


def render(doc: str, data: dict[str, Any]) -> str:
    """``doc`` with every generated section replaced from ``data``.

    Raises:
        ValueError: a section of :data:`SECTIONS` has no markers in ``doc``.
    """
    new = sections(data)
    missing = set(SECTIONS) - set(blocks(doc))
    if missing:
        raise ValueError(f"docs/benchmarks.md lacks the generated sections {sorted(missing)}")
    return _BLOCK.sub(lambda m: f"{m.group(1)}{new[m.group(2)]}\n{m.group(4)}", doc)


def update(doc_path: Path, results_path: Path) -> bool:
    """Rewrite the generated sections of ``doc_path`` from ``results_path``; True when the file changed."""
    doc = doc_path.read_text(encoding="utf-8")
    out = render(doc, json.loads(results_path.read_text(encoding="utf-8")))
    if out != doc:
        doc_path.write_text(out, encoding="utf-8")
    return out != doc
