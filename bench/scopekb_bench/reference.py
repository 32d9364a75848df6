"""The denominator of "chunks re-embedded ÷ chunks changed", derived independently of the pipeline (issue 18).

What a perfect incremental sync must embed after a push from ``old`` to ``new`` is the set of distinct embedding
inputs of the tree at ``new`` that the tree at ``old`` did not already have. This module computes that set from
the two whole trees by the simplest path: ``git ls-tree -r -l`` of each commit, one ``git cat-file --batch`` for
the blobs, the file filters, then every file chunked and turned into its embedding text.

It shares with the pipeline only the *definition* of an embedding input (``chunk_document`` + ``embedding_text``
and the file filters of ``scopekb.filetypes``, the size limit of ``GitSettings``); none of the pipeline's
incremental machinery (git diff, sync plan, rename handling, stale-chunk deletes, embedding cache, job counters)
is used. So when the pipeline embeds more than needed (an unchanged file re-embedded, a cache miss) the ratio is
above 1, and when it misses a change (a renamed file whose header changed) it is below 1.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from scopekb.chunking import chunk_document, embedding_text
from scopekb.filetypes import content_skip_reason, decode_text, language_for, path_skip_reason
from scopekb.settings import ChunkingSettings, GitSettings

_REGULAR = ("100644", "100755")


def tree_blobs(repo: Path, commit: str) -> dict[str, tuple[str, int]]:
    """``path -> (blob sha, size in bytes)`` of the regular files of ``commit`` (symlinks and submodules left
    out, as the pipeline skips them)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-l", "-z", commit], capture_output=True,
                         check=True).stdout.decode("utf-8", "surrogateescape")
    files = {}
    for rec in filter(None, out.split("\0")):
        meta, path = rec.split("\t", 1)
        mode, kind, sha, size = meta.split()
        if kind == "blob" and mode in _REGULAR:
            files[path] = (sha, int(size))
    return files


def read_blobs(repo: Path, shas: list[str]) -> dict[str, bytes]:
    """Contents of the given blobs through one ``git cat-file --batch``."""
    if not shas:
        return {}
    out = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"],
                         input="".join(s + "\n" for s in shas).encode(), capture_output=True, check=True).stdout
    blobs, pos = {}, 0
    for sha in shas:
        nl = out.index(b"\n", pos)
        size = int(out[pos:nl].split()[2])
        blobs[sha] = out[nl + 1:nl + 1 + size]
        pos = nl + 1 + size + 1
    return blobs


def embedding_inputs(repo: Path, commit: str, counter: Any, cfg: ChunkingSettings | None = None) -> set[str]:
    """Every distinct embedding input of the tree at ``commit``: what a fresh full index embeds."""
    cfg = cfg or ChunkingSettings()
    limit = GitSettings().max_file_bytes
    files = {p: v for p, v in tree_blobs(repo, commit).items() if path_skip_reason(p) is None and v[1] <= limit}
    blobs = read_blobs(repo, sorted({sha for sha, _ in files.values()}))
    texts: set[str] = set()
    for path, (sha, _size) in sorted(files.items()):
        data = blobs[sha]
        if content_skip_reason(data):
            continue
        lang = language_for(path)
        for c in chunk_document(path, decode_text(data), lang, cfg, counter):
            texts.add(embedding_text(path, lang, c, cfg, counter))
    return texts


def new_embedding_inputs(repo: Path, old: str, new: str, counter: Any,
                         cfg: ChunkingSettings | None = None) -> dict[str, int]:
    """``{"new_inputs": distinct inputs at new not at old, "inputs_old": ..., "inputs_new": ...}``."""
    before = embedding_inputs(repo, old, counter, cfg)
    after = embedding_inputs(repo, new, counter, cfg)
    return {"new_inputs": len(after - before), "inputs_old": len(before), "inputs_new": len(after)}
