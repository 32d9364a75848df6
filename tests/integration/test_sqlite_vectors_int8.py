"""Issue #19: the embedded (SQLite) store stores float32 or int8 vectors to match ``opensearch.knn_encoder``.

With ``int8`` each vector is kept as ``dimension`` signed bytes made by :func:`scopekb.fields.int8_vector` (the rule
the OpenSearch store's ``int8`` encoder uses, whose recall ``tests/integration/test_knn_quantized.py`` checks on
OpenSearch), the query vector is converted the same way, exact search keeps recall@10 >= 0.95 against float32
exact search, a file of the other storage is refused until ``reindex`` converts it, and the runtime of the embedded
profile builds its store with the setting."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from scopekb import fields as F
from scopekb.reindex import reindex
from scopekb.settings import ChunkingSettings
from scopekb.stores.base import ScopeFilter, SearchFilter
from scopekb.stores.sqlite import SqliteChunkStore
from scopekb.stores.sqlite.chunks import SqliteVersionMismatch

DIM = 384
FLT = SearchFilter(scope=ScopeFilter("a", ("c",)))


def clustered(n: int, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors around 40 random centres (as in test_knn_quantized)."""
    centres = rng.normal(size=(40, DIM))
    rows = centres[rng.integers(0, 40, n)] + 0.5 * rng.normal(size=(n, DIM))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _docs(vecs: np.ndarray) -> list[dict]:
    return [{"_id": str(i), F.AGENT_NAME: "a", F.CONTEXT_ID: "c", F.PATH: f"f{i}.py", F.CONTENT: f"x{i}",
             F.START_LINE: 1, F.END_LINE: 1, F.CHUNK_INDEX: 0, F.EMBEDDING: v.tolist(), F.EMBEDDING_MODEL: "m"}
            for i, v in enumerate(vecs)]


def _blob_sizes(path: Path) -> set[int]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT DISTINCT length(embedding) FROM chunk_vectors")}


@pytest.mark.parametrize("encoder", ["none", "sq", "int8"])
def test_vectors_stored_as_the_encoder_says_with_recall(tmp_path: Path, encoder: str) -> None:
    rng = np.random.default_rng(19)
    docs, queries = clustered(2000, rng), clustered(50, rng)
    store = SqliteChunkStore(tmp_path / "index.sqlite3", dimension=DIM, model="m", encoder=encoder)
    store.ensure_index()
    report = store.bulk_write(_docs(docs))
    assert not report.errors and report.written == len(docs)
    assert _blob_sizes(store.path) == {DIM if encoder == "int8" else 4 * DIM}
    back = {d["_id"]: d[F.EMBEDDING] for d in store.stored_documents()}
    if encoder == "int8":  # the bytes written, as int8_vector made them
        assert back["0"] == [float(x) for x in F.int8_vector(docs[0])]
    else:
        assert np.allclose(back["0"], docs[0])
    recalls = []
    for q in queries:
        exact = set(np.argsort(-(docs @ q))[:10].astype(str))
        hits = store.vector_search(q.tolist(), FLT, 10)
        # scores keep the (1 + cos) / 2 scale; int8: the cosine of the int8 vectors, within 0.01 of float32's
        tol = 5e-3 if encoder == "int8" else 1e-5
        assert all(abs(score - (1 + float(docs[int(i)] @ q)) / 2) < tol for i, score, _ in hits)
        recalls.append(len({h[0] for h in hits} & exact) / 10)
    assert float(np.mean(recalls)) >= (0.95 if encoder == "int8" else 1.0), recalls
    # the cached matrix (more rows than a direct read takes) answers the same as the first search
    again = store.vector_search(queries[0].tolist(), FLT, 10)
    assert [h[0] for h in again] == [h[0] for h in store.vector_search(queries[0].tolist(), FLT, 10)]


def test_other_storage_refused_until_reindex(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    vecs = clustered(30, rng)
    path = tmp_path / "index.sqlite3"
    f32 = SqliteChunkStore(path, dimension=DIM, model="m")
    f32.ensure_index()
    assert not f32.bulk_write(_docs(vecs)).errors
    i8 = SqliteChunkStore(path, dimension=DIM, model="m", encoder="int8")
    assert i8.version_name != f32.version_name
    with pytest.raises(SqliteVersionMismatch, match="int8"):
        i8.ensure_index()
    rep = reindex(i8, None, None, ChunkingSettings())  # no embedder: the stored vectors are converted
    assert rep.chunks == 30 and _blob_sizes(path) == {DIM}
    assert i8.ensure_index() and i8.vector_search(vecs[3].tolist(), FLT, 1)[0][0] == "3"
    with pytest.raises(SqliteVersionMismatch, match="none"):
        SqliteChunkStore(path, dimension=DIM, model="m").ensure_index()
    rep = reindex(f32, None, None, ChunkingSettings())  # and back: float32 blobs of the int8 values
    assert rep.chunks == 30 and _blob_sizes(path) == {4 * DIM}
    assert f32.vector_search(vecs[3].tolist(), FLT, 1)[0][0] == "3"


def test_embedded_runtime_builds_its_store_with_the_setting(tmp_path: Path) -> None:
    from scopekb.runtime import build_embedded_runtime
    from scopekb.settings import Settings
    from tests.openai_stub import OpenAIStub

    def encode(texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 8), dtype=np.float32) / np.sqrt(8)

    with OpenAIStub(encode, api_key="sk-int8") as stub:
        s = Settings(data_dir=str(tmp_path), opensearch={"knn_encoder": "int8"},
                     embedding={"provider": "openai", "model": "ones-8", "base_url": stub.base_url,
                                "api_key": "sk-int8"})
        rt = build_embedded_runtime(s)
        assert rt.chunks.kind == "sqlite" and rt.chunks.encoder == "int8"
