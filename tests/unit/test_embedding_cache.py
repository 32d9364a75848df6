"""Embedding caches (memory, SQLite) and embed_with_cache: misses only, each distinct text once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from scopekb.embedding import (
    EmbedResult,
    MemoryEmbeddingCache,
    SQLiteEmbeddingCache,
    cache_doc_id,
    embed_with_cache,
    make_embedding_cache,
    text_sha,
)
from scopekb.embedding.cache import pack_vector, unpack_vector
from scopekb.settings import EmbeddingSettings, Settings


class FakeEmbedder:
    """Counts what it is asked to embed; refuses texts in ``bad``."""

    def __init__(self, model_id: str = "fake:1", bad: Sequence[str] = ()) -> None:
        self.model_id = model_id
        self.dimension = 3
        self.max_input_tokens = 100
        self.bad = set(bad)
        self.calls: list[list[str]] = []

    def vec(self, text: str) -> list[float]:
        return np.asarray([len(text), text.count("a"), 0.1], dtype=np.float32).tolist()

    def embed(self, texts: Sequence[str]) -> EmbedResult:
        self.calls.append(list(texts))
        vectors = [None if t in self.bad else self.vec(t) for t in texts]
        errors = {i: "http 400: refused" for i, t in enumerate(texts) if t in self.bad}
        return EmbedResult(vectors=vectors, token_counts=[len(t) for t in texts], errors=errors,
                           total_tokens=sum(len(t) for t in texts), requests=1)

    def embed_query(self, text: str) -> list[float]:
        return self.vec(text)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]

    def close(self) -> None:
        pass


class BrokenCache:
    def get_many(self, model, shas):
        raise ConnectionError("cache down")

    def put_many(self, model, vectors):
        raise ConnectionError("cache down")


@pytest.fixture(params=["memory", "sqlite"])
def cache(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        yield MemoryEmbeddingCache()
    else:
        c = SQLiteEmbeddingCache(tmp_path / "sub" / "cache.sqlite3", batch=2)
        yield c
        c.close()


def test_keys_and_packing() -> None:
    assert text_sha("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert cache_doc_id("m", "s") != cache_doc_id("m2", "s") and len(cache_doc_id("m", "s")) == 64
    v = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    raw = pack_vector(v)
    assert len(raw) == 384 * 4
    assert unpack_vector(raw) == v.tolist()
    with pytest.raises(ValueError):
        unpack_vector(b"abc")


def test_cache_round_trip_and_model_isolation(cache) -> None:
    vecs = {text_sha(t): FakeEmbedder().vec(t) for t in ["a", "bb", "ccc", "dddd", "eeeee"]}
    cache.put_many("m1", vecs)
    assert cache.get_many("m1", list(vecs)) == vecs
    assert cache.get_many("m2", list(vecs)) == {}
    assert cache.get_many("m1", [text_sha("zzz")]) == {}
    cache.put_many("m1", {text_sha("a"): [9.0, 9.0, 9.0]})  # overwrite
    assert cache.get_many("m1", [text_sha("a"), text_sha("a")]) == {text_sha("a"): [9.0, 9.0, 9.0]}


def test_sqlite_cache_persists(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    c = SQLiteEmbeddingCache(path)
    c.put_many("m", {"s": [1.0, 2.0]})
    c.close()
    c2 = SQLiteEmbeddingCache(path)
    assert c2.get_many("m", ["s"]) == {"s": [1.0, 2.0]}
    c2.close()


def test_memory_cache_bound() -> None:
    c = MemoryEmbeddingCache(max_entries=2)
    c.put_many("m", {"a": [1.0], "b": [2.0], "c": [3.0]})
    assert len(c) == 2 and c.get_many("m", ["a", "b", "c"]) == {"b": [2.0], "c": [3.0]}


def test_embed_with_cache_dedupes_and_skips_blanks(cache) -> None:
    emb = FakeEmbedder()
    texts = ["x", "y", "x", "", "  ", "z", "y"]
    vectors, stats, errors = embed_with_cache(emb, cache, texts)
    assert emb.calls == [["x", "y", "z"]]
    assert vectors == [emb.vec("x"), emb.vec("y"), emb.vec("x"), None, None, emb.vec("z"), emb.vec("y")]
    assert errors == {}
    assert (stats.computed, stats.cached, stats.failed, stats.blank, stats.duplicates) == (3, 0, 0, 2, 2)
    assert stats.tokens == 3 and stats.requests == 1

    again = embed_with_cache(emb, cache, texts + ["w"])
    assert emb.calls[1:] == [["w"]]
    assert (again.stats.computed, again.stats.cached) == (1, 3)
    assert again.vectors[:7] == vectors

    third = embed_with_cache(emb, cache, list(reversed(texts)))
    assert len(emb.calls) == 2 and third.stats.computed == 0 and third.stats.cached == 3


def test_cache_is_per_model(cache) -> None:
    embed_with_cache(FakeEmbedder("m1"), cache, ["t"])
    other = FakeEmbedder("m2")
    _, stats, _ = embed_with_cache(other, cache, ["t"])
    assert stats.computed == 1 and other.calls == [["t"]]


def test_failures_are_reported_per_position_and_not_cached(cache) -> None:
    emb = FakeEmbedder(bad=["bad"])
    texts = ["ok", "bad", "ok2", "bad"]
    vectors, stats, errors = embed_with_cache(emb, cache, texts)
    assert vectors[1] is None and vectors[3] is None and vectors[0] == emb.vec("ok")
    assert errors == {1: "http 400: refused", 3: "http 400: refused"}
    assert (stats.computed, stats.failed) == (2, 1)
    _, stats2, errors2 = embed_with_cache(emb, cache, texts)
    assert emb.calls[-1] == ["bad"] and stats2.cached == 2 and errors2.keys() == {1, 3}


def test_no_cache_and_broken_cache_still_embed() -> None:
    emb = FakeEmbedder()
    vectors, stats, _ = embed_with_cache(emb, None, ["a", "a"])
    assert vectors == [emb.vec("a")] * 2 and stats.computed == 1
    vectors, stats, _ = embed_with_cache(emb, BrokenCache(), ["a", "b"])
    assert vectors == [emb.vec("a"), emb.vec("b")] and stats.cache_errors == 2 and stats.computed == 2


def test_all_blank_no_embedder_call() -> None:
    emb = FakeEmbedder()
    vectors, stats, errors = embed_with_cache(emb, MemoryEmbeddingCache(), ["", "\n"])
    assert vectors == [None, None] and stats.blank == 2 and emb.calls == [] and errors == {}


def test_stats_add() -> None:
    emb = FakeEmbedder()
    total = embed_with_cache(emb, None, ["a", ""]).stats
    total.add(embed_with_cache(emb, None, ["b", "c"]).stats)
    assert (total.computed, total.blank, total.requests) == (3, 1, 2)


def test_make_embedding_cache(tmp_path: Path) -> None:
    def settings(cache: str) -> Settings:
        return Settings(data_dir=tmp_path, embedding=EmbeddingSettings(cache=cache))

    assert make_embedding_cache(settings("none")) is None
    assert isinstance(make_embedding_cache(settings("memory")), MemoryEmbeddingCache)
    sq = make_embedding_cache(settings("sqlite"))
    assert isinstance(sq, SQLiteEmbeddingCache) and Path(sq.path) == tmp_path / "embcache.sqlite3"
    sq.close()
    with pytest.raises(ValueError, match="client"):
        make_embedding_cache(settings("opensearch"))


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOPEKB_EMBEDDING__PROVIDER", "openai")
    monkeypatch.setenv("SCOPEKB_EMBEDDING__MAX_BATCH_INPUTS", "16")
    monkeypatch.setenv("SCOPEKB_EMBEDDING__API_KEY", "secret-value")
    s = Settings().embedding
    assert s.provider == "openai" and s.max_batch_inputs == 16
    assert s.api_key is not None and s.api_key.get_secret_value() == "secret-value"
    assert "secret-value" not in repr(s)
    with pytest.raises(ValueError):
        EmbeddingSettings(max_batch_inputs=0)


def test_embedded_runtime_uses_the_configured_cache_path(tmp_path: Path) -> None:
    """``embedding.cache_path`` is honoured by the embedded profile too (it used ``<data_dir>/embcache.sqlite3``
    whatever was configured, so a cache shared between runs was never read)."""
    from scopekb.runtime import build_runtime

    s = Settings(profile="embedded", data_dir=tmp_path / "data",
                 embedding=EmbeddingSettings(provider="local", cache="sqlite", cache_path=tmp_path / "shared.sqlite3"))
    rt = build_runtime(s, lazy_embedder=True)
    assert rt._cache is not None and Path(rt._cache.path) == tmp_path / "shared.sqlite3"
    rt._cache.close()


@pytest.mark.parametrize(("cache", "kind"), [("none", type(None)), ("memory", MemoryEmbeddingCache),
                                             ("opensearch", SQLiteEmbeddingCache), ("sqlite", SQLiteEmbeddingCache)])
def test_embedded_runtime_honours_the_cache_setting(tmp_path: Path, cache: str, kind: type) -> None:
    """``embedding.cache`` is honoured by the embedded profile (``none`` and ``memory`` were ignored: every vector
    went to ``<data_dir>/embcache.sqlite3``); its default, ``opensearch``, is the SQLite file there."""
    from scopekb.runtime import build_runtime

    data = tmp_path / f"data-{cache}"
    s = Settings(profile="embedded", data_dir=data, embedding=EmbeddingSettings(provider="local", cache=cache))
    rt = build_runtime(s, lazy_embedder=True)
    assert type(rt.embed_cache) is kind
    assert (data / "embcache.sqlite3").exists() == (kind is SQLiteEmbeddingCache)
    if isinstance(rt._cache, SQLiteEmbeddingCache):
        rt._cache.close()
