"""Edge files: huge single lines, syntax errors, large valid files, empty and whitespace-only input."""

from __future__ import annotations

import ast
import random
import time

import pytest

from scopekb.chunking import chunk_document, chunk_with_report
from scopekb.chunking.lines import chunk_lines
from scopekb.chunking.tokens import HFTokenizerCounter
from scopekb.settings import ChunkingSettings
from tests.unit.test_chunking_support import DATA, run

CFG = ChunkingSettings()
LANGUAGES = ["python", "javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp", "csharp", "ruby", "php",
             "kotlin", "bash", "markdown", "notebook", "text", "yaml"]


def minified_js(size: int, seed: int = 1) -> str:
    """One line of minified-looking JavaScript, ``size`` characters."""
    rnd = random.Random(seed)
    parts = []
    n = 0
    while n < size:
        name = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(1, 3)))
        part = rnd.choice([f"function {name}(a,b){{return a+b*{rnd.randint(0, 99)}}}", f"var {name}=[1,2,3];",
                           f"{name}.prototype.x=function(){{return this.{name}}};", f'"{name * 20}",',
                           f"if({name}){{{name}++}}else{{{name}--}}"])
        parts.append(part)
        n += len(part)
    return "".join(parts)[:size]


def test_two_megabyte_minified_line_is_split_never_sent_whole() -> None:
    text = minified_js(2 * 1024 * 1024)
    t0 = time.perf_counter()
    chunks, report = run("app.min.js", text, "javascript", CFG)
    assert time.perf_counter() - t0 < 30
    assert report.fallback == "too_large_to_parse" and len(chunks) > 100
    assert all(c.start_line == c.end_line == 1 and len(c.content) <= CFG.max_chars for c in chunks)
    assert "".join(c.content for c in chunks) == text  # contiguous sub-slices of the one line
    assert [c.metadata["line_part"] for c in chunks] == list(range(len(chunks)))


def test_huge_line_can_be_skipped_with_a_reason() -> None:
    text = "short line\n" + minified_js(50_000) + "\nlast line\n"
    chunks, report = run("a.js", text, "javascript", ChunkingSettings(long_lines="skip"))
    assert report.skipped == [(2, "line_too_long")]
    assert "".join(c.content for c in chunks) == "short linelast line"


def test_huge_line_with_the_real_tokenizer() -> None:
    counter = _minilm()
    text = minified_js(120_000, seed=2)
    chunks, report = run("a.js", text, "javascript", CFG, counter)
    assert report.budget == 256 - CFG.context_reserve_tokens
    assert "".join(c.content for c in chunks) == text


def test_base64_line_in_text() -> None:
    blob = "".join(random.Random(3).choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
                   for _ in range(300_000))
    chunks, _ = run("data.txt", f"header\n{blob}\nfooter", "text", CFG)
    assert chunks[0].content == "header" and chunks[-1].content == "footer"


def test_python_with_syntax_error_fixture() -> None:
    text = (DATA / "syntax_error.py").read_text()
    chunks, report = run("syntax_error.py", text, "python", CFG)
    assert report.fallback == "syntax_error"
    assert {c.kind for c in chunks} == {"lines"}


def generated_python(target_bytes: int) -> str:
    """A valid Python module of about ``target_bytes``: functions, classes with methods, module statements."""
    rnd = random.Random(7)
    out = ['"""Generated module."""', "", "import os", "import sys", "", "CONSTANT = 42", ""]
    i = 0
    while sum(len(x) + 1 for x in out) < target_bytes:
        if i % 3 == 0:
            methods = "\n\n".join(
                f"    def method_{k}(self, arg_{k}):\n        \"\"\"Method {k}.\"\"\"\n"
                f"        return self.value * arg_{k} + {rnd.randint(0, 9)}" for k in range(rnd.randint(1, 12)))
            out += [f"class Generated{i}(object):", f'    """Class {i}."""', "", "    value = 1", "", methods, "", ""]
        else:
            body = "\n".join(f"    total += item * {k}" for k in range(rnd.randint(1, 40)))
            out += [f"@decorator_{i % 4}", f"def function_{i}(items):", "    total = 0", body, "    return total",
                    "", ""]
        if i % 5 == 0:
            out += [f"REGISTRY_{i} = {{'name': 'function_{i}'}}", ""]
        i += 1
    return "\n".join(out) + "\n"


def test_forty_kilobyte_python_file() -> None:
    text = generated_python(40 * 1024)
    assert 40 * 1024 <= len(text.encode()) < 48 * 1024
    chunks, report = run("gen.py", text, "python", CFG)
    assert report.chunker == "syntax"
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            mine = [c for c in chunks if c.symbol == node.name or (c.symbol or "").startswith(node.name + ".")]
            assert min(c.start_line for c in mine) == start
            assert max(c.end_line for c in mine) == node.end_lineno


def generated_c_header(target_bytes: int) -> str:
    """A C header of about ``target_bytes``: include guard, macros, structs, enums, typedefs, prototypes and
    static inline functions."""
    out = ["#ifndef GENERATED_H", "#define GENERATED_H", "", "#include <stddef.h>", ""]
    i = 0
    while sum(len(x) + 1 for x in out) < target_bytes:
        out += [f"/* Block {i}: a struct, an enum, a macro, a prototype and an inline function. */",
                f"#define GEN_MAX_{i}(a, b) ((a) > (b) ? (a) : (b))",
                f"struct gen_item_{i} {{", "    int id;", "    const char *name;", f"    double weight_{i};", "};", "",
                f"enum gen_kind_{i} {{ GEN_A_{i}, GEN_B_{i}, GEN_C_{i} }};",
                f"typedef struct gen_item_{i} gen_item_{i}_t;", "",
                f"int gen_process_{i}(gen_item_{i}_t *item, size_t count);", "",
                f"static inline int gen_add_{i}(int a, int b)", "{", f"    return a + b + {i};", "}", ""]
        i += 1
    out += ["#endif /* GENERATED_H */", ""]
    return "\n".join(out)


def test_one_megabyte_c_header() -> None:
    text = generated_c_header(1_000_000)
    assert 1_000_000 <= len(text) <= CFG.syntax_max_bytes
    t0 = time.perf_counter()
    chunks, report = run("gen.h", text, "c", CFG)
    assert time.perf_counter() - t0 < 30
    assert report.chunker == "syntax", report.fallback
    lines = text.split("\n")
    funcs = [c for c in chunks if c.kind == "function"]
    assert len(funcs) > 1000
    for c in funcs[:50]:
        assert lines[c.start_line - 1].startswith(f"static inline int {c.symbol}(")
        assert lines[c.end_line - 1] == "}"
    assert {c.kind for c in chunks} >= {"function", "struct", "enum", "type", "macro", "lines"}


def test_markdown_fixture_with_fenced_hashes() -> None:
    text = (DATA / "fences.md").read_text()
    chunks, _ = run("fences.md", text, "markdown", CFG)
    assert all(not (c.symbol or "").startswith(("clone", "still", "tilde", "inside")) for c in chunks)


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("text", ["", "   ", "\n\n\n", " \t \n  \n\t\n", "\n"])
def test_empty_and_whitespace_only(language: str, text: str) -> None:
    assert chunk_document("f", text, language, CFG) == []


def test_four_argument_call_and_chunk_lines_compat() -> None:
    chunks = chunk_document("a.txt", "a\nb\n", "text", CFG)
    assert [(c.content, c.start_line, c.end_line, c.chunk_index) for c in chunks] == [("a\nb", 1, 2, 0)]
    with pytest.raises(ValueError):
        chunk_lines("x", 5, 5)
    text = "\n".join(f"line {i}" for i in range(100))
    got = chunk_lines(text, 10, 3)
    assert got[0].start_line == 1 and got[0].end_line == 10 and got[1].start_line == 8


def test_bad_settings_rejected_at_start() -> None:
    with pytest.raises(ValueError):
        ChunkingSettings(window_lines=10, overlap_lines=10)
    with pytest.raises(ValueError):
        ChunkingSettings(max_tokens=64, context_reserve_tokens=40)
    with pytest.raises(ValueError):
        ChunkingSettings(long_lines="truncate")  # type: ignore[arg-type]


def _minilm() -> HFTokenizerCounter:
    try:
        return HFTokenizerCounter.minilm()
    except ImportError as e:
        pytest.skip(f"MiniLM tokenizer not installed: {e}")


def test_odd_characters_never_raise() -> None:
    text = "def f():\n\x00\x0b\x0c\u2028\ud800 pass\r\n" + "é" * 10000 + "\n\U0001F600" * 50
    for language in LANGUAGES:
        chunks, report = chunk_with_report("odd", text, language, CFG)
        assert chunks, language
