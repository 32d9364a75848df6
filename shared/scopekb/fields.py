"""Field names of the chunk document and the OpenSearch mapping built from them (DESIGN §3).

Writer and reader use these constants only; the mapping is ``"dynamic": "strict"`` so a typo fails loudly.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

AGENT_NAME = "agent_name"
CONTEXT_ID = "context_id"
SOURCE_ID = "source_id"
REPO = "repo"
REF = "ref"
#: Every ref (branch, tag, pinned commit) of the source whose indexed commit holds this chunk (issue 23): one
#: document per distinct (path, line range, content) of a source, whatever number of refs share it.
REFS = "refs"
COMMIT = "commit"
PATH = "path"
PATH_TEXT = "path.text"
LANGUAGE = "language"
KIND = "kind"
SYMBOL = "symbol"
SIGNATURE = "signature"
CONTENT = "content"
CHUNK_INDEX = "chunk_index"
START_LINE = "start_line"
END_LINE = "end_line"
CONTENT_SHA = "content_sha"
BLOB_SHA = "blob_sha"
EMBEDDING = "embedding"
EMBEDDING_MODEL = "embedding_model"
METADATA = "metadata"
INDEXED_AT = "indexed_at"
#: ``content`` cut into every 3-character sequence (3-grams of code points, case kept; postings without frequencies,
#: positions or norms): the candidate filter of exact/regex search (:func:`trigram_clauses`). Mapping versions 4-8
#: used a ``wildcard`` field here, which also indexes every 1- and 2-gram.
CONTENT_TRI = "content.tri"
#: Definitions in the chunk (stored, not indexed): ``[{"name", "path", "kind", "signature", "line"}]``.
DEFS = "defs"
#: Indexed views of ``defs`` for symbol search: names and qualified paths lower-cased (keyword + normalizer), kinds.
DEF_NAMES = "def_names"
DEF_PATHS = "def_paths"
DEF_KINDS = "def_kinds"

#: Bumped whenever the mapping or analyzers change; part of the concrete index name behind the alias.
#: 4: ``content.wc`` (wildcard), ``defs``/``def_names``/``def_paths``/``def_kinds``, ``metadata`` as ``flat_object``.
#: 5: vectors back in ``_source`` (4 left them out, and a membership update dropped them).
#: 6: vectors out of the stored ``_source`` again, through the k-NN plugin's derived source (issue 19): the stored
#: ``_source`` has no vector, and every read of it (get, search, update, update_by_query) gets the vector back from
#: the vector values, so membership updates keep it.
#: 7: no doc values for the vector (``doc_values: false``): the k-NN plugin kept a second float32 copy of every vector
#: there, as large as the vector file itself; kNN, the ``knn_score`` rescoring of ``sq`` and derived source read the
#: vector values (issue 19).
#: 8: stored fields with ``index.codec: best_compression`` (DEFLATE; the stored ``_source`` was 13% of the index at
#: version 7 and shrinks by 39%), and the ``int8`` vector encoder (:func:`int8_vector`, ``data_type: byte``: 384 bytes
#: a 384-d vector instead of 1,536; issue 19, docs/benchmarks.md).
#: 9: a leaner index for the same answers (issue 19, index bytes ÷ source bytes, docs/benchmarks.md): the candidate
#: filter of exact/regex search is ``content.tri`` (3-grams, postings only) instead of the ``wildcard`` field
#: ``content.wc``; ``content`` and ``path.text`` keep term frequencies but no positions (no query uses phrases);
#: no ``symbol.keyword``/``signature.keyword`` (nothing read them); doc values only on the fields sorted or
#: aggregated on (:data:`_NO_DOC_VALUES`).
MAPPING_VERSION = 9

#: BM25 field boosts in the order symbol, signature, content, path (the Turso seed weights name 5.0 and signature
#: 3.0 over content). A context may use others chosen on its own evaluation set (``scopekb eval --tune``,
#: :mod:`scopekb.tuning`); both stores take them as :func:`keyword_fields` / bm25() column weights.
KEYWORD_BOOSTS: tuple[float, float, float, float] = (5.0, 3.0, 1.0, 2.0)


def keyword_fields(boosts: tuple[float, ...] | None = None) -> list[str]:
    """The ``multi_match`` fields with their boosts (``None``: :data:`KEYWORD_BOOSTS`); a boost of 0 leaves the
    field out. Raises ValueError unless four finite boosts >= 0 with one > 0 are given."""
    b = KEYWORD_BOOSTS if boosts is None else tuple(float(x) for x in boosts)
    if len(b) != 4 or not all(x == x and 0 <= x < 1e6 for x in b) or not any(b):
        raise ValueError(f"keyword boosts must be four numbers >= 0, one of them > 0: {boosts!r}")
    return [f"{name}^{w:g}" for name, w in zip((SYMBOL, SIGNATURE, CONTENT, PATH_TEXT), b, strict=True) if w > 0]


KEYWORD_FIELDS = keyword_fields()

#: The OpenSearch ``multi_match`` of keyword search (besides ``query``): the fields searched as one field
#: (``cross_fields``, term by term: best field + 0.3 × the others), which is what FTS5's ``bm25()`` over the columns of
#: the SQLite store does; measured against ``best_fields`` in issue 21 (docs/benchmarks.md).
KEYWORD_MATCH: dict[str, Any] = {"fields": KEYWORD_FIELDS, "type": "cross_fields", "tie_breaker": 0.3}

CODE_ANALYZER = "scopekb_code"
TRIGRAM_ANALYZER = "scopekb_trigram"
CODE_SEARCH_ANALYZER = "scopekb_code_search"
LOWER_NORMALIZER = "scopekb_lower"

_ANALYSIS: dict[str, Any] = {
    "filter": {
        "scopekb_code_split": {
            # Split camelCase, snake_case, dots, punctuation and digits, keeping the original token so an exact
            # identifier still matches best.
            "type": "word_delimiter",
            "preserve_original": True,
            "split_on_case_change": True,
            "split_on_numerics": True,
            "generate_word_parts": True,
            "generate_number_parts": True,
            "catenate_words": False,
            "stem_english_possessive": False,
        }
    },
    "tokenizer": {
        # Identifiers (letters, digits, underscore) are tokens; everything else separates them.
        "scopekb_identifier": {"type": "pattern", "pattern": "[^\\p{L}\\p{N}_]+"},
        # every 3 consecutive code points of the text, whitespace and punctuation included (no token_chars)
        TRIGRAM_ANALYZER: {"type": "ngram", "min_gram": 3, "max_gram": 3},
    },
    "normalizer": {LOWER_NORMALIZER: {"type": "custom", "filter": ["lowercase"]}},
    "analyzer": {
        CODE_ANALYZER: {
            "type": "custom",
            "tokenizer": "scopekb_identifier",
            "filter": ["scopekb_code_split", "lowercase"],
        },
        # Queries keep identifiers whole: `parse_rfc3339` matches the preserved original token exactly instead of
        # every chunk that mentions "parse"; "retry upload" still matches the parts split at index time.
        CODE_SEARCH_ANALYZER: {
            "type": "custom",
            "tokenizer": "scopekb_identifier",
            "filter": ["lowercase"],
        },
        TRIGRAM_ANALYZER: {"type": "custom", "tokenizer": TRIGRAM_ANALYZER},
    },
}


def int8_vector(vec: Any) -> list[int]:
    """A vector as the ``int8`` encoder stores it: each value times ``127 / max|value|``, rounded to the nearest
    integer, so the largest value becomes ±127 and none is clipped.

    The scale is per vector: the index's space is cosine, which ignores the length of either vector, so any
    positive scale gives the same similarity and this one keeps the most precision. Measured on 1,497 chunks of
    scopekb's own source with all-MiniLM-L6-v2 (largest value of a unit vector 0.16 median, 0.25 at most): the
    top 10 by cosine of the int8 vectors held 99.5% of the exact float32 top 10 (100 queries); a fixed scale of
    127 / 0.25 held 99.1%, 127 / 0.5 97.9% (issue 19, docs/benchmarks.md). ``vec``: finite numbers, not all zero
    (an all-zero vector is returned as zeros). Returns ``len(vec)`` ints in [-127, 127].
    """
    vals = [float(x) for x in vec]
    top = max((abs(x) for x in vals), default=0.0)
    if not top:
        return [0] * len(vals)
    scale = 127.0 / top
    return [max(-127, min(127, round(x * scale))) for x in vals]


def stored_vector(vec: Any, encoder: str) -> list[float] | list[int]:
    """``vec`` (floats) as a chunk index with ``encoder`` takes it: ints by :func:`int8_vector` for ``int8``, else
    floats."""
    return int8_vector(vec) if encoder == "int8" else [float(x) for x in vec]


#: Fields only filtered on (term, terms, range, exists queries), never sorted or aggregated on: no doc values (mapping
#: version 9). Sorted or aggregated on, so with doc values: path, chunk_index, source_id, context_id, agent_name,
#: content_sha, blob_sha, indexed_at (:mod:`scopekb.stores.opensearch`).
_NO_DOC_VALUES = (REPO, REF, REFS, COMMIT, LANGUAGE, KIND, EMBEDDING_MODEL, DEF_NAMES, DEF_PATHS, DEF_KINDS,
                  START_LINE, END_LINE)

#: At most this many 3-gram terms in one candidate filter (:func:`trigram_clauses`): OpenSearch counts every clause
#: of a query (a ``terms`` clause of up to 16 values becomes one per value) against
#: ``indices.query.bool.max_clause_count`` (1,024 by default).
MAX_TRIGRAM_CLAUSES = 512
#: Characters that match an ASCII letter ignoring case besides its two ASCII cases (Unicode simple case folding:
#: KELVIN SIGN folds to ``k``, LATIN SMALL LETTER LONG S to ``s``; RE2's ``(?i)`` matches them).
_FOLDS_TO_ASCII = {"k": "\u212a", "s": "\u017f"}


def _case_variants(ch: str) -> list[str]:
    """The characters a literal's ``ch`` matches ignoring case: itself unless it is an ASCII letter."""
    if not (ch.isascii() and ch.isalpha()):
        return [ch]
    low = ch.lower()
    return [low, low.upper(), *([_FOLDS_TO_ASCII[low]] if low in _FOLDS_TO_ASCII else [])]


def trigram_clauses(literals: list[str], case_sensitive: bool, budget: int = MAX_TRIGRAM_CLAUSES
                    ) -> list[dict[str, Any]]:
    """Filter clauses on :data:`CONTENT_TRI` that every document holding all of ``literals`` satisfies: each literal
    requires its 3-grams (code points, as the ``ngram`` tokenizer cuts them). With ``case_sensitive`` false the
    literals are ASCII (:class:`scopekb.textsearch.LiteralQuery`) and each 3-gram is a ``terms`` clause over its
    case variants (ASCII upper and lower case, plus the two non-ASCII letters that fold to ``k`` and ``s``).

    The clauses are a candidate filter, a superset of the answer: line verification (:mod:`scopekb.textsearch`)
    decides. Literals shorter than 3 characters give no clause. ``budget`` bounds the terms of all clauses
    (OpenSearch counts each against ``indices.query.bool.max_clause_count``): when the 3-grams need more, each
    literal keeps an evenly spread share of its own (with two or more, the first and last), which only widens the
    filter. Returns a list of ``term``/``terms`` clauses (empty: no filter)."""
    grams_of = []
    for lit in literals:
        g = list(dict.fromkeys(lit[i:i + 3] for i in range(len(lit) - 2)))
        if g:
            grams_of.append(g)
    if not grams_of:
        return []
    # a case-insensitive 3-gram of letters has up to 27 variants, 8 for most
    share = max(1, budget // len(grams_of) // (1 if case_sensitive else 8))
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for g in grams_of:
        if len(g) > share:
            step = (len(g) - 1) / max(1, share - 1)
            g = [g[round(i * step)] for i in range(share)] if share > 1 else [g[len(g) // 2]]
        for gram in g:
            if gram in seen:
                continue
            seen.add(gram)
            variants = [""]
            for ch in ([gram] if case_sensitive else gram):
                variants = [v + c for v in variants for c in ([ch] if case_sensitive else _case_variants(ch))]
            if len(variants) > budget:
                continue
            budget -= len(variants)
            out.append({"terms": {CONTENT_TRI: sorted(set(variants))}} if len(variants) > 1
                       else {"term": {CONTENT_TRI: gram}})
    return out


def chunk_mapping(dimension: int | None, model: str | None = None, encoder: str = "none") -> dict[str, Any]:
    """Return the chunk index mapping; ``dimension`` None means keyword-only (no ``embedding`` field).

    Vectors use the ``lucene`` engine (hnsw, cosinesimil): the k-NN plugin here has no native libraries and its
    default engine would end the node (DESIGN §8). Vectors are not stored in ``_source``: the index has the k-NN
    plugin's derived source on (:func:`chunk_index_settings`), which leaves the vector out of the stored
    ``_source`` and puts it back from the vector values whenever the source is read. That matters because ref
    membership (issue #23) and the embedding stage change chunks with partial updates and ``update_by_query``, which
    re-index each document from its ``_source``: with a plain ``_source.excludes`` the first membership change
    silently drops the vector (measured on OpenSearch 2.19 with mapping version 4: the chunk no longer answers
    kNN), with derived source it survives (``tests/integration/test_vectors_source.py``). The vector as JSON
    floats was 86% of a chunk's stored ``_source`` (issue 19). A reindex still takes vectors from the embedding
    cache (:mod:`scopekb.reindex`), never from ``_source``. ``encoder`` ``sq``: Lucene's scalar quantization
    (int8 per dimension, OpenSearch ≥ 2.16) of the stored vectors the graph is built and searched on, the float32
    vectors kept beside them; ``int8``: the vectors themselves are bytes (``data_type: byte``, values from
    :func:`int8_vector`; the OpenSearch store converts what it writes and the query vector).
    ``_meta`` records ``model`` and ``encoder`` so a process configured for other vectors refuses the index.
    """
    text_kw = {"type": "text", "analyzer": CODE_ANALYZER, "search_analyzer": CODE_SEARCH_ANALYZER}
    props: dict[str, Any] = {
        AGENT_NAME: {"type": "keyword"},
        CONTEXT_ID: {"type": "keyword"},
        SOURCE_ID: {"type": "keyword"},
        REPO: {"type": "keyword"},
        REF: {"type": "keyword"},
        REFS: {"type": "keyword"},
        COMMIT: {"type": "keyword"},
        PATH: {"type": "keyword", "fields": {"text": {"type": "text", "analyzer": CODE_ANALYZER,
                                                      "search_analyzer": CODE_SEARCH_ANALYZER,
                                                      "index_options": "freqs"}}},
        LANGUAGE: {"type": "keyword"},
        KIND: {"type": "keyword"},
        SYMBOL: text_kw,
        SIGNATURE: text_kw,
        CONTENT: {"type": "text", "analyzer": CODE_ANALYZER, "search_analyzer": CODE_SEARCH_ANALYZER,
                  "index_options": "freqs",
                  "fields": {CONTENT_TRI.split(".", 1)[1]: {"type": "text", "analyzer": TRIGRAM_ANALYZER,
                                                            "index_options": "docs", "norms": False}}},
        CHUNK_INDEX: {"type": "integer"},
        START_LINE: {"type": "integer"},
        END_LINE: {"type": "integer"},
        CONTENT_SHA: {"type": "keyword"},
        BLOB_SHA: {"type": "keyword"},
        EMBEDDING_MODEL: {"type": "keyword"},
        # flat_object: every leaf is a keyword at its dotted path (``metadata.author``); never a mapping explosion
        METADATA: {"type": "flat_object"},
        INDEXED_AT: {"type": "date"},
        DEFS: {"type": "object", "enabled": False},
        DEF_NAMES: {"type": "keyword", "normalizer": LOWER_NORMALIZER, "ignore_above": 512},
        DEF_PATHS: {"type": "keyword", "normalizer": LOWER_NORMALIZER, "ignore_above": 1024},
        DEF_KINDS: {"type": "keyword"},
    }
    for name in _NO_DOC_VALUES:
        props[name] = {**props[name], "doc_values": False}
    if dimension:
        props[EMBEDDING] = {
            "type": "knn_vector",
            "dimension": dimension,
            # the plugin's binary doc values would hold a second float32 copy of each vector (1,536 bytes a chunk
            # at 384 dimensions); kNN, knn_score and derived source read Lucene's vector values instead
            "doc_values": False,
            **({"data_type": "byte"} if encoder == "int8" else {}),
            "method": {"name": "hnsw", "engine": "lucene", "space_type": "cosinesimil",
                       "parameters": {"m": 16, "ef_construction": 128,
                                      **({"encoder": {"name": "sq"}} if encoder == "sq" else {})}},
        }
    mapping: dict[str, Any] = {
        "dynamic": "strict",
        "_meta": {"mapping_version": MAPPING_VERSION, "dimension": dimension, "model": model if dimension else None,
                  "encoder": encoder if dimension else None},
        "properties": props}
    return mapping


#: Chunk kinds that are not definitions (line windows, markdown sections, notebook cells).
_NOT_DEFS = frozenset({"lines", "section", "cell", "markdown", "text"})


def def_fields(defs: list[dict[str, Any]] | None, symbol: str | None = None, kind: str | None = None,
               signature: str | None = None, start_line: int | None = None) -> dict[str, Any]:
    """The symbol-search fields of a chunk document from its definitions: ``{DEFS, DEF_NAMES, DEF_PATHS,
    DEF_KINDS}`` (names and paths lower-cased, each list de-duplicated in order).

    ``defs`` None (a chunk written before mapping version 4, copied by a reindex): one definition is derived from
    the chunk's own ``symbol``/``kind``/``signature`` when its kind is a definition kind, so such chunks are still
    found by their top-level symbol until the next full sync records every definition.
    """
    if defs is None:
        defs = []
        if symbol and kind and kind not in _NOT_DEFS:
            defs = [{"name": symbol.rsplit(".", 1)[-1], "path": symbol, "kind": kind, "signature": signature,
                     "line": start_line}]
    names: dict[str, None] = {}
    paths: dict[str, None] = {}
    kinds: dict[str, None] = {}
    for d in defs:  # one pass (issue 20: this runs for every chunk a sync writes)
        name, qual, kind = d.get("name"), d.get("path"), d.get("kind")
        if name:
            names[str(name).lower()] = None
        if qual:
            paths[str(qual).lower()] = None
        if kind:
            kinds[str(kind)] = None
    return {DEFS: defs, DEF_NAMES: list(names), DEF_PATHS: list(paths), DEF_KINDS: list(kinds)}


def metadata_text(value: Any) -> str:
    """A metadata value as stores compare it: booleans ``true``/``false``, anything else ``str(value)`` (OpenSearch's
    ``flat_object`` keeps every leaf as such a keyword)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


#: Nesting kept by :func:`storable_metadata`; deeper values are stored as text (OpenSearch's own object depth limit,
#: ``index.mapping.depth.limit``, is 20; front matter stops at 4 levels, :func:`scopekb.chunking.front_matter`).
_METADATA_DEPTH = 8


def storable_metadata(value: Any, depth: int = 0) -> Any:
    """``value`` (a chunk's metadata: front matter, S3 object metadata, chunker facts - all untrusted) as plain JSON
    both stores accept (SQLite ``json``, OpenSearch ``flat_object``): string keys (an empty key becomes ``"_"``),
    lists for tuples and sets, non-finite floats (YAML ``.nan``, ``.inf``; JSON has no such number, RFC 8259 §6)
    and any other non-JSON value (bytes, dates, objects) as text, objects nested deeper than 8 levels as their JSON
    text. Never raises; finite numbers, booleans, strings and None are returned as they are."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        if depth >= _METADATA_DEPTH:
            return json.dumps(storable_metadata(value, 0), ensure_ascii=False, default=str)[:1000]
        return {(str(k) or "_"): storable_metadata(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [storable_metadata(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def flatten_metadata(meta: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Leaves of a metadata object as ``(dotted key, value as text)`` pairs, like OpenSearch's ``flat_object``:
    nested objects join their keys with ``.``, a list gives one pair per element, ``None`` gives none, booleans
    are ``true``/``false``. ``{"a": {"b": [1, True]}}`` → ``[("a.b", "1"), ("a.b", "true")]``."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [(f"{prefix}{k}", v) for k, v in meta.items()]
    while stack and len(out) < 10_000:
        key, v = stack.pop(0)
        if v is None:
            continue
        if isinstance(v, dict):
            stack.extend((f"{key}.{k}", x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((key, x) for x in v)
        else:
            out.append((key, metadata_text(v)))
    return out


def chunk_index_settings(shards: int, replicas: int, knn: bool, encoder: str = "none") -> dict[str, Any]:
    """Index settings for a chunk index: shards/replicas, analyzers, the stored fields' codec, and when vectors are
    stored ``index.knn`` with ``index.knn.derived_source.enabled`` (k-NN plugin ≥ 2.19, a static setting: vectors
    kept out of the stored ``_source`` and derived from the vector values on every read; see
    :func:`chunk_mapping`). Not for the ``int8`` encoder: derived source of k-NN 2.19.1 reads float vectors only
    (a read of a byte vector's document fails with "VectorValuesIterator is not of a valid type"), so int8 vectors
    stay in ``_source`` as JSON integers, which membership updates copy with the rest of the document."""
    s: dict[str, Any] = {"number_of_shards": shards, "number_of_replicas": replicas, "analysis": _ANALYSIS,
                         # DEFLATE for stored fields (the k-NN plugin's codec keeps this delegate): on itsdangerous
                         # 2.1.2 the .fdt file went from 118,315 to 71,841 bytes (docs/benchmarks.md, issue 19)
                         "codec": "best_compression"}
    if knn:
        s["knn"] = True
        s["knn.derived_source.enabled"] = encoder != "int8"
    return {"index": s}


def index_version_name(alias: str, dimension: int | None, model: str | None, encoder: str = "none") -> str:
    """Concrete index name behind ``alias`` for one mapping version, embedding model and vector encoder.

    Example: ``scopekb-chunks-v1-kw`` (keyword-only) or ``scopekb-chunks-v1-384-1a2b3c4d`` (the tag hashes the
    model id, plus ``|sq`` with scalar quantization).
    """
    if not dimension:
        return f"{alias}-v{MAPPING_VERSION}-kw"
    tag = hashlib.sha256(((model or "") + (f"|{encoder}" if encoder in ("sq", "int8") else "")).encode()
                         ).hexdigest()[:8]
    return f"{alias}-v{MAPPING_VERSION}-{dimension}-{tag}"


def chunk_id(agent_name: str, context_id: str, source_id: str, path: str, start_line: int, end_line: int,
             content_sha: str) -> str:
    """Deterministic, stable document ``_id`` of a chunk (DESIGN §3; issue 20).

    Computed from the scope, the source (the repository within the scope), the path, the chunk's line range
    (1-based, inclusive) and ``content_sha`` (:func:`chunk_sha`: the chunk's text and what the chunker derived
    for it) - never from the ref, the commit, the blob or a per-sync counter. So a retried or duplicated task
    overwrites instead of duplicating, and when a file changes the chunks whose content and position did not
    change keep their id: a sync rewrites only the chunks that really changed and deletes only vanished ids.

    Returns a 40-character hex string (sha256 prefix) of the NUL-joined fields.
    """
    raw = "\0".join([agent_name, context_id, source_id, path, str(start_line), str(end_line), content_sha])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:40]


def chunk_sha(content: str, kind: str = "lines", symbol: str | None = None, signature: str | None = None,
              metadata: dict[str, Any] | None = None) -> str:
    """Identity of what a chunker produced for one chunk, for :func:`chunk_id`: sha256 hex of the content and,
    when any is set beyond the defaults, the kind, symbol, signature and metadata (a chunk whose text is unchanged
    but whose enclosing symbol was renamed is a changed chunk). Equal to ``sha256(content)`` for a plain line
    chunk, so it is also the ``content_sha`` field of line chunks."""
    h = hashlib.sha256(content.encode("utf-8"))
    if kind != "lines" or symbol or signature or metadata:
        extra = json.dumps([kind, symbol, signature, metadata or {}], sort_keys=True, ensure_ascii=False,
                           default=str)
        h.update(b"\0" + extra.encode("utf-8"))
    return h.hexdigest()
