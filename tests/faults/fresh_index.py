"""Index one repository ref from scratch into a throwaway alias and write its chunks as JSON: the reference a
faulted index is compared with ("a fresh full index of the commit").

    python -m tests.faults.fresh_index <repo> <ref> <out.json>

Settings come from the environment (the scenario's ``SCOPEKB_*``); the alias, system prefix and mirror cache
are replaced by fresh ones and deleted afterwards. The output holds the job record and, per chunk,
``[path, start_line, content]``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid


def main() -> None:
    """Run one full sync in this process and dump what it indexed."""
    repo, ref, out = sys.argv[1:4]
    run = uuid.uuid4().hex[:8]
    os.environ["SCOPEKB_OPENSEARCH__ALIAS"] = f"fresh-{run}"
    os.environ["SCOPEKB_OPENSEARCH__SYSTEM_PREFIX"] = f"fresh-{run}-sys"
    os.environ["SCOPEKB_GIT__CACHE_DIR"] = tempfile.mkdtemp(prefix="fresh-git-")
    os.environ["SCOPEKB_GIT__ALLOW_LOCAL_PATHS"] = "true"

    from opensearchpy import helpers

    from scopekb.indexing import run_sync
    from scopekb.models import Source
    from scopekb.runtime import build_runtime
    from scopekb.settings import get_settings

    rt = build_runtime(get_settings())
    client = rt.opensearch_client
    try:
        rt.chunks.ensure_index()
        src = Source(id=Source.new_id(), agent_name="fresh", context_id="fresh", repo_url=repo, ref=ref)
        rt.records.put_source(src)
        job = run_sync(rt.sync_deps(), f"fresh-{run}", [src.id], trigger="test")
        rt.chunks.refresh()
        chunks = [[h["_source"]["path"], h["_source"]["start_line"], h["_source"]["content"]]
                  for h in helpers.scan(client, index=f"fresh-{run}", query={"query": {"match_all": {}}},
                                        _source=["path", "start_line", "content"], size=1000)]
        with open(out, "w", encoding="utf-8") as fh:
            json.dump({"job": job.model_dump(mode="json"), "chunks": chunks}, fh)
    finally:
        client.indices.delete(index=f"fresh-{run}*", params={"expand_wildcards": "open,closed"})


if __name__ == "__main__":
    main()
