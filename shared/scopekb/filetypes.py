"""What is indexed: text detection, decoding, languages and skip rules (DESIGN §4.4).

Everything here is pure: bytes and paths in, decisions out.
"""

from __future__ import annotations

import codecs
import fnmatch
import posixpath
import re
from collections.abc import Container, Sequence

from scopekb.patterns import CEILING, PatternRefused, compile_glob

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

#: Every language name :func:`language_for` gives (what a search's ``languages`` filter can match).
LANGUAGES = frozenset(_EXT_LANG.values()) | frozenset(_NAME_LANG.values()) | {"text"}

# Build output and dependency folders, and generated or minified files (the linguist conventions, short list).
_VENDORED_DIRS = {"node_modules", "vendor", "third_party", "bower_components", ".git", "dist", "build",
                  "target", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache", ".next", "out"}
_GENERATED_GLOBS = ["*.min.js", "*.min.css", "*.map", "*.lock", "package-lock.json", "yarn.lock",
                    "pnpm-lock.yaml", "*.pb.go", "*_pb2.py", "*.generated.*"]
# Secret-bearing files, excluded by default.
_SECRET_GLOBS = [".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa", "id_rsa*", "id_dsa*",
                 "id_ecdsa*", "id_ed25519*", ".npmrc", ".pypirc", ".netrc", "credentials", "credentials.json",
                 "*.keystore", "*.jks", "secrets.yaml", "secrets.yml", ".htpasswd"]

#: Each list as one regular expression (``fnmatch.fnmatchcase`` of any glob, case-sensitive, whole name): one match
#: per path instead of one per glob (issue 20: 200,000 fnmatch calls in a django sync's read phase).
_SECRET_NAMES = re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in _SECRET_GLOBS))
_GENERATED_NAMES = re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in _GENERATED_GLOBS))


def language_for(path: str) -> str:
    """Language name for a path by file name or extension; ``text`` when unknown."""
    name = posixpath.basename(path)
    if name in _NAME_LANG:
        return _NAME_LANG[name]
    ext = posixpath.splitext(name)[1].lower()
    return _EXT_LANG.get(ext, "text")


def path_skip_reason(path: str, include: Sequence[str] = (), exclude: Sequence[str] = (),
                     vendored: Container[str] = frozenset()) -> str | None:
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
    if _SECRET_NAMES.match(name):
        return SKIP_SECRET
    if path in vendored or set(path.split("/")[:-1]) & _VENDORED_DIRS:
        return SKIP_VENDORED
    if _GENERATED_NAMES.match(name):
        return SKIP_VENDORED
    return None


def _glob(path: str, pattern: str) -> bool:
    """Glob on a repository path (fnmatch dialect with ``**/``, see :mod:`scopekb.patterns`): a pattern without
    ``/`` matches the file name in any folder. Matched by RE2 in linear time; a pattern over the ceiling (only a
    source registered before the limits existed can hold one) matches nothing."""
    try:
        return compile_glob(pattern, CEILING, classes=True).match(path if "/" in pattern else posixpath.basename(path))
    except PatternRefused:
        return False


#: Bytes examined when telling text from binary (git's own NUL check looks at the first 8000 bytes).
SNIFF_BYTES = 8192
#: Share of C0 control characters (other than tab, newline, carriage return, form feed, vertical tab, backspace
#: and escape) above which valid UTF-8 is still not text (e.g. random bytes 0x01-0x7F).
MAX_CONTROL_SHARE = 0.10
_TEXT_CONTROLS = frozenset("\t\n\r\f\v\b\x1b")
#: The C0 control characters not in :data:`_TEXT_CONTROLS` (U+0000-U+001F less tab, LF, VT, FF, CR, BS, ESC).
_CONTROL_CHARS = re.compile("[" + "".join(re.escape(chr(c)) for c in range(32)
                                          if chr(c) not in _TEXT_CONTROLS) + "]")
#: On a tie between equally plausible single-byte encodings, Windows-1252 is chosen (the WHATWG Encoding
#: Standard's label for legacy Western text, a superset of Latin-1's printable range).
_PREFERRED_LEGACY = ("cp1252", "latin_1")


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


#: Every byte value except the C0 controls :data:`_CONTROL_CHARS` matches: ``bytes.translate(None, this)`` keeps
#: only those controls, so its length counts them in one C pass (ASCII fast path of :func:`sniff_encoding`).
_NOT_CONTROL_BYTES = bytes(b for b in range(256) if not _CONTROL_CHARS.match(chr(b)))


def _too_many_controls(text: str) -> bool:
    sample = text[:SNIFF_BYTES]
    # one regex scan in C (issue 20: a Python loop over the characters cost seconds per django sync, twice)
    n = len(_CONTROL_CHARS.findall(sample))
    return n > MAX_CONTROL_SHARE * max(len(sample), 1)


def _too_many_control_bytes(data: bytes) -> bool:
    """:func:`_too_many_controls` of ASCII bytes without decoding them (one ASCII character per byte, so the
    first :data:`SNIFF_BYTES` bytes are the same sample and the counts are the same)."""
    sample = data[:SNIFF_BYTES]
    return len(sample.translate(None, _NOT_CONTROL_BYTES)) > MAX_CONTROL_SHARE * max(len(sample), 1)


def sniff_encoding(data: bytes) -> str | None:
    """The encoding of a blob, or None when it is not text (binary).

    UTF-8 (with or without BOM) and UTF-16 with BOM are recognised directly; a NUL byte in the first
    :data:`SNIFF_BYTES` bytes or too many control characters (:data:`MAX_CONTROL_SHARE`) means binary; anything
    else is handed to charset-normalizer, which either names a plausible encoding (Shift_JIS, GB18030, KOI8-R,
    Windows-1252, ...) or finds the bytes too chaotic for any (binary). Ties between equally plausible
    single-byte encodings go to Windows-1252.
    """
    if data.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    if b"\x00" in data[:SNIFF_BYTES]:
        return None
    if data.isascii():  # ASCII is UTF-8: no decode, the controls counted on the bytes (issue 20: most source files)
        return None if _too_many_control_bytes(data) else "utf-8"
    text = _utf8(data)
    if text is not None:
        return None if _too_many_controls(text) else "utf-8"
    from charset_normalizer import from_bytes

    matches = list(from_bytes(data))
    if not matches:
        return None
    best = matches[0]
    for m in matches:
        if (m.chaos, m.coherence) != (best.chaos, best.coherence):
            continue
        for enc in _PREFERRED_LEGACY:
            if enc in m.could_be_from_charset:
                try:
                    data.decode(enc)
                    return enc
                except UnicodeDecodeError:
                    pass
    return best.encoding


def content_skip_reason(data: bytes) -> str | None:
    """Reason to skip a blob by its bytes (empty, LFS pointer, ``binary``), or None when it is text.

    Binary means :func:`sniff_encoding` finds no text encoding for it.
    """
    if not data or data.isspace():  # same as ``not data.strip()`` without copying the blob
        return SKIP_EMPTY
    if data.startswith(LFS_POINTER_PREFIX):
        return SKIP_LFS
    if sniff_encoding(data) is None:
        return SKIP_BINARY
    return None


def decode_text(data: bytes) -> str:
    """Decode a text blob in the encoding :func:`sniff_encoding` names (UTF-8 without BOM, UTF-16 by BOM,
    legacy encodings as charset-normalizer guesses them); CRLF and CR become LF.

    Never raises: bytes not valid in the chosen encoding are replaced (U+FFFD), and a blob with no text
    encoding (binaries are caught earlier by :func:`content_skip_reason`) is read as Latin-1.
    """
    enc = sniff_encoding(data) or "latin-1"
    text = data.decode(enc, errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")
