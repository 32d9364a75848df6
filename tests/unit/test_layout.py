"""Code-layout rules of issue 17 that import-linter does not check: short functions in the services and workers,
one place that asks for the profile, one module that spells coordination keys."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Longest function (``def`` line to last line, docstring and nested functions included) in services/ and workers/.
MAX_FUNCTION_LINES = 100


def _py(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def test_no_function_in_services_or_workers_is_over_100_lines() -> None:
    long = []
    for path in _py("services", "workers"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert long == []


def test_only_the_runtime_asks_which_profile_runs() -> None:
    askers = [str(p.relative_to(ROOT)) for p in _py("shared", "services", "workers", "cli")
              if "is_embedded(" in p.read_text() and p.name not in ("runtime.py", "settings.py")]
    assert askers == []


def test_coordination_keys_are_spelled_in_one_module() -> None:
    literal = re.compile(r"""["']scopekb:(delivery|job|lock|sources|attempts)\b""")
    spelled = [str(p.relative_to(ROOT)) for p in _py("shared", "services", "workers", "cli")
               if literal.search(p.read_text()) and p.name != "keys.py"]
    assert spelled == []
