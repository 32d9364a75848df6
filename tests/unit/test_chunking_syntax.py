"""Syntax-aware chunking: definitions per language, splitting of large classes and long functions, fallbacks."""

from __future__ import annotations

import textwrap

import pytest

from scopekb.chunking import chunk_document, chunk_with_report, syntax
from scopekb.settings import ChunkingSettings
from tests.unit.test_chunking_support import run

CFG = ChunkingSettings()

SNIPPETS = {
    "python": ("""\
        import os

        # helper
        @decorator
        def top(x: int) -> int:
            return x

        class Box(Base):
            size = 1

            async def open(self):
                pass
        """, [("top", "function", 3, 6), ("Box", "class", 8, 12)]),
    "javascript": ("""\
        const fs = require('fs');
        /** Greets. */
        function greet(name) {
          return 'hi ' + name;
        }
        class Door { open() { return 1; } }
        const add = (a, b) => a + b;
        module.exports.run = function run() {};
        """, [("greet", "function", 2, 5), ("Door", "class", 6, 6), ("add", "function", 7, 7),
              ("module.exports.run", "function", 8, 8)]),
    "typescript": ("""\
        import { x } from './x';
        export interface Shape { area(): number }
        export type Id = string;
        export enum Color { Red }
        export class Circle implements Shape {
          constructor(private r: number) {}
          area(): number { return 3 * this.r; }
        }
        export default function main(): void {}
        """, [("Shape", "interface", 2, 2), ("Id", "type", 3, 3), ("Color", "enum", 4, 4),
              ("Circle", "class", 5, 8), ("main", "function", 9, 9)]),
    "tsx": ("""\
        import React from 'react';
        export function App(): JSX.Element {
          return <div className="app">hello</div>;
        }
        """, [("App", "function", 2, 4)]),
    "go": ("""\
        package main

        import "fmt"

        // Point is a point.
        type Point struct {
        \tX, Y int
        }

        func (p *Point) Move(dx int) {
        \tp.X += dx
        }

        func main() {
        \tfmt.Println("hi")
        }
        """, [("Point", "struct", 5, 8), ("Point.Move", "method", 10, 12), ("main", "function", 14, 16)]),
    "rust": ("""\
        use std::fmt;

        /// A thing.
        #[derive(Debug)]
        pub struct Thing { a: i32 }

        impl Thing {
            pub fn new() -> Self { Thing { a: 1 } }
        }

        pub trait Named { fn name(&self) -> String; }

        fn main() {}
        """, [("Thing", "struct", 3, 5), ("Thing", "impl", 7, 9), ("Named", "trait", 11, 11),
              ("main", "function", 13, 13)]),
    "java": ("""\
        package a.b;

        import java.util.List;

        /** Docs. */
        public class Greeter {
            private final String name;
            public Greeter(String name) { this.name = name; }
            public String greet() { return "hi " + name; }
        }
        """, [("Greeter", "class", 5, 10)]),
    "c": ("""\
        #include <stdio.h>

        struct point { int x; int y; };

        typedef struct { int a; } pair_t;

        /* Adds. */
        static int add(int a, int b)
        {
            return a + b;
        }
        """, [("point", "struct", 3, 3), ("pair_t", "type", 5, 5), ("add", "function", 7, 11)]),
    "cpp": ("""\
        #include <vector>
        namespace geo {
        class Shape {
         public:
          virtual double area() const = 0;
        };
        double Shape::scale(double f) { return f; }
        }  // namespace geo
        """, [("Shape", "class", 3, 6), ("Shape::scale", "function", 7, 8)]),
    "csharp": ("""\
        using System;
        namespace App {
            public class User {
                public string Name { get; set; }
                public int Age() => 3;
            }
        }
        """, [("User", "class", 3, 7)]),  # the namespace "}" joins the last chunk
    "ruby": ("""\
        require 'set'

        class Stack
          def push(x)
            @items << x
          end
        end

        def helper(a) = a
        """, [("Stack", "class", 3, 7), ("helper", "function", 9, 9)]),
    "php": ("""\
        <?php
        namespace App;

        function helper($x) { return $x; }

        class Repo {
            public function find(int $id) { return $id; }
        }
        """, [("helper", "function", 4, 4), ("Repo", "class", 6, 8)]),
    "kotlin": ("""\
        package demo

        class Counter(var n: Int) {
            fun inc() { n += 1 }
        }

        fun main() {
            println("hi")
        }
        """, [("Counter", "class", 3, 5), ("main", "function", 7, 9)]),
    "bash": ("""\
        #!/bin/bash
        set -e

        build() {
          make all
        }

        function clean {
          rm -rf out
        }

        build
        """, [("build", "function", 4, 6), ("clean", "function", 8, 10)]),
}


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_definitions_per_language(language: str) -> None:
    source, expected = SNIPPETS[language]
    text = textwrap.dedent(source)
    chunks, report = run(f"x.{language}", text, language, CFG)
    assert report.chunker == "syntax", report.fallback
    got = [(c.symbol, c.kind, c.start_line, c.end_line) for c in chunks if c.kind != "lines"]
    assert got == expected
    for c in chunks:
        if c.kind != "lines":
            assert c.signature and c.symbol.rsplit(".", 1)[-1].split("::")[-1] in c.signature


def test_signature_is_the_header_only() -> None:
    text = "def f(a,\n      b) -> int:\n    return a\n"
    (c,) = chunk_document("m.py", text, "python", CFG)
    assert c.signature == "def f(a, b) -> int:"


def _big_class(n_methods: int = 12) -> str:
    methods = "\n".join(f"    def method_{i}(self, value):\n        total = value + {i}\n"
                        f"        return self.helper(total, '{'x' * 40}')\n" for i in range(n_methods))
    return f'class Big(Base):\n    """Doc."""\n\n    attr = 1\n\n{methods}\n\nx = Big()\n'


def test_large_class_is_split_into_methods_with_context() -> None:
    text = _big_class()
    cfg = ChunkingSettings(max_tokens=120, context_reserve_tokens=16)
    chunks, _ = run("big.py", text, "python", cfg)
    methods = [c for c in chunks if c.kind == "method"]
    assert [c.symbol for c in methods] == [f"Big.method_{i}" for i in range(12)]
    for c in methods:
        assert c.metadata["parent"] == "Big" and c.metadata["parent_kind"] == "class"
        assert c.metadata["context"] == "class Big(Base):"
        assert c.signature.startswith("def method_")
    header = [c for c in chunks if c.symbol == "Big"]
    assert header and header[0].kind == "class" and header[0].content.startswith("class Big(Base):")
    assert chunks[-1].kind == "lines" and chunks[-1].content == "x = Big()"


def test_long_function_is_split_at_statements_keeping_symbol() -> None:
    body = "\n".join(f"    value_{i} = compute(value_{i - 1}, 'some text {i}')" for i in range(1, 80))
    text = f"def long_one(value_0):\n{body}\n    return value_79\n"
    cfg = ChunkingSettings(max_tokens=100, context_reserve_tokens=10)
    chunks, _ = run("long.py", text, "python", cfg)
    assert len(chunks) > 3
    assert {c.symbol for c in chunks} == {"long_one"} and {c.kind for c in chunks} == {"function"}
    assert [c.metadata["part"] for c in chunks] == list(range(len(chunks)))
    assert all(c.metadata["parts"] == len(chunks) for c in chunks)
    assert all(c.signature == "def long_one(value_0):" for c in chunks)
    # parts are consecutive and cover the function
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 81
    assert all(a.end_line + 1 == b.start_line for a, b in zip(chunks, chunks[1:], strict=False))


def test_statement_boundaries_preferred_over_lines() -> None:
    stmt = "    if cond_{i}:\n        do_a_{i}()\n        do_b_{i}()\n"
    text = "def f():\n" + "".join(stmt.format(i=i) for i in range(30))
    cfg = ChunkingSettings(max_tokens=64, context_reserve_tokens=8)
    chunks, _ = run("s.py", text, "python", cfg)
    assert len(chunks) > 2
    for c in chunks[1:]:
        assert c.content.startswith("    if cond_"), c.content[:40]


def test_syntax_error_falls_back_to_lines() -> None:
    text = "def ok():\n    return 1\n\ndef broken(:\n    pass\n"
    chunks, report = run("bad.py", text, "python", CFG)
    assert report.chunker == "lines" and report.fallback == "syntax_error"
    assert all(c.kind == "lines" and c.metadata["fallback"] == "syntax_error" for c in chunks)


def test_partial_policy_keeps_good_definitions() -> None:
    text = "def ok():\n    return 1\n\n\ndef broken(:\n    pass\n"
    cfg = ChunkingSettings(on_syntax_error="partial")
    chunks, report = run("bad.py", text, "python", cfg)
    assert report.chunker == "syntax"
    assert chunks[0].symbol == "ok" and chunks[0].kind == "function"
    assert all(c.kind == "lines" for c in chunks[1:])


def test_parse_timeout_falls_back() -> None:
    text = "def f(x):\n    return x\n" * 20000
    cfg = ChunkingSettings(parse_timeout_s=1e-6)
    chunks, report = chunk_with_report("t.py", text, "python", cfg)
    assert report.fallback == "parse_timeout" and chunks
    # the parser is reset: the next parse works
    chunks, report = chunk_with_report("t.py", "def g():\n    pass\n", "python", CFG)
    assert report.chunker == "syntax" and chunks[0].symbol == "g"


def test_parser_crash_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a, **_k):
        raise RuntimeError("grammar exploded")

    monkeypatch.setattr(syntax.SyntaxChunker, "run", boom)
    chunks, report = run("c.py", "def f():\n    pass\n", "python", CFG)
    assert report.fallback == "error:RuntimeError" and chunks[0].kind == "lines"


def test_missing_grammar_means_line_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(syntax, "_languages", {"rust": None})
    chunks, report = run("x.rs", "fn main() {}\n", "rust", CFG)
    assert report.fallback == "no_grammar" and chunks[0].kind == "lines"


def test_file_too_large_for_parsing() -> None:
    text = "def f():\n    return 1\n" * 200
    cfg = ChunkingSettings(syntax_max_bytes=1000)
    _, report = run("big.py", text, "python", cfg)
    assert report.fallback == "too_large_to_parse"


def test_syntax_off_and_unknown_languages_use_windows() -> None:
    _, report = run("a.py", "def f():\n    pass\n", "python", ChunkingSettings(syntax=False))
    assert report.chunker == "lines" and report.fallback is None
    _, report = run("a.scala", "object A { def f = 1 }\n", "scala", CFG)
    assert report.chunker == "lines"


def test_every_grammar_loads() -> None:
    assert sorted(syntax.available_languages()) == sorted(syntax.GRAMMARS)


def test_deterministic() -> None:
    text = _big_class(20)
    cfg = ChunkingSettings(max_tokens=100, context_reserve_tokens=16)
    assert chunk_document("a.py", text, "python", cfg) == chunk_document("a.py", text, "python", cfg)


def test_without_tree_sitter_everything_is_line_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "tree_sitter", None)  # "import tree_sitter" now raises ImportError
    monkeypatch.setattr(syntax, "_languages", {})
    monkeypatch.setattr(syntax, "_local", type(syntax._local)())
    chunks, report = run("a.go", "package main\n\nfunc main() {}\n", "go", CFG)
    assert report.fallback == "no_grammar" and chunks[0].kind == "lines"
    assert syntax.available_languages() == []
