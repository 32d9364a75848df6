"""Packaging metadata as current setuptools wants it (README newcomer): ``scripts/bootstrap``'s editable install
printed a ``SetuptoolsDeprecationWarning`` twice (``project.license`` as a TOML table) even with ``pip --quiet``.
The license is an SPDX expression with ``license-files`` (setuptools >= 77, which the build system requires);
applying ``pyproject.toml`` with the installed setuptools emits no warning at all."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import setuptools
from packaging.requirements import Requirement
from packaging.version import Version
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[2]


def test_license_is_an_spdx_expression_with_its_file() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in project["project"].get("classifiers", []))  # superseded
    for pattern in project["project"]["license-files"]:
        assert list(ROOT.glob(pattern)), pattern
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    req = next(Requirement(r) for r in project["build-system"]["requires"] if r.startswith("setuptools"))
    assert Version("77") in req.specifier and Version("76.9") not in req.specifier, req  # SPDX + license-files
    assert Version(setuptools.__version__) in req.specifier, setuptools.__version__


def test_setuptools_applies_the_project_table_without_a_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [f"{w.category.__name__}: {str(w.message)[:120]}" for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0" and dist.metadata.license_files == ["LICENSE"]


def _bootstrap(tmp: Path, extras: str) -> tuple[list[str], list[str]]:
    """Run a copy of scripts/bootstrap in ``tmp`` whose ``.venv/bin/python`` is a stub recording its arguments and
    PYTHONWARNINGS (the step logic only: scripts/test runs the real one). Returns (stderr lines, calls)."""
    import os
    import shutil
    import subprocess

    (tmp / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "bootstrap", tmp / "scripts" / "bootstrap")
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    stub = tmp / ".venv" / "bin" / "python"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text('#!/bin/sh\necho "$* | $PYTHONWARNINGS" >> "$(dirname "$0")/../calls"\n')
    stub.chmod(0o755)
    p = subprocess.run([str(tmp / "scripts" / "bootstrap"), extras], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    assert p.returncode == 0 and p.stdout == "", (p.stdout, p.stderr)
    calls = tmp / ".venv" / "calls"
    return p.stderr.splitlines(), calls.read_text().splitlines() if calls.exists() else []


def test_bootstrap_prints_one_line_per_install_step(tmp_path: Path) -> None:
    """README newcomer: about 10 minutes of install with no line at all. Each step says what it installs and how
    long it may take; the local extra (PyTorch) is a step of its own; setuptools' editable-install notice is
    filtered; a second run with the same extras installs nothing and prints nothing."""
    lines, calls = _bootstrap(tmp_path, "dev,local")
    assert len(lines) == 4, lines
    assert lines[0].startswith("[bootstrap] step 1/3: upgrading pip"), lines
    assert lines[1].startswith("[bootstrap] step 2/3: installing scopekb[dev] ") and "minutes" in lines[1], lines
    assert lines[2].startswith("[bootstrap] step 3/3: ") and "PyTorch" in lines[2] and "minutes" in lines[2], lines
    assert lines[3].startswith("[bootstrap] scopekb[dev,local] installed in .venv in "), lines
    assert [c.split(" | ")[0] for c in calls] == ["-m pip install --quiet --upgrade pip",
                                                   "-m pip install --quiet -e .[dev]",
                                                   "-m pip install --quiet -e .[dev,local]"], calls
    assert all(c.endswith(" | ignore:Editable installation") for c in calls), calls
    assert _bootstrap(tmp_path, "dev,local") == ([], calls)  # unchanged pyproject and extras: nothing to do

    (tmp_path / "plain").mkdir()
    lines, calls = _bootstrap(tmp_path / "plain", "dev")
    assert [ln[:20] for ln in lines] == ["[bootstrap] step 1/2", "[bootstrap] step 2/2", "[bootstrap] scopekb["], lines
    assert calls[-1].startswith("-m pip install --quiet -e .[dev] |"), calls
