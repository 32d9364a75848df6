"""A first use that builds the local model's ONNX export (50-160 s) says so in one line before it starts, and the
CLI prints that line to stderr (README newcomer: ``scopekb index`` with the second model sat silent for minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scopekb.embedding import EmbeddingConfigError, onnx
from scopekb.embedding.local import packaged_model_path


@pytest.fixture
def notices(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(onnx, "_export_notice", lines.append)
    return lines


def test_a_missing_export_built_on_first_use_is_announced_once(tmp_path: Path, notices: list[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(*_a: object, **_k: object) -> None:
        assert len(notices) == 1  # told before the build starts, not after
        raise EmbeddingConfigError("stopped before building")

    monkeypatch.setattr(onnx, "export_in_child", stop)
    with pytest.raises(EmbeddingConfigError, match="stopped before building"):
        onnx.OnnxRunner(packaged_model_path(), "onnx-int8", 1, export_dir=tmp_path, auto_export=True)
    assert len(notices) == 1 and "\n" not in notices[0], notices
    assert notices[0].startswith("embeddings: building the onnx-int8 export of the local model once, in "), notices
    assert str(tmp_path) in notices[0] and "later runs reuse it" in notices[0]


def test_no_notice_when_the_export_is_refused_rather_than_built(tmp_path: Path, notices: list[str]) -> None:
    with pytest.raises(EmbeddingConfigError, match="scopekb model export"):
        onnx.OnnxRunner(packaged_model_path(), "onnx-int8", 1, export_dir=tmp_path, auto_export=False)
    assert notices == []


def test_the_cli_prints_the_notice_to_stderr(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from scopekb_cli import main

    monkeypatch.setattr(onnx, "_export_notice", None)
    monkeypatch.setattr(main.err, "file", None)  # rich: None writes to the current sys.stderr (captured)
    main._export_notice()
    assert onnx._export_notice is not None
    onnx._export_notice("embeddings: building the onnx-int8 export [bold]x[/bold] " + "p" * 200)
    got = capsys.readouterr()
    assert got.out == "" and got.err == "embeddings: building the onnx-int8 export [bold]x[/bold] " + "p" * 200 + "\n"
