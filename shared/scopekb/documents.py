"""Documents that are not in git: an S3 prefix as a source, and text extraction for PDF and HTML.

An object-store source lists its prefix; each object's ETag is its version. A sync indexes objects whose ETag
differs from the indexed one and deletes the chunks of objects that are gone, exactly like a git diff does.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

from minio import Minio
from minio.error import S3Error

from scopekb.gitrepo import TreeEntry
from scopekb.settings import S3Settings, Settings

#: Object names indexed from an object-store source (others are listed and skipped as ``unsupported``).
DOCUMENT_SUFFIXES = (".md", ".markdown", ".txt", ".rst", ".html", ".htm", ".pdf", ".adoc", ".csv", ".json",
                     ".yaml", ".yml")


class DocumentError(ValueError):
    """A document cannot be turned into text (corrupt PDF, ...); the message says why."""


def etag_id(etag: str) -> str:
    """A 40-hex content id for an object version (sha1 of its ETag), used as ``blob_sha`` and blob key."""
    return hashlib.sha1(("s3-etag:" + etag.strip('"')).encode()).hexdigest()


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


def to_text(path: str, data: bytes) -> bytes | None:
    """Text bytes (UTF-8) for a document that needs extraction (PDF, HTML), or None to use ``data`` as is.

    Raises:
        DocumentError: the document cannot be read.
    """
    low = path.lower()
    if low.endswith(".pdf"):
        return pdf_text(data).encode("utf-8")
    if low.endswith((".html", ".htm")):
        return html_text(data.decode("utf-8", errors="replace")).encode("utf-8")
    return None


class ObjectPrefix:
    """Objects under ``bucket/prefix`` as a tree of documents (paths relative to the prefix).

    Raises: :class:`scopekb.settings.S3NotConfigured` (constructor) when the settings carry no credentials;
    ``minio.error.S3Error`` (from :meth:`tree`) when the bucket cannot be listed.
    """

    def __init__(self, cfg: S3Settings, bucket: str, prefix: str) -> None:
        access_key, secret_key = cfg.credentials()  # raises S3NotConfigured: never built-in credentials
        self.client = Minio(cfg.endpoint, access_key=access_key, secret_key=secret_key, secure=cfg.secure,
                            region=cfg.region)
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._keys: dict[str, str] = {}

    def tree(self) -> dict[str, TreeEntry]:
        """Every object under the prefix: path → entry with ``sha`` = :func:`etag_id` of its ETag."""
        out: dict[str, TreeEntry] = {}
        for obj in self._list():
            rel = obj.object_name[len(self.prefix):]
            if not rel or obj.is_dir:
                continue
            sha = etag_id(obj.etag or "")
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

    def put(self, rel: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Store a document under the prefix; returns its object key."""
        if not self.client.bucket_exists(self.bucket):
            self.client.make_bucket(self.bucket)
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
        parts = rel.split("/")
        if not rel or any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 for c in rel):
            raise ValueError(f"document path {rel[:100]!r} is not a plain relative path")
        return self.base / rel

    def tree(self) -> dict[str, TreeEntry]:
        """Every regular file under the prefix: path → entry with ``sha`` from its content."""
        out: dict[str, TreeEntry] = {}
        if not self.base.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(self.base, followlinks=False):
            dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
            for name in filenames:
                full = Path(dirpath) / name
                st = full.lstat()
                if not stat.S_ISREG(st.st_mode) or ".tmp" in name:
                    continue
                rel = full.relative_to(self.base).as_posix()
                sha = hashlib.sha1(b"folder:" + hashlib.sha256(full.read_bytes()).digest()).hexdigest()
                self._paths[sha] = full
                out[rel] = TreeEntry(path=rel, mode="100644", sha=sha, size=st.st_size)
        return out

    def read_blob(self, sha: str) -> bytes:
        """Contents of the file listed with content id ``sha``."""
        return self._paths[sha].read_bytes()

    def put(self, rel: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Store a document under the prefix (atomically); returns its key (``prefix/rel``).

        Raises:
            ValueError: ``rel`` is not a plain relative path.
        """
        p = self._path(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(p)
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
    """
    bucket = bucket or settings.s3.bucket
    if local_root is not None:
        return FolderPrefix(local_root, bucket, prefix)
    return ObjectPrefix(settings.s3, bucket, prefix)
