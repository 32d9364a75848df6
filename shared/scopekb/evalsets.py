"""Evaluation sets for retrieval quality, made without labels from a repository itself (issue 21).

Two kinds of query, each with the chunks that answer it (``targets``: a path and a line range; a hit is relevant
when it is in that file and its lines overlap the range):

- **docstring** (the CodeSearchNet method): for each Python function or method with a docstring, the query is the
  docstring's first paragraph and the target is the function in a copy of the code with every docstring removed
  (:func:`strip_docstrings`); dropped as CodeSearchNet does: queries under three words, functions under three
  lines, tests, dunder methods, and queries or function bodies that occur more than once.
- **history**: for each non-merge commit that changes few definitions, the query is the commit subject (plus the
  first paragraph of its body) and the targets are the definitions (Python: the enclosing function/method/class
  of each changed line; other files: the changed line range) *as they were in the parent commit*, so the set
  is evaluated on the parent commit's index — the code a developer searched before making the change.

Metrics (:func:`rank_metrics`) are NDCG@10 with binary gains over the targets (each target credited once, at the
first hit that overlaps it), MRR@10, Hit@1 and Hit@10; intervals are percentile bootstrap intervals over queries
(:func:`bootstrap_ci`, :func:`paired_gain`; Efron & Tibshirani 1993, 2,000 resamples).

All inputs are untrusted repository text: they are parsed with :mod:`ast` and compared as data, never executed.
"""

from __future__ import annotations

import ast
import hashlib
import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: Queries shorter than this many words are dropped (CodeSearchNet drops docstrings under three tokens).
MIN_QUERY_WORDS = 3
#: A history commit qualifies when it touches at most this many definitions (and files).
MAX_TARGETS = 3
#: Subjects that describe no code change (merges, reverts, releases, formatting) are not queries.
_NOISE_SUBJECT = re.compile(r"^(merge|revert|bump|release|version|prepare|changelog|update changelog|"
                            r"format|lint|typo|docs?:|chore)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Target:
    """A relevant region: ``path`` and 1-based inclusive lines ``start``..``end``."""

    path: str
    start: int
    end: int


@dataclass
class EvalQuery:
    """One query of an evaluation set.

    ``at`` is the commit whose index answers it (history: the parent commit; docstring: None, the stripped copy).
    """

    kind: str
    query: str
    targets: list[Target]
    at: str | None = None
    label: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- docstring → function -------------------------------------------------------------------------------------

def _docstring_node(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0]
    return None


def strip_docstrings(src: str) -> str:
    """``src`` without module, class and function docstrings (the lines they occupy are removed; a body left
    empty gets ``pass``). Raises SyntaxError for code that does not parse."""
    tree = ast.parse(src)
    lines = src.split("\n")
    remove: set[int] = set()
    replace: dict[int, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        d = _docstring_node(node)
        if d is None:
            continue
        first, last = d.lineno, d.end_lineno or d.lineno
        before = lines[first - 1].encode()[:d.col_offset].decode(errors="replace")
        after = lines[last - 1].encode()[d.end_col_offset:].decode(errors="replace")
        if before.strip() or after.strip():
            continue  # shares a line with code: leave it
        remove.update(range(first, last + 1))
        if len(node.body) == 1 and not isinstance(node, ast.Module):
            replace[first] = " " * d.col_offset + "pass"
    out = [replace[i] if i in replace else ln for i, ln in enumerate(lines, 1) if i not in remove or i in replace]
    text = "\n".join(out)
    ast.parse(text)
    return text


def first_paragraph(doc: str) -> str:
    """The first paragraph of a cleaned docstring (or commit body), on one line."""
    para = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    return " ".join(para.split())


def functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Module-level functions and methods of module-level classes, with qualified names (``Class.method``)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    out.append((f"{node.name}.{sub.name}", sub))
    return out


def docstring_pairs(path: str, original: str, stripped: str) -> list[dict[str, Any]]:
    """Candidate docstring→function pairs of one file (before the set-wide duplicate filter :func:`dedupe`).

    Each pair: ``path``, ``function`` (qualified name), ``query``, ``start_line``/``end_line`` of the function in
    ``stripped`` (decorators included) and ``code_sha`` (sha256 of its whitespace-normalised code).
    """
    orig_defs = functions(ast.parse(original))
    new_defs = functions(ast.parse(stripped))
    counts: dict[str, int] = {}
    for q, _ in new_defs:
        counts[q] = counts.get(q, 0) + 1
    where = {q: n for q, n in new_defs if counts[q] == 1}
    stripped_lines = stripped.split("\n")
    out = []
    for qual, node in orig_defs:
        doc = ast.get_docstring(node)
        name = qual.rsplit(".", 1)[-1]
        if not doc or qual not in where:
            continue
        if "test" in name.lower() or (name.startswith("__") and name.endswith("__")):
            continue  # CodeSearchNet drops tests, constructors and standard extension methods
        query = first_paragraph(doc)
        if len(query.split()) < MIN_QUERY_WORDS or len(query) > 2000:
            continue
        target = where[qual]
        start = min([target.lineno, *(d.lineno for d in target.decorator_list)])
        end = target.end_lineno or target.lineno
        if end - target.lineno + 1 < 3:
            continue  # functions shorter than three lines
        code = "\n".join(stripped_lines[start - 1:end])
        out.append({"path": path, "function": qual, "query": query, "start_line": start, "end_line": end,
                    "code_sha": hashlib.sha256(" ".join(code.split()).encode()).hexdigest()})
    return out


def dedupe(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop every pair whose query text or function code occurs more than once in the set."""
    q_count: dict[str, int] = {}
    c_count: dict[str, int] = {}
    for p in pairs:
        q = p["query"].lower()
        q_count[q] = q_count.get(q, 0) + 1
        c_count[p["code_sha"]] = c_count.get(p["code_sha"], 0) + 1
    return [p for p in pairs if q_count[p["query"].lower()] == 1 and c_count[p["code_sha"]] == 1]


def is_test_path(path: str) -> bool:
    """True for test files and folders (``tests/``, ``test_x.py``, ``x_test.py``, ``conftest.py``)."""
    parts = path.lower().split("/")
    name = parts[-1]
    return any(p in ("test", "tests", "testing") for p in parts[:-1]) or name.startswith("test_") \
        or name.endswith("_test.py") or name == "conftest.py"


def docstring_set(files: Iterable[tuple[str, str]]) -> tuple[dict[str, str], list[EvalQuery]]:
    """The docstring set of some Python files: (``{path: docstring-free text}``, queries).

    ``files`` yields ``(path, text)``; files that do not parse and test files are left out. Queries are in path
    order, then line order.
    """
    stripped_files: dict[str, str] = {}
    pairs: list[dict[str, Any]] = []
    for path, text in files:
        if not path.endswith(".py") or is_test_path(path):
            continue
        try:
            stripped = strip_docstrings(text)
            pairs.extend(docstring_pairs(path, text, stripped))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        stripped_files[path] = stripped
    queries = [EvalQuery("docstring", p["query"], [Target(p["path"], p["start_line"], p["end_line"])],
                         label=f"{p['path']}:{p['function']}") for p in dedupe(pairs)]
    return stripped_files, queries


# ---- commit history → changed definitions ---------------------------------------------------------------------

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def changed_old_lines(diff_u0: str) -> dict[str, list[tuple[int, int]]]:
    """``{old path: [(start, end), ...]}`` of the lines a ``git diff -U0`` removes or replaces in the old file.

    A pure insertion (``-n,0``) is recorded as the line it follows (``(n, n)``, or line 1 at the top), since the
    code around it is what the change was about. Added and deleted files are left out (nothing to find in the
    parent, or nothing left to change).
    """
    out: dict[str, list[tuple[int, int]]] = {}
    old: str | None = None
    for line in diff_u0.split("\n"):
        if line.startswith("--- "):
            old = line[6:] if line.startswith("--- a/") else None
        elif line.startswith("+++ ") and line[4:] == "/dev/null":
            old = None
        elif line.startswith("@@") and old is not None:
            m = _HUNK.match(line)
            if not m:
                continue
            start, count = int(m.group(1)), int(m.group(2) or "1")
            span = (max(start, 1), max(start, 1)) if count == 0 else (start, start + count - 1)
            out.setdefault(old, []).append(span)
    return out


def enclosing_definitions(src: str, lines: Sequence[tuple[int, int]]) -> list[tuple[str, int, int]] | None:
    """The innermost function/method (else class) enclosing each changed line range of Python ``src``:
    ``[(qualified name, start, end), ...]`` without repeats; None when a range lies outside every definition
    (module-level code: the change is not about a definition) or the source does not parse."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    defs: list[tuple[str, int, int, int, bool]] = []  # (name, start, end, depth, is a class)

    def walk(node: ast.AST, prefix: str, depth: int) -> None:
        for sub in ast.iter_child_nodes(node):
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                start = min([sub.lineno, *(d.lineno for d in sub.decorator_list)])
                name = f"{prefix}{sub.name}"
                defs.append((name, start, sub.end_lineno or sub.lineno, depth, isinstance(sub, ast.ClassDef)))
                walk(sub, name + ".", depth + 1)

    walk(tree, "", 0)
    found: dict[str, tuple[int, int]] = {}
    for a, b in lines:
        inside = [d for d in defs if d[1] <= a and b <= d[2]]
        if not inside:
            return None
        fn = [d for d in inside if not d[4]] or inside
        name, s, e, _, _ = max(fn, key=lambda d: d[3])
        found.setdefault(name, (s, e))
    return [(n, s, e) for n, (s, e) in found.items()]


@dataclass
class CommitInfo:
    """A commit as the history miner sees it: id, first parent, subject and body."""

    sha: str
    parent: str | None
    subject: str
    body: str = ""
    merge: bool = False


def history_query(c: CommitInfo, diff_u0: str, show: Callable[[str, str], str | None],
                  max_targets: int = MAX_TARGETS) -> EvalQuery | None:
    """The history query of one commit, or None when it does not qualify.

    ``diff_u0`` is ``git diff -U0 parent commit``; ``show(commit, path)`` returns a file's text at a commit (None
    when unreadable). Qualifies: not a merge, a parent, a subject of at least three words that is not release or
    housekeeping noise, 1..``max_targets`` definitions or files changed, none of them test files.
    """
    if c.merge or not c.parent:
        return None
    query = c.subject.strip()
    if _NOISE_SUBJECT.match(query):
        return None
    para = first_paragraph(c.body) if c.body.strip() else ""
    if para and not para.lower().startswith(("signed-off-by", "co-authored-by", "change-id")):
        query = f"{query} {para}"
    if len(query.split()) < MIN_QUERY_WORDS:
        return None
    changed = changed_old_lines(diff_u0)
    if not changed or len(changed) > max_targets or any(is_test_path(p) for p in changed):
        return None
    targets: list[Target] = []
    for path, spans in sorted(changed.items()):
        if path.endswith(".py"):
            src = show(c.parent, path)
            defs = enclosing_definitions(src, spans) if src is not None else None
            if not defs:
                return None
            targets.extend(Target(path, s, e) for _, s, e in defs)
        else:
            targets.append(Target(path, min(a for a, _ in spans), max(b for _, b in spans)))
        if len(targets) > max_targets:
            return None
    return EvalQuery("history", query[:2000], targets, at=c.parent, label=c.sha[:12])


# ---- metrics ----------------------------------------------------------------------------------------------------

def _overlaps(hit: dict[str, Any], t: Target) -> bool:
    return hit["path"] == t.path and hit["start_line"] <= t.end and hit["end_line"] >= t.start


def rank_metrics(hits: Sequence[dict[str, Any]], targets: Sequence[Target], k: int = 10) -> dict[str, float]:
    """NDCG@k, MRR@k, Hit@1 and Hit@k of one ranked list (dicts with ``path``, ``start_line``, ``end_line``).

    Binary gains: a hit gains 1 when it overlaps a target not yet credited (each target counts once, several
    chunks of one long function do not inflate the score); the ideal ranks every target first.
    """
    credited: set[int] = set()
    dcg, first = 0.0, None
    for rank, h in enumerate(hits[:k], 1):
        new = [i for i, t in enumerate(targets) if i not in credited and _overlaps(h, t)]
        if any(_overlaps(h, t) for t in targets) and first is None:
            first = rank
        if new:
            credited.add(new[0])
            dcg += 1.0 / math.log2(rank + 1)
    ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(targets), k) + 1))
    return {"ndcg10": dcg / ideal if ideal else 0.0, "mrr10": 1.0 / first if first else 0.0,
            "hit1": float(first == 1), "hit10": float(first is not None)}


METRICS = ("ndcg10", "mrr10", "hit1", "hit10")


def bootstrap_ci(values: Sequence[float], n: int = 2000, seed: int = 7) -> tuple[float, float, float]:
    """Mean of ``values`` with its 95% percentile bootstrap interval (resampling queries): (mean, low, high).
    NaNs for an empty list."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n, len(v)))].mean(axis=1)
    return float(v.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired_gain(a: Sequence[float], b: Sequence[float], n: int = 2000, seed: int = 7) -> tuple[float, float, float]:
    """Mean of ``a - b`` over the same queries with a 95% paired bootstrap interval: (mean, low, high)."""
    return bootstrap_ci([x - y for x, y in zip(a, b, strict=True)], n, seed)


def summarise(per_query: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Per metric ``{"mean", "ci95": [low, high]}`` over a mode's per-query scores."""
    out: dict[str, Any] = {}
    for m in METRICS:
        mean, lo, hi = bootstrap_ci([q[m] for q in per_query])
        out[m] = {"mean": mean, "ci95": [lo, hi]}
    return out


def sample(queries: Sequence[EvalQuery], n: int | None, seed: int = 11) -> list[EvalQuery]:
    """A deterministic sample of at most ``n`` queries, in the input's order (all when ``n`` is None)."""
    if n is None or n >= len(queries):
        return list(queries)
    idx = sorted(random.Random(seed).sample(range(len(queries)), n))
    return [queries[i] for i in idx]


@dataclass
class SetResult:
    """Per-mode per-query metric dicts of one evaluation set."""

    kind: str
    queries: list[EvalQuery] = field(default_factory=list)
    per_query: dict[str, list[dict[str, float]]] = field(default_factory=dict)
