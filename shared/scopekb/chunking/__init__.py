"""Chunking: documents in, :class:`scopekb.models.Chunk` lists out (DESIGN §4.5, issue #6).

:func:`chunk_document` is the single entry point used by the indexers. It picks a chunker by language:

- code with a tree-sitter grammar wheel installed (python, javascript, typescript, tsx, go, rust, java, c, cpp,
  csharp, ruby, php, kotlin, bash): one chunk per definition, code between definitions in line chunks
  (:mod:`scopekb.chunking.syntax`);
- ``markdown``: by heading hierarchy (:mod:`scopekb.chunking.markdown`);
- ``notebook`` (``.ipynb``): by cell, outputs dropped (:mod:`scopekb.chunking.notebook`);
- anything else, and every fallback: line windows with overlap (:mod:`scopekb.chunking.lines`).

Guarantees, for any text input (tested with hypothesis in tests/unit/test_chunking_properties.py):

- never raises; a syntax error, parse timeout, parser exception, missing grammar or over-large file falls back
  to line windows (the reason is in :func:`chunk_with_report`'s report and in ``metadata["fallback"]``);
- deterministic: the same input gives the same chunks;
- every chunk has at most ``budget`` tokens by the given :class:`~scopekb.chunking.tokens.TokenCounter`
  (``min(cfg.max_tokens, counter.limit)`` less ``cfg.context_reserve_tokens`` when ``cfg.embed_context``) and at
  most ``cfg.max_chars`` characters; :func:`embedding_text` stays within ``counter.limit``;
- ``1 <= start_line <= end_line <= number of lines``; ``content`` equals those lines joined by ``\\n``, except
  pieces of an over-long single line, whose content is ``line[col_start:col_end]`` (``metadata["col_start"]``,
  ``["col_end"]``, ``["line_part"]``), and notebook chunks (cell source; see the notebook module);
- coverage: every non-blank line is in exactly one chunk, except that consecutive plain line windows share at
  most ``cfg.overlap_lines`` lines, and skipped over-long lines (``cfg.long_lines == "skip"``).
"""

from __future__ import annotations

import bisect
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from scopekb.chunking.core import Doc, Piece
from scopekb.chunking.markdown import chunk_markdown
from scopekb.chunking.notebook import NotebookError, chunk_notebook
from scopekb.chunking.syntax import GRAMMARS, SyntaxFallback, available_languages, chunk_syntax
from scopekb.chunking.tokens import (
    EstimateCounter,
    HFTokenizerCounter,
    TiktokenCounter,
    TokenCounter,
    counter_for_model,
    default_counter,
)
from scopekb.logging import get_logger
from scopekb.models import Chunk
from scopekb.settings import ChunkingSettings

__all__ = [
    "ChunkingReport", "EstimateCounter", "HFTokenizerCounter", "TiktokenCounter", "TokenCounter",
    "available_languages", "chunk_document", "chunk_with_report", "counter_for_model", "default_counter",
    "embedding_text", "SYNTAX_LANGUAGES",
]

log = get_logger(__name__)

#: Languages with a syntax-aware chunker (when their grammar wheel is installed).
SYNTAX_LANGUAGES = frozenset(GRAMMARS)


@dataclass(slots=True)
class ChunkingReport:
    """How a document was chunked.

    Attributes:
        chunker: ``syntax``, ``markdown``, ``notebook`` or ``lines``.
        fallback: why the language's own chunker was not used (``no_grammar``, ``syntax_error``,
            ``parse_timeout``, ``parse_failed``, ``too_large_to_parse``, ``too_deep``, ``not_a_notebook``,
            ``error:<ExceptionType>``), else None.
        skipped: ``(line, reason)`` of lines left out (``line_too_long`` under ``long_lines="skip"``).
        counter: the token counter's name; budget: the content budget in tokens; seconds: wall time.
    """

    chunker: str = "lines"
    fallback: str | None = None
    skipped: list[tuple[int, str]] = field(default_factory=list)
    counter: str = ""
    budget: int = 0
    seconds: float = 0.0


def chunk_document(path: str, text: str, language: str, cfg: ChunkingSettings,
                   counter: TokenCounter | None = None) -> list[Chunk]:
    """Cut one decoded document into chunks, numbered 0.. in order. Never raises.

    Args:
        path: repository-relative path (used for the notebook check and for context).
        text: decoded text with LF line ends.
        language: from :func:`scopekb.filetypes.language_for`.
        cfg: sizes and policies (:class:`scopekb.settings.ChunkingSettings`).
        counter: the embedder's token counter (see :func:`counter_for_model`); default: the estimate sized by
            ``cfg.max_tokens`` (keyword-only mode).

    Returns:
        Chunks with 1-based inclusive ``start_line``/``end_line``; see the module docstring for guarantees.
    """
    return chunk_with_report(path, text, language, cfg, counter)[0]


def chunk_with_report(path: str, text: str, language: str, cfg: ChunkingSettings,
                      counter: TokenCounter | None = None) -> tuple[list[Chunk], ChunkingReport]:
    """:func:`chunk_document` plus a :class:`ChunkingReport` (chunker used, fallback reason, skipped lines)."""
    t0 = time.perf_counter()
    counter = counter if counter is not None else default_counter(cfg)
    report = ChunkingReport(counter=getattr(counter, "name", type(counter).__name__))
    try:
        chunks = _chunk(path, text, language, cfg, counter, report)
    except Exception as e:  # never take the worker down: plain line windows with the estimate
        log.warning("chunking_failed", path=path, language=language, error=type(e).__name__, detail=str(e)[:200])
        report.chunker, report.fallback = "lines", f"error:{type(e).__name__}"
        try:
            chunks = _lines(Doc(text, cfg, default_counter(cfg)), report)
        except Exception:  # pragma: no cover - last resort, should be unreachable
            chunks = _crude(text, cfg)
    for i, c in enumerate(chunks):
        c.chunk_index = i
    report.seconds = time.perf_counter() - t0
    return chunks, report


def _chunk(path: str, text: str, language: str, cfg: ChunkingSettings, counter: TokenCounter,
           report: ChunkingReport) -> list[Chunk]:
    if language == "notebook" or path.lower().endswith(".ipynb"):
        def sub(cell_text: str, lang: str) -> tuple[list[Chunk], ChunkingReport]:
            return chunk_with_report(f"{path}#cell", cell_text, lang, cfg, counter)

        try:
            chunks = chunk_notebook(text, cfg, counter, sub)
            for c in chunks:  # cell-relative definition lines: not recorded for notebooks
                c.defs = []
            report.chunker = "notebook"
            report.budget = Doc("", cfg, counter).budget
            return chunks
        except NotebookError:
            report.fallback = "not_a_notebook"
            return _lines(Doc(text, cfg, counter), report)
    if language == "markdown":
        doc = Doc(text, cfg, counter)
        report.chunker, report.budget = "markdown", doc.budget
        chunks = _finish(doc, chunk_markdown(doc, cfg), report)
        fm = front_matter(text)
        if fm:  # the document's front matter on each of its chunks, for metadata filters
            for c in chunks:
                c.metadata["front_matter"] = fm
        return chunks
    if cfg.syntax and language in SYNTAX_LANGUAGES:
        if len(text) > cfg.syntax_max_bytes:  # cheap check before counting tokens of every line
            report.fallback = "too_large_to_parse"
            return _lines(Doc(text, cfg, counter), report)
        doc = Doc(text, cfg, counter)
        defs: list[dict[str, Any]] = []
        try:
            pieces = chunk_syntax(doc, language, cfg, defs)
        except SyntaxFallback as f:
            report.fallback = f.reason
            return _lines(doc, report)
        report.chunker, report.budget = "syntax", doc.budget
        return _attach_defs(_finish(doc, pieces, report), defs)
    return _lines(Doc(text, cfg, counter), report)


def _finish(doc: Doc, pieces: list[Piece], report: ChunkingReport) -> list[Chunk]:
    report.skipped.extend(doc.skipped)
    return doc.to_chunks(pieces)


#: Front matter kept: characters of the block, leaves, nesting depth, characters of a string value.
_FM_MAX_CHARS, _FM_MAX_LEAVES, _FM_MAX_DEPTH, _FM_MAX_VALUE = 16_384, 200, 4, 1_000


def front_matter(text: str) -> dict[str, Any]:
    """The YAML front matter of a Markdown document (a ``---`` first line, closed by ``---`` or ``...`` within
    500 lines, as the Markdown chunker reads it) as plain data: string keys; strings, numbers, booleans, lists
    and objects (dates as ISO text, non-finite numbers such as ``.nan`` as text), at most 200 leaves, 4 levels
    and 1,000 characters a string; ``{}`` when
    absent, malformed, not a mapping or over 16 KiB. Parsed with ``yaml.safe_load`` (no object construction);
    aliases count once per use against the leaf bound, so a "billion laughs" block stays small."""
    if not text.startswith("---"):
        return {}
    lines = text.split("\n", 501)
    if lines[0].strip() != "---":
        return {}
    end = next((r for r in range(1, min(len(lines), 500)) if lines[r].strip() in ("---", "...")), None)
    if end is None:
        return {}
    block = "\n".join(lines[1:end])
    if len(block) > _FM_MAX_CHARS:
        return {}
    import yaml

    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError:
        return {}
    if not isinstance(data, dict):
        return {}
    budget = [_FM_MAX_LEAVES]

    def plain(v: Any, depth: int) -> Any:
        if budget[0] <= 0 or depth > _FM_MAX_DEPTH:
            return None
        if isinstance(v, dict):
            return {str(k)[:200]: x for k, x in ((k, plain(x, depth + 1)) for k, x in v.items()) if x is not None}
        if isinstance(v, list):
            return [x for x in (plain(x, depth + 1) for x in v) if x is not None]
        budget[0] -= 1
        if isinstance(v, bool | int):
            return v
        if isinstance(v, float):  # YAML's .nan/.inf: no JSON number (stores refuse the document), kept as text
            return v if math.isfinite(v) else str(v)
        if hasattr(v, "isoformat"):
            return v.isoformat()
        return None if v is None else str(v)[:_FM_MAX_VALUE]

    out = plain(data, 0)
    return out if isinstance(out, dict) else {}


def _attach_defs(chunks: list[Chunk], defs: list[dict[str, Any]]) -> list[Chunk]:
    """Give each chunk the definitions whose name line it holds (the first piece of an over-long line only)."""
    lines = [d["line"] for d in defs]  # ascending
    for c in chunks:
        if c.metadata.get("col_start", 0):
            continue
        lo, hi = bisect.bisect_left(lines, c.start_line), bisect.bisect_right(lines, c.end_line)
        c.defs = [dict(d) for d in defs[lo:hi]]
    return chunks


def _lines(doc: Doc, report: ChunkingReport) -> list[Chunk]:
    report.chunker, report.budget = "lines", doc.budget
    tpl = Piece(0, 0, meta={"fallback": report.fallback} if report.fallback else {})
    return _finish(doc, doc.windows(0, doc.n - 1, tpl), report)


def _crude(text: str, cfg: ChunkingSettings) -> list[Chunk]:  # pragma: no cover - see chunk_with_report
    out = []
    for i, line in enumerate(text.split("\n")):
        for k in range(0, len(line), max(1, cfg.max_chars // 4)):
            piece = line[k:k + max(1, cfg.max_chars // 4)]
            if piece.strip():
                out.append(Chunk(piece, i + 1, i + 1, metadata={"fallback": "crude"}))
    return out


_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_CAMEL = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def identifier_words(text: str) -> list[str]:
    """Lower-case words of the identifiers in ``text``, split at ``_``, ``.`` and camelCase, first occurrence
    kept: ``"HTTPClient.send_request"`` → ``["http", "client", "send", "request"]``."""
    out: dict[str, None] = {}
    for ident in _IDENT.findall(text.replace("_", " ")):
        for w in _CAMEL.findall(ident):
            out.setdefault(w.lower(), None)
    return list(out)


def embedding_text(path: str, language: str, chunk: Chunk, cfg: ChunkingSettings,
                   counter: TokenCounter | None = None) -> str:
    """The text to embed for a chunk: a short context header, a blank line, then the chunk content.

    The header names the path, the language, the symbol and kind, the parent's header (``metadata["context"]``)
    and markdown heading path, e.g.::

        path: src/click/core.py
        language: python
        symbol: Command.invoke (method)
        in: class Command(BaseCommand):

    With ``cfg.embed_context`` off it is the content alone. The result stays within ``counter.limit`` tokens
    (default counter: the estimate of ``cfg``): header lines are dropped from the end, then the path is shortened
    from the left, and as a last resort the content is returned alone. Chunks from :func:`chunk_document`
    leave ``cfg.context_reserve_tokens`` free for the header.
    """
    if not cfg.embed_context:
        return chunk.content
    counter = counter if counter is not None else default_counter(cfg)
    limit = min(int(counter.limit), int(cfg.max_tokens))
    header = [f"path: {path}", f"language: {language}"]
    if chunk.symbol:
        header.append(f"symbol: {chunk.symbol} ({chunk.kind})")
    if cfg.embed_header == "words":
        stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        words = identifier_words(f"{chunk.symbol or ''} {stem}")
        if words:
            header.append("words: " + " ".join(words))
    headings = chunk.metadata.get("headings") if isinstance(chunk.metadata, dict) else None
    if headings:
        header.append("section: " + " > ".join(str(h) for h in headings))
    context = chunk.metadata.get("context") if isinstance(chunk.metadata, dict) else None
    if context:
        header.append(f"in: {context}")
    header = [h[:200] for h in header]
    while header:
        text = "\n".join(header) + "\n\n" + chunk.content
        if counter.count(text) <= limit:
            return text
        if len(header) > 1:
            header.pop()
        elif len(header[0]) > 24:
            header[0] = "path: …" + header[0][len(header[0]) // 2:]
        else:
            header.pop()
    return chunk.content
