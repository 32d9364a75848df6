"""The fix named for an index of another embedding model (issue 19: a changed ``embedding.local_backend``)."""

from scopekb.embedding.local import default_model_id
from scopekb.stores.base import model_mismatch_fix

FP32 = default_model_id(None, "onnx")
INT8 = default_model_id(None, "onnx-int8")


def test_the_int8_default_on_an_fp32_index_names_the_setting_that_keeps_it() -> None:
    fix = model_mismatch_fix(FP32, INT8)
    assert "scopekb reindex" in fix and "SCOPEKB_EMBEDDING__LOCAL_BACKEND=onnx to keep" in fix


def test_fp32_on_an_int8_index_names_onnx_int8() -> None:
    assert "SCOPEKB_EMBEDDING__LOCAL_BACKEND=onnx-int8 to keep" in model_mismatch_fix(INT8, FP32)


def test_other_models_and_other_quantizations_name_the_reindex_only() -> None:
    for have, want in ((FP32, "local:other@0123456789ab"), (INT8, INT8[:-8] + "ffffffff"), ("minilm", "minilm+int8"),
                       (None, INT8), (FP32, None)):
        fix = model_mismatch_fix(have, want)
        assert "scopekb reindex" in fix and "LOCAL_BACKEND" not in fix, (have, want)


def test_only_int8_ids_carry_the_mark() -> None:
    assert "+int8-" in INT8 and "+int8" not in FP32


def test_an_index_of_another_named_local_model_names_the_setting_that_keeps_it() -> None:
    """README newcomer: the notice named both model ids but not the setting to restore (issue 21's second model)."""
    bge = "local:bge-small-en-v1.5@0123456789ab+int8-5cca3e1e"
    assert "SCOPEKB_EMBEDDING__LOCAL_MODEL=bge-small-en-v1.5 to keep" in model_mismatch_fix(bge, INT8)
    assert "SCOPEKB_EMBEDDING__LOCAL_MODEL=all-MiniLM-L6-v2 to keep" in model_mismatch_fix(INT8, bge)
    assert "LOCAL_MODEL=" not in model_mismatch_fix("local:bge-small-en-v1.5@0123456789ab", bge)  # backend only
    both = model_mismatch_fix(FP32, bge)  # another model and another backend: both settings, or it still differs
    assert "LOCAL_MODEL=all-MiniLM-L6-v2 and SCOPEKB_EMBEDDING__LOCAL_BACKEND=onnx to keep" in both, both
    assert "LOCAL_MODEL=" not in model_mismatch_fix(bge, "local:mine@0123456789ab")  # a LOCAL_MODEL_PATH process
