"""Property tests (hypothesis, bounded examples): for generated documents in every language and for slices of
real released files, under varied settings and token counters, chunking never raises, is deterministic, keeps
every chunk within the token budget and ``max_chars``, gives valid line ranges whose content equals those lines
(or the documented sub-slice of a split long line), and covers every non-blank line exactly once (plain line
windows: at least once, with at most ``overlap_lines`` shared between neighbours)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scopekb.chunking import chunk_with_report, embedding_text
from scopekb.chunking.tokens import EstimateCounter, HFTokenizerCounter
from scopekb.filetypes import language_for
from scopekb.settings import ChunkingSettings
from tests.unit.test_chunking_support import check_chunks, code_cell, markdown_cell, notebook_json, sdist, vendored

LANGUAGES = ["python", "javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp", "csharp", "ruby", "php",
             "kotlin", "bash", "markdown", "notebook", "text"]

VOCAB = [
    # python
    "import os", "def f(x):", "    return x", "class C(Base):", "    def m(self):", "        pass", "@decorator",
    "    '''doc'''", "if __name__ == '__main__':", "    main()",
    # c-family / js / go / rust / java / c# / php / kotlin
    "function g(a, b) {", "  return a + b;", "}", "};", "class A {", "  m() { return 1; }", "int add(int a, int b)",
    "{", "    return a + b;", "namespace ns {", "}  // namespace ns", "#ifndef H", "#define H 1", "#endif",
    "func (p *P) Move() {", "package main", "impl S {", "    fn new() -> Self { S {} }", "pub struct S { a: i32 }",
    "public class K {", "    public void run() {}", "<?php", "fun main() {", "object O {", "const h = () => 1;",
    "export default function x() {}", "interface I { a: number }", "// comment", "/* block */", "/**", " * doc", " */",
    # ruby / bash
    "module M", "  def go(x)", "    x", "  end", "end", "build() {", "  make all", "echo done", "fi", "done",
    # markdown
    "# Title", "## Section", "### Sub", "```", "```bash", "~~~", "````", "Some prose here.", "---", "===", "- item",
    # odd
    "", "", "", "   ", "\t", "x" * 300, "é中文😀", "\x00", "a,b;c)d}e]",
]

line = st.one_of(st.sampled_from(VOCAB), st.text(max_size=30),
                 st.text(alphabet="ab1;(){} =", min_size=100, max_size=2500))
document = st.lists(line, max_size=60).map("\n".join)


@st.composite
def chunk_settings(draw: st.DrawFn) -> ChunkingSettings:
    window = draw(st.integers(1, 30))
    max_tokens = draw(st.integers(16, 300))
    return ChunkingSettings(
        window_lines=window, overlap_lines=draw(st.integers(0, window - 1)), max_chars=draw(st.integers(16, 3000)),
        max_tokens=max_tokens, context_reserve_tokens=draw(st.integers(0, max_tokens // 2)),
        embed_context=draw(st.booleans()), long_lines=draw(st.sampled_from(["split", "skip"])),
        on_syntax_error=draw(st.sampled_from(["lines", "partial"])), syntax=draw(st.booleans()) or True)


class SpaceCounter:
    """Not additive: counts whitespace-separated words and newlines (exercises the final re-count)."""

    additive = False
    name = "space"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def count(self, text: str) -> int:
        return 1 + len(text.split()) + text.count("\n") + len(text) // 40


@lru_cache(maxsize=1)
def _minilm() -> HFTokenizerCounter | None:
    try:
        return HFTokenizerCounter.minilm()
    except ImportError:
        return None


def _counter(kind: str, cfg: ChunkingSettings):  # noqa: ANN202 - a TokenCounter
    if kind == "minilm" and _minilm() is not None:
        return _minilm()
    if kind == "space":
        return SpaceCounter(cfg.max_tokens)
    return EstimateCounter(cfg.max_tokens, cfg.estimate_chars_per_token)


def _check(path: str, text: str, language: str, cfg: ChunkingSettings, counter) -> None:  # noqa: ANN001
    chunks, report = chunk_with_report(path, text, language, cfg, counter)
    check_chunks(text, chunks, report, cfg, counter, notebook=report.chunker == "notebook")
    again, _ = chunk_with_report(path, text, language, cfg, counter)
    assert again == chunks, "not deterministic"
    if cfg.embed_context and chunks:
        for c in chunks[:5]:
            assert counter.count(embedding_text(path, language, c, cfg, counter)) <= counter.limit


PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.data_too_large])


@PROPS
@given(text=document, language=st.sampled_from(LANGUAGES), cfg=chunk_settings(),
       counter=st.sampled_from(["estimate", "minilm", "space"]))
@example(  # found by hypothesis: overlapping windows cut in halves by the real counter came out of line order
    text="import os\nimport os\n" + "1" * 88 + " 1 1 1 1 1 1\nimport os", language="python",
    cfg=ChunkingSettings(window_lines=3, overlap_lines=2, max_chars=120, max_tokens=16, context_reserve_tokens=0,
                         estimate_chars_per_token=2.5, on_syntax_error="lines", long_lines="split"),
    counter="space")
def test_generated_documents(text: str, language: str, cfg: ChunkingSettings, counter: str) -> None:
    _check(f"f.{language}", text, language, cfg, _counter(counter, cfg))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=400), language=st.sampled_from(LANGUAGES), cfg=chunk_settings())
def test_arbitrary_text(text: str, language: str, cfg: ChunkingSettings) -> None:
    _check("any", text, language, cfg, _counter("estimate", cfg))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cells=st.lists(st.tuples(st.booleans(), document), max_size=6), cfg=chunk_settings(),
       counter=st.sampled_from(["estimate", "space"]))
def test_generated_notebooks(cells: list[tuple[bool, str]], cfg: ChunkingSettings, counter: str) -> None:
    nb = notebook_json([markdown_cell(t) if md else code_cell(t) for md, t in cells])
    _check("n.ipynb", nb, "notebook", cfg, _counter(counter, cfg))


@lru_cache(maxsize=1)
def _real_files() -> tuple[Path, ...]:
    roots = [sdist("click", "8.1.0"), vendored("express"), vendored("rxjs"), vendored("screens")]
    exts = (".py", ".js", ".ts", ".tsx", ".java", ".kt", ".cpp", ".md", ".rst")
    files = [p for r in roots for p in sorted(r.rglob("*")) if p.suffix in exts and p.is_file()
             and "/dist/" not in str(p)]
    return tuple(files[::7])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cfg=chunk_settings(), counter=st.sampled_from(["estimate", "minilm"]))
def test_real_file_slices(data: st.DataObject, cfg: ChunkingSettings, counter: str) -> None:
    files = _real_files()
    path = files[data.draw(st.integers(0, len(files) - 1), label="file")]
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    start = data.draw(st.integers(0, len(lines) - 1), label="start")
    length = data.draw(st.integers(1, 400), label="length")
    text = "\n".join(lines[start:start + length])
    _check(str(path), text, language_for(path.name), cfg, _counter(counter, cfg))
