"""The embedder interface shared by every provider, its result type and its errors.

An :class:`Embedder` turns a list of texts into one vector per text, aligned with the input: blank texts
(empty or whitespace only) are never sent and get ``None``; a text the provider refuses (an HTTP 400 for that
input, say) gets ``None`` plus a reason in :attr:`EmbedResult.errors`, so the caller can record that file and
index everything else. Failures that are not about one input (bad credentials, unknown model, the service
unreachable after the bounded retries) raise instead: the whole batch has to be tried again later.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scopekb.errors import Transient

Vector = list[float]


class EmbeddingError(RuntimeError):
    """Base class of embedding failures that are not about one input."""


class EmbeddingUnavailable(EmbeddingError, Transient):
    """Transient: the provider kept answering 429/5xx/408 or could not be reached within the bounded retries.

    Retrying the task later is expected to succeed. ``status`` is the provider's last HTTP status (None: no
    answer); services answer 503 whatever it is.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class EmbeddingConfigError(EmbeddingError):
    """Permanent until the configuration changes: 401/403/404, an unsupported parameter, a wrong dimension,
    a malformed answer, or a missing optional dependency (sentence-transformers, the model wheel)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


#: Characters that are not whitespace: the candidates :func:`is_blank` looks at, in order.
_NOT_SPACE = re.compile(r"\S")


def is_blank(text: str) -> bool:
    """True for texts that are never sent to a provider: empty, or no character of the Unicode categories L
    (letters), N (numbers), P (punctuation) or S (symbols) other than U+FFFD, the replacement character. So
    whitespace, control and format characters (zero-width, bidi, tags), combining marks and variation selectors
    alone, private-use characters and unassigned code points are blank: the model's tokenizer drops them all,
    and such a query embedded as ``[CLS] [SEP]`` ranked arbitrary chunks (hostile reviews of issue 19). Stops at
    the first visible character, which for real text is one of the first few."""
    for m in _NOT_SPACE.finditer(text):
        c = m.group()
        if unicodedata.category(c)[0] in "LNPS" and c != "\ufffd":
            return False
    return True


def live_inputs(texts: Sequence[str], count_tokens: Callable[[Sequence[str]], list[int]]
                ) -> tuple[list[int], list[int]]:
    """Positions of the non-blank texts and the token count of every position (0 for blanks).

    The common start of every provider's ``embed``: blank texts are never sent and never counted.
    """
    live = [i for i, t in enumerate(texts) if not is_blank(t)]
    token_counts = [0] * len(texts)
    if live:
        for i, c in zip(live, count_tokens([texts[i] for i in live]), strict=True):
            token_counts[i] = c
    return live, token_counts


@dataclass
class EmbedResult:
    """Vectors for one :meth:`Embedder.embed` call, aligned with its input.

    Attributes:
        vectors: ``len(texts)`` entries; ``vectors[i]`` is a list of ``dimension`` floats (float32 values), or
            None when ``texts[i]`` is blank or failed.
        token_counts: ``len(texts)`` entries, tokens of each input as counted by the provider's tokenizer
            (``local``: exact, special tokens included, before truncation) or estimated (``openai`` without a
            tokenizer: see ``embedding.estimate_bytes_per_token``); 0 for blank inputs.
        errors: input index -> reason for inputs that got no vector although not blank, e.g.
            ``"http 400: This model's maximum context length is 8192 tokens ..."``.
        total_tokens: tokens billed by the provider (``usage.prompt_tokens`` summed over requests) or, for the
            local model, the sum of ``token_counts`` capped at the model's input limit per text.
        requests: provider requests made, retries and bisection included (0 for the local model).
    """

    vectors: list[Vector | None]
    token_counts: list[int]
    errors: dict[int, str] = field(default_factory=dict)
    total_tokens: int = 0
    requests: int = 0


class Embedder(Protocol):
    """A text embedding provider (a static protocol: not ``runtime_checkable``, because ``isinstance`` would read
    ``dimension``, which may cost the openai provider a probe request).

    Attributes:
        model_id: stable id of the model and its output size, e.g. ``openai:text-embedding-3-small@512d``; keys
            the embedding cache and is stored as ``embedding_model`` on chunks.
        dimension: length of every vector (``local``: 384; ``openai``: ``dimensions`` or probed once).
        max_input_tokens: the model's input limit in tokens, special tokens included (``local``: 256, the
            model's ``max_seq_length``; longer inputs are truncated by the model; ``openai``: setting, 8191
            by default; longer inputs are refused per item by the API).
    """

    model_id: str
    dimension: int
    max_input_tokens: int

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        """Embed ``texts`` (any length; batched internally). Blank inputs get None without a request.

        Raises:
            EmbeddingUnavailable: transient provider failure after the bounded retries.
            EmbeddingConfigError: a failure no retry fixes (credentials, model, dimension).
        """
        ...

    def embed_query(self, text: str) -> Vector:
        """Embed one search query.

        Raises:
            ValueError: ``text`` is blank, or the provider refused this text (the message says why).
            EmbeddingUnavailable, EmbeddingConfigError: as for :meth:`embed`.
        """
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text as this embedder counts them (see :attr:`EmbedResult.token_counts`)."""
        ...

    def close(self) -> None:
        """Release connections; the embedder is not used afterwards."""
        ...
