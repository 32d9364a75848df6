"""Chunking throughput benchmark (not a test): scopekb.chunking.chunk_document next to a plain line splitter.

Runs over the text files of real released sources (by default click 8.1.0's sdist, express 4.18.2 and rxjs 7.8.1
from npm, downloaded once into .services/cache/chunking, the same cache the tests use; or any folder with
``--path``), measures files/s and MB/s for both on the same files, and reports the ratio
(chunking throughput / plain splitter throughput). Prints a table and writes bench/results/chunking.json.

    .venv/bin/python bench/chunking.py                 # default sources, estimate counter
    .venv/bin/python bench/chunking.py --counter minilm --rounds 3
    .venv/bin/python bench/chunking.py --path /some/repo

The plain splitter is what a line-window chunker without syntax, markdown or token awareness costs: split into
lines, take windows of ``window_lines`` with ``overlap_lines`` overlap, join, drop blank windows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "shared"))

from scopekb.chunking import chunk_with_report, counter_for_model  # noqa: E402 - after the path set-up
from scopekb.filetypes import content_skip_reason, decode_text, language_for, path_skip_reason  # noqa: E402
from scopekb.settings import ChunkingSettings  # noqa: E402

CACHE = REPO / ".services" / "cache" / "chunking"
RESULTS = REPO / "bench" / "results" / "chunking.json"
DEFAULT_SOURCES = [("pypi", "click", "8.1.0"), ("npm", "express", "4.18.2"), ("npm", "rxjs", "7.8.1")]


def fetch(kind: str, name: str, version: str) -> Path:
    """Unpacked release in the cache (``pip download`` of the sdist, or ``npm pack``)."""
    out = CACHE / f"{kind}-{name}-{version}"
    if out.is_dir():
        return out
    dl = CACHE / "downloads" / f"{kind}-{name}-{version}"
    dl.mkdir(parents=True, exist_ok=True)
    if not any(dl.iterdir()):
        if kind == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--no-build-isolation", "-q", "-d", ".", f"{name}=={version}"]
        else:
            cmd = ["npm", "pack", "--silent", f"{name}@{version}"]
        subprocess.run(cmd, cwd=dl, check=True, capture_output=True, timeout=600)
    archive = next(p for p in dl.iterdir() if p.name.endswith((".tar.gz", ".tgz")))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive) as t:
        t.extractall(tmp, filter="data")
    os.replace(tmp, out)
    return out


def collect(roots: list[Path], max_bytes: int) -> list[tuple[str, str, str]]:
    """(path, text, language) of the indexable text files under ``roots`` (same skip rules as the indexer)."""
    files = []
    for root in roots:
        for p in sorted(root.rglob("*")):
            if not p.is_file() or p.is_symlink():
                continue
            rel = p.relative_to(root).as_posix()
            if path_skip_reason(rel) or p.stat().st_size > max_bytes:
                continue
            data = p.read_bytes()
            if content_skip_reason(data):
                continue
            files.append((rel, decode_text(data), language_for(rel)))
    return files


def plain_split(text: str, window: int, overlap: int) -> list[str]:
    """The baseline: fixed line windows with overlap, blank windows dropped."""
    lines = text.split("\n")
    out = []
    step = window - overlap
    for start in range(0, max(1, len(lines)), step):
        piece = "\n".join(lines[start:start + window])
        if piece.strip():
            out.append(piece)
        if start + window >= len(lines):
            break
    return out


def timed(fn, rounds: int) -> float:  # noqa: ANN001
    """Best wall time of ``rounds`` runs of ``fn()`` in seconds."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", action="append", type=Path, help="folder(s) to chunk instead of the default sources")
    ap.add_argument("--counter", default="estimate", choices=["estimate", "minilm"],
                    help="token counter: the keyword-only estimate or all-MiniLM-L6-v2's tokenizer")
    ap.add_argument("--rounds", type=int, default=3, help="runs per measurement; the best is reported")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    cfg = ChunkingSettings()
    roots = args.path or [fetch(*s) for s in DEFAULT_SOURCES]
    files = collect(roots, 1024 * 1024)
    total_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for _, t, _ in files)
    counter = counter_for_model("all-MiniLM-L6-v2" if args.counter == "minilm" else None, cfg)

    reports = []

    def run_chunking() -> None:
        reports.clear()
        for path, text, lang in files:
            reports.append(chunk_with_report(path, text, lang, cfg, counter))

    def run_plain() -> None:
        for _, text, _ in files:
            plain_split(text, cfg.window_lines, cfg.overlap_lines)

    run_chunking()  # warm-up: grammar loading, tokenizer, caches
    t_chunk = timed(run_chunking, args.rounds)
    t_plain = timed(run_plain, args.rounds)

    by_chunker: dict[str, dict] = {}
    n_chunks = 0
    for (_path, text, _), (chunks, rep) in zip(files, reports, strict=True):
        b = by_chunker.setdefault(rep.chunker, {"files": 0, "bytes": 0, "chunks": 0, "seconds": 0.0})
        b["files"] += 1
        b["bytes"] += len(text.encode("utf-8", "surrogatepass"))
        b["chunks"] += len(chunks)
        b["seconds"] += rep.seconds
        n_chunks += len(chunks)
    fallbacks: dict[str, int] = {}
    for _, rep in reports:
        if rep.fallback:
            fallbacks[rep.fallback] = fallbacks.get(rep.fallback, 0) + 1
    sample = [c.content for chunks, _ in reports for c in chunks][:3000]
    tokens = [counter.count(s) for s in sample]

    mb = total_bytes / 1e6
    result = {
        "sources": [str(r.relative_to(REPO)) if r.is_relative_to(REPO) else str(r) for r in roots],
        "files": len(files), "megabytes": round(mb, 3), "rounds": args.rounds, "counter": counter.name,
        "chunking": {"seconds": round(t_chunk, 4), "files_per_s": round(len(files) / t_chunk, 1),
                     "mb_per_s": round(mb / t_chunk, 3), "chunks": n_chunks},
        "plain_splitter": {"seconds": round(t_plain, 4), "files_per_s": round(len(files) / t_plain, 1),
                           "mb_per_s": round(mb / t_plain, 3)},
        "ratio_chunking_over_plain": round(t_plain / t_chunk, 4),
        "by_chunker": {k: {**v, "seconds": round(v["seconds"], 4)} for k, v in sorted(by_chunker.items())},
        "fallbacks": fallbacks,
        "chunk_tokens": {"mean": round(statistics.mean(tokens), 1) if tokens else 0,
                         "max": max(tokens) if tokens else 0, "budget": reports[0][1].budget if reports else 0},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }

    print(f"{len(files)} files, {mb:.2f} MB from {', '.join(result['sources'])}; counter {counter.name}; "
          f"best of {args.rounds}")
    print(f"{'':22} {'seconds':>9} {'files/s':>10} {'MB/s':>9}")
    for name, r in (("scopekb chunking", result["chunking"]), ("plain line splitter", result["plain_splitter"])):
        print(f"{name:22} {r['seconds']:9.3f} {r['files_per_s']:10.1f} {r['mb_per_s']:9.3f}")
    print(f"ratio (chunking / plain throughput): {result['ratio_chunking_over_plain']:.4f}")
    for k, v in result["by_chunker"].items():
        print(f"  {k:10} {v['files']:5d} files {v['bytes'] / 1e6:7.2f} MB {v['chunks']:7d} chunks "
              f"{v['bytes'] / 1e6 / max(v['seconds'], 1e-9):7.3f} MB/s")
    if fallbacks:
        print("  fallbacks:", ", ".join(f"{k}={v}" for k, v in sorted(fallbacks.items())))
    print(f"  chunk tokens: mean {result['chunk_tokens']['mean']}, max {result['chunk_tokens']['max']}, "
          f"budget {result['chunk_tokens']['budget']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
