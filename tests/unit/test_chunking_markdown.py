"""Markdown by headings (fences are not headings) and notebooks by cell (outputs dropped)."""

from __future__ import annotations

import base64
import json

from scopekb.chunking import chunk_with_report
from scopekb.settings import ChunkingSettings
from tests.unit.test_chunking_support import DATA, code_cell, markdown_cell, notebook_json, run

CFG = ChunkingSettings()


def test_heading_paths_and_fences() -> None:
    text = (DATA / "fences.md").read_text()
    chunks, report = run("README.md", text, "markdown", CFG)
    assert report.chunker == "markdown"
    got = [(c.metadata["headings"], c.symbol) for c in chunks]
    assert got == [
        ([], None),
        (["Install"], "Install"),
        (["Install", "From source"], "From source"),
        (["Install", "From packages"], "From packages"),
        (["Install", "Setext Heading"], "Setext Heading"),
        (["Usage", "Empty parent", "Child"], "Child"),
    ]
    lines = text.split("\n")
    src = chunks[2]
    assert lines[src.start_line - 1] == "## From source"
    for needle in ("# clone the repository", "## still inside the fence", "# tilde fence",
                   "# inside a nested fence", "# still inside the four-backtick fence"):
        assert needle in src.content
    assert "# indented fence opener" in chunks[3].content
    assert chunks[0].content.startswith("---\ntitle:")
    assert chunks[5].content.startswith("# Usage\n## Empty parent\n### Child")
    assert all(c.kind == "section" for c in chunks)
    assert chunks[4].metadata["level"] == 2 and chunks[4].signature == "Setext Heading"


def test_unclosed_fence_runs_to_the_end() -> None:
    text = "# A\n\n```\n# not a heading\n"
    chunks, _ = run("a.md", text, "markdown", CFG)
    assert [c.symbol for c in chunks] == ["A"]


def test_large_section_is_split_keeping_headings_and_fences_whole() -> None:
    para = "Some words about the topic that go on for a while. " * 3
    fence = "```python\n" + "\n".join(f"value_{i} = {i}" for i in range(8)) + "\n```"
    body = "\n\n".join([para] * 6 + [fence] + [para] * 6)
    text = f"# Guide\n\n## Details\n\n{body}\n"
    cfg = ChunkingSettings(max_tokens=120, context_reserve_tokens=16)
    chunks, _ = run("g.md", text, "markdown", cfg)
    parts = [c for c in chunks if c.symbol == "Details"]
    assert len(parts) > 2
    assert all(c.metadata["headings"] == ["Guide", "Details"] for c in parts)
    assert [c.metadata["part"] for c in parts] == list(range(len(parts)))
    assert any(c.content.startswith("```python") and c.content.endswith("```") for c in parts)


def test_notebook_cells_outputs_dropped_and_line_mapping() -> None:
    image = base64.b64encode(bytes(range(256)) * 4096).decode()  # 1 MiB of PNG-like base64
    outputs = [{"output_type": "display_data", "data": {"image/png": image, "text/plain": ["<Figure>"]},
                "metadata": {}}, {"output_type": "stream", "name": "stdout", "text": ["SECRET OUTPUT\n"]}]
    cells = [markdown_cell("# Title\n\nSome text."), code_cell("import math\n\nprint(math.pi)", outputs),
             code_cell("   \n"), code_cell("x = 1")]
    text = notebook_json(cells)
    assert len(text) > 1_000_000
    chunks, report = run("nb.ipynb", text, "notebook", CFG)
    assert report.chunker == "notebook"
    assert [c.content for c in chunks] == ["# Title\n\nSome text.", "import math\n\nprint(math.pi)", "x = 1"]
    assert [c.metadata["cell"] for c in chunks] == [0, 1, 3]
    assert [c.metadata["cell_type"] for c in chunks] == ["markdown", "code", "code"]
    assert all(c.kind == "cell" for c in chunks)
    lines = text.split("\n")
    for c in chunks:  # start/end lines point at the JSON strings holding the first and last source line
        first, last = c.content.split("\n")[0], c.content.split("\n")[-1]
        assert json.dumps(first)[1:-1] in lines[c.start_line - 1]
        assert json.dumps(last)[1:-1] in lines[c.end_line - 1]
    assert not any("SECRET" in c.content or image[:100] in c.content for c in chunks)


def test_large_notebook_cell_is_chunked_as_code() -> None:
    funcs = "\n\n".join(f"def f_{i}(x):\n    return x + {i}  # {'comment ' * 8}" for i in range(20))
    text = notebook_json([code_cell(funcs)])
    cfg = ChunkingSettings(max_tokens=100, context_reserve_tokens=16)
    chunks, _ = run("nb.ipynb", text, "notebook", cfg)
    assert [c.symbol for c in chunks if c.kind == "function"] == [f"f_{i}" for i in range(20)]
    lines = text.split("\n")
    for c in chunks:
        assert json.dumps(c.content.split("\n")[0])[1:-1] in lines[c.start_line - 1]
        assert c.metadata["cell"] == 0


def test_compact_notebook_and_string_sources() -> None:
    nb = {"cells": [{"cell_type": "code", "source": "a = 1\nb = 2", "outputs": [], "metadata": {}}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(nb)
    chunks, _ = run("c.ipynb", text, "notebook", CFG)
    assert [(c.content, c.start_line, c.end_line) for c in chunks] == [("a = 1\nb = 2", 1, 1)]


def test_invalid_notebook_falls_back_to_lines() -> None:
    for text in ('{"cells": [', "not json at all\n", '{"nbformat": 4}', "[1, 2]"):
        chunks, report = chunk_with_report("bad.ipynb", text, "notebook", CFG)
        assert report.chunker == "lines" and report.fallback == "not_a_notebook"
        assert "".join(c.content for c in chunks).replace("\n", "") == text.replace("\n", "")
