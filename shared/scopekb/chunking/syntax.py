"""Syntax-aware chunking with tree-sitter: one chunk per definition, code between definitions in line chunks.

Grammars come from the per-language wheels (``tree-sitter-python``, ``tree-sitter-javascript``, ...), imported
lazily; a missing wheel (or a missing ``tree-sitter``) means line chunking for that language
(:class:`SyntaxFallback` with reason ``no_grammar``).

Rules (rows are 0-based, chunks 1-based inclusive):

- Top-level children of the syntax tree are grouped by rows; nodes sharing a row are merged. A group that is one
  definition (function, class, method, struct, ...) becomes a definition chunk; comments (and Rust attributes)
  directly above it, without a blank line, belong to it. Namespaces, ``extern "C"`` blocks and preprocessor
  conditionals are transparent: their contents are treated like the top level. Everything else (imports,
  statements, ``}`` of namespaces) goes into line chunks, so every non-blank row is in exactly one chunk.
- A definition over the size budget is split: a class-like one (class, interface, struct, enum, trait, impl,
  module, object, record) into its members, each with symbol ``Outer.member`` and ``metadata["parent"]``,
  ``metadata["context"]`` (the parent's header); its own remaining rows (header, fields, closing lines) become
  chunks of the class itself. Any other definition is cut at statement boundaries (then lines); all its parts
  keep symbol, kind and signature and get ``metadata["part"]``/``["parts"]``.
- A tree with syntax errors falls back to line chunking (``cfg.on_syntax_error == "lines"``, the default), or
  only the broken top-level regions do (``"partial"``). A parse is cancelled after ``cfg.parse_timeout_s``
  seconds (progress callback, py-tree-sitter >= 0.25; ``timeout_micros`` on older versions), and files over
  ``cfg.syntax_max_bytes`` are not parsed.
"""

from __future__ import annotations

import importlib
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from scopekb.chunking.core import Doc, Piece

#: language -> (module, function returning the grammar pointer)
GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "java": ("tree_sitter_java", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "csharp": ("tree_sitter_c_sharp", "language"),
    "ruby": ("tree_sitter_ruby", "language"),
    "php": ("tree_sitter_php", "language_php"),
    "kotlin": ("tree_sitter_kotlin", "language"),
    "bash": ("tree_sitter_bash", "language"),
}

_JS_DEFS = {"function_declaration": "function", "generator_function_declaration": "function",
            "class_declaration": "class", "method_definition": "function"}
_TS_DEFS = {**_JS_DEFS, "abstract_class_declaration": "class", "interface_declaration": "interface",
            "type_alias_declaration": "type", "enum_declaration": "enum", "method_signature": "function",
            "abstract_method_signature": "function", "function_signature": "function"}
_C_DEFS = {"function_definition": "function", "struct_specifier": "struct", "union_specifier": "union",
           "enum_specifier": "enum", "type_definition": "type", "preproc_function_def": "macro"}

#: language -> node type -> kind
DEFS: dict[str, dict[str, str]] = {
    "python": {"function_definition": "function", "class_definition": "class"},
    "javascript": _JS_DEFS,
    "typescript": _TS_DEFS,
    "tsx": _TS_DEFS,
    "go": {"function_declaration": "function", "method_declaration": "method", "type_declaration": "type"},
    "rust": {"function_item": "function", "function_signature_item": "function", "struct_item": "struct",
             "enum_item": "enum", "union_item": "union", "trait_item": "trait", "impl_item": "impl",
             "mod_item": "module", "macro_definition": "macro", "type_item": "type"},
    "java": {"class_declaration": "class", "interface_declaration": "interface", "enum_declaration": "enum",
             "record_declaration": "record", "annotation_type_declaration": "interface",
             "method_declaration": "function", "constructor_declaration": "constructor",
             "compact_constructor_declaration": "constructor"},
    "c": _C_DEFS,
    "cpp": {**_C_DEFS, "class_specifier": "class", "concept_definition": "type"},
    "csharp": {"class_declaration": "class", "struct_declaration": "struct", "interface_declaration": "interface",
               "enum_declaration": "enum", "record_declaration": "record", "record_struct_declaration": "record",
               "method_declaration": "function", "constructor_declaration": "constructor",
               "destructor_declaration": "function", "operator_declaration": "function",
               "property_declaration": "property", "local_function_statement": "function"},
    "ruby": {"class": "class", "module": "module", "method": "function", "singleton_method": "function"},
    "php": {"function_definition": "function", "class_declaration": "class", "interface_declaration": "interface",
            "trait_declaration": "trait", "enum_declaration": "enum", "method_declaration": "function"},
    "kotlin": {"class_declaration": "class", "object_declaration": "object", "function_declaration": "function",
               "companion_object": "object", "secondary_constructor": "constructor"},
    "bash": {"function_definition": "function"},
}

#: node type -> field holding the wrapped definition (None: its first named child that is a definition)
WRAPPERS: dict[str, str | None] = {
    "decorated_definition": "definition",  # python
    "export_statement": "declaration",  # js/ts
    "template_declaration": None,  # c++
    "ambient_declaration": None,  # ts "declare ..."
    "list": None,  # bash "f() { ...; } && complete -F f cmd"
}
#: nodes whose children are treated like the level they are on (namespaces, conditionals, extern "C")
TRANSPARENT = frozenset({
    "preproc_ifdef", "preproc_if", "preproc_else", "preproc_elif", "preproc_elifdef", "linkage_specification",
    "namespace_definition", "namespace_declaration", "internal_module", "module", "enum_body_declarations",
})
#: transparent in these languages only ("module" is a Ruby definition but a TS namespace)
_TRANSPARENT_LANGS = {"module": {"typescript", "tsx"}, "internal_module": {"typescript", "tsx"}}
CONTAINER_KINDS = frozenset({"class", "interface", "struct", "union", "enum", "trait", "impl", "module",
                             "object", "record"})
_FUNC_KINDS = frozenset({"function"})
_BODY_TYPES = frozenset({"class_body", "declaration_list", "field_declaration_list", "body_statement",
                         "enum_body", "interface_body", "enum_class_body", "enum_declaration_list",
                         "enum_member_declaration_list", "annotation_type_body", "statement_block", "block",
                         "compound_statement", "function_body", "object_type"})
#: Statements :meth:`SyntaxChunker.js_value_def` reads a definition from.
_JS_VALUE_STATEMENTS = frozenset({"lexical_declaration", "variable_declaration", "expression_statement"})
_JS_VALUE_DEFS = {"arrow_function": "function", "function_expression": "function", "function": "function",
                  "generator_function": "function", "class": "class"}
_NAME_LEAVES = frozenset({"identifier", "field_identifier", "qualified_identifier", "operator_name",
                          "destructor_name", "type_identifier", "template_function", "template_method",
                          "operator_cast", "scoped_identifier", "primitive_type"})
_NAMESPACES = frozenset({"namespace_definition", "namespace_declaration", "internal_module", "module"})
_WS = re.compile(r"\s+")
_LAST_PART = re.compile(r"\.|::")
_MAX_SIGNATURE = 300
_MAX_DEPTH = 40


class SyntaxFallback(Exception):
    """Syntax chunking is not possible for this file; ``reason`` says why (for reports and metadata)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_languages: dict[str, Any] = {}
_lang_lock = threading.Lock()
_local = threading.local()


def load_language(language: str) -> Any | None:
    """The tree-sitter ``Language`` for a scopekb language name, or None when the grammar (or tree-sitter)
    is not installed. Cached per process."""
    if language not in GRAMMARS:
        return None
    with _lang_lock:
        if language in _languages:
            return _languages[language]
        lang = None
        try:
            import tree_sitter

            module, attr = GRAMMARS[language]
            lang = tree_sitter.Language(getattr(importlib.import_module(module), attr)())
        except Exception:  # ImportError, or an ABI the installed tree-sitter cannot load
            lang = None
        _languages[language] = lang
        return lang


def available_languages() -> list[str]:
    """Languages whose grammar loads here."""
    return [name for name in GRAMMARS if load_language(name) is not None]


def _parser(language: str, lang: Any) -> Any:
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    p = parsers.get(language)
    if p is None:
        import tree_sitter

        try:
            p = tree_sitter.Parser(lang)
        except TypeError:  # py-tree-sitter < 0.22
            p = tree_sitter.Parser()
            p.set_language(lang)
        parsers[language] = p
    return p


def parse(language: str, data: bytes, timeout_s: float) -> Any:
    """Parse ``data`` with a wall-clock bound.

    Raises:
        SyntaxFallback: ``no_grammar``, ``parse_timeout`` or ``parse_failed``.
    """
    lang = load_language(language)
    if lang is None:
        raise SyntaxFallback("no_grammar")
    parser = _parser(language, lang)
    parser.reset()
    deadline = time.monotonic() + timeout_s
    timed_out = False

    def progress(*_args: Any) -> bool:
        nonlocal timed_out
        if time.monotonic() > deadline:
            timed_out = True
        return timed_out

    step = 1 << 16

    def read(offset: int, _point: Any) -> bytes:
        return data[offset:offset + step]

    try:
        try:
            tree = parser.parse(read, progress_callback=progress)
        except TypeError:  # py-tree-sitter < 0.25: no progress callback, but a timeout_micros property
            if hasattr(parser, "timeout_micros"):
                parser.timeout_micros = int(timeout_s * 1_000_000)
            tree = parser.parse(data)
    except Exception as e:
        parser.reset()
        raise SyntaxFallback("parse_timeout" if timed_out else "parse_failed") from e
    if tree is None:
        parser.reset()
        raise SyntaxFallback("parse_timeout")
    return tree


@dataclass(slots=True)
class Def:
    """A definition found in the tree: ``outer`` spans it (with decorators/export/template), ``inner`` is the
    node with the name and body."""

    kind: str
    name: str | None
    outer: Any
    inner: Any
    sig_node: Any


@dataclass(slots=True)
class _Seg:
    s: int
    e: int
    items: list[tuple[str, Any]] = field(default_factory=list)  # ("def", Def) / ("ns", node) / ("comment", n) /…

    def only(self, tag: str) -> Any | None:
        """The one item tagged ``tag`` when every other item is a comment."""
        hits = [x for t, x in self.items if t == tag]
        if len(hits) == 1 and all(t in (tag, "comment") for t, _ in self.items):
            return hits[0]
        return None


@dataclass(slots=True)
class _Ctx:
    prefix: str | None = None
    parent_kind: str | None = None
    parent_sig: str | None = None
    tpl: Piece = field(default_factory=lambda: Piece(0, 0))
    namespace: tuple[str, ...] = ()
    depth: int = 0


class SyntaxChunker:
    """Chunks one parsed file. Use :func:`chunk_syntax`."""

    def __init__(self, doc: Doc, language: str, data: bytes, cfg: Any) -> None:
        self.doc = doc
        self.language = language
        self.data = data
        self.defs = DEFS[language]
        self.partial = cfg.on_syntax_error == "partial"
        #: Node types :meth:`as_def` can answer with a definition (any other: None): :func:`collect_defs` calls it
        #: only for these (issue 20: it was called for every named node, ~2.6 M calls for a django sync).
        self.def_types = frozenset(WRAPPERS) | frozenset(self.defs) | (
            _JS_VALUE_STATEMENTS if language in ("javascript", "typescript", "tsx") else frozenset())

    # -- tree helpers --------------------------------------------------------------------------------------
    def text(self, node: Any) -> str:
        """Source text of a node (UTF-8, undecodable bytes replaced)."""
        return self.data[node.start_byte:node.end_byte].decode("utf-8", errors="replace")

    @staticmethod
    def rows(node: Any) -> tuple[int, int]:
        """First and last row a node occupies (a node ending at column 0 does not occupy that row)."""
        s, e = node.start_point[0], node.end_point[0]
        if e > s and node.end_point[1] == 0:
            e -= 1
        return s, e

    @staticmethod
    def body(node: Any) -> Any | None:
        """The node's body (field ``body``, else its first child of a known body type), or None."""
        b = node.child_by_field_name("body")
        if b is not None:
            return b
        for c in node.named_children:
            if c.type in _BODY_TYPES:
                return c
        return None

    def is_transparent(self, node: Any) -> bool:
        """Whether a node's children are chunked as if they were on the node's own level."""
        t = node.type
        if t not in TRANSPARENT:
            return False
        langs = _TRANSPARENT_LANGS.get(t)
        if langs is not None and self.language not in langs:
            return False
        if t in ("namespace_definition", "internal_module", "module") and self.body(node) is None:
            return False  # PHP "namespace X;" / TS "declare module 'x';": a plain statement
        return True

    def transparent_children(self, node: Any) -> list[Any]:
        """Children of a transparent node to chunk (a namespace's body, a conditional's branches)."""
        if node.type in ("namespace_definition", "namespace_declaration", "internal_module", "module",
                         "linkage_specification"):
            b = self.body(node)
            return list(b.children) if b is not None else []
        return list(node.children)

    def name_of(self, node: Any) -> str | None:
        """A definition's name: field ``name``, or per language (Go receiver ``Type.Method``, Rust impl type,
        C/C++ declarator such as ``ns::f`` or ``operator==``, Kotlin companion ``Companion``); None if unnamed."""
        t = node.type
        if t == "method_declaration" and self.language == "go":
            name = node.child_by_field_name("name")
            recv = node.child_by_field_name("receiver")
            rtype = None
            if recv is not None:
                for p in recv.named_children:
                    ty = p.child_by_field_name("type")
                    if ty is not None:
                        rtype = self.text(ty).lstrip("*").split("[", 1)[0].strip()
                        break
            base = self.text(name) if name is not None else None
            return f"{rtype}.{base}" if rtype and base else base
        if t == "type_declaration":  # go: type X ... / type ( A ...; B ... )
            for c in node.named_children:
                n = c.child_by_field_name("name")
                if n is not None:
                    return self.text(n)
            return None
        if t == "impl_item":
            ty = node.child_by_field_name("type")
            if ty is None:
                return None
            base = ty.child_by_field_name("type") if ty.type == "generic_type" else ty
            return self.text(base if base is not None else ty)
        if t in ("function_definition", "type_definition") and self.language in ("c", "cpp"):
            d = node.child_by_field_name("declarator")
            for _ in range(12):
                if d is None or d.type in _NAME_LEAVES:
                    break
                nxt = d.child_by_field_name("declarator")
                if nxt is None:
                    named = [c for c in d.named_children if c.type not in ("parameter_list", "attribute")]
                    nxt = named[0] if named else None
                d = nxt
            return self.text(d) if d is not None else None
        if t == "companion_object":
            n = node.child_by_field_name("name")
            return self.text(n) if n is not None else "Companion"
        n = node.child_by_field_name("name")
        return self.text(n) if n is not None else None

    def as_def(self, node: Any, depth: int = 0) -> Def | None:
        """The definition a node is (through wrappers), or None."""
        t = node.type
        if depth > 4:
            return None
        if t in WRAPPERS:
            f = WRAPPERS[t]
            inner = node.child_by_field_name(f) if f else None
            candidates = [inner] if inner is not None else list(node.named_children)
            for c in candidates:
                d = self.as_def(c, depth + 1)
                if d is not None:
                    if d.name is None and t == "export_statement":
                        d.name = "default"
                    sig = d.sig_node if t == "decorated_definition" else node
                    return Def(d.kind, d.name, node, d.inner, sig)
            return None
        if self.language in ("javascript", "typescript", "tsx"):
            d = self.js_value_def(node)
            if d is not None:
                return d
        kind = self.defs.get(t)
        if kind is None:
            return None
        if t in ("struct_specifier", "union_specifier", "enum_specifier", "class_specifier", "mod_item") \
                and node.child_by_field_name("body") is None:
            return None  # a use of the type, or "mod foo;"
        name = self.name_of(node)
        if name is None and kind not in CONTAINER_KINDS and t != "method_definition":
            return None
        if t == "type_declaration":
            for c in node.named_children:
                ty = c.child_by_field_name("type")
                if ty is not None and ty.type in ("struct_type", "interface_type"):
                    kind = ty.type.removesuffix("_type")
                    break
        if t == "class_declaration" and self.language == "kotlin":
            if any(c.type == "interface" for c in node.children):
                kind = "interface"
        return Def(kind, name, node, node, node)

    def js_value_def(self, node: Any) -> Def | None:
        """``const f = () => ...`` / ``let C = class ...`` / ``exports.f = function ...``."""
        t = node.type
        if t in ("lexical_declaration", "variable_declaration"):
            decls = [c for c in node.named_children if c.type == "variable_declarator"]
            if len(decls) != 1:
                return None
            value, name = decls[0].child_by_field_name("value"), decls[0].child_by_field_name("name")
        elif t == "expression_statement" and node.named_child_count == 1 \
                and node.named_children[0].type == "assignment_expression":
            a = node.named_children[0]
            value, name = a.child_by_field_name("right"), a.child_by_field_name("left")
        else:
            return None
        if value is None or name is None or value.type not in _JS_VALUE_DEFS:
            return None
        return Def(_JS_VALUE_DEFS[value.type], self.text(name), node, value, node)

    def signature(self, d: Def) -> str | None:
        """Header text from the definition's start to its body, whitespace collapsed, at most 300 chars."""
        b = self.body(d.inner)
        start = d.sig_node.start_byte
        end = b.start_byte if b is not None and b.start_byte > start else min(d.inner.end_byte, start + 1000)
        for c in d.inner.children:  # a comment between header and body is not part of the signature
            if start < c.start_byte < end and self.is_comment(c):
                end = c.start_byte
                break
        raw = self.data[start:end].decode("utf-8", errors="replace")
        if b is None:
            raw = raw.split("\n", 1)[0]
        sig = _WS.sub(" ", raw).strip()
        return sig[:_MAX_SIGNATURE] or None

    @staticmethod
    def is_comment(node: Any) -> bool:
        """Comments, Rust attributes and decorators: attached to the definition below them."""
        return "comment" in node.type or node.type in ("attribute_item", "decorator")

    def collect_defs(self, root: Any) -> list[dict[str, Any]]:
        """Every named definition in the tree at any depth (members of classes kept whole, nested functions,
        definitions inside conditionals), as ``{"name", "path", "kind", "signature", "line"}``: ``path`` is the
        qualified name (``Outer.inner``; a Go method ``Type.Method``), ``line`` the 1-based row of its name, kind
        ``method`` for a function inside a class-like definition. In source order."""
        out: list[dict[str, Any]] = []
        stack: list[tuple[Any, str | None, str | None, int]] = [(root, None, None, 0)]
        while stack:
            node, prefix, pkind, depth = stack.pop()
            if depth > 2 * _MAX_DEPTH:
                continue
            for c in reversed(node.named_children):
                d = self.as_def(c) if c.type in self.def_types else None
                if d is None or not d.name:
                    stack.append((c if d is None else d.inner, prefix, pkind, depth + 1))
                    continue
                kind = "method" if d.kind in _FUNC_KINDS and pkind in CONTAINER_KINDS else d.kind
                path = f"{prefix}.{d.name}" if prefix else d.name
                name_node = d.inner.child_by_field_name("name")
                row = (name_node if name_node is not None else d.inner).start_point[0]
                out.append({"name": _LAST_PART.split(d.name)[-1] or d.name, "path": path, "kind": kind,
                            "signature": self.signature(d), "line": row + 1})
                stack.append((d.inner, path, kind, depth + 1))
        out.sort(key=lambda x: x["line"])
        return out

    # -- chunking ------------------------------------------------------------------------------------------
    def run(self, root: Any) -> list[Piece]:
        """Pieces for the whole tree, covering rows 0..n-1."""
        return self.region(list(root.children), 0, self.doc.n - 1, _Ctx())

    def region(self, nodes: list[Any], lo: int, hi: int, ctx: _Ctx) -> list[Piece]:
        """Pieces covering rows lo..hi, given the child nodes found there."""
        if ctx.depth > _MAX_DEPTH:
            raise SyntaxFallback("too_deep")
        segs: list[_Seg] = []
        for n in nodes:
            if not n.is_named:
                continue
            if n.type in ("expression_statement", "ambient_declaration") and n.named_child_count == 1 \
                    and self.is_transparent(n.named_children[0]):
                n = n.named_children[0]  # TS "namespace X {}" / "declare module 'x' {}"
            s, e = self.rows(n)
            s, e = max(s, lo), min(e, hi)
            if s > e:
                continue
            broken = self.partial and n.has_error
            if self.is_comment(n) or n.end_byte - n.start_byte <= 1:
                item: tuple[str, Any] = ("comment", n)  # comments and stray ";" do not break a definition
            elif not broken and self.is_transparent(n):
                item = ("ns", n)
            else:
                d = None if broken else self.as_def(n)
                item = ("def", d) if d is not None else ("other", n)
            if segs and s <= segs[-1].e:
                segs[-1].e = max(segs[-1].e, e)
                segs[-1].items.append(item)
            else:
                segs.append(_Seg(s, e, [item]))
        # comments directly above a definition (no blank row between) belong to it
        merged: list[_Seg] = []
        for seg in segs:
            if seg.only("def") is not None:
                while merged and all(t == "comment" for t, _ in merged[-1].items) and merged[-1].e + 1 == seg.s:
                    prev = merged.pop()
                    seg.s = prev.s
                    seg.items = prev.items + seg.items
            merged.append(seg)
        out: list[Piece] = []
        cursor = lo
        for seg in merged:
            d = seg.only("def")
            ns = seg.only("ns") if d is None else None
            if d is None and ns is None:
                continue
            self.doc.gap(cursor, seg.s - 1, ctx.tpl, out)
            if d is not None:
                out.extend(self.definition(d, seg.s, seg.e, ctx))
            else:
                name_node = ns.child_by_field_name("name") if ns.type in _NAMESPACES else None
                sub = _Ctx(ctx.prefix, ctx.parent_kind, ctx.parent_sig, ctx.tpl,
                           ctx.namespace + ((self.text(name_node),) if name_node is not None else ()),
                           ctx.depth + 1)
                out.extend(self.region(self.transparent_children(ns), seg.s, seg.e, sub))
            cursor = seg.e + 1
        self.doc.gap(cursor, hi, ctx.tpl, out)
        return out

    def definition(self, d: Def, s: int, e: int, ctx: _Ctx) -> list[Piece]:
        """Pieces of one definition on rows s..e: one piece when it fits, else its members (containers) or
        statement-boundary parts (everything else)."""
        doc = self.doc
        kind = "method" if d.kind in _FUNC_KINDS and ctx.parent_kind in CONTAINER_KINDS else d.kind
        symbol = d.name if not ctx.prefix else f"{ctx.prefix}.{d.name or '?'}"
        sig = self.signature(d)
        meta: dict[str, Any] = {}
        if ctx.prefix:
            meta["parent"] = ctx.prefix
            meta["parent_kind"] = ctx.parent_kind
            if ctx.parent_sig:
                meta["context"] = ctx.parent_sig
        if ctx.namespace:
            meta["namespace"] = ".".join(ctx.namespace)
        tpl = Piece(s, e, kind, symbol, sig, meta)
        t = doc.trim(s, e)
        if t is None:
            return []
        if doc.fits(*t):
            return [tpl.like(*t)]
        tpl.group = doc.new_group()
        b = self.body(d.inner)
        if d.kind in CONTAINER_KINDS and b is not None and b.named_child_count:
            sub = _Ctx(symbol, kind, sig, tpl, ctx.namespace, ctx.depth + 1)
            return self.region(list(b.children), s, e, sub)
        return doc.pack(self.units(d.inner, s, e, 0), tpl)

    def units(self, node: Any, lo: int, hi: int, depth: int) -> list[tuple[int, int]]:
        """Rows lo..hi as statement units: the body's children (merged when they share rows), single rows
        elsewhere; a unit over budget is cut into its own children's units (up to 6 levels), else rows."""
        b = self.body(node) or node
        spans: list[list[Any]] = []  # [s, e, node | None]
        for c in b.named_children:
            s, e = self.rows(c)
            s, e = max(s, lo), min(e, hi)
            if s > e:
                continue
            if spans and s <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], e)
                spans[-1][2] = None
            else:
                spans.append([s, e, c])
        out: list[tuple[int, int]] = []
        cursor = lo
        for s, e, c in spans:
            out.extend((r, r) for r in range(cursor, s))
            if c is not None and depth < 6 and e > s and not self.doc.fits(s, e) and c.named_child_count:
                out.extend(self.units(c, s, e, depth + 1))
            else:
                out.append((s, e))
            cursor = e + 1
        out.extend((r, r) for r in range(cursor, hi + 1))
        return out


def chunk_syntax(doc: Doc, language: str, cfg: Any, defs_out: list[dict[str, Any]] | None = None) -> list[Piece]:
    """Definition pieces for a whole document; ``defs_out`` (when given) receives every definition of the file
    (:meth:`SyntaxChunker.collect_defs`).

    Raises:
        SyntaxFallback: no grammar, file too large, parse timeout/failure, syntax errors (policy ``lines``),
            or a tree too deep to walk. The caller then uses line windows.
    """
    if language not in DEFS:
        raise SyntaxFallback("no_grammar")
    data = doc.text.encode("utf-8", errors="surrogatepass")
    if len(data) > cfg.syntax_max_bytes:
        raise SyntaxFallback("too_large_to_parse")
    tree = parse(language, data, float(cfg.parse_timeout_s))
    root = tree.root_node
    if root.has_error and cfg.on_syntax_error == "lines":
        raise SyntaxFallback("syntax_error")
    try:
        chunker = SyntaxChunker(doc, language, data, cfg)
        pieces = chunker.run(root)
        if defs_out is not None:
            defs_out.extend(chunker.collect_defs(root))
        return pieces
    except RecursionError as e:
        raise SyntaxFallback("too_deep") from e
