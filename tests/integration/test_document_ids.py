"""Object-store documents whose stored text depends on their path, on both profiles: embedded (SQLite + a blob
folder, documents in the data dir's folder) and distributed (OpenSearch + S3, documents in an S3 prefix).

The same bytes at ``page.html`` and ``page.md`` are two texts: the HTML one is extracted (tags dropped, blank lines
gone), the Markdown one is indexed as it is. Both used to get the content id of the bytes, so the sync stored both
texts under one blob key (the later put won) and ``read`` of one file returned the other's text. The same kind of
bug as the chunk cache keyed by blob sha (tests/integration/test_multi_ref.py,
``test_one_blob_at_paths_of_two_languages_is_chunked_for_each``).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from scopekb import fields as F
from scopekb.documents import document_prefix, to_text
from scopekb.indexing import SyncDeps, run_sync
from scopekb.models import ReadRequest, Source
from scopekb.reading import read_lines, result_bytes, split_lines
from scopekb.settings import Settings
from scopekb.stores.base import ScopeFilter

BODY = b"<p>hello   world</p>\n\n<p>second    para</p>\n\n<p>third</p>\n"


@pytest.fixture(params=["embedded", "distributed"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("docids")
    chunking = {"window_lines": 4, "overlap_lines": 1, "syntax": False}
    if request.param == "embedded":
        from scopekb.blobs import LocalBlobStore
        from scopekb.stores.sqlite import SqliteChunkStore, SqliteRecordStore

        s = Settings(data_dir=tmp / "data", chunking=chunking)
        chunks = SqliteChunkStore(tmp / "index.sqlite3", dimension=3, model="none")
        chunks.ensure_index()
        deps = SyncDeps(settings=s, records=SqliteRecordStore(tmp / "records.sqlite3"), chunks=chunks,
                        blobs=LocalBlobStore(tmp / "blobs"), embedder=None, embed_cache=None)
        yield {"deps": deps, "kind": "sqlite"}
        chunks.close()
        return
    from scopekb.blobs import S3BlobStore
    from scopekb.stores.opensearch import OpenSearchChunkStore, make_client
    from scopekb.stores.records import OpenSearchRecordStore

    run = f"it-docid-{uuid.uuid4().hex[:8]}"
    s = Settings(opensearch={"url": request.getfixturevalue("opensearch_url"), "alias": run,
                             "system_prefix": f"{run}-sys"},
                 s3={**request.getfixturevalue("s3_config"), "bucket": run}, chunking=chunking)
    client = make_client(s.opensearch)
    chunks = OpenSearchChunkStore(client, alias=run, dimension=3, model="none")
    chunks.ensure_index()
    deps = SyncDeps(settings=s, records=OpenSearchRecordStore(client, s.opensearch.system_prefix), chunks=chunks,
                    blobs=S3BlobStore(s.s3), embedder=None, embed_cache=None)
    yield {"deps": deps, "kind": "opensearch", "client": client}
    client.indices.delete(index=f"{run}*", params={"expand_wildcards": "open"})


def _docs(world: dict[str, Any], src: Source) -> list[dict[str, Any]]:
    deps: SyncDeps = world["deps"]
    deps.chunks.refresh()
    if world["kind"] == "sqlite":
        with sqlite3.connect(deps.chunks.path) as conn:  # type: ignore[attr-defined]
            return [d for d in (json.loads(r[0]) for r in conn.execute("SELECT doc FROM chunk_docs"))
                    if d[F.SOURCE_ID] == src.id]
    from opensearchpy import helpers

    return [h["_source"] for h in helpers.scan(world["client"], index=deps.chunks.alias,  # type: ignore[attr-defined]
                                               query={"query": {"term": {F.SOURCE_ID: src.id}}})]


def test_one_content_at_an_extracted_and_a_plain_path_keeps_two_texts(world: dict[str, Any]) -> None:
    deps: SyncDeps = world["deps"]
    bucket = deps.settings.s3.bucket
    prefix = document_prefix(deps.settings, bucket, "docs", deps.documents_dir)
    for name in ("page.html", "page.md"):  # one right after the other: one ETag and (mostly) one listed second
        prefix.put(name, BODY)
    texts = {"page.html": to_text("page.html", BODY), "page.md": BODY}
    assert texts["page.html"] != BODY
    src = Source(id=Source.new_id(), agent_name="docid", context_id=uuid.uuid4().hex[:8], kind="s3", bucket=bucket,
                 prefix="docs", repo_url=f"s3://{bucket}/docs", ref="main", webhooks=False)
    deps.records.put_source(src)
    job = run_sync(deps, f"docid-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
    assert job.state.value == "done", job.errors
    docs = _docs(world, src)
    assert {d[F.PATH] for d in docs} == set(texts)
    assert len({d[F.BLOB_SHA] for d in docs}) == 2  # two texts, two content ids
    scope = ScopeFilter(src.agent_name, (src.context_id,))
    for d in docs:
        text = texts[d[F.PATH]]
        want = b"".join(split_lines(text)[d[F.START_LINE] - 1:d[F.END_LINE]])
        res = read_lines(deps.chunks, deps.blobs, scope, ReadRequest(
            path=d[F.PATH], blob_sha=d[F.BLOB_SHA], start_line=d[F.START_LINE], end_line=d[F.END_LINE]))
        assert result_bytes(res) == want, (d[F.PATH], result_bytes(res), want)
        assert ("<p>" in d[F.CONTENT]) == (d[F.PATH] == "page.md")
    # a second sync finds both documents as indexed: nothing read or written again
    again = run_sync(deps, f"docid-{uuid.uuid4().hex[:8]}", [src.id], trigger="test")
    assert again.state.value == "done", again.errors
    assert again.chunks_written == 0 and again.files_indexed == 0, (again.chunks_written, again.files_indexed)
