"""The openai provider against the stub server with a fake (hash) encoder: no model, no real waiting.

Retries are observed through the injected ``sleep`` (a recorder), so Retry-After handling is checked exactly.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from scopekb.embedding import EmbeddingConfigError, EmbeddingUnavailable, make_embedder
from scopekb.embedding.openai_provider import PROBE_TEXT, OpenAIEmbedder
from scopekb.settings import EmbeddingSettings
from tests.openai_stub import OpenAIStub

DIM = 8


def fake_encode(texts: list[str]) -> np.ndarray:
    """Deterministic unit vectors from sha256 of each text."""
    rows = []
    for t in texts:
        raw = np.frombuffer(hashlib.sha256(t.encode()).digest()[: DIM * 4], dtype="<u4").astype(np.float64)
        v = raw / 2**32 - 0.5
        rows.append(v / np.linalg.norm(v))
    return np.asarray(rows, dtype=np.float32)


def expected(text: str) -> list[float]:
    return fake_encode([text])[0].tolist()


@pytest.fixture(scope="module")
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub(fake_encode, api_key="sk-test") as s:
        yield s


@pytest.fixture(autouse=True)
def _reset(stub: OpenAIStub) -> None:
    stub.reset()


class Sleeps(list):
    """Records the delays instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def embedder(stub: OpenAIStub, sleeps: Sleeps | None = None, **kw) -> OpenAIEmbedder:
    kw.setdefault("model", "fake-embed")
    return OpenAIEmbedder(base_url=stub.base_url, api_key="sk-test", sleep=sleeps if sleeps is not None else Sleeps(),
                          **kw)


def test_vectors_match_and_batches_respect_max_inputs(stub: OpenAIStub) -> None:
    texts = [f"text number {i}" for i in range(7)]
    e = embedder(stub, max_batch_inputs=3)
    r = e.embed(texts)
    assert r.errors == {}
    assert r.vectors == [expected(t) for t in texts]
    assert [len(q.inputs) for q in stub.served()] == [3, 3, 1]
    assert [t for q in stub.served() for t in q.inputs] == texts
    assert r.requests == 3
    assert r.total_tokens == sum(len(t.split()) + 2 for t in texts)  # the stub's usage.prompt_tokens
    assert e.dimension == DIM and len(stub.served()) == 3  # learnt from the answers, no probe


def test_batches_respect_max_tokens(stub: OpenAIStub) -> None:
    texts = ["a" * 10, "b" * 10, "c" * 10, "d" * 10, "e" * 10]
    e = embedder(stub, max_batch_tokens=25, count_tokens=lambda ts: [len(t) for t in ts])
    r = e.embed(texts)
    assert r.token_counts == [10] * 5
    assert [len(q.inputs) for q in stub.served()] == [2, 2, 1]
    assert r.vectors == [expected(t) for t in texts]


def test_blank_inputs_are_never_sent_and_stay_aligned(stub: OpenAIStub) -> None:
    texts = ["alpha", "", "   \n\t", "beta", ""]
    r = embedder(stub).embed(texts)
    assert r.vectors[0] == expected("alpha") and r.vectors[3] == expected("beta")
    assert r.vectors[1] is None and r.vectors[2] is None and r.vectors[4] is None
    assert r.errors == {}
    assert r.token_counts[1] == r.token_counts[2] == 0
    assert [q.inputs for q in stub.served()] == [["alpha", "beta"]]


def test_all_blank_makes_no_request(stub: OpenAIStub) -> None:
    r = embedder(stub).embed(["", " "])
    assert r.vectors == [None, None] and r.requests == 0 and stub.requests == []
    assert embedder(stub).embed([]).vectors == []


def test_output_order_follows_index_not_position(stub: OpenAIStub) -> None:
    stub.shuffle = True
    texts = [f"t{i}" for i in range(5)]
    assert embedder(stub).embed(texts).vectors == [expected(t) for t in texts]


def test_base64_encoding(stub: OpenAIStub) -> None:
    texts = ["one", "two"]
    r = embedder(stub, encoding_format="base64").embed(texts)
    assert r.vectors == [expected(t) for t in texts]
    assert stub.served()[0].body["encoding_format"] == "base64"


def test_429_honours_retry_after(stub: OpenAIStub) -> None:
    stub.fail_with_429(3, retry_after="7")
    sleeps = Sleeps()
    r = embedder(stub, sleeps).embed(["x"])
    assert r.vectors == [expected("x")]
    assert sleeps == [7.0, 7.0, 7.0]
    assert [q.status for q in stub.requests] == [429, 429, 429, 200]
    assert r.requests == 4


def test_retry_after_is_clamped(stub: OpenAIStub) -> None:
    stub.fail_with_429(1, retry_after="3600")
    sleeps = Sleeps()
    embedder(stub, sleeps, max_retry_after_s=5).embed(["x"])
    assert sleeps == [5]


def test_429_without_retry_after_backs_off(stub: OpenAIStub) -> None:
    stub.fail_with_429(2, retry_after=None)
    sleeps = Sleeps()
    embedder(stub, sleeps, backoff_base_s=1.0, backoff_max_s=10.0).embed(["x"])
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0


def test_5xx_is_retried(stub: OpenAIStub) -> None:
    stub.fail_with_5xx(1)
    stub.fail_with_5xx(1, status=503)
    sleeps = Sleeps()
    r = embedder(stub, sleeps).embed(["y"])
    assert r.vectors == [expected("y")] and len(sleeps) == 2
    assert [q.status for q in stub.requests] == [500, 503, 200]


def test_retries_are_bounded(stub: OpenAIStub) -> None:
    stub.fail_with_429(10, retry_after="1")
    sleeps = Sleeps()
    with pytest.raises(EmbeddingUnavailable) as info:
        embedder(stub, sleeps, max_retries=3).embed(["z"])
    assert info.value.status == 429
    assert len(stub.requests) == 4 and sleeps == [1.0, 1.0, 1.0]


def test_400_is_bisected_to_the_bad_inputs(stub: OpenAIStub) -> None:
    texts = [f"item {i}" for i in range(8)]
    stub.bad_inputs = {"item 2", "item 5"}
    sleeps = Sleeps()
    e = embedder(stub, sleeps)
    r = e.embed(texts)
    assert set(r.errors) == {2, 5}
    assert r.errors[2].startswith("http 400: Invalid input")
    for i, t in enumerate(texts):
        assert r.vectors[i] == (None if i in (2, 5) else expected(t))
    assert sleeps == []  # a 400 is never retried as such
    # 1 refused batch + 1 probe + 2 halves + 4 quarters + 2*2 pairs containing a bad one -> singles
    assert r.requests == len(stub.requests) <= 1 + 1 + 2 + 4 + 4
    assert PROBE_TEXT in stub.served()[0].inputs


def test_probe_only_once_per_embedder(stub: OpenAIStub) -> None:
    e = embedder(stub)
    e.embed(["fine"])
    stub.bad_inputs = {"bad"}
    r = e.embed(["bad", "good"])
    assert r.errors.keys() == {0} and r.vectors[1] == expected("good")
    assert not any(q.inputs == [PROBE_TEXT] for q in stub.requests)


def test_bisection_budget_bounds_the_requests(stub: OpenAIStub) -> None:
    texts = [f"w{i}" for i in range(16)]
    stub.bad_inputs = {"w3"}
    e = embedder(stub, max_bisect_requests=2)
    e.embed(["warm"])  # no probe in the counts below
    stub.requests.clear()
    r = e.embed(texts)
    assert len(stub.requests) == 3  # the batch, then its two halves (budget 2)
    assert set(r.errors) == set(range(8)) and "bisection budget spent" in r.errors[3]
    assert all(r.vectors[i] == expected(texts[i]) for i in range(8, 16))


def test_refused_parameter_is_a_config_error(stub: OpenAIStub) -> None:
    with pytest.raises(EmbeddingConfigError, match="dimensions"):
        embedder(stub, dimensions=DIM + 1).embed(["a", "b"])
    assert len(stub.requests) == 1


def test_request_refused_whatever_the_input_is_a_config_error(stub: OpenAIStub) -> None:
    stub.bad_inputs = {"a", "b", PROBE_TEXT}
    with pytest.raises(EmbeddingConfigError, match="probe"):
        embedder(stub).embed(["a", "b"])
    assert len(stub.requests) == 2


def test_401_is_not_retried(stub: OpenAIStub) -> None:
    sleeps = Sleeps()
    e = OpenAIEmbedder(model="fake-embed", base_url=stub.base_url, api_key="wrong", sleep=sleeps)
    with pytest.raises(EmbeddingConfigError) as info:
        e.embed(["a"])
    assert info.value.status == 401 and sleeps == [] and len(stub.requests) == 1


def test_connection_errors_are_retried_then_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    e = OpenAIEmbedder(model="m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", sleep=sleeps,
                       max_retries=2, timeout_s=2)
    with pytest.raises(EmbeddingUnavailable, match="unreachable"):
        e.embed(["a"])
    assert len(sleeps) == 2


def test_embed_query(stub: OpenAIStub) -> None:
    e = embedder(stub)
    assert e.embed_query("find me") == expected("find me")
    with pytest.raises(ValueError, match="blank"):
        e.embed_query("  ")
    stub.bad_inputs = {"evil"}
    with pytest.raises(ValueError, match="refused"):
        e.embed_query("evil")


def test_dimension_probe_when_unknown(stub: OpenAIStub) -> None:
    e = embedder(stub)
    assert e.dimension == DIM and e.dimension == DIM
    assert [q.inputs for q in stub.requests] == [[PROBE_TEXT]]
    assert embedder(stub, dimensions=DIM).dimension == DIM  # given: no request
    assert len(stub.requests) == 1


def test_model_id() -> None:
    assert OpenAIEmbedder(model="text-embedding-3-small", api_key="k").model_id == "openai:text-embedding-3-small"
    assert OpenAIEmbedder(model="m", api_key="k", dimensions=256).model_id == "openai:m@256d"
    assert OpenAIEmbedder(model="m", api_key="k", model_id="custom").model_id == "custom"


def test_make_embedder_from_settings(stub: OpenAIStub) -> None:
    assert make_embedder(EmbeddingSettings(provider="none")) is None
    s = EmbeddingSettings(provider="openai", model="fake-embed", base_url=stub.base_url, api_key="sk-test",
                          max_batch_inputs=2, max_retries=1)
    e = make_embedder(s, sleep=Sleeps())
    assert isinstance(e, OpenAIEmbedder)
    assert e.max_batch_inputs == 2 and e.max_retries == 1 and e.model_id == "openai:fake-embed"
    assert e.embed(["p", "q", "r"]).vectors == [expected(t) for t in "pqr"]
    assert "sk-test" not in repr(s)
