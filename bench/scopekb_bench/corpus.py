"""Benchmark inputs made from released sources of real projects (PyPI sdists), cached under .services/cache.

- :func:`release_repo`: a git repository with one commit per release (:func:`scopekb.realrepo.build_release_repo`)
  plus one more commit that edits one function in one Python file (the one-file push).
- :func:`eval_repo`: the retrieval-quality corpus (the CodeSearchNet method). For each project, the ``.py`` files
  of its package with every docstring removed, one commit per release (all projects together), plus a one-file
  edit commit; and the docstring→function pairs of the last release: the query is the first paragraph of a
  function's docstring, the relevant document is that function in the docstring-free code.

Built repositories are cached under ``.services/cache/bench-repos`` (keyed by project, versions and
:data:`BUILD_VERSION`); each run works on a hard-linked bare clone, so the cache is never modified.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scopekb.evalsets import dedupe, docstring_pairs, strip_docstrings
from scopekb.realrepo import build_release_repo, fetch_sdist, git
from scopekb_bench.util import REPO, log

SDISTS = REPO / ".services" / "cache" / "sdists"
REPO_CACHE = REPO / ".services" / "cache" / "bench-repos"
#: Bump when the way repositories or pairs are built changes, so cached builds are not reused.
BUILD_VERSION = 4


@dataclass
class Edit:
    """The one-file edit commit: ``path`` gets one added statement (``marker = None``) inside ``function``."""

    path: str
    function: str
    marker: str
    parent: str
    commit: str


@dataclass
class Built:
    """A cached benchmark repository: release commits (oldest first), the edit commit and, for the evaluation
    corpus, the docstring→function pairs."""

    name: str
    path: str
    versions: list[str]
    releases: list[str]
    edit: Edit
    pairs: list[dict[str, Any]] = field(default_factory=list)
    projects: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def load(meta: Path) -> Built:
        d = json.loads(meta.read_text())
        d["edit"] = Edit(**d["edit"])
        return Built(**d)

    def save(self, meta: Path) -> None:
        meta.write_text(json.dumps(asdict(self), indent=1))

    def clone_bare(self, dest: Path) -> Path:
        """A bare, hard-linked clone of the cached repository at ``dest`` (the run's "git host")."""
        subprocess.run(["git", "clone", "--quiet", "--bare", "--local", self.path, str(dest)], check=True)
        return dest


def _valid(meta: Path) -> Built | None:
    if not meta.is_file():
        return None
    try:
        b = Built.load(meta)
        git(Path(b.path), "cat-file", "-e", f"{b.edit.commit}^{{commit}}")
        return b
    except Exception:  # noqa: BLE001 - any problem means rebuild
        return None


# ---- the one-file edit ---------------------------------------------------------------------------------------

def show(repo: Path, commit: str, path: str) -> str:
    """A file's text at a commit, exactly (``scopekb.realrepo.git`` strips its output)."""
    out = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, check=True)
    return out.stdout.decode("utf-8", errors="replace")


def _edit_candidates(src: str) -> list[ast.FunctionDef]:
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and len(node.body) >= 2 and 6 <= node.end_lineno - node.lineno <= 30:
            out.append(node)
    return out


def _make_edit(repo: Path, parent: str, key: str, prefer: str = "") -> Edit:
    """Commit, on top of ``parent``, one added statement in a mid-sized top-level function of a Python file.

    The file is chosen deterministically: among non-test Python files (under ``prefer`` when given) with a
    qualifying function, the one in the middle of the sorted list.
    """
    files = [p for p in git(repo, "ls-tree", "-r", "--name-only", parent).splitlines()
             if p.endswith(".py") and "test" not in p.lower() and p.startswith(prefer)]
    cands = []
    for p in sorted(files):
        src = show(repo, parent, p)
        funcs = _edit_candidates(src)
        if funcs:
            cands.append((p, src, funcs[len(funcs) // 2]))
    if not cands:
        raise RuntimeError(f"no function to edit in {repo}")
    path, src, fn = cands[len(cands) // 2]
    marker = "scopekbbenchedit" + hashlib.sha256(key.encode()).hexdigest()[:10]
    last = fn.body[-1]
    lines = src.split("\n")
    lines.insert(last.lineno - 1, " " * last.col_offset + f"{marker} = None")
    git(repo, "checkout", "--quiet", "--detach", parent)
    (repo / path).write_text("\n".join(lines))
    git(repo, "add", "--", path)
    git(repo, "commit", "--quiet", "-m", f"bench: one-file edit of {path}:{fn.name}")
    commit = git(repo, "rev-parse", "HEAD")
    git(repo, "branch", "--force", "bench-edit", commit)
    git(repo, "checkout", "--quiet", "main")
    return Edit(path=path, function=fn.name, marker=marker, parent=parent, commit=commit)


def release_repo(package: str, versions: list[str], prefer: str = "") -> Built:
    """The cached repository of ``package`` releases (one commit each) plus the one-file edit commit."""
    key = f"{package}-{'-'.join(versions)}-b{BUILD_VERSION}"
    dest, meta = REPO_CACHE / key, REPO_CACHE / f"{key}.json"
    b = _valid(meta)
    if b is not None:
        return b
    log(f"building {key} from sdists (cached afterwards)")
    REPO_CACHE.mkdir(parents=True, exist_ok=True)
    commits = build_release_repo(dest, package, versions, SDISTS)
    edit = _make_edit(dest, commits[-1], key, prefer)
    b = Built(name=package, path=str(dest), versions=versions, releases=commits, edit=edit)
    b.save(meta)
    return b


# ---- the docstring→function corpus ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Project:
    """A project of the evaluation corpus: PyPI name, releases (oldest first) and the package folder whose
    ``.py`` files are indexed (relative to the sdist root)."""

    name: str
    versions: tuple[str, ...]
    package_dir: str


def _unpack(package: str, version: str, into: Path) -> Path:
    archive = fetch_sdist(package, version, SDISTS)
    with tarfile.open(archive) as t:
        t.extractall(into, filter="data")
    tops = [p for p in into.iterdir() if p.is_dir()]
    return tops[0] if len(tops) == 1 else into


def eval_repo(projects: list[Project]) -> Built:
    """The cached evaluation corpus: one commit per release step (every project's i-th release, docstrings
    removed), a one-file edit commit, and the pairs of the last release."""
    key = "eval-" + "-".join(f"{p.name}{'_'.join(p.versions)}" for p in projects) + f"-b{BUILD_VERSION}"
    key = key if len(key) < 120 else "eval-" + hashlib.sha256(key.encode()).hexdigest()[:16]
    dest, meta = REPO_CACHE / key, REPO_CACHE / f"{key}.json"
    b = _valid(meta)
    if b is not None:
        return b
    log(f"building the evaluation corpus {key} (cached afterwards)")
    steps = max(len(p.versions) for p in projects)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    git(dest, "init", "--quiet", "--initial-branch", "main")
    commits: list[str] = []
    pairs: list[dict[str, Any]] = []
    info: list[dict[str, Any]] = []
    for i in range(steps):
        for p in dest.iterdir():
            if p.name != ".git":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        last_step = i == steps - 1
        for proj in projects:
            version = proj.versions[min(i, len(proj.versions) - 1)]
            with tempfile.TemporaryDirectory() as tmp:
                root = _unpack(proj.name, version, Path(tmp))
                pkg = root / proj.package_dir
                n_files = n_pairs = 0
                for f in sorted(pkg.rglob("*.py")):
                    rel = f"{proj.name}/{f.relative_to(root).as_posix()}"
                    original = f.read_text(encoding="utf-8", errors="replace")
                    try:
                        stripped = strip_docstrings(original)
                    except SyntaxError:
                        continue
                    out = dest / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(stripped, encoding="utf-8")
                    n_files += 1
                    if last_step:
                        found = docstring_pairs(rel, original, stripped)
                        for pr in found:
                            pr["project"] = proj.name
                        pairs.extend(found)
                        n_pairs += len(found)
            if last_step:
                info.append({"project": proj.name, "version": version, "package_dir": proj.package_dir,
                             "files": n_files})
        git(dest, "add", "--all", "--force")
        git(dest, "commit", "--quiet", "--allow-empty", "-m",
            "eval corpus: " + ", ".join(f"{p.name} {p.versions[min(i, len(p.versions) - 1)]}" for p in projects))
        commits.append(git(dest, "rev-parse", "HEAD"))
    pairs = dedupe(pairs)
    for row in info:
        row["pairs"] = sum(1 for p in pairs if p["project"] == row["project"])
    edit = _make_edit(dest, commits[-1], key)
    b = Built(name="eval", path=str(dest), versions=[",".join(p.versions) for p in projects], releases=commits,
              edit=edit, pairs=pairs, projects=info)
    b.save(meta)
    return b


def tree_text_bytes(repo: Path, commit: str) -> tuple[int, int, int]:
    """(tree entries, bytes of all blobs, bytes of the blobs scopekb indexes as text) at ``commit``."""
    from scopekb import filetypes

    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-l", "-z", commit], capture_output=True,
                         check=True).stdout.decode()
    entries = []
    for rec in out.split("\0"):
        if not rec:
            continue
        meta, path = rec.split("\t", 1)
        mode, typ, sha, size = meta.split()
        if typ == "blob" and mode != "120000":
            entries.append((path, sha, int(size)))
    total = sum(s for _, _, s in entries)
    text = 0
    proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin and proc.stdout
    for path, sha, size in entries:
        if filetypes.path_skip_reason(path) or size > 1024 * 1024:
            continue
        proc.stdin.write(sha.encode() + b"\n")
        proc.stdin.flush()
        header = proc.stdout.readline().split()
        data = proc.stdout.read(int(header[2]) + 1)[:-1]
        if filetypes.content_skip_reason(data) is None:
            text += size
    proc.stdin.close()
    proc.wait()
    return len(entries), total, text
