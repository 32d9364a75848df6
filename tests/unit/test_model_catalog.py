"""Issue 21: which folder the local-model settings name, what a fetched model folder holds, and how ``scopekb model
fetch`` fails (pure logic with a fake model and a fake ``mvn`` script; the real fetch from Maven Central is
tests/integration/test_fetched_model.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from scopekb.embedding import EmbeddingConfigError, catalog
from scopekb.embedding.catalog import (
    DEFAULT_MODEL,
    FETCHABLE,
    FETCHED_FILE,
    LOCAL_MODELS,
    ONNX_FILE,
    _maven_error,
    _write_config,
    check_fetched,
    default_models_dir,
    fetch_model,
    is_onnx_only,
)
from scopekb.embedding.local import check_backend, check_model_dir, default_model_id, settings_model_path
from scopekb.embedding.onnx import default_export_dir
from scopekb.settings import EmbeddingSettings

NAME = "bge-small-en-v1.5"
ONNX = b"fake onnx weights " * 64
TOKENIZER = b'{"fake": "tokenizer"}'


@pytest.fixture(autouse=True)
def fake_spec(monkeypatch: pytest.MonkeyPatch) -> catalog.FetchedModel:
    """The catalog entry of ``NAME`` with the digests and sizes of the fake files above."""
    spec = dataclasses.replace(FETCHABLE[NAME], onnx_sha256=hashlib.sha256(ONNX).hexdigest(), onnx_bytes=len(ONNX),
                               tokenizer_sha256=hashlib.sha256(TOKENIZER).hexdigest(),
                               tokenizer_bytes=len(TOKENIZER))
    monkeypatch.setitem(FETCHABLE, NAME, spec)
    return spec


def fake_fetched(root: Path, onnx: bytes = ONNX) -> Path:
    """A folder laid out as ``scopekb model fetch`` writes it, with the fake files."""
    folder = root / NAME
    (folder / ONNX_FILE).parent.mkdir(parents=True)
    (folder / "1_Pooling").mkdir()
    (folder / ONNX_FILE).write_bytes(onnx)
    (folder / "tokenizer.json").write_bytes(TOKENIZER)
    _write_config(folder, FETCHABLE[NAME])
    return folder


def test_the_settings_accept_every_catalog_name_and_nothing_else() -> None:
    assert set(LOCAL_MODELS) == {DEFAULT_MODEL, NAME}
    assert EmbeddingSettings().local_model == DEFAULT_MODEL
    for name in LOCAL_MODELS:
        assert EmbeddingSettings(local_model=name).local_model == name
    with pytest.raises(ValidationError):
        EmbeddingSettings(local_model="bge-large")


def test_settings_model_path_resolution(tmp_path: Path) -> None:
    assert settings_model_path(EmbeddingSettings()) is None  # the packaged wheel
    other = tmp_path / "mine"
    assert settings_model_path(EmbeddingSettings(local_model=NAME, local_model_path=other)) == other  # path wins
    with pytest.raises(EmbeddingConfigError, match=f"LOCAL_MODELS_DIR.*scopekb model fetch {NAME}` once"):
        settings_model_path(EmbeddingSettings(local_model=NAME, local_models_dir=tmp_path))
    folder = fake_fetched(tmp_path)
    assert settings_model_path(EmbeddingSettings(local_model=NAME, local_models_dir=tmp_path)) == folder


def test_a_fetched_folder_is_a_model_folder_for_the_onnx_backends_only(tmp_path: Path) -> None:
    folder = fake_fetched(tmp_path)
    assert check_model_dir(folder) == folder
    meta = json.loads((folder / FETCHED_FILE).read_text())
    assert meta["onnx_bytes"] == len(ONNX) and meta["artifact"] == FETCHABLE[NAME].artifact
    pool = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pool == {"word_embedding_dimension": 384, "pooling_mode_cls_token": True,
                    "pooling_mode_mean_tokens": False}
    assert is_onnx_only(folder)
    for backend in ("onnx", "onnx-int8"):
        check_backend(folder, backend)
    with pytest.raises(EmbeddingConfigError, match="ONNX only.*LOCAL_BACKEND"):
        check_backend(folder, "torch")
    (folder / "model.safetensors").write_bytes(b"w")  # torch weights beside it: torch may run it
    assert not is_onnx_only(folder)
    check_backend(folder, "torch")


def test_the_model_id_names_the_model_and_follows_its_onnx_files_content(tmp_path: Path) -> None:
    a = default_model_id(fake_fetched(tmp_path / "a"), "onnx")
    same_size = bytes(reversed(ONNX))  # the same size, other weights (a hostile review: same id, other vectors)
    b = default_model_id(fake_fetched(tmp_path / "b", same_size), "onnx")
    assert a.startswith(f"local:{NAME}@") and b.startswith(f"local:{NAME}@") and a != b
    assert default_model_id(fake_fetched(tmp_path / "c"), "onnx-int8").startswith(a + "+int8-")


def test_an_onnx_file_beside_torch_weights_leaves_the_model_id_as_before(tmp_path: Path) -> None:
    """A Hugging Face snapshot (safetensors and an onnx/ folder) given as LOCAL_MODEL_PATH keeps the id it had before
    fetched models existed: its vectors come from the safetensors (hostile review: an upgrade refused its index)."""
    folder = tmp_path / "hf-snapshot"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    before = default_model_id(folder, "onnx")
    (folder / ONNX_FILE).parent.mkdir()
    (folder / ONNX_FILE).write_bytes(ONNX)
    assert default_model_id(folder, "onnx") == before


@pytest.mark.parametrize("damage", ["same-size-onnx", "tokenizer-gone", "pooling-gone", "meta-fifo", "not-a-folder"])
def test_a_changed_or_incomplete_folder_is_refused_naming_the_forced_fetch(tmp_path: Path, damage: str) -> None:
    folder = fake_fetched(tmp_path)
    if damage == "same-size-onnx":
        (folder / ONNX_FILE).write_bytes(bytes(reversed(ONNX)))
    elif damage == "tokenizer-gone":
        (folder / "tokenizer.json").unlink()
    elif damage == "pooling-gone":
        (folder / "1_Pooling" / "config.json").unlink()
    elif damage == "meta-fifo":  # never read: a FIFO would block a reader for good
        (folder / FETCHED_FILE).unlink()
        os.mkfifo(folder / FETCHED_FILE)
    else:
        shutil.rmtree(folder)
        folder.write_text("a file")
    with pytest.raises(EmbeddingConfigError, match=f"incomplete or changed.*scopekb model fetch {NAME} --force"):
        check_fetched(NAME, tmp_path)


def test_maven_errors_are_read_from_the_error_line_without_colour_codes() -> None:
    out = ("\x1b[1;31m[ERROR]\x1b[m No plugin found for prefix 'dependency' in the current project\n"
           "[ERROR] \n[ERROR] [Help 1] http://cwiki.apache.org/x\n\x1b[0m\x1b[0m\n")
    assert _maven_error(out) == "[ERROR] No plugin found for prefix 'dependency' in the current project"
    assert _maven_error("\x1b[0m\n") == "no output"
    assert _maven_error("one\nlast words\n") == "last words"


def test_relative_cache_homes_are_ignored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "rel")
    assert default_models_dir().is_absolute() and default_export_dir().is_absolute()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_models_dir() == tmp_path / "scopekb" / "models"


# ---- scopekb model fetch with a fake mvn ------------------------------------------------------------------------


def fake_mvn(tmp: Path, mode: str) -> str:
    """An ``mvn`` that writes a jar (``ok``: the fake files; ``big``: an onnx entry larger than recorded) into the
    ``-Dmaven.repo.local`` repository and exits 0, or fails as Debian's Maven does (``fail``), or writes nothing
    (``nojar``)."""
    jar = tmp / f"{mode}.jar"
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as z:
        spec = FETCHABLE[NAME]
        z.writestr(spec.onnx_entry, ONNX + (b"\0" * 4096 if mode == "big" else b""))
        z.writestr(spec.tokenizer_entry, TOKENIZER)
    group, artifact, version = FETCHABLE[NAME].artifact.split(":")
    rel = f"{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"
    script = tmp / f"mvn-{mode}"
    script.write_text(f"""#!{sys.executable}
import os, shutil, sys
if {mode!r} == "fail":
    print("\\x1b[1;31m[ERROR]\\x1b[m Could not transfer artifact: connection refused")
    print("[ERROR] [Help 1] http://cwiki.apache.org/x")
    sys.stderr.write("\\x1b[0m\\x1b[0m")
    sys.exit(1)
repo = [a.split("=", 1)[1] for a in sys.argv if a.startswith("-Dmaven.repo.local=")][0]
if {mode!r} != "nojar":
    os.makedirs(os.path.dirname(os.path.join(repo, {rel!r})), exist_ok=True)
    shutil.copy({str(jar)!r}, os.path.join(repo, {rel!r}))
""")
    script.chmod(0o755)
    return str(script)


def test_fetch_writes_the_folder_once_and_force_replaces_it(tmp_path: Path) -> None:
    models = tmp_path / "models"
    calls: list[str] = []
    where, fetched = fetch_model(NAME, models, mvn=fake_mvn(tmp_path, "ok"), on_fetch=lambda a, mb: calls.append(a))
    assert (where, fetched) == (models / NAME, True) and calls == [FETCHABLE[NAME].artifact]
    assert check_fetched(NAME, models) == where
    assert fetch_model(NAME, models, mvn="/nonexistent/mvn") == (where, False)  # complete: Maven not needed
    (models / f".{NAME}.tmp-killed").mkdir()  # a fetch killed before it cleaned up
    assert fetch_model(NAME, models, force=True, mvn=fake_mvn(tmp_path, "ok")) == (where, True)
    assert sorted(p.name for p in models.iterdir()) == [f".{NAME}.lock", NAME]


@pytest.mark.parametrize(("mode", "needle"), [
    ("fail", "Maven could not fetch .*: \\[ERROR\\] Could not transfer artifact: connection refused$"),
    ("nojar", "Maven reported success but wrote no jar"),
    ("big", "onnx is 5248 bytes, not the 1152 recorded"),
])
def test_a_failed_fetch_is_one_error_and_keeps_the_folder_that_was_there(tmp_path: Path, mode: str,
                                                                        needle: str) -> None:
    models = tmp_path / "models"
    fetch_model(NAME, models, mvn=fake_mvn(tmp_path, "ok"))
    with pytest.raises(EmbeddingConfigError, match=needle):
        fetch_model(NAME, models, force=True, mvn=fake_mvn(tmp_path, mode))
    assert check_fetched(NAME, models) == models / NAME
    assert sorted(p.name for p in models.iterdir()) == [f".{NAME}.lock", NAME]


def test_fetch_refuses_unknown_names_missing_maven_and_a_file_in_the_way(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EmbeddingConfigError, match="no local model named 'x'.*bge-small-en-v1.5"):
        fetch_model("x", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no mvn on PATH
    with pytest.raises(EmbeddingConfigError, match="needs Maven"):
        fetch_model(NAME, tmp_path)
    (tmp_path / NAME).write_text("a file")
    with pytest.raises(EmbeddingConfigError, match="exists and is not a folder scopekb wrote"):
        fetch_model(NAME, tmp_path, force=True, mvn="/nonexistent/mvn")  # refused before anything is fetched
