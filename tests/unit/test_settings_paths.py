"""Every path setting is absolute from the moment the settings are loaded (issue 15 item 5).

The issue's input: ``scopekb --data-dir rel index notes`` (or ``SCOPEKB_HOME=rel``) failed with ``scheme '(none)'
is not allowed`` because the folder snapshot's relative path became a clone URL. The siblings: the git cache,
the embedding cache file, the local model folder, ``XDG_DATA_HOME`` and ``~``. Path fields are found by walking
the settings models, so a path setting added later is covered too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from scopekb.settings import Settings, default_data_dir

ROOT = Path(__file__).resolve().parents[2]


def _is_path(annotation: object) -> bool:
    if annotation is Path:
        return True
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_path(args[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_path(a) for a in args)
    return False


def path_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """(group, field) paths of every Path-typed setting, nested groups included."""
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += path_fields(ann, (*prefix, name))
        elif _is_path(ann):
            out.append((*prefix, name))
    return out


def test_every_path_setting_is_found() -> None:
    found = set(path_fields(Settings))
    assert {("data_dir",), ("git", "cache_dir"), ("embedding", "cache_path"),
            ("embedding", "local_model_path")} <= found, found


@pytest.mark.parametrize("value", ["rel", "./a/../b", "rel/sub dir", "~/scopekb-x"])
def test_relative_path_settings_from_the_environment_become_absolute(value: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for field in path_fields(Settings):
        monkeypatch.setenv("SCOPEKB_" + "__".join(f.upper() for f in field), value)
    s = Settings()
    want = Path(os.path.abspath(os.path.expanduser(value)))
    for field in path_fields(Settings):
        got = s
        for part in field:
            got = getattr(got, part)
        assert got == want and got.is_absolute(), (field, got)
    monkeypatch.chdir("/")
    assert Settings().data_dir != s.data_dir or value.startswith("~")  # resolved at load, against that cwd


def test_relative_paths_given_as_arguments_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings(data_dir="d", git={"cache_dir": "g"}, embedding={"cache_path": "e.sqlite3"})
    assert (s.data_dir, s.git.cache_dir, s.embedding.cache_path) == (tmp_path / "d", tmp_path / "g",
                                                                     tmp_path / "e.sqlite3")


@pytest.mark.parametrize("env", [{"SCOPEKB_HOME": "rel"}, {"XDG_DATA_HOME": "xdg"}])
def test_default_data_dir_is_absolute(env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                      ) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCOPEKB_HOME", raising=False)
    monkeypatch.delenv("SCOPEKB_DATA_DIR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert default_data_dir().is_absolute() and str(default_data_dir()).startswith(str(tmp_path))
    assert Settings().data_dir == default_data_dir()


@pytest.mark.parametrize("how", ["--data-dir", "SCOPEKB_HOME", "SCOPEKB_GIT__CACHE_DIR"])
def test_cli_indexes_a_folder_with_a_relative_data_dir(how: str, tmp_path: Path) -> None:
    """The issue's command, embedded profile, keyword-only, run from the folder's parent."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("# Notes\nrelmarker text\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOPEKB_")}
    env.update(SCOPEKB_EMBEDDING__PROVIDER="none", SCOPEKB_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    args = [sys.executable, "-c", "from scopekb_cli.main import main; main()"]
    if how == "--data-dir":
        args += ["--data-dir", "rel"]
    elif how == "SCOPEKB_HOME":
        env["SCOPEKB_HOME"] = "rel"
    else:
        env["SCOPEKB_GIT__CACHE_DIR"] = "rel-git"
    p = subprocess.run([*args, "index", "notes", "--json"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert '"files_indexed": 1' in p.stdout, p.stdout
    if how != "SCOPEKB_GIT__CACHE_DIR":
        assert (tmp_path / "rel" / "index.sqlite3").exists()
    else:
        assert any((tmp_path / "rel-git").iterdir())
    s = subprocess.run([*args, *(["--data-dir", "rel"] if how == "--data-dir" else []), "search", "relmarker",
                        "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert s.returncode == 0 and "notes/a.md" not in s.stderr and '"a.md"' in s.stdout, (s.stdout, s.stderr)


def test_an_empty_setting_from_the_environment_means_its_default(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``NAME=`` (an uncommented ``.env.example`` line, a compose ``${NAME:-}``) means the default, as when unset:
    an empty path setting once meant the working directory (hostile review of issue 19: the ONNX exports went to
    wherever the command ran), and an empty OpenSearch URL chose the distributed profile."""
    from scopekb.settings import is_embedded

    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("SCOPEKB_")]:
        monkeypatch.delenv(name)
    for field in path_fields(Settings):
        monkeypatch.setenv("SCOPEKB_" + "__".join(f.upper() for f in field), "")
    for name in ("SCOPEKB_OPENSEARCH__URL", "SCOPEKB_EMBEDDING__DIMENSIONS", "SCOPEKB_WORKER__EMBED_QUEUE"):
        monkeypatch.setenv(name, "")
    s = Settings()
    for field in path_fields(Settings):
        got = s
        for part in field:
            got = getattr(got, part)
        assert got != tmp_path, field
    assert s.embedding.local_export_dir is None and s.git.cache_dir is None and s.data_dir == default_data_dir()
    assert s.embedding.dimensions is None and s.worker.embed_queue == "" and is_embedded(s)
    assert s.opensearch.url == Settings.model_fields["opensearch"].default_factory().url
