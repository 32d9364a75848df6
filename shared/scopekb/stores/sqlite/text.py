"""Tokenisation of the SQLite chunk index, mirroring the OpenSearch analyzers of :mod:`scopekb.fields`.

At index time identifiers are split into parts (camelCase, snake_case, digits) and the original identifier is
kept; at query time identifiers stay whole. The FTS5 table receives the tokens as one space-separated string.
Also the SQL function behind path-glob filters (:func:`glob_match`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from scopekb.patterns import CEILING, PatternRefused, compile_glob

# Python's \w is letters, digits and "_" (marks excluded), like the pattern tokenizer [^\p{L}\p{N}_]+ splits on.
_WORD = re.compile(r"\w+")
# Lucene word_delimiter subwords for ASCII: an upper-case run may continue lower-case ("HTTPServer" stays whole,
# "fooBar" -> foo, Bar), digits are their own part, "_" delimits.
_ASCII_PART = re.compile(r"[A-Z]+[a-z]*|[a-z]+|[0-9]+")
_LOWER, _UPPER, _DIGIT, _DELIM = 1, 2, 4, 8
_ALPHA = _LOWER | _UPPER
_CATEGORY_TYPE = {"Lu": _UPPER, "Ll": _LOWER, "Lt": _ALPHA, "Lm": _ALPHA, "Lo": _ALPHA, "Mn": _ALPHA,
                  "Me": _ALPHA, "Mc": _ALPHA, "Nd": _DIGIT, "Nl": _DIGIT, "No": _DIGIT}


@lru_cache(maxsize=4096)
def _char_type(ch: str) -> int:
    if ord(ch) > 0xFFFF:  # Lucene walks UTF-16 units: a surrogate never breaks a word
        return _ALPHA | _DIGIT
    return _CATEGORY_TYPE.get(unicodedata.category(ch), _DELIM)


def _is_break(last: int, cur: int) -> bool:
    # Lucene WordDelimiterIterator.isBreak with split_on_case_change and split_on_numerics on.
    if cur & last:
        return False
    if last & _UPPER and cur & _ALPHA:
        return False
    return True


def _parts(token: str) -> list[str]:
    """Subwords of one identifier as Lucene's ``word_delimiter`` filter finds them (before lower-casing)."""
    if token.isascii():
        return _ASCII_PART.findall(token)
    out: list[str] = []
    start = -1
    last = 0
    for i, ch in enumerate(token):
        t = _char_type(ch)
        if t == _DELIM:
            if start >= 0:
                out.append(token[start:i])
                start = -1
            last = 0
            continue
        if start < 0:
            start = i
        elif _is_break(last, t):
            out.append(token[start:i])
            start = i
        last = t
    if start >= 0:
        out.append(token[start:])
    return out


def _lower(text: str) -> str:
    # Lucene lower-cases code point by code point (simple mapping); Python's full mapping turns "İ" into "i̇".
    return text.lower() if "\u0130" not in text else text.replace("\u0130", "i").lower()


@lru_cache(maxsize=65536)
def _analyse(token: str) -> tuple[str, ...]:
    parts = _parts(token)
    if len(parts) == 1 and parts[0] == token:
        return (_lower(token),)
    return (_lower(token), *(_lower(p) for p in parts))


class _AnalysedCache(dict[str, str]):
    """identifier → its index-time tokens joined by spaces; filled on first sight, emptied when it grows large."""

    def __missing__(self, token: str) -> str:
        if len(self) >= 200_000:
            self.clear()
        value = self[token] = " ".join(_analyse(token))
        return value


_ANALYSED = _AnalysedCache()


def index_tokens(text: str | None) -> list[str]:
    """Index-time tokens of ``text``, equivalent to the ``scopekb_code`` analyzer of :mod:`scopekb.fields`.

    Each identifier (run of letters, digits and ``_``) yields itself lower-cased plus, when it has several parts,
    its camelCase / snake_case / digit parts: ``"parseRFC3339_date"`` →
    ``["parserfc3339_date", "parse", "rfc", "3339", "date"]``. ``None`` or empty text gives ``[]``.
    """
    return fts_text(text).split()


def index_terms_in(text: Any, terms: Sequence[str]) -> list[str]:
    """The ``terms`` (query-time tokens, :func:`query_tokens`) that are among ``index_tokens(text)``, in the order
    given; the same answer as ``[t for t in terms if t in set(index_tokens(text))]`` without analysing all of
    ``text`` (issue 20: a search's hit reasons analysed every hit's whole content, the query service's largest CPU
    cost per keyword request).

    For ASCII text, lower-casing is per character, so a term can only be a token where it occurs in the
    lower-cased text: each occurrence's enclosing identifier is analysed (cached), and a term with no occurrence
    costs one substring search. Other text is analysed whole when a term occurs in it (Unicode lower-casing
    depends on context: a final sigma), and not at all when none does.
    """
    if not text or not terms:
        return []
    s = text if isinstance(text, str) else str(text)
    if not s.isascii():  # only a term found in the lower-cased text (sigma forms as one) needs the analysis
        low = _lower(s).replace("ς", "σ")
        terms = [t for t in terms if t.replace("ς", "σ") in low]
        if not terms:
            return []
        have = set(fts_text(s).split())
        return [t for t in terms if t in have]
    low = s.lower()
    # ``t in low`` first: most terms of a long query occur in few of a hit's fields, and the substring test in C
    # rejects them before any Python call (issue 20: 20-term docstring queries made ~800 calls per search)
    present = [t for t in terms if t in low and _WORD.fullmatch(t)]
    if not present:
        return []
    rev = low[::-1]
    return [t for t in present if _ascii_has_token(s, low, rev, t)]


#: A run of identifier characters of lower-cased ASCII text (``str.isalnum`` or ``_``), matched from a position.
_ASCII_ID_RUN = re.compile(r"[0-9a-z_]*")


def _ascii_has_token(s: str, low: str, rev: str, term: str) -> bool:
    # ``low`` is ``s`` lower-cased (ASCII: same positions), ``rev`` is ``low`` reversed: each occurrence's
    # enclosing identifier is found by matching identifier characters right of it in ``low`` and left of it in
    # ``rev``, in C; an identifier equal to the term is its own first token, others are analysed (cached).
    n = len(low)
    i = low.find(term)
    while i >= 0:
        a = n - _ASCII_ID_RUN.match(rev, n - i).end()  # rev[n - i:] runs leftwards from low[i - 1]
        b = _ASCII_ID_RUN.match(low, i + len(term)).end()
        if b - a == len(term) or term in _analyse(s[a:b]):
            return True
        i = low.find(term, b)  # a later occurrence in the same identifier is covered by its analysis
    return False


def query_tokens(text: str) -> list[str]:
    """Query-time tokens (the ``scopekb_code_search`` analyzer): identifiers whole and lower-cased.

    ``"parse_rfc3339 retry"`` → ``["parse_rfc3339", "retry"]``.
    """
    return [_lower(t) for t in _WORD.findall(text)]


#: English stop words left out of keyword (BM25) queries: Lucene's ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET``.
#: In code they are rare (comments and strings only), so BM25 gives them a high IDF and a natural-language query
#: ranks comment-heavy chunks first; dropping them gained keyword NDCG@10 on the issue-21 docstring sets
#: (docs/benchmarks.md, "Issue 21").
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                       "there these they this to was will with".split())


#: Identifier parts are added to keyword queries of at least this many terms (after stop words): descriptions,
#: where a part of a name is evidence; a shorter query is a lookup of names, which stays exact (``zqx1marker``
#: must not match every chunk holding ``marker``).
SPLIT_MIN_TERMS = 3


def keyword_terms(text: str) -> list[str]:
    """The terms a keyword (BM25) search matches: :func:`query_tokens` without :data:`STOP_WORDS` (all of them
    when every term is a stop word: a search for ``"if"`` still finds it), in order, duplicates kept; when at least
    :data:`SPLIT_MIN_TERMS` remain, followed by the camelCase / snake_case / digit parts of the identifiers among
    them (the parts the index analyzer adds at index time; the whole identifier stays, so an exact match still
    scores highest).

    ``"Return the parsed HTTPHeader_map"`` → ``["return", "parsed", "httpheader_map", "httpheader", "map"]``;
    ``"parseHeader"`` → ``["parseheader"]``. Both chunk stores search these terms (issue 21: each of the two
    changes gained keyword NDCG@10 on the docstring sets, docs/benchmarks.md).
    """
    words = _WORD.findall(text)
    kept = [w for w in words if _lower(w) not in STOP_WORDS]
    if not kept:
        return [_lower(w) for w in words]
    terms = [_lower(w) for w in kept]
    if len(terms) < SPLIT_MIN_TERMS:
        return terms
    return terms + [p for w in kept for p in _analyse(w)[1:] if p not in STOP_WORDS]


def fts_text(text: Any) -> str:
    """The index-time tokens of ``text`` as one space-separated string (what the FTS5 table stores)."""
    if not text:
        return ""
    return " ".join(map(_ANALYSED.__getitem__, _WORD.findall(text if isinstance(text, str) else str(text))))


def glob_match(path: str | None, glob: str) -> int:
    """SQL function ``scopekb_glob(path, glob)``: RE2 full match of a bounded glob (:mod:`scopekb.patterns`; a glob
    over the stores' ceiling matches nothing — requests are refused earlier, with 400, by :func:`run_search`)."""
    if path is None:
        return 0
    try:
        return 1 if compile_glob(glob, CEILING).match(path) else 0
    except PatternRefused:
        return 0
