"""Optional cross-encoder reranker stage after fusion (issue 21; ``query.rerank``, off by default).

Two providers, both scoring ``(query, text)`` pairs, higher is more relevant:

- ``http``: an OpenAI-compatible rerank endpoint, ``POST {query.rerank_url}/rerank`` with ``{"model", "query",
  "documents", "top_n"}``, answered ``{"results": [{"index", "relevance_score"}, ...]}`` (the Cohere/Jina shape that
  vLLM, LocalAI and llama.cpp's server serve; a bare list of ``{"index", "score"}`` as text-embeddings-inference
  answers is accepted too);
- ``cross_encoder``: :class:`sentence_transformers.CrossEncoder` loaded from the local folder ``query.rerank_model``
  (``local_files_only``: nothing is downloaded at run time).

A configured reranker is *available*, not used: :func:`scopekb.search.run_search` reranks a context's hits only when
its ranking record (``scopekb eval --tune``, :func:`scopekb.tuning.choose_rerank`) says the reranked order won on
the context's own sets with a 95% interval above 0. A failing reranker never fails a search: the fused order is
kept and the answer's notice says so.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from scopekb.logging import get_logger
from scopekb.settings import QuerySettings

log = get_logger(__name__)

#: ``(query, texts) -> one score per text`` (higher is better).
Reranker = Callable[[str, Sequence[str]], list[float]]

#: Characters of a hit's text sent to the reranker at most (cross-encoders read 512 word pieces at most).
MAX_TEXT_CHARS = 2000


class RerankError(RuntimeError):
    """The reranker could not score (endpoint down, bad answer, model folder missing)."""


def http_reranker(url: str, model: str | None, api_key: str | None = None, timeout_s: float = 10.0) -> Reranker:
    """A reranker calling ``POST {url}/rerank`` (see the module doc for the shapes).

    Raises:
        RerankError: (when called) a transport error, a non-2xx answer, or an answer that does not give one
            finite score per text.
    """
    endpoint = url.rstrip("/") + "/rerank"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def score(query: str, texts: Sequence[str]) -> list[float]:
        body = {"model": model or "", "query": query, "documents": [t[:MAX_TEXT_CHARS] for t in texts],
                "top_n": len(texts)}
        try:
            r = httpx.post(endpoint, json=body, headers=headers, timeout=timeout_s)
            r.raise_for_status()
            data: Any = r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise RerankError(f"rerank endpoint failed: {e}") from e
        rows = data.get("results", data.get("data")) if isinstance(data, dict) else data
        out = [math.nan] * len(texts)
        try:
            for row in rows:
                i = int(row["index"])
                s = float(row.get("relevance_score", row.get("score")))
                if 0 <= i < len(texts):
                    out[i] = s
        except (TypeError, KeyError, ValueError) as e:
            raise RerankError(f"rerank endpoint answered an unexpected shape: {e}") from e
        if any(not math.isfinite(s) for s in out):
            raise RerankError("rerank endpoint did not score every document")
        return out

    return score


def cross_encoder_reranker(model_dir: str) -> Reranker:
    """A reranker running a sentence-transformers CrossEncoder from the local folder ``model_dir``.

    Raises:
        RerankError: the folder cannot be loaded as a CrossEncoder (nothing is downloaded).
    """
    try:
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(model_dir, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any load failure is a configuration error
        raise RerankError(f"cannot load the cross-encoder from {model_dir!r}: {e}") from e

    def score(query: str, texts: Sequence[str]) -> list[float]:
        return [float(x) for x in model.predict([(query, t[:MAX_TEXT_CHARS]) for t in texts])]

    return score


_CACHE: dict[tuple[Any, ...], Reranker | None] = {}
_LOCK = threading.Lock()


def for_settings(cfg: QuerySettings) -> Reranker | None:
    """The reranker ``cfg`` configures (built once per configuration and process), or None when ``rerank`` is off.

    Raises:
        RerankError: ``http`` without ``rerank_url``, ``cross_encoder`` without a loadable ``rerank_model``.
    """
    if cfg.rerank == "off":
        return None
    key = (cfg.rerank, cfg.rerank_url, cfg.rerank_model, cfg.rerank_timeout_s,
           cfg.rerank_api_key.get_secret_value() if cfg.rerank_api_key else None)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    if cfg.rerank == "http":
        if not cfg.rerank_url:
            raise RerankError("query.rerank is 'http' but query.rerank_url is not set")
        r = http_reranker(cfg.rerank_url, cfg.rerank_model, key[-1], cfg.rerank_timeout_s)
    else:
        if not cfg.rerank_model:
            raise RerankError("query.rerank is 'cross_encoder' but query.rerank_model (a local folder) is not set")
        r = cross_encoder_reranker(cfg.rerank_model)
    with _LOCK:
        _CACHE[key] = r
    return r


def rerank_order(reranker: Reranker, query: str, ids: Sequence[str], texts: Sequence[str]) -> list[str]:
    """``ids`` reordered by the reranker's scores of ``texts`` (same length), best first; ties keep the input
    order. Raises :class:`RerankError` from the reranker."""
    scores = reranker(query, list(texts))
    if len(scores) != len(ids):
        raise RerankError("the reranker returned a different number of scores")
    order = sorted(range(len(ids)), key=lambda n: (-scores[n], n))
    return [ids[n] for n in order]


def hit_text(path: str, symbol: str | None, content: str) -> str:
    """The text a reranker reads for a hit: path, symbol and content (as the embedder's header does)."""
    head = f"{path}" + (f" {symbol}" if symbol else "")
    return (head + "\n" + content)[:MAX_TEXT_CHARS]


__all__ = ["MAX_TEXT_CHARS", "RerankError", "Reranker", "cross_encoder_reranker", "for_settings", "hit_text",
           "http_reranker", "rerank_order"]
