"""Syntax-aware chunking on released sources of real projects.

Python expectations come from the ``ast`` module; for the other languages a few known definitions are located by
searching the file text (the definition's first line, and its end as the first later line at the same
indentation that only closes the block). Every file is also checked against the chunking invariants.
Sources: click 8.1.0 (sdist), MarkupSafe 2.1.3 (C), greenlet 3.0.3 (C++), pythonnet 3.0.3 (C#), downloaded once
into .services/cache/chunking with pip; and, vendored with their licences under tests/data/realfiles (see its
README.md) so they run offline and in CI: express 4.18.2 (JavaScript), rxjs 7.8.1 (TypeScript),
react-native-screens 3.29.0 (Java and Kotlin), semver 1.0.20 (Rust), Go 1.26's ``strings`` package, Debian's
ruby-rack, php-psr-log and bash-completion packages.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from scopekb.chunking import chunk_with_report
from scopekb.filetypes import language_for
from scopekb.models import Chunk
from scopekb.settings import ChunkingSettings
from tests.unit.test_chunking_support import check_chunks, sdist, vendored

CFG = ChunkingSettings()
_LEAD = re.compile(r"^\s*(?:$|//|/\*|\*|#|@|\[|<!--)")  # comment / annotation / attribute lines above a def
_CLOSE = re.compile(r"^\s*(?:[\]\)\}]+[;,]?|end)\s*(?://.*|#.*)?$")


def _chunks(path: Path, language: str | None = None) -> tuple[str, list[Chunk]]:
    text = path.read_text(encoding="utf-8", errors="replace")
    lang = language or language_for(path.name)
    chunks, report = chunk_with_report(str(path), text, lang, CFG)
    check_chunks(text, chunks, report, CFG)
    assert report.chunker == "syntax", (path, report.fallback)
    return text, chunks


def _assert_def(text: str, chunks: list[Chunk], symbol: str, kind: str, start: int, end: int) -> None:
    """The run of chunks named ``symbol`` (or ``symbol.member`` for a split container) around line ``start``
    spans ``start..end`` (1-based): it may begin earlier only over comment or annotation lines and end later only
    over comment or block-closing lines; the definition's own chunks carry ``kind`` and number their parts."""
    lines = text.split("\n")

    def fam(c: Chunk) -> bool:
        return c.symbol == symbol or (c.symbol or "").startswith(symbol + ".")

    at = [i for i, c in enumerate(chunks) if fam(c) and c.start_line <= end and c.end_line >= start]
    assert at, f"no chunk for {symbol} ({kind}) at {start}-{end}; symbols: {sorted({str(c.symbol) for c in chunks})}"
    i0, i1 = at[0], at[-1]
    while i0 > 0 and fam(chunks[i0 - 1]) and not (chunks[i0].symbol == symbol
                                                   and chunks[i0].metadata.get("part", 0) == 0):
        i0 -= 1  # earlier parts of a split definition (e.g. a long doc comment above it)
    run = chunks[i0:i1 + 1]
    assert all(fam(c) for c in run), (symbol, [(c.symbol, c.start_line) for c in run])
    lo, hi = min(c.start_line for c in run), max(c.end_line for c in run)
    assert lo <= start and all(_LEAD.match(lines[i - 1]) for i in range(lo, start)), (symbol, lo, start)
    assert hi >= end and all(_CLOSE.match(lines[i - 1]) or _LEAD.match(lines[i - 1]) for i in range(end + 1, hi + 1)), \
        (symbol, hi, end)
    own = [c for c in run if c.symbol == symbol]
    assert {c.kind for c in own} == {kind}, (symbol, {c.kind for c in own})
    if len(own) > 1:  # a split definition: parts numbered in order
        assert [c.metadata.get("part") for c in own] == list(range(len(own)))


def _find(text: str, needle: str, after: int = 0) -> tuple[int, int]:
    """1-based line of the first line starting with ``needle`` (after ``after``, indentation ignored) and the
    first later line at the same indentation that closes the block (-1 when there is none)."""
    lines = text.split("\n")
    for i in range(after, len(lines)):
        if lines[i].strip().startswith(needle):
            indent = len(lines[i]) - len(lines[i].lstrip())
            for j in range(i + 1, len(lines)):
                ln = lines[j]
                if ln.strip() and len(ln) - len(ln.lstrip()) == indent and _CLOSE.match(ln):
                    return i + 1, j + 1
            return i + 1, -1
    raise AssertionError(f"{needle!r} not found")


# -- Python, checked against ast --------------------------------------------------------------------------------

def _ast_span(node: ast.AST) -> tuple[int, int]:
    decos = [d.lineno for d in getattr(node, "decorator_list", [])]
    return min([node.lineno, *decos]), node.end_lineno  # type: ignore[attr-defined, return-value]


def test_click_definitions_match_ast() -> None:
    root = sdist("click", "8.1.0")
    files = sorted((root / "click-8.1.0" / "src" / "click").glob("*.py"))
    assert len(files) > 10
    checked = split_classes = 0
    for path in files:
        text, chunks = _chunks(path)
        tree = ast.parse(text)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            start, end = _ast_span(node)
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            _assert_def(text, chunks, node.name, kind, start, end)
            checked += 1
            first = next(c for c in chunks if c.symbol == node.name and c.end_line >= start)
            assert first.signature and first.signature.split("(")[0].split(":")[0].endswith(node.name)
            if isinstance(node, ast.ClassDef) and any((c.symbol or "").startswith(node.name + ".") for c in chunks):
                split_classes += 1
                for m in node.body:
                    if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef):
                        ms, me = _ast_span(m)
                        _assert_def(text, chunks, f"{node.name}.{m.name}", "method", ms, me)
                        mc = next(c for c in chunks if c.symbol == f"{node.name}.{m.name}" and c.end_line >= ms)
                        assert mc.metadata["parent"] == node.name
                        assert mc.metadata["context"].startswith(f"class {node.name}")
                        checked += 1
    assert checked > 200 and split_classes >= 5, (checked, split_classes)


# -- other languages: known definitions located in the text ----------------------------------------------------

# source, path in it, needle (a definition's first line, indentation ignored), symbol, kind, and optionally
# "shift" (lines the definition starts above the needle), "end" (a needle for its last line) or "language".
CASES: list[dict] = [
    dict(src="express", rel="package/lib/application.js", needle="app.init = function init()", symbol="app.init",
         kind="function"),
    dict(src="express", rel="package/lib/application.js", needle="app.handle = function handle(",
         symbol="app.handle", kind="function"),
    dict(src="express", rel="package/lib/application.js", needle="app.listen = function listen()",
         symbol="app.listen", kind="function"),
    dict(src="express", rel="package/lib/router/index.js", needle="proto.param = function param(",
         symbol="proto.param", kind="function"),
    dict(src="rxjs", rel="package/src/internal/util/isFunction.ts", needle="export function isFunction(",
         symbol="isFunction", kind="function"),
    dict(src="rxjs", rel="package/src/internal/Subscription.ts", needle="unsubscribe(): void {",
         symbol="Subscription.unsubscribe", kind="method"),
    dict(src="rxjs", rel="package/src/internal/Subscription.ts", needle="export function isSubscription(",
         symbol="isSubscription", kind="function"),
    dict(src="go", rel="strings/strings.go", needle="func Index(s, substr string) int {", symbol="Index",
         kind="function"),
    dict(src="go", rel="strings/builder.go", needle="func (b *Builder) WriteString(", symbol="Builder.WriteString",
         kind="method"),
    dict(src="go", rel="strings/builder.go", needle="type Builder struct {", symbol="Builder", kind="struct"),
    dict(src="semver", rel="src/parse.rs", needle="impl FromStr for Version {", symbol="Version", kind="impl"),
    dict(src="semver", rel="src/lib.rs", needle="pub struct Version {", symbol="Version", kind="struct"),
    dict(src="markupsafe", rel="MarkupSafe-2.1.3/src/markupsafe/_speedups.c",
         needle="escape_unicode_kind1(PyUnicodeObject *in)", shift=1, symbol="escape_unicode_kind1",
         kind="function"),
    dict(src="greenlet", rel="greenlet-3.0.3/src/greenlet/TGreenlet.cpp", needle="Greenlet::release_args()",
         shift=1, symbol="Greenlet::release_args", kind="function"),
    dict(src="pythonnet", rel="pythonnet-3.0.3/src/runtime/PythonEngine.cs", needle="public static void Shutdown()",
         symbol="PythonEngine.Shutdown", kind="method"),
    dict(src="screens",
         rel="package/android/src/paper/java/com/facebook/react/viewmanagers/RNSScreenStackManagerDelegate.java",
         needle="public class RNSScreenStackManagerDelegate", symbol="RNSScreenStackManagerDelegate", kind="class"),
    dict(src="screens", rel="package/android/src/main/java/com/swmansion/rnscreens/utils/DeviceUtils.kt",
         needle="object DeviceUtils {", symbol="DeviceUtils", kind="object"),
    dict(src="rack", rel="lib/rack/utils.rb", needle="def escape(s)", symbol="Rack.Utils.escape", kind="method"),
    dict(src="psr-log", rel="usr/share/php/Psr/Log/AbstractLogger.php", needle="abstract class AbstractLogger",
         symbol="AbstractLogger", kind="class"),
    dict(src="bash-completion", rel="usr/share/bash-completion/completions/apt-get", language="bash",
         needle="_apt_get()", end="complete -F _apt_get apt-get", symbol="_apt_get", kind="function"),
]

_SOURCES = {
    "express": lambda: vendored("express"),
    "rxjs": lambda: vendored("rxjs"),
    "screens": lambda: vendored("screens"),
    "go": lambda: vendored("go"),
    "semver": lambda: vendored("semver"),
    "markupsafe": lambda: sdist("markupsafe", "2.1.3"),
    "greenlet": lambda: sdist("greenlet", "3.0.3"),
    "pythonnet": lambda: sdist("pythonnet", "3.0.3"),
    "rack": lambda: vendored("rack"),
    "psr-log": lambda: vendored("psr-log"),
    "bash-completion": lambda: vendored("bash-completion"),
}


def _source_path(source: str, rel: str) -> Path:
    return _SOURCES[source]() / rel


@pytest.mark.parametrize("case", CASES, ids=[f"{c['src']}:{c['symbol']}" for c in CASES])
def test_known_definition(case: dict) -> None:
    path = _source_path(case["src"], case["rel"])
    text, chunks = _chunks(path, case.get("language"))
    start, end = _find(text, case["needle"])
    start -= case.get("shift", 0)
    if "end" in case:
        end = next(i + 1 for i, ln in enumerate(text.split("\n")) if i >= start and case["end"] in ln)
    assert end > 0, "no end line found"
    _assert_def(text, chunks, case["symbol"], case["kind"], start, end)


def test_every_file_of_each_source_keeps_the_invariants() -> None:
    """All source files of a few projects: invariants hold, and most files are chunked by syntax."""
    roots = {
        "python": sdist("click", "8.1.0"), "javascript": vendored("express"), "java+kotlin": vendored("screens"),
        "rust": vendored("semver"), "csharp": sdist("pythonnet", "3.0.3"), "ruby": vendored("rack"),
    }
    exts = (".py", ".js", ".java", ".kt", ".rs", ".cs", ".rb")
    for name, root in roots.items():
        files = sorted(p for p in root.rglob("*") if p.suffix in exts and p.is_file())[:120]
        assert files, name
        syntax = 0
        for p in files:
            text = p.read_text(encoding="utf-8", errors="replace")
            chunks, report = chunk_with_report(str(p), text, language_for(p.name), CFG)
            check_chunks(text, chunks, report, CFG)
            syntax += report.chunker == "syntax"
        assert syntax >= 0.9 * len(files), (name, syntax, len(files))
