"""Pure helpers of the HTTP providers: request batching within limits, ``Retry-After`` parsing and backoff.

Kept free of I/O so they are unit-tested directly (tests/unit/test_embedding_limits.py).
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Mapping, Sequence


def plan_batches(token_counts: Sequence[int], max_inputs: int, max_tokens: int) -> list[list[int]]:
    """Split positions ``0..n-1`` into consecutive batches within a provider's per-request limits.

    Args:
        token_counts: tokens of each input, in input order (estimates are fine).
        max_inputs: most inputs per request (OpenAI: 2,048).
        max_tokens: most tokens summed over one request (OpenAI: 300,000). An input that alone exceeds it goes
            in a batch of its own (the provider then refuses that input, which is reported for that input).

    Returns:
        Lists of positions, in order, covering every position exactly once; no batch is empty.

    Raises:
        ValueError: a limit is < 1.
    """
    if max_inputs < 1 or max_tokens < 1:
        raise ValueError("max_inputs and max_tokens must be >= 1")
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, n in enumerate(token_counts):
        n = max(0, int(n))
        if current and (len(current) >= max_inputs or tokens + n > max_tokens):
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        batches.append(current)
    return batches


def estimate_tokens(text: str, bytes_per_token: float) -> int:
    """Token estimate without a tokenizer: ``ceil(len(UTF-8 bytes) / bytes_per_token)``, at least 1.

    With the default 2.5 bytes per token this over-counts OpenAI's cl100k tokens on ordinary code and prose
    (about 4 bytes per token there); dense strings such as base64 or CJK text can come closer to the bound.
    """
    return max(1, math.ceil(len(text.encode("utf-8", "surrogatepass")) / bytes_per_token))


def parse_retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait as the server asked, or None when it did not say (or said something unusable).

    Reads ``retry-after-ms`` (milliseconds, sent by OpenAI and Azure OpenAI) first, then ``retry-after`` as
    delay-seconds or as an HTTP-date (RFC 9110 §10.2.3). Header names are matched case-insensitively (any
    mapping; ``httpx`` headers already are). Negative, NaN or infinite values give None; a date in the past
    gives 0.

    Args:
        headers: response headers.
        now: current Unix time for HTTP-dates (default ``time.time()``).
    """
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = lowered.get(name)
        if raw is None:
            continue
        try:
            value = float(raw.strip()) / divisor
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return value
        return None
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    delay = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, delay)


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with "equal jitter": a value in ``[d/2, d]`` where ``d = min(max_s, base_s * 2**attempt)``.

    Args:
        attempt: 0 for the first retry.
    """
    d = min(max_s, base_s * (2 ** max(0, attempt)))
    r = (rng or random).random()
    return d / 2 + r * d / 2
