"""Documents that are not in git: an S3 prefix as a source, and text extraction for PDF and HTML.

An object-store source lists its prefix; each object's version is its ETag and its last-modified time
(:func:`etag_id`). A sync indexes objects whose version differs from the indexed one and deletes the chunks of
objects that are gone, exactly like a git diff does.

Object metadata (S3 user metadata, the ``x-amz-meta-*`` headers) is read with each object's contents, normalised
(:func:`object_metadata`) and stored on the document's chunks under ``metadata["s3"]``, where the ``metadata``
search filter finds it (``{"s3.team": "docs"}``). A metadata-only change (a copy onto itself with
``x-amz-metadata-directive: REPLACE``) keeps the ETag - it is the MD5 of the unchanged bytes - but gives the
object a new last-modified time, so the next sync re-indexes it; only a change within the same second as the
listed time (S3 lists whole seconds) goes unseen until the object is written again.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import unicodedata
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

from minio import Minio
from minio.error import MinioException, S3Error
from urllib3.exceptions import HTTPError as Urllib3Error

from scopekb.blobs import ensure_bucket
from scopekb.errors import Refused, ScopekbError, Transient, translating
from scopekb.gitrepo import TreeEntry
from scopekb.settings import S3Settings, Settings

#: Object names indexed from an object-store source (others are listed and skipped as ``unsupported``).
DOCUMENT_SUFFIXES = (".md", ".markdown", ".txt", ".rst", ".html", ".htm", ".pdf", ".adoc", ".csv", ".json",
                     ".yaml", ".yml")


class DocumentError(ValueError):
    """A document cannot be turned into text (corrupt PDF, ...); the message says why."""


def etag_id(etag: str, last_modified: datetime | None = None) -> str:
    """A 40-hex id for an object version, used as ``blob_sha`` and blob key: sha1 of its ETag and, when given,
    its last-modified time (ISO, UTC as listed). The time is part of it because S3 keeps the ETag (the MD5 of the
    bytes) when only the user metadata changes, and the metadata is indexed too (see the module docstring)."""
    text = "s3-etag:" + etag.strip('"')
    if last_modified is not None:
        text += "\0" + last_modified.isoformat()
    return hashlib.sha1(text.encode()).hexdigest()


#: Object metadata kept per document: keys (the first by name), characters of a key, characters of a value. S3
#: itself allows 2 KB of user metadata an object (AWS S3 user guide, "Working with object metadata").
META_MAX_KEYS, META_MAX_KEY_CHARS, META_MAX_VALUE_CHARS = 32, 64, 1_000
#: A kept key after lower-casing and removing ``x-amz-meta-``: letters, digits, ``_`` and ``-`` only (no ``.``,
#: which the ``metadata`` filter reads as nesting; other characters are dropped with the key).
_META_KEY = re.compile(r"[a-z0-9][a-z0-9_-]*")
_META_PREFIX = "x-amz-meta-"
#: Chunk metadata key holding an object's normalised user metadata (filter keys ``s3.<key>``).
OBJECT_METADATA_KEY = "s3"


def _meta_value(raw: object) -> str:
    """One metadata header value as text: RFC 2047 encoded words (``=?UTF-8?B?...?=``, how S3 returns non-ASCII
    values) decoded, raw UTF-8 bytes (which HTTP clients hand over as Latin-1 text) re-decoded, control
    characters dropped, surrounding blanks stripped, at most :data:`META_MAX_VALUE_CHARS` characters."""
    value = str(raw)
    if "=?" in value:
        from email.header import decode_header, make_header

        try:
            value = str(make_header(decode_header(value)))
        except (ValueError, LookupError, UnicodeDecodeError):
            pass
    else:
        try:
            value = value.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            pass
    value = "".join(c for c in value if unicodedata.category(c) != "Cc").strip()
    return value[:META_MAX_VALUE_CHARS]


def object_metadata(headers: Iterable[tuple[str, object]]) -> dict[str, str]:
    """The user metadata among an object's response headers (``(name, value)`` pairs), normalised: ``x-amz-meta-``
    removed and the key lower-cased; keys that are not 1-64 characters of ``[a-z0-9_-]`` (starting with a letter or
    digit) dropped; values as :func:`_meta_value` makes them; at most :data:`META_MAX_KEYS` keys (the first by
    name). Metadata is untrusted like contents: it is stored and filtered on, never rendered as structure and
    never chooses a code path. ``[("X-Amz-Meta-Team", "Docs")]`` → ``{"team": "Docs"}``."""
    out: dict[str, str] = {}
    for name, raw in headers:
        low = str(name).lower()
        if not low.startswith(_META_PREFIX):
            continue
        key = low[len(_META_PREFIX):]
        if len(key) > META_MAX_KEY_CHARS or not _META_KEY.fullmatch(key):
            continue
        value = _meta_value(raw)
        out[key] = f"{out[key]},{value}"[:META_MAX_VALUE_CHARS] if key in out else value
    return {k: out[k] for k in sorted(out)[:META_MAX_KEYS]}


def pdf_text(data: bytes) -> str:
    """The text of a PDF, page by page (pypdf). Raises :class:`DocumentError` for an unreadable file."""
    try:
        from pypdf import PdfReader

        reader = PdfReader(io.BytesIO(data))
        return "\n\n".join((page.extract_text() or "").strip() for page in reader.pages).strip()
    except Exception as e:  # pypdf raises many types for damaged files
        raise DocumentError(f"unreadable PDF: {type(e).__name__}: {str(e)[:120]}") from None


class _Text(HTMLParser):
    _skip = {"script", "style", "noscript", "template"}
    _block = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "section", "article",
              "header", "footer", "table", "ul", "ol", "blockquote"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:  # type: ignore[type-arg]
        if tag in self._skip:
            self._hidden += 1
        elif tag in self._block:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._skip and self._hidden:
            self._hidden -= 1
        elif tag in self._block:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def html_text(html: str) -> str:
    """Visible text of an HTML document: scripts and styles dropped, block elements on their own lines."""
    p = _Text()
    p.feed(html)
    p.close()
    lines = [" ".join(line.split()) for line in "".join(p.parts).splitlines()]
    return "\n".join(line for line in lines if line)


#: Longest document name accepted by an upload (characters), below S3's 1,024-byte object key with a prefix.
MAX_DOCUMENT_NAME = 900
#: Longest object key, prefix included, in UTF-8 bytes (Amazon S3: "The name for a key is a sequence of Unicode
#: characters whose UTF-8 encoding is at most 1,024 bytes long").
MAX_OBJECT_KEY_BYTES = 1024
#: Longest path segment in UTF-8 bytes (Linux ``NAME_MAX``; the embedded profile stores documents as files).
MAX_SEGMENT_BYTES = 255
#: The names an older embedded folder gave its partial writes (``<name>.tmp<pid>``); its listing skips them.
_PARTIAL_WRITE = re.compile(r"\.tmp[0-9]+$")


def document_name_problem(rel: str, prefix: str = "") -> str | None:
    """Why ``rel`` cannot name an uploaded document (a path below a source's prefix, ``runbooks/x.md``), or None.

    One rule for both profiles (hostile reviews 3 and 4): at most :data:`MAX_DOCUMENT_NAME` characters, an object
    key (``prefix`` + name) of at most :data:`MAX_OBJECT_KEY_BYTES` and parts of at most :data:`MAX_SEGMENT_BYTES`
    UTF-8 bytes; no control
    characters, no whitespace at either end and no U+FFFD (a trailing ``%0A`` was stripped and invalid UTF-8 was
    stored as U+FFFD, so the document got another name than the one sent); no empty, ``.`` or ``..`` segment
    (``a//b.md``, ``dir/``, ``a/./b.md``: S3 stored ``dir/`` as a folder marker that was never indexed and refused
    ``.`` with a 500; the embedded folder refused all three with a 500); and no last segment ending in
    ``.tmp<digits>`` (the embedded folder's old partial-write names, which its listing skips)."""
    if len(rel) > MAX_DOCUMENT_NAME:
        return f"name is {len(rel)} characters; at most {MAX_DOCUMENT_NAME} are allowed"
    stored_prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""  # as ObjectPrefix and FolderPrefix keep it
    key_bytes = len((stored_prefix + rel).encode("utf-8", "surrogatepass"))
    if key_bytes > MAX_OBJECT_KEY_BYTES:  # hostile review: 1,798 bytes in 899 characters was a 503 from S3
        return (f"name makes an object key of {key_bytes} bytes (UTF-8, with the source's prefix); at most "
                f"{MAX_OBJECT_KEY_BYTES} are allowed")
    longest = max((len(p.encode("utf-8", "surrogatepass")) for p in rel.split("/")), default=0)
    if longest > MAX_SEGMENT_BYTES:  # hostile review: a 300-character file name was a 500 (ENAMETOOLONG)
        return f"a part of the name between '/' is {longest} bytes (UTF-8); at most {MAX_SEGMENT_BYTES} are allowed"
    if not rel or any(unicodedata.category(c) == "Cc" for c in rel):  # C0, DEL and C1 (U+0085 ...)
        return "name must be a non-empty relative path without control characters"
    if rel != rel.strip():
        return "name must not start or end with whitespace"
    if "\ufffd" in rel:  # what a decoder makes of bytes that are not UTF-8 (%FF in a query string)
        return "name must be valid UTF-8 (it holds U+FFFD, the replacement for bytes that are not)"
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "name must be a relative path of plain segments (no '..', '.', empty segment or trailing '/')"
    if _PARTIAL_WRITE.search(parts[-1]):
        return "names ending in '.tmp' and digits are reserved for partial writes"
    return None


def extraction(path: str) -> str | None:
    """The text extraction a document at ``path`` needs, by its suffix: ``"pdf"``, ``"html"`` (``.html``,
    ``.htm``), or None when its bytes are its text."""
    low = path.lower()
    if low.endswith(".pdf"):
        return "pdf"
    if low.endswith((".html", ".htm")):
        return "html"
    return None


def to_text(path: str, data: bytes) -> bytes | None:
    """Text bytes (UTF-8) for a document that needs extraction (PDF, HTML), or None to use ``data`` as is.

    Raises:
        DocumentError: the document cannot be read.
    """
    kind = extraction(path)
    if kind == "pdf":
        return pdf_text(data).encode("utf-8")
    if kind == "html":
        return html_text(data.decode("utf-8", errors="replace")).encode("utf-8")
    return None


def document_id(path: str, raw_id: str) -> str:
    """The content id of the document at ``path`` whose bytes have id ``raw_id`` (:func:`etag_id`, or a folder
    file's content hash): its ``blob_sha`` and blob key, under which the sync stores the text it indexed.

    A document's stored text depends on its path (PDF and HTML are extracted, :func:`to_text`), so the same bytes
    at ``a.html`` and ``a.md`` are two texts and need two ids: an extracted document's id is the sha1 of
    ``"<extraction>:" + raw_id``; other documents keep ``raw_id``. (Keyed by bytes alone, the second text
    overwrote the first in the blob store and ``read`` returned the other file's text.)"""
    kind = extraction(path)
    return raw_id if kind is None else hashlib.sha1(f"{kind}:{raw_id}".encode()).hexdigest()


def translate_object_store(exc: BaseException) -> ScopekbError:
    """scopekb's error for an S3 failure behind an object-store source (unreachable, refused, server error):
    :class:`Transient` - an upload answers 503, a sync retries."""
    return Transient(f"object store unavailable ({type(exc).__name__})")


@translating((MinioException, Urllib3Error, OSError), translate_object_store)
class ObjectPrefix:
    """Objects under ``bucket/prefix`` as a tree of documents (paths relative to the prefix).

    Raises: :class:`scopekb.settings.S3NotConfigured` (constructor) when the settings carry no credentials;
    :class:`scopekb.errors.Transient` from every method when S3 cannot be reached or refuses (the bucket cannot
    be listed, an object cannot be read or written).
    """

    def __init__(self, cfg: S3Settings, bucket: str, prefix: str) -> None:
        access_key, secret_key = cfg.credentials()  # raises S3NotConfigured: never built-in credentials
        self.client = Minio(cfg.endpoint, access_key=access_key, secret_key=secret_key, secure=cfg.secure,
                            region=cfg.region)
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._keys: dict[str, str] = {}

    def tree(self) -> dict[str, TreeEntry]:
        """Every object under the prefix: path → entry with ``sha`` = :func:`document_id` of the :func:`etag_id` of
        its ETag and last-modified time."""
        out: dict[str, TreeEntry] = {}
        for obj in self._list():
            rel = obj.object_name[len(self.prefix):]
            if not rel or obj.is_dir:
                continue
            sha = document_id(rel, etag_id(obj.etag or "", obj.last_modified))
            self._keys[sha] = obj.object_name
            out[rel] = TreeEntry(path=rel, mode="100644", sha=sha, size=obj.size)
        return out

    def _list(self) -> Iterator:  # type: ignore[type-arg]
        try:
            yield from self.client.list_objects(self.bucket, prefix=self.prefix, recursive=True)
        except S3Error as e:
            if e.code == "NoSuchBucket":
                return
            raise

    def read_blob(self, sha: str) -> bytes:
        """Contents of the object listed with content id ``sha``."""
        resp = self.client.get_object(self.bucket, self._keys[sha])
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    def read_document(self, rel: str, sha: str) -> tuple[bytes, dict[str, str]]:
        """Contents and normalised user metadata (:func:`object_metadata`) of the object listed at path ``rel``
        (one GET: the metadata comes with the contents; ``sha``, its listed version, is not needed)."""
        resp = self.client.get_object(self.bucket, self.prefix + rel)
        try:
            return resp.read(), object_metadata(resp.headers.items())
        finally:
            resp.close()
            resp.release_conn()

    def put(self, rel: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Store a document under the prefix; returns its object key."""
        ensure_bucket(self.client, self.bucket)
        key = self.prefix + rel.lstrip("/")
        self.client.put_object(self.bucket, key, io.BytesIO(data), length=len(data), content_type=content_type)
        return key

    def fetch(self) -> None:
        """Nothing to fetch: the listing in :meth:`tree` is the state."""

    def close(self) -> None:
        """Nothing to close."""


class FolderPrefix:
    """The embedded profile's object store for documents: files under ``<data_dir>/documents/<bucket>/<prefix>/``,
    with the interface of :class:`ObjectPrefix` (issue 16: embedded mode never sends documents to an S3 endpoint
    it was not given). A file's content id is a sha1 over its sha256; symlinks are never followed.
    """

    def __init__(self, root: Path, bucket: str, prefix: str) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.root = Path(root)
        self.base = self.root / bucket / self.prefix
        self._paths: dict[str, Path] = {}

    def _path(self, rel: str) -> Path:
        rel = rel.lstrip("/")
        problem = document_name_problem(rel)
        if problem:
            raise ValueError(f"document path {rel[:100]!r}: {problem}")
        return self.base / rel

    def tree(self) -> dict[str, TreeEntry]:
        """Every regular file under the prefix: path → entry with ``sha`` from its content (:func:`document_id`)."""
        out: dict[str, TreeEntry] = {}
        if not self.base.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(self.base, followlinks=False):
            dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
            for name in filenames:
                full = Path(dirpath) / name
                st = full.lstat()
                if not stat.S_ISREG(st.st_mode) or _PARTIAL_WRITE.search(name):
                    continue
                rel = full.relative_to(self.base).as_posix()
                raw = hashlib.sha1(b"folder:" + hashlib.sha256(full.read_bytes()).digest()).hexdigest()
                sha = document_id(rel, raw)
                self._paths[sha] = full
                out[rel] = TreeEntry(path=rel, mode="100644", sha=sha, size=st.st_size)
        return out

    def read_blob(self, sha: str) -> bytes:
        """Contents of the file listed with content id ``sha``."""
        return self._paths[sha].read_bytes()

    def read_document(self, rel: str, sha: str) -> tuple[bytes, dict[str, str]]:
        """Contents of the file listed at ``rel`` with content id ``sha``; files carry no object metadata (``{}``)."""
        return self.read_blob(sha), {}

    def put(self, rel: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Store a document under the prefix (atomically); returns its key (``prefix/rel``).

        Raises:
            ValueError: ``rel`` is not a plain relative path.
            scopekb.errors.Refused: 409, a folder is where the document would go (``a`` when ``a/b.md`` exists) or
                a document where one of its folders would (``a.md/b.md`` when ``a.md`` exists): names S3 holds
                side by side but one folder cannot.
            scopekb.errors.Transient: the folder cannot be written (disk full, I/O error).
        """
        p = self._path(rel)
        if p.is_dir() and not p.is_symlink():
            raise Refused(f"document name {rel[:100]!r}: a folder of documents has this name", 409)
        for parent in p.parents:  # the nearest existing one below the prefix must be a folder
            if parent == self.base or not parent.is_relative_to(self.base):
                break
            if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                raise Refused(f"document name {rel[:100]!r}: {parent.relative_to(self.base).as_posix()!r} is a "
                              "document, not a folder", 409)
            if parent.exists():
                break
        # Written beside the bucket folders (no bucket name starts with '.'), never inside a listed tree: a
        # document whose name held ".tmp" (``release.tmpl.md``) was skipped by the listing and never indexed.
        partial = self.root / ".partial"
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            partial.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise Transient(f"document folder unavailable ({type(e).__name__})") from e
        tmp = partial / f"{os.getpid()}-{uuid.uuid4().hex}"
        try:
            tmp.write_bytes(data)
            tmp.replace(p)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise Transient(f"document folder unavailable ({type(e).__name__})") from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return self.prefix + rel.lstrip("/")

    def fetch(self) -> None:
        """Nothing to fetch: the listing in :meth:`tree` is the state."""

    def close(self) -> None:
        """Nothing to close."""


def document_prefix(settings: Settings, bucket: str | None, prefix: str,
                    local_root: Path | None = None) -> ObjectPrefix | FolderPrefix:
    """Where an object-store source's documents live: the folder ``local_root`` when given (the embedded
    runtime's ``<data_dir>/documents``), otherwise S3 with the settings' credentials.

    Raises:
        scopekb.settings.S3NotConfigured: S3 is to be used but no credentials are set.
        scopekb.errors.Refused: 409, ``bucket`` is a path ('/' in it, '.' or '..') or holds NUL, or ``prefix`` holds
            NUL (a source stored before :func:`scopekb.models.bucket_name_problem` was checked).
    """
    # a source stored before SourceCreate checked bucket names (scopekb.models.bucket_name_problem) keeps a bucket
    # its server accepted, but never one that is a path: '/tmp' or '..' would leave local_root in the embedded
    # profile, and NUL reaches no S3 client or file name
    if bucket and (bucket in (".", "..") or "/" in bucket or "\0" in bucket) or "\0" in prefix:
        raise Refused("this source's location cannot be used (its bucket is a path or its bucket or prefix holds "
                      "NUL); register it again with an S3 bucket name", 409)
    bucket = bucket or settings.s3.bucket
    if local_root is not None:
        return FolderPrefix(local_root, bucket, prefix)
    return ObjectPrefix(settings.s3, bucket, prefix)
