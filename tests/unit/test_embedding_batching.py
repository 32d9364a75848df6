"""Issue #19: the local embedder's batching is pure logic (no model): length-sorted batches within a text and a
padded-token budget, truncation that matches Hugging Face's for one ``[CLS] … [SEP]`` sequence, thread count."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scopekb.embedding.local import cpu_threads, default_model_id, l2_normalise, pack_batch, plan_batches
from scopekb.embedding.onnx import (
    CALIBRATION_FILE,
    CALIBRATION_SHA256,
    FORMAT,
    INT8_QUANTIZATION,
    MANIFEST,
    MODEL_FILE,
    _state,
    int8_id_suffix,
    read_manifest,
)


@given(st.lists(st.integers(1, 300), max_size=200), st.integers(1, 64), st.integers(1, 5000))
def test_plan_batches_covers_every_text_once_within_limits(lengths: list[int], max_texts: int,
                                                            max_tokens: int) -> None:
    batches = plan_batches(lengths, max_texts, max_tokens)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    for b in batches:
        assert 1 <= len(b) <= max_texts
        width = max(lengths[i] for i in b)
        assert len(b) == 1 or width * len(b) <= max_tokens  # a lone over-long text is its own batch
    # longest first across the whole plan: padding only within texts of near length
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)


def test_plan_batches_packs_short_texts_together() -> None:
    lengths = [256] * 4 + [10] * 100
    batches = plan_batches(lengths, max_texts=64, max_tokens=1024)
    assert [len(b) for b in batches] == [4, 64, 36]


def test_pack_batch_truncates_like_hugging_face() -> None:
    cls, sep = 101, 102
    long = [cls, *range(1000, 1300), sep]  # 302 ids
    short = [cls, 7, 8, sep]
    ids, mask = pack_batch([long, short], max_len=256, pad_id=0)
    assert ids.shape == (2, 256) and ids.dtype == np.int64
    assert ids[0, 0] == cls and ids[0, 255] == sep and list(ids[0, 1:255]) == list(range(1000, 1254))
    assert list(ids[1, :4]) == short and not ids[1, 4:].any()
    assert mask[0].all() and list(mask[1]) == [1] * 4 + [0] * 252


def test_threads_follow_the_cpus_this_process_may_use() -> None:
    assert cpu_threads(3) == 3
    assert cpu_threads(0) == len(os.sched_getaffinity(0))


def test_int8_vectors_get_their_own_model_id() -> None:
    """int8 vectors have their own id, and one per quantization: the per-tensor settings' vectors (id ``+int8``
    before the settings were part of it) are never mixed with per-channel ones in a cache or an index."""
    torch_id, onnx_id, int8_id = (default_model_id(None, b) for b in ("torch", "onnx", "onnx-int8"))
    assert torch_id == onnx_id and int8_id == torch_id + int8_id_suffix()
    assert int8_id != torch_id + "+int8" and int8_id_suffix().startswith("+int8-")
    assert int8_id_suffix({"weight_type": "QInt8"}) != int8_id_suffix(INT8_QUANTIZATION)
    assert int8_id_suffix(dict(reversed(INT8_QUANTIZATION.items()))) == int8_id_suffix()  # key order: same id


#: the dynamic quantization shipped before the static one (its vectors depended on their batch)
DYNAMIC_SETTINGS = {"weight_type": "QInt8", "op_types_to_quantize": ["MatMul"], "per_channel": True,
                    "keep_fp32": "ffn_output"}


@pytest.mark.parametrize("recorded", [None, {"weight_type": "QInt8"}, DYNAMIC_SETTINGS,
                                      {**INT8_QUANTIZATION, "reduce_range": True},
                                      {**INT8_QUANTIZATION, "calibration_sha256": "0" * 64}],
                         ids=["not-recorded", "per-tensor", "dynamic", "other", "other-calibration"])
def test_an_int8_export_of_other_quantization_settings_is_stale(tmp_path: Path, recorded: dict | None) -> None:
    """An int8 manifest must record today's quantization settings; one written before they were recorded, or with
    other settings, reads as no export (so it is rebuilt), while the fp32 manifest needs no settings."""
    (tmp_path / MODEL_FILE).write_bytes(b"x" * 10)
    man = {"format": FORMAT, "backend": "onnx-int8", "bytes": 10, "sha256": hashlib.sha256(b"x" * 10).hexdigest()}
    (tmp_path / MANIFEST).write_text(json.dumps(man if recorded is None else {**man, "quantization": recorded}))
    assert read_manifest(tmp_path) is None
    assert _state(tmp_path).startswith("stale")
    (tmp_path / MANIFEST).write_text(json.dumps({**man, "quantization": INT8_QUANTIZATION}))
    assert read_manifest(tmp_path) is not None
    (tmp_path / MANIFEST).write_text(json.dumps({**man, "backend": "onnx"}))
    assert read_manifest(tmp_path) is not None


def test_the_calibration_texts_are_the_recorded_ones() -> None:
    """The packaged calibration file is the one whose digest the int8 settings (and so the model id) name: a new
    file without a new digest would give other int8 vectors under the same id."""
    raw = CALIBRATION_FILE.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == CALIBRATION_SHA256 == INT8_QUANTIZATION["calibration_sha256"]
    texts = json.loads(raw)["texts"]
    assert len(texts) >= 128 and all(isinstance(t, str) and t.strip() for t in texts)
    assert int8_id_suffix() != int8_id_suffix(DYNAMIC_SETTINGS)


def test_changed_calibration_texts_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibration texts other than the recorded ones (an edited install) are refused with one error naming the fix,
    never quantized into vectors under the recorded model id; an unreadable file likewise."""
    from scopekb.embedding import onnx
    from scopekb.embedding.base import EmbeddingConfigError
    from scopekb.embedding.local import packaged_model_path

    f = tmp_path / "calibration.json"
    f.write_text(json.dumps({"texts": ["def f(): pass"]}))
    monkeypatch.setattr(onnx, "CALIBRATION_FILE", f)
    with pytest.raises(EmbeddingConfigError, match=r"not the ones this release was built with.*reinstall scopekb"):
        onnx.calibration_batches(packaged_model_path())
    f.write_text("{not json")
    with pytest.raises(EmbeddingConfigError, match=r"cannot read the int8 calibration texts.*reinstall scopekb"):
        onnx.calibration_batches(packaged_model_path())


def test_calibration_batches_are_padded_batches_within_the_model_limit() -> None:
    from scopekb.embedding.local import packaged_model_path
    from scopekb.embedding.onnx import calibration_batches

    batches = calibration_batches(packaged_model_path(), 16)
    texts = json.loads(CALIBRATION_FILE.read_bytes())["texts"]
    assert sum(b["input_ids"].shape[0] for b in batches) == len(texts)
    for b in batches:
        assert b["input_ids"].shape == b["attention_mask"].shape == b["token_type_ids"].shape
        assert b["input_ids"].shape[0] <= 16 and b["input_ids"].shape[1] <= 256
        assert b["attention_mask"].sum(axis=1).min() >= 2  # [CLS] and [SEP] at least


def test_l2_normalise_keeps_zero_rows() -> None:
    out = l2_normalise(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert np.allclose(out, [[0.6, 0.8], [0.0, 0.0]]) and out.dtype == np.float32


def test_an_export_is_complete_only_with_the_recorded_sha256(tmp_path: Path) -> None:
    """Same size, other bytes (hostile review of issue 19: flipped weights loaded and gave other vectors under the
    same model id): damaged; no sha256 recorded (an export of an earlier release): stale; both read as no export,
    so they are rebuilt (the export is deterministic: the same vectors)."""
    (tmp_path / MODEL_FILE).write_bytes(b"weights!")
    man = {"format": FORMAT, "backend": "onnx", "bytes": 8, "sha256": hashlib.sha256(b"weights!").hexdigest()}
    (tmp_path / MANIFEST).write_text(json.dumps(man))
    assert read_manifest(tmp_path) == man
    (tmp_path / MODEL_FILE).write_bytes(b"weights?")
    assert read_manifest(tmp_path) is None and _state(tmp_path).startswith("damaged")
    (tmp_path / MANIFEST).write_text(json.dumps({k: v for k, v in man.items() if k != "sha256"}))
    assert read_manifest(tmp_path) is None and _state(tmp_path).startswith("stale")
    (tmp_path / MODEL_FILE).write_bytes(b"weights")
    assert read_manifest(tmp_path) is None and _state(tmp_path) == "partial"


def test_a_lone_surrogate_is_tokenized_as_the_replacement_character() -> None:
    """``"\\ud800"`` in JSON is a lone surrogate in a Python ``str``: the tokenizer refused the whole batch for it
    (hostile review of issue 19); now that text reads as U+FFFD and the batch's other texts are unchanged."""
    from scopekb.embedding.local import WordPieces, packaged_model_path, valid_unicode

    w = WordPieces(packaged_model_path())
    assert valid_unicode("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert w.ids(["hello world", "a\ud800b"]) == w.ids(["hello world", "a\ufffdb"])
    assert w.one("x\udc00") == w.one("x\ufffd") and w.ids(["hello world"])[0] == w.one("hello world")


def test_texts_the_tokenizer_reads_as_nothing_are_blank() -> None:
    """Whatever :func:`is_blank` calls blank, the model's tokenizer reads as ``[CLS] [SEP]`` alone (so embedding it
    would rank arbitrary chunks); a text with one letter, digit, punctuation mark or symbol is not blank."""
    from scopekb.embedding.base import is_blank
    from scopekb.embedding.local import WordPieces, packaged_model_path

    w = WordPieces(packaged_model_path())
    blank = ["", " \t\n", "\u200b\u200d\ufeff", "\u0301\u0301", "\ufe0f", "\ue000", "\U000e0041", "\u034f",
             "\u17b4", "\u180b", "\U0001d173", "\U0001bca0", "\x00\x07", "\u00a0\u2028", "\ufffd"]
    for text in blank:
        assert is_blank(text), repr(text)
        assert w.one(text) == w.one(""), repr(text)
    for text in ["a", "  x", "\u200bz", "7", ".", "+", "\u4e2d", "\u00e9", "\U0001f600"]:
        assert not is_blank(text), repr(text)
