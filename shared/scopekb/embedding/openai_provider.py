"""Embeddings from any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, Azure, vLLM, Ollama, TEI).

Through the official ``openai`` SDK with its own retries switched off (``max_retries=0``) so that the policy
here is the only one and is testable:

- Batches stay within the per-request limits (OpenAI API documentation: at most 2,048 inputs and 300,000
  tokens summed over a request); blank inputs are never sent.
- Output order follows the response's ``index`` field, never the order of ``data``.
- 429, 408, 409 and 5xx answers and connection errors are retried up to ``max_retries`` times, waiting what
  ``retry-after-ms``/``Retry-After`` asks (clamped to ``max_retry_after_s``) or exponential backoff.
- 400, 413 and 422 for a batch are bisected until the refused input(s) are isolated; those get ``None`` and a
  reason, everything else in the batch is embedded. An error naming a parameter other than ``input`` (e.g.
  ``dimensions``), or one that a known-good probe text also gets, is a configuration error and raises.
- Any other 4xx (401, 403, 404, ...) raises :class:`EmbeddingConfigError`.
"""

from __future__ import annotations

import base64
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from scopekb.embedding.base import (
    EmbeddingConfigError,
    EmbeddingUnavailable,
    EmbedResult,
    Vector,
    is_blank,
    live_inputs,
)
from scopekb.embedding.limits import backoff_delay, estimate_tokens, parse_retry_after, plan_batches
from scopekb.logging import get_logger
from scopekb.settings import EmbeddingSettings

log = get_logger(__name__)

#: HTTP statuses retried with Retry-After/backoff (429 rate limit, 408 request timeout, 409 conflict: the SDK's
#: own retry set, plus every 5xx).
RETRY_STATUSES = frozenset({408, 409, 429})
#: HTTP statuses that refuse the request's content: bisected to find the refused input(s).
REFUSED_STATUSES = frozenset({400, 413, 422})
#: Text of the probe request that tells a refused input from a refused request (and finds the dimension).
PROBE_TEXT = "dimension probe"
_MAX_REASON = 500


class _Refused(Exception):
    """The provider refused one request's content (400/413/422)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    @property
    def reason(self) -> str:
        return f"http {self.status}: {self.message}"[:_MAX_REASON]


def _error_message(exc: Any) -> str:
    """The API's own message from an SDK status error (``body`` is the JSON ``error`` object when there is one)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        msg = body.get("message") or body.get("error") or body.get("detail")
        if isinstance(msg, dict):
            msg = msg.get("message")
        if msg:
            return str(msg)
    elif isinstance(body, str) and body:
        return body
    return str(getattr(exc, "message", None) or exc)


class OpenAIEmbedder:
    """:class:`scopekb.embedding.Embedder` over an OpenAI-compatible HTTP API.

    Args:
        model: model name sent to the API.
        base_url: endpoint root including ``/v1``; None: the SDK default (or ``OPENAI_BASE_URL``).
        api_key: bearer key; None: the SDK reads ``OPENAI_API_KEY`` (and raises if unset: pass any non-empty
            string for servers without auth).
        dimensions: ``dimensions`` request parameter; None: the model's native size (probed once on demand).
        model_id: overrides :attr:`model_id` (default ``openai:<model>`` plus ``@<dimensions>d`` when set).
        max_input_tokens, max_batch_inputs, max_batch_tokens: limits in tokens/inputs (see EmbeddingSettings).
        estimate_bytes_per_token: token estimate used when ``count_tokens`` is None.
        count_tokens: batch token counter (e.g. tiktoken for OpenAI models); None: the byte estimate.
        encoding_format: ``float`` or ``base64`` (decoded here as little-endian float32).
        timeout_s: per-request timeout in seconds.
        max_retries: retries of one request after 429/408/409/5xx/connection errors.
        backoff_base_s, backoff_max_s: exponential backoff bounds in seconds when no Retry-After is given.
        max_retry_after_s: longest honoured Retry-After in seconds (longer ones are clamped).
        max_bisect_requests: extra requests one :meth:`embed` call may spend isolating refused inputs.
        sleep: called with the delay in seconds before each retry (tests pass a recorder).
        client: a ready ``openai.OpenAI`` client (tests); its retries should be 0. Else one is built.
        http_client: an ``httpx`` client of the SDK's flavour passed to ``openai.OpenAI`` (tests: a mock
            transport).

    Raises:
        EmbeddingConfigError: the ``openai`` package is missing or the client cannot be built (no API key).
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        dimensions: int | None = None,
        model_id: str | None = None,
        max_input_tokens: int = 8191,
        max_batch_inputs: int = 2048,
        max_batch_tokens: int = 300_000,
        estimate_bytes_per_token: float = 2.5,
        count_tokens: Callable[[Sequence[str]], list[int]] | None = None,
        encoding_format: str = "float",
        timeout_s: float = 60.0,
        max_retries: int = 6,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        max_retry_after_s: float = 120.0,
        max_bisect_requests: int = 128,
        sleep: Callable[[float], None] = time.sleep,
        client: Any | None = None,
        http_client: Any | None = None,
    ) -> None:
        if encoding_format not in ("float", "base64"):
            raise ValueError("encoding_format must be 'float' or 'base64'")
        self.model = model
        self.dimensions = dimensions
        self.model_id = model_id or (f"openai:{model}" + (f"@{dimensions}d" if dimensions else ""))
        self.max_input_tokens = max_input_tokens
        self.max_batch_inputs = max_batch_inputs
        self.max_batch_tokens = max_batch_tokens
        self.estimate_bytes_per_token = estimate_bytes_per_token
        self._count_tokens = count_tokens
        self.encoding_format = encoding_format
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_retry_after_s = max_retry_after_s
        self.max_bisect_requests = max_bisect_requests
        self._sleep = sleep
        self._dimension: int | None = dimensions
        #: True once any request succeeded: a later refusal is then about the inputs, not the request shape.
        self._request_shape_ok = False
        if client is None:
            try:
                import openai
            except ImportError as e:  # pragma: no cover - openai is a core dependency
                raise EmbeddingConfigError("the openai package is not installed") from e
            kwargs: dict[str, Any] = {"max_retries": 0, "timeout": timeout_s}
            if base_url:
                kwargs["base_url"] = base_url
            if api_key is not None:
                kwargs["api_key"] = api_key
            if http_client is not None:
                kwargs["http_client"] = http_client
            try:
                client = openai.OpenAI(**kwargs)
            except openai.OpenAIError as e:
                raise EmbeddingConfigError(f"cannot build the OpenAI client: {e}") from e
        self._client = client

    @classmethod
    def from_settings(cls, s: EmbeddingSettings, **overrides: Any) -> OpenAIEmbedder:
        """Build from ``settings.embedding``; ``overrides`` (e.g. ``sleep``, ``count_tokens``) win."""
        kwargs: dict[str, Any] = dict(
            model=s.model, base_url=s.base_url,
            api_key=s.api_key.get_secret_value() if s.api_key is not None else None,
            dimensions=s.dimensions, model_id=s.model_id, max_input_tokens=s.max_input_tokens,
            max_batch_inputs=s.max_batch_inputs, max_batch_tokens=s.max_batch_tokens,
            estimate_bytes_per_token=s.estimate_bytes_per_token, encoding_format=s.encoding_format,
            timeout_s=s.timeout_s, max_retries=s.max_retries, backoff_base_s=s.backoff_base_s,
            backoff_max_s=s.backoff_max_s, max_retry_after_s=s.max_retry_after_s,
            max_bisect_requests=s.max_bisect_requests,
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    # --- Embedder ---------------------------------------------------------------------------------------------

    @property
    def dimension(self) -> int:
        """Vector length: ``dimensions`` when set, else learnt from the first answer (one probe request if no
        answer was seen yet).

        Raises:
            EmbeddingUnavailable, EmbeddingConfigError: the probe request failed.
        """
        if self._dimension is None:
            try:
                vectors, _ = self._request([PROBE_TEXT])
            except _Refused as refused:
                raise EmbeddingConfigError(f"the provider refused the dimension probe: {refused.reason}",
                                           status=refused.status) from None
            self._dimension = len(vectors[0]) if vectors[0] is not None else None
            if self._dimension is None:
                raise EmbeddingConfigError("the provider returned no usable vector for the dimension probe")
        return self._dimension

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text: the ``count_tokens`` callable when given, else ``ceil(UTF-8 bytes / bytes_per_token)``
        (0 for the empty string)."""
        if self._count_tokens is not None:
            return [int(n) for n in self._count_tokens(list(texts))]
        return [estimate_tokens(t, self.estimate_bytes_per_token) if t else 0 for t in texts]

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        """Embed ``texts``; see the module docstring for batching, retries and per-input refusals.

        Returns:
            :class:`EmbedResult` aligned with ``texts``.

        Raises:
            EmbeddingUnavailable: 429/5xx/408/409/connection errors outlasted ``max_retries`` for one request.
            EmbeddingConfigError: 401/403/404 or another non-retryable status, a refused parameter, a probe
                text refused like the batch, a malformed answer or a vector of the wrong dimension.
        """
        texts = list(texts)
        vectors: list[Vector | None] = [None] * len(texts)
        errors: dict[int, str] = {}
        live, token_counts = live_inputs(texts, self.count_tokens)
        if not live:
            return EmbedResult(vectors=vectors, token_counts=token_counts)
        counts = [token_counts[i] for i in live]
        stats = {"requests": 0, "tokens": 0, "bisect_budget": self.max_bisect_requests}
        for batch in plan_batches(counts, self.max_batch_inputs, self.max_batch_tokens):
            positions = [live[k] for k in batch]
            self._embed_positions(texts, positions, token_counts, vectors, errors, stats)
        return EmbedResult(vectors=vectors, token_counts=token_counts, errors=errors,
                           total_tokens=stats["tokens"], requests=stats["requests"])

    def embed_query(self, text: str) -> Vector:
        """One query vector.

        Raises:
            ValueError: ``text`` is blank or was refused (the message carries the API's reason).
            EmbeddingUnavailable, EmbeddingConfigError: as for :meth:`embed`.
        """
        if is_blank(text):
            raise ValueError("cannot embed a blank query")
        result = self.embed([text])
        vector = result.vectors[0]
        if vector is None:
            raise ValueError(f"the embedding provider refused the query: {result.errors.get(0, 'no vector')}")
        return vector

    def close(self) -> None:
        """Close the SDK client's connection pool."""
        close = getattr(self._client, "close", None)
        if close is not None:
            close()

    # --- internals --------------------------------------------------------------------------------------------

    def _embed_positions(self, texts: list[str], positions: list[int], token_counts: list[int],
                         vectors: list[Vector | None], errors: dict[int, str], stats: dict[str, int]) -> None:
        """Embed one planned batch, bisecting refused sub-batches (breadth-first, in input order)."""
        queue: deque[list[int]] = deque([positions])
        while queue:
            part = queue.popleft()
            try:
                got, tokens = self._request([texts[i] for i in part], stats)
            except _Refused as refused:
                if not self._request_shape_ok:
                    self._check_request_shape(refused, stats)
                if len(part) == 1:
                    errors[part[0]] = refused.reason
                    log.warning("embedding_input_refused", model=self.model_id, status=refused.status,
                                tokens=token_counts[part[0]], reason=refused.message[:200])
                elif stats["bisect_budget"] < 2:
                    for i in part:
                        errors[i] = f"{refused.reason} (in a batch of {len(part)}; bisection budget spent)"
                    log.warning("embedding_bisect_budget_spent", model=self.model_id, inputs=len(part))
                else:
                    stats["bisect_budget"] -= 2
                    mid = len(part) // 2
                    queue.append(part[:mid])
                    queue.append(part[mid:])
                continue
            stats["tokens"] += tokens if tokens is not None else sum(token_counts[i] for i in part)
            for i, vec in zip(part, got, strict=True):
                if vec is None:
                    errors[i] = "provider returned a vector with non-finite values"
                else:
                    vectors[i] = vec

    def _check_request_shape(self, refused: _Refused, stats: dict[str, int]) -> None:
        """No request has succeeded yet: send the probe text. If it is refused too, the request itself (model,
        ``dimensions``, ``encoding_format``) is wrong, not the inputs: raise instead of bisecting."""
        try:
            self._request([PROBE_TEXT], stats)
        except _Refused as probe:
            raise EmbeddingConfigError(
                f"the provider refused a known-good probe text as well ({probe.reason}); first refusal: "
                f"{refused.reason}", status=probe.status) from None

    def _request(self, inputs: list[str], stats: dict[str, int] | None = None
                 ) -> tuple[list[Vector | None], int | None]:
        """One embeddings request with retries. Returns vectors in input order (None: non-finite values) and
        the billed prompt tokens (None when the server sent no usage).

        Raises:
            _Refused: 400/413/422 about the inputs.
            EmbeddingUnavailable, EmbeddingConfigError: see :meth:`embed`.
        """
        import openai

        attempt = 0
        while True:
            if stats is not None:
                stats["requests"] += 1
            try:
                kwargs: dict[str, Any] = {"input": inputs, "model": self.model,
                                          "encoding_format": self.encoding_format}
                if self.dimensions is not None:
                    kwargs["dimensions"] = self.dimensions
                response = self._client.embeddings.create(**kwargs)
            except openai.APIStatusError as e:
                status = int(e.status_code)
                message = _error_message(e)
                if status in RETRY_STATUSES or status >= 500:
                    if attempt >= self.max_retries:
                        raise EmbeddingUnavailable(
                            f"embedding provider answered http {status} after {attempt + 1} attempts: "
                            f"{message[:200]}", status=status) from None
                    delay = self._retry_delay(attempt, e.response.headers if e.response is not None else None)
                    log.warning("embedding_retry", model=self.model_id, status=status, attempt=attempt + 1,
                                delay_s=round(delay, 3), inputs=len(inputs))
                    self._sleep(delay)
                    attempt += 1
                    continue
                if status in REFUSED_STATUSES:
                    param = getattr(e, "param", None)
                    if param and param != "input" and not str(param).startswith("input"):
                        raise EmbeddingConfigError(
                            f"embedding provider refused parameter {param!r}: http {status}: {message[:300]}",
                            status=status) from None
                    raise _Refused(status, message) from None
                raise EmbeddingConfigError(f"embedding provider answered http {status}: {message[:300]}",
                                           status=status) from None
            except openai.APIConnectionError as e:
                if attempt >= self.max_retries:
                    raise EmbeddingUnavailable(
                        f"embedding provider unreachable after {attempt + 1} attempts: {e}") from None
                delay = backoff_delay(attempt, self.backoff_base_s, self.backoff_max_s)
                log.warning("embedding_retry", model=self.model_id, status=None, attempt=attempt + 1,
                            delay_s=round(delay, 3), error=type(e).__name__)
                self._sleep(delay)
                attempt += 1
                continue
            vectors = self._parse(response, len(inputs))
            self._request_shape_ok = True
            usage = getattr(response, "usage", None)
            tokens = getattr(usage, "prompt_tokens", None) if usage is not None else None
            return vectors, (int(tokens) if tokens is not None else None)

    def _retry_delay(self, attempt: int, headers: Any) -> float:
        """Retry-After (clamped to ``max_retry_after_s``) when the server sent one, else backoff."""
        asked = parse_retry_after(headers)
        if asked is not None:
            return min(asked, self.max_retry_after_s)
        return backoff_delay(attempt, self.backoff_base_s, self.backoff_max_s)

    def _parse(self, response: Any, expected: int) -> list[Vector | None]:
        """Vectors in input order from an embeddings response, as float32 values.

        Raises:
            EmbeddingConfigError: wrong count or indices, or a vector whose length differs from the dimension.
        """
        data = list(getattr(response, "data", None) or [])
        indices = sorted(int(getattr(d, "index", -1)) for d in data)
        if len(data) != expected or indices != list(range(expected)):
            raise EmbeddingConfigError(
                f"malformed embeddings response: {len(data)} items with indices {indices[:10]} for "
                f"{expected} inputs")
        out: list[Vector | None] = [None] * expected
        for d in data:
            raw = d.embedding
            if isinstance(raw, str):
                arr = np.frombuffer(base64.b64decode(raw), dtype="<f4")
            else:
                arr = np.asarray(raw, dtype=np.float32)
            if arr.ndim != 1 or arr.size == 0:
                raise EmbeddingConfigError("malformed embeddings response: an embedding is not a flat vector")
            if self._dimension is None:
                self._dimension = int(arr.size)
            elif arr.size != self._dimension:
                raise EmbeddingConfigError(
                    f"embedding provider returned {arr.size}-d vectors, expected {self._dimension} "
                    f"(model {self.model!r}, dimensions={self.dimensions})")
            out[int(d.index)] = arr.astype(np.float32).tolist() if np.isfinite(arr).all() else None
        return out
