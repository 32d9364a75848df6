"""Object-store sources (issue 5): documents under an S3 prefix, uploaded through the API, indexed for one scope,
removed when deleted; PDF text is searchable. Real S3 (SeaweedFS), real worker, real OpenSearch."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from minio import Minio

from .conftest import S3_EVENT_TOKEN, Stack

pytestmark = pytest.mark.e2e


def tiny_pdf(text: str) -> bytes:
    """A one-page PDF showing ``text`` in Helvetica (written by hand, with a correct xref table)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def test_uploaded_documents_are_searchable_in_their_scope_and_deletions_heal(stack: Stack) -> None:
    prefix = f"agents/docs/kb-{uuid.uuid4().hex[:6]}"
    with stack.admin() as admin:
        r = admin.post("/v1/sources", json={"agent_name": "docs-agent", "context_id": "kb", "kind": "s3",
                                            "prefix": prefix})
        assert r.status_code == 201, r.text
        src = r.json()
        assert src["kind"] == "s3" and src["prefix"] == prefix
        keys = {a: admin.post("/v1/keys", json={"agent_name": a, "context_ids": ["kb"]}).json()["key"]
                for a in ("docs-agent", "other-agent")}
        docs = {"runbooks/restart.md": (b"# Restart\nDrain the okapi_queue before restarting.\n", "text/markdown"),
                "faq.txt": (b"Q: Who owns the narwhal_budget?\nA: Finance.\n", "text/plain"),
                "specs/protocol.pdf": (tiny_pdf("The quokka_protocol uses three handshakes."), "application/pdf")}
        jobs = []
        for name, (data, ctype) in docs.items():
            r = admin.post(f"/v1/sources/{src['id']}/documents", params={"name": name}, content=data,
                           headers={"Content-Type": ctype})
            assert r.status_code == 202, r.text
            jobs.append(r.json()["job_id"])
        assert admin.post(f"/v1/sources/{src['id']}/documents", params={"name": "../x"},
                          content=b"x").status_code == 422
    for j in jobs:
        assert stack.wait_job(j)["state"] == "done"

    def paths_for(key: str, q: str) -> list[str]:
        with stack.agent(key) as c:
            return [h["path"] for h in c.post("/v1/search", json={"query": q}).json()["hits"]]

    assert paths_for(keys["docs-agent"], "okapi_queue") == ["runbooks/restart.md"]
    assert paths_for(keys["docs-agent"], "narwhal_budget") == ["faq.txt"]
    assert paths_for(keys["docs-agent"], "quokka_protocol") == ["specs/protocol.pdf"]
    assert paths_for(keys["other-agent"], "okapi_queue") == []
    print(f"injected: 3 uploads under {prefix}; checked: each marker found in its document, none for another agent")

    # Delete one object directly in S3, then tell the ingester (an S3 event notification) and wait.
    env = stack.env
    s3 = Minio(env["SCOPEKB_S3__ENDPOINT"], access_key=env["SCOPEKB_S3__ACCESS_KEY"],
               secret_key=env["SCOPEKB_S3__SECRET_KEY"], secure=env["SCOPEKB_S3__SECURE"] == "true")
    s3.remove_object(env["SCOPEKB_S3__BUCKET"], f"{prefix}/faq.txt")
    event = {"Records": [{"eventName": "s3:ObjectRemoved:Delete", "s3": {
        "bucket": {"name": env["SCOPEKB_S3__BUCKET"]}, "object": {"key": f"{prefix}/faq.txt"}}}]}
    url = f"{stack.ingester_url}/webhooks/s3"
    assert httpx.post(url, content=json.dumps(event), headers={"X-Scopekb-Token": "wrong"}).status_code == 401
    r = httpx.post(url, content=json.dumps(event), headers={"X-Scopekb-Token": S3_EVENT_TOKEN})
    assert r.status_code == 202, r.text
    job = stack.wait_job(r.json()["job_ids"][0])
    assert job["state"] == "done" and job["files_deleted"] == 1 and job["files_indexed"] == 0
    assert paths_for(keys["docs-agent"], "narwhal_budget") == []
    assert paths_for(keys["docs-agent"], "okapi_queue") == ["runbooks/restart.md"]
    print("injected: S3 delete + event; checked: deleted document gone, others kept, nothing re-indexed")
