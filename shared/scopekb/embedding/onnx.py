"""The local model through ONNX Runtime: the export made once offline, and the runner that never imports torch.

Layout of an export (``embedding.local_export_dir``, default ``$XDG_CACHE_HOME/scopekb/onnx`` or
``~/.cache/scopekb/onnx``)::

    <export_dir>/<model key>/fp32/model.onnx + manifest.json     # backend "onnx"
    <export_dir>/<model key>/int8/model.onnx + manifest.json     # backend "onnx-int8"

``<model key>`` is :func:`scopekb.embedding.local.default_model_id` of the model directory made safe for a file
name, so a new model wheel gets a new export. ``manifest.json`` is written last, into a temporary directory that
is renamed into place: a directory without a manifest, or whose ``model.onnx`` differs in size from the
manifest's, is a partial export, and one whose ``model.onnx`` differs from the sha256 the manifest records is a
damaged one; :func:`export_model` rebuilds both. An exporter holds an exclusive ``flock`` on
``<model key>/.<variant>.lock`` while it builds, and checks again for a complete export once it has the lock, so
processes that start together build it once. :class:`OnnxRunner` exports a missing or partial export itself
(``auto_export``, in a child process so that the runner's own process never imports torch), or refuses it with
the command that fixes it.

The export (:func:`export_model`, ``scopekb model export``) needs torch and transformers (the ``local`` extra):
``torch.onnx.export`` of the Hugging Face model (eager attention, opset 17, dynamic batch and sequence axes), output
``last_hidden_state``; a model folder that holds only ``onnx/model.onnx`` (a model fetched by ``scopekb model
fetch``, :mod:`scopekb.embedding.catalog`) is exported by copying that file, without torch; ``onnx-int8`` is
``onnxruntime.quantization.quantize_static`` of that export with the settings :data:`INT8_QUANTIZATION`: int8
weights, and activations quantized with ranges fixed at export time from the packaged calibration texts
(:data:`CALIBRATION_FILE`), so a text's int8 vector does not depend on the texts embedded beside it. The int8
manifest records those settings: an int8 export made with other settings (or before they were recorded, e.g. the
dynamic quantization of earlier releases) is stale and is rebuilt like a partial one, and the settings are part of
the ``onnx-int8`` model id (:func:`int8_id_suffix`), so vectors of another quantization never share cache entries or
an index version.
Pooling (mean over the attention mask, or ``[CLS]``, from the model's ``1_Pooling/config.json``) and L2
normalisation run in numpy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from scopekb.embedding.base import EmbeddingConfigError
from scopekb.embedding.catalog import ONNX_FILE, cache_home, is_onnx_only
from scopekb.logging import get_logger

log = get_logger(__name__)

#: Told one line before a missing export is built on first use (a minute or more, see :func:`on_auto_export`).
_export_notice: Callable[[str], None] | None = None


def on_auto_export(notice: Callable[[str], None] | None) -> None:
    """Have ``notice(line)`` called with one line (``embeddings: building the <backend> export ...``) when a missing
    or partial export is about to be built on first use, so that a command waiting 50-160 s says why (the CLI
    prints it to stderr; services keep only the ``embedding_onnx_auto_export`` log event). None: no notice."""
    global _export_notice
    _export_notice = notice


#: Sub-directory of a model's exports per backend.
VARIANTS = {"onnx": "fp32", "onnx-int8": "int8"}
MANIFEST = "manifest.json"
MODEL_FILE = "model.onnx"
OPSET = 17
#: Bumped when the export procedure changes (a manifest of another format is a stale export: rebuilt).
FORMAT = 1
#: The calibration texts of the static quantization (:func:`_quantize`): a JSON object whose ``texts`` are chunks of
#: scopekb's own sources and docs as the indexer embeds them, and docstring queries, built by
#: ``bench/calibration_set.py``; its digest is :data:`CALIBRATION_SHA256`.
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
#: sha256 of :data:`CALIBRATION_FILE` (a unit test checks it): part of :data:`INT8_QUANTIZATION`, so new calibration
#: texts give a new model id and rebuild existing int8 exports.
CALIBRATION_SHA256 = "5e2c150963af34205308b53f583917fd686a96ba952536a7d2e1c83b14c8cfae"
#: Mean cosine of int8 to fp32 vectors an ``onnx-int8`` export must keep on the first :data:`RETENTION_TEXTS`
#: calibration texts (issue 19's quality bar for a backend), or it is refused (:func:`int8_retention`): the
#: packaged model keeps 0.995; another model directory whose graph the node names of ``keep_fp32`` do not fit can
#: fall far below (0.93 with every MatMul quantized).
MIN_INT8_COSINE = 0.98
RETENTION_TEXTS = 96
#: Texts per calibration batch (padded to the batch's longest text, as the indexer's batches are).
CALIBRATION_BATCH = 16
#: Settings of the ``onnx-int8`` export. ``quantize_static`` (``QOperator`` format: QLinearMatMul kernels) of the
#: MatMuls only (the word embeddings stay fp32), uint8 activations with MinMax ranges from the calibration texts,
#: int8 weights with one scale per output channel; ``keep_fp32`` names the MatMuls left in fp32: each layer's
#: feed-forward output projection (its input, the GELU output, has the widest, most outlier-prone range) and the
#: attention products (query x key and weights x value, both activations). Against fp32 on 600 texts of four
#: released libraries: mean cosine 0.995 (min 0.990), a text's vector identical alone and in any batch (the
#: dynamic quantization shipped before took each activation scale from the whole batch: 0.983 alone vs batched),
#: 1.14-1.30 x fp32 texts/s in interleaved rounds (docs/benchmarks.md, "Issue 19, a deterministic int8").
#: Changing them gives a new model id and rebuilds existing int8 exports.
INT8_QUANTIZATION: dict[str, Any] = {"method": "static", "format": "QOperator", "op_types_to_quantize": ["MatMul"],
                                     "activation_type": "QUInt8", "weight_type": "QInt8", "per_channel": True,
                                     "calibrate_method": "MinMax", "calibration_sha256": CALIBRATION_SHA256,
                                     "calibration_batch": CALIBRATION_BATCH,
                                     "keep_fp32": ["ffn_output", "attention_products"]}


def int8_id_suffix(quantization: dict[str, Any] | None = None) -> str:
    """The model-id suffix of ``onnx-int8`` vectors made with ``quantization`` (None: :data:`INT8_QUANTIZATION`):
    ``+int8-`` and the first 8 hex digits of sha256 over the settings as sorted JSON, so each quantization has
    its own embedding-cache entries and index version (``+int8`` alone was the per-tensor dynamic settings of the
    first release; each later setting, the static quantization included, has its own hash)."""
    q = INT8_QUANTIZATION if quantization is None else quantization
    return "+int8-" + hashlib.sha256(json.dumps(q, sort_keys=True).encode()).hexdigest()[:8]


def default_export_dir() -> Path:
    """``$XDG_CACHE_HOME/scopekb/onnx`` (when absolute: the XDG spec ignores a relative one), or
    ``~/.cache/scopekb/onnx``."""
    return cache_home() / "scopekb" / "onnx"


def export_path(model_path: Path, backend: str, export_dir: Path | None = None) -> Path:
    """Directory of ``backend``'s export of the model at ``model_path`` (see the module docstring)."""
    from scopekb.embedding.local import default_model_id, packaged_model_path

    try:
        packaged = model_path == packaged_model_path()
    except EmbeddingConfigError:
        packaged = False
    key = re.sub(r"[^A-Za-z0-9._@-]+", "_", default_model_id(None if packaged else model_path))
    return (export_dir or default_export_dir()) / key / VARIANTS[backend]


#: (path, size, mtime ns) -> sha256 hex of a ``model.onnx`` this process has hashed (:func:`file_sha256`).
_digests: dict[tuple[str, int, int], str] = {}
_digests_lock = threading.Lock()


def file_sha256(f: Path) -> str:
    """sha256 (hex) of the file ``f``, read in 1 MiB blocks; remembered per (path, size, modification time), so
    a process hashes an unchanged export once (about 0.2 s for the 90 MB fp32 file here). Raises OSError."""
    st = f.stat()
    key = (str(f), st.st_size, st.st_mtime_ns)
    with _digests_lock:
        hit = _digests.get(key)
    if hit is not None:
        return hit
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    digest = h.hexdigest()
    with _digests_lock:
        _digests[key] = digest
    return digest


def read_manifest(where: Path) -> dict[str, Any] | None:
    """The manifest of a complete, current export in ``where``, or None: missing, unreadable, other format,
    ``model.onnx`` missing or of another size than recorded (a partial export), of the recorded size but another
    sha256 (damaged: a hostile review of issue 19 flipped bytes of the weights, and the export loaded and gave
    vectors of cosine -0.008 to the right ones under the same model id), no sha256 recorded (made before exports
    recorded it), or an ``onnx-int8`` export whose recorded ``quantization`` is not :data:`INT8_QUANTIZATION`
    (stale: made with other settings, or before they were recorded). :func:`export_model` rebuilds all of these;
    the export is deterministic, so a rebuilt one gives the same vectors as the one it replaces."""
    try:
        man = json.loads((where / MANIFEST).read_text())
        ok = (man.get("format") == FORMAT and (where / MODEL_FILE).stat().st_size == man["bytes"]
              and isinstance(man.get("sha256"), str))
        if man.get("backend") == "onnx-int8":
            ok = ok and man.get("quantization") == INT8_QUANTIZATION
        ok = ok and file_sha256(where / MODEL_FILE) == man["sha256"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return man if ok else None


def _state(where: Path) -> str:
    """Why ``where`` holds no usable export (:func:`read_manifest` returned None): ``missing``, ``stale`` (an int8
    export of other quantization settings, or one made before exports recorded their sha256), ``damaged`` (the
    model file differs from its recorded sha256) or ``partial``."""
    if not where.exists():
        return "missing"
    try:
        man = json.loads((where / MANIFEST).read_text())
        if man.get("backend") == "onnx-int8" and man.get("quantization") != INT8_QUANTIZATION:
            return "stale (made with other quantization settings)"
        if man.get("format") == FORMAT and (where / MODEL_FILE).stat().st_size == man.get("bytes"):
            if not isinstance(man.get("sha256"), str):
                return "stale (made before exports recorded their sha256)"
            return "damaged (model.onnx differs from the sha256 its manifest records)"
    except (OSError, ValueError, AttributeError):
        pass
    return "partial"


def _fix(backend: str, force: bool = False) -> str:
    """The command that (re)builds ``backend``'s export; ``force``: one whose files look complete."""
    return (f"run `scopekb model export --backend {backend}{' --force' if force else ''}` "
            "(once, offline; needs the local extra)")


def _pooling(model_path: Path) -> tuple[str, int, int]:
    """(``mean`` | ``cls``, dimension, max_seq_length) from the sentence-transformers model files.

    Raises:
        EmbeddingConfigError: a pooling mode other than mean or CLS.
    """
    try:
        pool = json.loads((model_path / "1_Pooling" / "config.json").read_text())
        sbert = json.loads((model_path / "sentence_bert_config.json").read_text())
    except (OSError, ValueError) as e:
        raise EmbeddingConfigError(f"cannot read the pooling config of {model_path}: {e}") from e
    if pool.get("pooling_mode_mean_tokens"):
        mode = "mean"
    elif pool.get("pooling_mode_cls_token"):
        mode = "cls"
    else:
        raise EmbeddingConfigError(f"the ONNX backends support mean or CLS pooling only ({model_path})")
    return mode, int(pool["word_embedding_dimension"]), int(sbert.get("max_seq_length", 512))


class OnnxRunner:
    """Forward passes of an exported model with ONNX Runtime on CPU, pooled and normalised in numpy.

    Args:
        model_path: the sentence-transformers model directory the export was made from (tokenizer, pooling).
        backend: ``onnx`` or ``onnx-int8``.
        threads: ONNX Runtime intra-op threads (inter-op: 1).
        export_dir: root of the exports (None: :func:`default_export_dir`).
        auto_export: build a missing or partial export now (:func:`export_in_child`: once per export directory,
            also when several processes start together; about a minute, needs torch) instead of refusing it.

    Raises:
        EmbeddingConfigError: onnxruntime is not installed, or the export is missing or partial (and
            ``auto_export`` is off or the export failed) or does not load; the message names the command that
            fixes it.
    """

    def __init__(self, model_path: Path, backend: str, threads: int, export_dir: Path | None = None,
                 auto_export: bool = False) -> None:
        self.backend = backend
        self.pooling, self.dimension, self.max_seq_length = _pooling(model_path)
        where = export_path(model_path, backend, export_dir)
        if read_manifest(where) is None:
            state = _state(where)
            if not auto_export:
                raise EmbeddingConfigError(f"the {backend} export of the local model is {state} ({where}): "
                                           f"{_fix(backend)}")
            log.info("embedding_onnx_auto_export", path=str(where), backend=backend, state=state)
            _check_writable(where.parent)
            if _export_notice is not None:
                _export_notice(f"embeddings: building the {backend} export of the local model once, in {where} "
                               "(a minute or more; later runs reuse it)")
            export_in_child(model_path, backend, export_dir)
        try:
            import onnxruntime  # noqa: F401 - checked here so the error names the extra
        except ImportError as e:
            raise EmbeddingConfigError("the ONNX backends need onnxruntime: pip install 'scopekb[local]'") from e
        self.path = where
        self.threads = threads
        self._sessions: dict[int, Any] = {}
        self._session(1)  # loads (and so checks) the export now; the batch session is made on first use
        log.info("embedding_onnx_loaded", path=str(where), backend=backend, threads=threads)

    def _session(self, threads: int) -> Any:
        """The session with ``threads`` intra-op threads (one for single queries, ``self.threads`` for batches).

        Spinning is off: a waiting pool thread sleeps instead of burning a core that OpenSearch or another
        worker needs (with spinning, a query took 40 ms instead of 14 ms on the loaded 2-core machine).
        """
        sess = self._sessions.get(threads)
        if sess is not None:
            return sess
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            sess = ort.InferenceSession(str(self.path / MODEL_FILE), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - a corrupt file: same fix as a missing one
            raise EmbeddingConfigError(f"the {self.backend} export at {self.path} does not load ({e}): "
                                       f"{_fix(self.backend, force=True)}") from e
        self._inputs = {i.name for i in sess.get_inputs()}
        self._sessions[threads] = sess
        return sess

    def __call__(self, input_ids: np.ndarray, mask: np.ndarray, threads: int | None = None) -> np.ndarray:
        """Pooled (not yet normalised) float32 rows for a padded batch; ``threads``: intra-op threads (None: the
        runner's). Callers serialise calls (the embedder's lock)."""
        session = self._session(threads or self.threads)
        feeds = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        hidden = session.run(["last_hidden_state"], {k: v for k, v in feeds.items() if k in self._inputs})[0]
        if self.pooling == "cls":
            return np.asarray(hidden[:, 0], dtype=np.float32)
        m = mask[..., None].astype(np.float32)
        return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


_runners: dict[tuple[str, str, int, str], tuple[OnnxRunner, tuple[int, int]]] = {}
_runners_lock = threading.Lock()


def shared_runner(model_path: Path, backend: str, threads: int, export_dir: Path | None = None,
                  auto_export: bool = False) -> OnnxRunner:
    """The :class:`OnnxRunner` of this process for (model, backend, threads, export directory), built on first use
    and shared by every embedder of the process, as :func:`scopekb.embedding.local.load_model` shares the torch
    model (a runtime per test or per request would otherwise load the export again each time). A runner whose
    ``model.onnx`` changed since it was loaded (size or modification time: rebuilt or damaged) is built again.

    Raises:
        EmbeddingConfigError: as :class:`OnnxRunner`.
    """
    key = (str(model_path), backend, threads, str(export_dir or default_export_dir()))
    with _runners_lock:
        hit = _runners.get(key)
        if hit is not None and _stamp(hit[0].path / MODEL_FILE) == hit[1]:
            return hit[0]
        runner = OnnxRunner(model_path, backend, threads, export_dir, auto_export=auto_export)
        _runners[key] = (runner, _stamp(runner.path / MODEL_FILE))
        return runner


def _stamp(f: Path) -> tuple[int, int]:
    try:
        st = f.stat()
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def export_model(model_path: Path, backend: str, export_dir: Path | None = None, *, force: bool = False,
                 force_source: bool | None = None) -> tuple[Path, bool]:
    """Make ``backend``'s export of the model at ``model_path`` unless a complete one exists.

    ``onnx-int8`` first makes (or reuses) the fp32 export and quantizes it. A partial export (see the module
    docstring) is deleted and rebuilt. Safe against concurrent exporters of the same export directory (other
    processes too): the build holds an exclusive lock (:func:`_export_lock`) and looks for a complete export again
    once it has it, so the first one builds and the others reuse its export; the build happens in a temporary
    directory renamed into place, so a reader never sees a half-written one.

    ``force`` rebuilds even a complete export, for ``onnx-int8`` also the fp32 export it is quantized from (a
    source that looks complete but does not load fails every int8 build) unless ``force_source`` is False (a
    caller that has just rebuilt it).

    Returns:
        ``(export directory, True if it was built now / False if a complete one was reused)``.

    Raises:
        EmbeddingConfigError: ``model_path`` is not a model folder (:func:`scopekb.embedding.local.check_model_dir`),
            torch/transformers/onnxruntime missing, or the export failed.
    """
    from scopekb.embedding.local import check_model_dir

    if backend not in VARIANTS:
        raise EmbeddingConfigError(f"no export for backend {backend!r}: choose one of {', '.join(VARIANTS)}")
    check_model_dir(model_path)
    where = export_path(model_path, backend, export_dir)
    if not force and read_manifest(where) is not None:
        return where, False
    source = None
    if backend == "onnx-int8":
        source, _ = export_model(model_path, "onnx", export_dir,
                                 force=force if force_source is None else force_source)
    with _export_lock(where):
        if not force and read_manifest(where) is not None:
            return where, False  # another process built it while this one waited for the lock
        for left in where.parent.glob(f".{where.name}.tmp-*"):  # of a build killed before it cleaned up (the lock
            shutil.rmtree(left, ignore_errors=True)            # is held by every builder of this variant)
        _build(model_path, backend, where, source)
    return where, True


def check_export(model_path: Path, backend: str, export_dir: Path | None = None) -> None:
    """Check, loading nothing, that ``backend``'s export of the model at ``model_path`` can be used or made here.

    For a process about to start for a long time (``scopekb worker``, ``scopekb serve query``, ``scopekb up``):
    a complete export (:func:`read_manifest`) is usable; a missing, partial, stale or damaged one can be made
    when its directory can be written and sentence-transformers (the exporter) is installed. A hostile review of
    issue 19 found a worker that started with an export directory it could not write and would have failed every
    sync later. Hashes ``model.onnx`` once (about 0.2 s for the 90 MB fp32 file); imports nothing.

    Raises:
        EmbeddingConfigError: onnxruntime is missing, the export directory cannot be written (naming
            ``SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR``), or the export is unusable and cannot be made here.
    """
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        raise EmbeddingConfigError("the ONNX backends need onnxruntime: pip install 'scopekb[local]'")
    where = export_path(model_path, backend, export_dir)
    if read_manifest(where) is not None:
        return
    _check_writable(where.parent)
    if importlib.util.find_spec("sentence_transformers") is None and not is_onnx_only(model_path):
        raise EmbeddingConfigError(f"the {backend} export of the local model is {_state(where)} ({where}) and "
                                   f"cannot be made without sentence-transformers: {_fix(backend)}")


def _check_writable(folder: Path) -> None:
    """Create ``folder`` (and its parents) if needed and check that files can be made in it.

    Raises:
        EmbeddingConfigError: it cannot be written; the message names the setting that moves the exports.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as e:
        raise _unwritable(folder, e) from e


def _unwritable(folder: Path, e: OSError) -> EmbeddingConfigError:
    return EmbeddingConfigError(f"cannot write the ONNX export directory {folder} ({e.strerror or e}): set "
                                "SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR to a writable folder")


@contextlib.contextmanager
def _export_lock(where: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``<where's parent>/.<where's name>.lock`` (created if needed) while the block runs.

    Raises:
        EmbeddingConfigError: the export directory is not writable.
    """
    _check_writable(where.parent)
    try:
        fh = open(where.parent / f".{where.name}.lock", "a")  # noqa: SIM115 - closed below
    except OSError as e:
        raise _unwritable(where.parent, e) from e
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
    finally:
        fh.close()  # releases the lock


def _build(model_path: Path, backend: str, where: Path, source: Path | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{where.name}.tmp-", dir=where.parent))
    t0 = time.perf_counter()
    try:
        kept: list[str] = []
        if source is None and is_onnx_only(model_path):  # a fetched model: its fp32 file is the export
            shutil.copyfile(model_path / ONNX_FILE, tmp / MODEL_FILE)
        elif source is None:
            _export_fp32(model_path, tmp / MODEL_FILE)
        else:
            kept = _quantize(model_path, source / MODEL_FILE, tmp / MODEL_FILE)
            cosine = int8_retention(model_path, source / MODEL_FILE, tmp / MODEL_FILE)
            if cosine < MIN_INT8_COSINE:
                raise EmbeddingConfigError(
                    f"the int8 quantization of the local model keeps a mean cosine of {cosine:.3f} to its fp32 "
                    f"vectors, under the {MIN_INT8_COSINE} this backend promises (a model whose graph the "
                    "quantization settings do not fit): set SCOPEKB_EMBEDDING__LOCAL_BACKEND=onnx for this model")
        manifest = {"format": FORMAT, "backend": backend, "bytes": (tmp / MODEL_FILE).stat().st_size,
                    "sha256": file_sha256(tmp / MODEL_FILE),
                    "opset": OPSET, "source": str(model_path), "created_at": time.time()}
        if source is not None:
            manifest["quantization"] = INT8_QUANTIZATION
            manifest["fp32_nodes"] = kept
            manifest["cosine_to_fp32"] = round(cosine, 5)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if where.exists():
            shutil.rmtree(where)
        os.replace(tmp, where)
    except EmbeddingConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any export failure: one message
        raise EmbeddingConfigError(f"exporting the local model to {backend} failed: {type(e).__name__}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("embedding_onnx_exported", path=str(where), backend=backend,
             seconds=round(time.perf_counter() - t0, 1))


def export_in_child(model_path: Path, backend: str, export_dir: Path | None = None, timeout_s: float = 1800
                    ) -> tuple[Path, bool]:
    """:func:`export_model` in a child Python process (torch is imported there, never in this process), waiting
    for it; ``timeout_s`` bounds the wait (an export takes about a minute on a busy 2-core machine).

    Returns:
        ``(export directory, True if the child built it / False if it found a complete one)``, as
        :func:`export_model`.

    Raises:
        EmbeddingConfigError: the child failed (its last line of error output is in the message) or timed out.
    """
    code = ("import sys; from pathlib import Path; from scopekb.embedding.onnx import export_model; "
            "print(export_model(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]) if sys.argv[3] else None)[1])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        r = subprocess.run([sys.executable, "-c", code, str(model_path), backend, str(export_dir or "")],
                           capture_output=True, text=True, env=env, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EmbeddingConfigError(f"exporting the local model to {backend} failed ({e}): {_fix(backend)}") from e
    where = export_path(model_path, backend, export_dir)
    if r.returncode != 0 or read_manifest(where) is None:
        lines = (r.stderr or r.stdout).strip().splitlines()
        last = re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1]) if lines else f"exit {r.returncode}"
        if "SCOPEKB_EMBEDDING__" in last or "reinstall" in last:  # the child's error names its own fix (a
            # setting, a damaged install): `model export` would fail the same way
            raise EmbeddingConfigError(last if last.startswith("exporting the local model")
                                       else f"exporting the local model to {backend} failed: {last}")
        if last.startswith("exporting the local model"):  # the child's own failure line: not wrapped twice; an
            # export that files of its own make fail (a broken fp32 source of int8) needs the forced rebuild
            raise EmbeddingConfigError(f"{last}: {_fix(backend, force=True)}")
        raise EmbeddingConfigError(f"exporting the local model to {backend} failed ({last}): {_fix(backend)}")
    built = r.stdout.strip().splitlines()[-1:] == ["True"]
    log.info("embedding_onnx_export_child", path=str(where), backend=backend, built=built)
    return where, built


def _export_fp32(model_path: Path, dest: Path) -> None:
    try:
        import torch
        from transformers import AutoModel
    except ImportError as e:
        raise EmbeddingConfigError("exporting needs torch and transformers: pip install 'scopekb[local]'") from e

    model = AutoModel.from_pretrained(str(model_path), local_files_only=True, attn_implementation="eager").eval()

    class _Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    sample = torch.ones((2, 8), dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    # the tracer's warnings are about Python-side shape checks; parity with torch on padded batches is tested
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Hidden(), (sample, sample, torch.zeros_like(sample)), str(dest), input_names=names,
                          output_names=["last_hidden_state"], opset_version=OPSET, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]})


def ffn_output_matmuls(model_file: Path) -> list[str]:
    """Names of the MatMul nodes of each encoder layer's feed-forward output projection in the ONNX model at
    ``model_file``: ``…/output/dense/MatMul`` not under ``attention`` (the Hugging Face BERT export's names; one
    per layer, empty for a graph named otherwise)."""
    import onnx

    m = onnx.load(str(model_file), load_external_data=False)
    return [n.name for n in m.graph.node if n.op_type == "MatMul" and "/output/dense/" in n.name
            and "attention" not in n.name]


def attention_products(model_file: Path) -> list[str]:
    """Names of the MatMul nodes that multiply two activations in each encoder layer's self-attention (query x key,
    then the attention weights x value): ``…/attention/self/MatMul*`` in the Hugging Face BERT export (two per
    layer, empty for a graph named otherwise)."""
    import onnx

    m = onnx.load(str(model_file), load_external_data=False)
    return [n.name for n in m.graph.node if n.op_type == "MatMul" and "/attention/self/MatMul" in n.name]


_KEEP_FP32 = {"ffn_output": ffn_output_matmuls, "attention_products": attention_products}


def calibration_batches(model_path: Path, batch: int = CALIBRATION_BATCH) -> list[dict[str, np.ndarray]]:
    """The model inputs of the calibration texts (:data:`CALIBRATION_FILE`), in file order, ``batch`` texts per
    padded batch, each text cut to the model's ``max_seq_length`` as :class:`scopekb.embedding.local.LocalEmbedder`
    cuts it.

    Raises:
        EmbeddingConfigError: the calibration file is missing, unreadable or not the one recorded
            (:data:`CALIBRATION_SHA256`), or the tokenizer does not load.
    """
    from scopekb.embedding.local import WordPieces, pack_batch

    try:
        raw = CALIBRATION_FILE.read_bytes()
        texts = json.loads(raw)["texts"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EmbeddingConfigError(f"cannot read the int8 calibration texts {CALIBRATION_FILE}: {e}; "
                                   "reinstall scopekb") from e
    if hashlib.sha256(raw).hexdigest() != CALIBRATION_SHA256:
        raise EmbeddingConfigError(f"the int8 calibration texts {CALIBRATION_FILE} are not the ones this release "
                                   "was built with (sha256 differs); reinstall scopekb")
    _, _, max_len = _pooling(model_path)
    ids = [s if len(s) <= max_len else [*s[:max_len - 1], s[-1]] for s in WordPieces(model_path).ids(texts)]
    out = []
    for i in range(0, len(ids), batch):
        x, m = pack_batch(ids[i:i + batch], max(len(t) for t in ids[i:i + batch]))
        out.append({"input_ids": x, "attention_mask": m, "token_type_ids": np.zeros_like(x)})
    return out


def int8_retention(model_path: Path, fp32_file: Path, int8_file: Path) -> float:
    """Mean cosine between the pooled, normalised vectors of the fp32 and the int8 model files for the first
    :data:`RETENTION_TEXTS` calibration texts (about 5 s on this machine kind): the check an ``onnx-int8`` export
    passes before it is used (:data:`MIN_INT8_COSINE`).

    Raises:
        EmbeddingConfigError: as :func:`calibration_batches`.
    """
    import onnxruntime as ort

    from scopekb.embedding.local import l2_normalise

    pooling = _pooling(model_path)[0]
    batches = calibration_batches(model_path)[:max(1, RETENTION_TEXTS // CALIBRATION_BATCH)]

    def vectors(f: Path) -> np.ndarray:
        sess = ort.InferenceSession(str(f), providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}
        rows = []
        for b in batches:
            hidden = sess.run(["last_hidden_state"], {k: v for k, v in b.items() if k in names})[0]
            if pooling == "cls":
                rows.append(hidden[:, 0])
            else:
                m = b["attention_mask"][..., None].astype(np.float32)
                rows.append((hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9))
        return l2_normalise(np.concatenate(rows).astype(np.float32))

    return float((vectors(fp32_file) * vectors(int8_file)).sum(axis=1).mean())


def _quantize(model_path: Path, source: Path, dest: Path) -> list[str]:
    """``quantize_static`` of the fp32 model file ``source`` into ``dest`` with :data:`INT8_QUANTIZATION`, calibrated
    on :func:`calibration_batches` (the graph is first prepared by ONNX Runtime's ``quant_pre_process``, shape
    inference and graph optimisation, as its documentation asks; no symbolic shape inference, which this graph's
    dynamic axes defeat).

    Returns:
        the names of the MatMul nodes kept in fp32.

    Raises:
        EmbeddingConfigError: onnxruntime is not installed, or the calibration texts are unusable.
    """
    try:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as e:
        raise EmbeddingConfigError("quantizing needs onnxruntime: pip install 'scopekb[local]'") from e
    q = INT8_QUANTIZATION
    batches = calibration_batches(model_path, q["calibration_batch"])

    class _Reader(CalibrationDataReader):  # type: ignore[misc] - onnxruntime's base class is untyped
        def __init__(self) -> None:
            self._it = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    keep = sorted({n for k in q["keep_fp32"] for n in _KEEP_FP32[k](source)})
    prepared = dest.with_name("prepared.onnx")
    try:
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        quantize_static(str(prepared), str(dest), _Reader(), quant_format=QuantFormat[q["format"]],
                        op_types_to_quantize=list(q["op_types_to_quantize"]),
                        activation_type=QuantType[q["activation_type"]], weight_type=QuantType[q["weight_type"]],
                        per_channel=q["per_channel"], nodes_to_exclude=keep,
                        calibrate_method=CalibrationMethod[q["calibrate_method"]],
                        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
    finally:
        prepared.unlink(missing_ok=True)
    return keep
