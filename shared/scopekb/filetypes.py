"""What is indexed: text detection, decoding, languages and skip rules (DESIGN §4.4).

Everything here is pure: bytes and paths in, decisions out.
"""

from __future__ import annotations

import codecs
import fnmatch
import posixpath
from collections.abc import Sequence

#: Skip reasons recorded in job records (counts per reason).
SKIP_BINARY = "binary"
SKIP_TOO_LARGE = "too_large"
SKIP_LFS = "lfs_pointer"
SKIP_SUBMODULE = "submodule"
SKIP_SYMLINK = "symlink"
SKIP_VENDORED = "vendored_or_generated"
SKIP_SECRET = "secret"
SKIP_EXCLUDED = "excluded"
SKIP_EMPTY = "empty"

LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"

_EXT_LANG = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "javascript", ".ts": "typescript", ".tsx": "tsx", ".go": "go", ".rs": "rust", ".java": "java",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".cs": "csharp", ".rb": "ruby", ".php": "php", ".kt": "kotlin", ".kts": "kotlin", ".sh": "bash",
    ".bash": "bash", ".swift": "swift", ".scala": "scala", ".sql": "sql", ".md": "markdown",
    ".markdown": "markdown", ".rst": "rst", ".txt": "text", ".json": "json", ".yaml": "yaml", ".yml": "yaml",
    ".toml": "toml", ".ini": "ini", ".cfg": "ini", ".html": "html", ".htm": "html", ".css": "css",
    ".xml": "xml", ".ipynb": "notebook", ".lua": "lua", ".r": "r", ".pl": "perl", ".ex": "elixir",
    ".exs": "elixir", ".erl": "erlang", ".hs": "haskell", ".ml": "ocaml", ".dart": "dart", ".vue": "vue",
    ".proto": "protobuf", ".tf": "hcl", ".gradle": "groovy", ".groovy": "groovy",
}
_NAME_LANG = {"Dockerfile": "dockerfile", "Makefile": "make", "CMakeLists.txt": "cmake"}

# Build output and dependency folders, and generated or minified files (the linguist conventions, short list).
_VENDORED_DIRS = {"node_modules", "vendor", "third_party", "bower_components", ".git", "dist", "build",
                  "target", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache", ".next", "out"}
_GENERATED_GLOBS = ["*.min.js", "*.min.css", "*.map", "*.lock", "package-lock.json", "yarn.lock",
                    "pnpm-lock.yaml", "*.pb.go", "*_pb2.py", "*.generated.*"]
# Secret-bearing files, excluded by default.
_SECRET_GLOBS = [".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa", "id_rsa*", "id_dsa*",
                 "id_ecdsa*", "id_ed25519*", ".npmrc", ".pypirc", ".netrc", "credentials", "credentials.json",
                 "*.keystore", "*.jks", "secrets.yaml", "secrets.yml", ".htpasswd"]


def language_for(path: str) -> str:
    """Language name for a path by file name or extension; ``text`` when unknown."""
    name = posixpath.basename(path)
    if name in _NAME_LANG:
        return _NAME_LANG[name]
    ext = posixpath.splitext(name)[1].lower()
    return _EXT_LANG.get(ext, "text")


def path_skip_reason(path: str, include: Sequence[str] = (), exclude: Sequence[str] = (),
                     vendored: frozenset[str] = frozenset()) -> str | None:
    """Reason to skip a path before reading it, or None to read it.

    Args:
        path: repository-relative POSIX path.
        include: globs; when non-empty a path must match one.
        exclude: globs; a match skips with ``excluded``.
        vendored: paths marked ``linguist-vendored``/``linguist-generated`` by ``.gitattributes``.
    """
    name = posixpath.basename(path)
    if include and not any(_glob(path, g) for g in include):
        return SKIP_EXCLUDED
    if any(_glob(path, g) for g in exclude):
        return SKIP_EXCLUDED
    if any(fnmatch.fnmatchcase(name, g) for g in _SECRET_GLOBS):
        return SKIP_SECRET
    if path in vendored or set(path.split("/")[:-1]) & _VENDORED_DIRS:
        return SKIP_VENDORED
    if any(fnmatch.fnmatchcase(name, g) for g in _GENERATED_GLOBS):
        return SKIP_VENDORED
    return None


def _glob(path: str, pattern: str) -> bool:
    """Glob on a repository path: a pattern without ``/`` matches the file name in any folder."""
    if "/" not in pattern:
        return fnmatch.fnmatchcase(posixpath.basename(path), pattern)
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern.replace("**/", ""))


def content_skip_reason(data: bytes) -> str | None:
    """Reason to skip a blob by its bytes (LFS pointer, binary, empty), or None when it is text."""
    if not data.strip():
        return SKIP_EMPTY
    if data.startswith(LFS_POINTER_PREFIX):
        return SKIP_LFS
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None
    if b"\x00" in data[:8192]:
        return SKIP_BINARY
    return None


def decode_text(data: bytes) -> str:
    """Decode a text blob: UTF-8 (BOM stripped), UTF-16 with BOM, else Latin-1; CRLF and CR become LF.

    Latin-1 maps every byte, so this never raises; binaries are caught earlier by :func:`content_skip_reason`.
    """
    if data.startswith(codecs.BOM_UTF8):
        text = data[len(codecs.BOM_UTF8):].decode("utf-8", errors="replace")
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        text = data.decode("utf-16", errors="replace")
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("latin-1")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse_gitattributes_vendored(text: str) -> list[str]:
    """Patterns marked ``linguist-vendored`` or ``linguist-generated`` (set, not ``=false``) in .gitattributes."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0].startswith("#"):
            continue
        for attr in parts[1:]:
            if attr in ("linguist-vendored", "linguist-generated", "linguist-vendored=true",
                        "linguist-generated=true"):
                out.append(parts[0])
    return out
