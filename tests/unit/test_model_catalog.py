"""Issue 21: which folder the local-model settings name, and what a fetched model folder holds (pure logic; the
real fetch from Maven is tests/integration/test_fetched_model.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from scopekb.embedding import EmbeddingConfigError
from scopekb.embedding.catalog import (
    DEFAULT_MODEL,
    FETCHABLE,
    FETCHED_FILE,
    LOCAL_MODELS,
    ONNX_FILE,
    _write_config,
    check_fetched,
    fetch_model,
    is_onnx_only,
)
from scopekb.embedding.local import check_backend, check_model_dir, default_model_id, settings_model_path
from scopekb.settings import EmbeddingSettings

NAME = "bge-small-en-v1.5"


def fake_fetched(root: Path, onnx: bytes = b"onnx bytes") -> Path:
    """A folder laid out as ``scopekb model fetch`` writes it, with a fake ONNX file."""
    folder = root / NAME
    (folder / ONNX_FILE).parent.mkdir(parents=True)
    (folder / "1_Pooling").mkdir()
    (folder / ONNX_FILE).write_bytes(onnx)
    (folder / "tokenizer.json").write_text("{}")
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
    with pytest.raises(EmbeddingConfigError, match=f"LOCAL_MODELS_DIR.*scopekb model fetch {NAME}"):
        settings_model_path(EmbeddingSettings(local_model=NAME, local_models_dir=tmp_path))
    folder = fake_fetched(tmp_path)
    assert settings_model_path(EmbeddingSettings(local_model=NAME, local_models_dir=tmp_path)) == folder


def test_a_fetched_folder_is_a_model_folder_for_the_onnx_backends_only(tmp_path: Path) -> None:
    folder = fake_fetched(tmp_path)
    assert check_model_dir(folder) == folder
    meta = json.loads((folder / FETCHED_FILE).read_text())
    assert meta["onnx_bytes"] == len(b"onnx bytes") and meta["artifact"] == FETCHABLE[NAME].artifact
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


def test_the_model_id_names_the_model_and_changes_with_its_onnx_file(tmp_path: Path) -> None:
    a = default_model_id(fake_fetched(tmp_path / "a"), "onnx")
    b = default_model_id(fake_fetched(tmp_path / "b", b"other, longer onnx bytes"), "onnx")
    assert a.startswith(f"local:{NAME}@") and b.startswith(f"local:{NAME}@") and a != b
    assert default_model_id(fake_fetched(tmp_path / "c"), "onnx-int8").startswith(a + "+int8-")


def test_an_incomplete_or_foreign_folder_is_not_fetched(tmp_path: Path) -> None:
    folder = fake_fetched(tmp_path)
    (folder / ONNX_FILE).write_bytes(b"cut")  # another size than recorded: an interrupted copy
    with pytest.raises(EmbeddingConfigError, match="not fetched"):
        check_fetched(NAME, tmp_path)
    (folder / FETCHED_FILE).write_text("not json")
    with pytest.raises(EmbeddingConfigError, match="not fetched"):
        check_fetched(NAME, tmp_path)


def test_fetch_refuses_unknown_names_and_a_missing_maven_in_one_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EmbeddingConfigError, match="no local model named 'x'.*bge-small-en-v1.5"):
        fetch_model("x", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no mvn on PATH
    with pytest.raises(EmbeddingConfigError, match="needs Maven"):
        fetch_model(NAME, tmp_path)
    fake_fetched(tmp_path)
    assert fetch_model(NAME, tmp_path) == (tmp_path / NAME, False)  # complete: reused, Maven not needed
