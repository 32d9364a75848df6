"""``read``: exactly the lines of an indexed blob, from the blob store, within the caller's scope (issue 23).

A search hit names ``path``, ``blob_sha`` and lines; :func:`read_lines` returns those lines byte for byte as the
blob holds them, so an agent can open the file it was pointed at, at the version it saw. REST (``GET
/v1/read``), MCP (``read``) and the CLI (``scopekb read``) call it.

Lines are counted as the chunkers count them (:func:`scopekb.filetypes.decode_text`: LF, CRLF and a lone CR each
end a line), so a hit's ``start_line``-``end_line`` are the same lines here, with their original line ends.

Scope: a blob is readable only when the caller's scope holds a chunk of that path at that blob id
(:meth:`scopekb.stores.base.ChunkStore.find_blob`); otherwise the answer is 404, the same whether the blob exists
for another agent or not at all, so existence never leaks across agents.
"""

from __future__ import annotations

import base64
import codecs
import re

from scopekb import fields as F
from scopekb.blobs import BlobNotFound, BlobStore, blob_key
from scopekb.errors import NotFound, Refused
from scopekb.filetypes import sniff_encoding
from scopekb.models import ReadRequest, ReadResult
from scopekb.search import name_ref, scope_refs
from scopekb.stores.base import ChunkStore, RecordStore, ScopeFilter, SearchFilter

#: A line end as :func:`scopekb.filetypes.decode_text` sees one: CRLF, a lone CR or LF.
_LINE_END = re.compile(r"\r\n|\r|\n")
_LINE_END_BYTES = re.compile(rb"\r\n|\r|\n")

NOT_FOUND = "blob not found in this scope (path and blob_sha as a search hit names them)"


def split_lines(data: bytes, enc: str | None = "") -> list[bytes]:
    """The lines of a text blob as bytes, each with its own line end (the last one may have none).

    ``b"".join(split_lines(data)) == data``. Line ``n`` (1-based) is the ``n``-th element of
    ``decode_text(data).split("\\n")``: ASCII-compatible encodings (UTF-8, Latin-1, Windows-125x, Shift_JIS,
    GB18030, ...) are split on their line-end bytes; UTF-16 (by BOM) is split on decoded line ends and each line
    encoded back (the BOM stays on line 1). An empty blob, or one ending with a line end, has a last empty line,
    as ``str.split`` gives. ``enc``: the blob's :func:`~scopekb.filetypes.sniff_encoding` when the caller has it
    (``""``: sniffed here).
    """
    enc = sniff_encoding(data) if enc == "" else enc
    if enc == "utf-16":
        bom = data[:2]
        codec = _utf16_codec(bom)
        text = data[2:].decode(codec, errors="surrogatepass")
        pieces = _split_keep(text, _LINE_END)
        out = [p.encode(codec, errors="surrogatepass") for p in pieces]
        out[0] = bom + out[0]
        return out
    return _split_keep(data, _LINE_END_BYTES)


def _utf16_codec(bom: bytes) -> str:
    """The codec of a UTF-16 blob by its byte order mark (little or big endian)."""
    return "utf-16-le" if bom == codecs.BOM_UTF16_LE else "utf-16-be"


def _split_keep(data: str | bytes, pattern: re.Pattern) -> list:  # type: ignore[type-arg]
    out = []
    pos = 0
    for m in pattern.finditer(data):
        out.append(data[pos:m.end()])
        pos = m.end()
    out.append(data[pos:])
    return out


def read_lines(chunks: ChunkStore, blobs: BlobStore, scope: ScopeFilter, req: ReadRequest,
               records: RecordStore | None = None, max_age_s: float = 0.0) -> ReadResult:
    """Lines ``req.start_line..req.end_line`` (1-based, inclusive; ``end_line`` None or past the end: to the last
    line) of the blob ``req.blob_sha`` indexed at ``req.path`` within ``scope`` (and ``req.ref`` when given: a
    branch, tag or indexed head commit, resolved as a search's ``ref``).

    Returns a :class:`ReadResult` naming repo, source, ref and commit of an indexed chunk of that blob (the most
    recently indexed one when several sources hold it). With ``records``, ref and commit follow the rule of
    search hits (:func:`scopekb.search.name_ref`): the asked ref and its indexed commit, else the source's default
    ref when the chunk is in it, else its first indexed ref by name; ``max_age_s`` is how old the cached refs
    may be (``query.revocation_bound_s``, as for search). Without ``records``, the ref/commit stored on the chunk.

    Raises:
        NotFound: (404) the scope holds no chunk of that path at that blob (also when another scope does), or
            none in ``req.ref``, or ``req.ref`` is not indexed, or the blob store no longer has the blob.
        Refused: (422) ``start_line`` is past the blob's last line (the message gives the line count); (409)
            ``req.ref`` is a commit prefix of several refs.
        scopekb.errors.Transient: a store is unavailable.
    """
    refs = scope_refs(records, scope, None, req.repo, req.ref, max_age_s) if records is not None else None
    ref = refs.resolve(req.ref) if refs is not None and req.ref else req.ref
    flt = SearchFilter(scope=scope, repo=req.repo, ref=ref,
                       overlays=refs.overlays_for(ref) if refs is not None and ref else ())
    doc = chunks.find_blob(flt, req.path, req.blob_sha)
    if doc is None:
        raise NotFound(NOT_FOUND if not ref else f"{NOT_FOUND}, in ref {ref[:200]!r}")
    named_ref, commit = doc.get(F.REF), doc.get(F.COMMIT)
    if refs is not None:
        _, named_ref, commit = name_ref(refs, ref, doc.get(F.SOURCE_ID), doc.get("_id"), doc.get(F.REFS),
                                        named_ref, commit)
    try:
        data = blobs.get(blob_key(req.blob_sha))
    except BlobNotFound:
        raise NotFound("blob no longer in the blob store; sync the source again") from None
    enc = sniff_encoding(data)  # once: charset-normalizer reads the whole blob for a legacy encoding
    lines = split_lines(data, enc)
    if len(lines) > 1 and not lines[-1]:
        lines.pop()  # a final line end ends the last line; it starts none (`wc -l`, and what hits name)
    total = len(lines)
    if req.start_line > total:
        raise Refused(f"start_line {req.start_line} is past the blob's last line ({total} lines)", 422)
    end = min(req.end_line or total, total)
    raw = b"".join(lines[req.start_line - 1:end])
    content, b64, text, encoding = _contents(data[:2], enc, raw, req.start_line)
    return ReadResult(repo=doc.get(F.REPO), ref=named_ref, commit=commit,
                      source_id=doc.get(F.SOURCE_ID), blob_sha=req.blob_sha, path=req.path,
                      start_line=req.start_line, end_line=end, total_lines=total, content=content,
                      content_base64=b64, text=text, encoding=encoding, agent_name=str(doc.get(F.AGENT_NAME)),
                      context_id=str(doc.get(F.CONTEXT_ID)))


def _contents(head: bytes, enc: str | None, raw: bytes,
              start_line: int) -> tuple[str | None, str | None, str | None, str]:
    """``(content, content_base64, text, encoding)`` of the lines ``raw`` of a blob starting with ``head`` (its
    first two bytes) whose :func:`scopekb.filetypes.sniff_encoding` is ``enc``: the exact bytes as UTF-8 text when
    the blob is UTF-8, else as base64 with ``text``, the lines decoded in the encoding the blob was indexed in (as
    :func:`scopekb.filetypes.decode_text` decodes it, Latin-1 when none was named;
    hostile review: UTF-16 lines came back as UTF-8 text full of NULs and Latin-1 ones as base64 only, while the
    hits that pointed at them showed the decoded text)."""
    enc = enc or "latin-1"
    if enc in ("utf-8", "utf-8-sig"):
        try:
            return raw.decode("utf-8"), None, None, "utf-8"
        except UnicodeDecodeError:  # not UTF-8 after all past the sniffed part
            return None, base64.b64encode(raw).decode("ascii"), raw.decode("utf-8", errors="replace"), "utf-8"
    raw_text = raw
    if enc == "utf-16":
        enc = _utf16_codec(head)
        if start_line == 1 and raw.startswith(head):
            raw_text = raw[2:]  # the byte order mark
    return None, base64.b64encode(raw).decode("ascii"), raw_text.decode(enc, errors="replace"), enc


def result_bytes(res: ReadResult) -> bytes:
    """The exact bytes a :class:`ReadResult` carries (``content`` as UTF-8, or ``content_base64`` decoded; never
    ``text``, which is decoded)."""
    if res.content is not None:
        return res.content.encode("utf-8")
    return base64.b64decode(res.content_base64 or "")
