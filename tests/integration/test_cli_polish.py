"""CLI leftovers of the hostile review 2 (H7, H8) and the README newcomer run, on both profiles: what each command
says is what it did, in CLI terms, with no library warnings around it.

- ``scopekb reconcile`` (H7): embedded, no worker reads the CLI process's in-memory queue, so the verifying syncs
  run in that process and their outcome is printed; distributed, they are enqueued for the workers and the line
  says so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import test_cli_search_text
from .test_cli_errors import base_env, run

env = test_cli_search_text.env  # the fixture: the CLI's environment on each profile


def git_repo(where: Path, files: dict[str, str], commits: int = 1) -> Path:
    """A git repository at ``where`` with ``files``, in ``commits`` commits (later ones append a line)."""
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(where)], check=True)
    for n in range(commits):
        for name, text in files.items():
            (where / name).write_text(text + "\n# edit\n" * n)
        subprocess.run(["git", "-C", str(where), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(where), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "--quiet",
                        "-m", f"change the retry helper {n}"], check=True)
    return where


def is_distributed(env: dict[str, str]) -> bool:
    return env.get("SCOPEKB_PROFILE") == "distributed"


def test_reconcile_says_what_it_did(env: dict[str, str], tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo", {"a.py": "def retry_helper():\n    return 1\n"})
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    p = run(["reconcile"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == "", p.stderr  # no kombu/OpenSearch client warnings around the line
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout
    if is_distributed(env):
        assert lines[0].startswith("verifying syncs enqueued for the workers: 1;"), lines
    else:
        assert lines[0].startswith("verifying syncs run in this process: 1 (1 done);"), lines
        # the sync left its job record where `scopekb up`'s /v1/jobs reads it
        from scopekb.runtime import build_embedded_runtime
        from scopekb.settings import Settings

        rt = build_embedded_runtime(Settings(data_dir=Path(env["SCOPEKB_HOME"]), embedding={"provider": "none"},
                                             profile="embedded"))
        jobs = [j for j in rt.records.list_jobs() if j.trigger == "reconcile"]
        assert [j.state for j in jobs] == ["done"], jobs


def source_id(env: dict[str, str], tmp_path: Path, context: str) -> str:
    import json

    p = run(["source", "list", "--json"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    return next(s["id"] for s in json.loads(p.stdout) if s["context_id"] == context)


def test_search_options_notices_and_an_empty_scope_speak_cli(env: dict[str, str], tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"a.py": "def retry_helper():\n    return 1\n",
                                        "b.py": "def other():\n    return retry_helper()\n"})
    p = run(["index", str(repo)], env, tmp_path)
    assert p.returncode == 0, p.stderr
    # not a terminal: plain progress lines, no escape codes
    assert "reading files: 2/2" in p.stderr and "\x1b" not in p.stderr + p.stdout, p.stderr

    p = run(["search", "retry_helper", "--context", "nope"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "context nope has no sources for agent local (its contexts: proj)" in p.stdout, p.stdout
    p = run(["search", "retry_helper", "--agent", "nobody"], env, tmp_path)
    assert "agent nobody has no sources" in p.stdout, p.stdout

    # the same action and renderer as REST format=text / MCP: one result per file, packed into the budget
    p = run(["search", "retry_helper", "--group-by", "file", "--max-tokens", "3000"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "one result per file" in p.stdout and "<<<chunk-" in p.stdout, p.stdout
    heads = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    assert len({h.split(":")[0] for h in heads}) == len(heads) == 2, p.stdout  # a.py and b.py, once each
    p = run(["search", "retry_helper", "--max-tokens", "100"], env, tmp_path)
    assert p.returncode == 0 and ("[1] " in p.stdout or "max_tokens of at least" in p.stdout), p.stdout

    # a notice names the flag to change, not the REST field
    p = run(["search", "retry_helper", "--mode", "exact", "--max-results", "1"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "--max-results" in p.stderr and "max_results" not in p.stderr.replace("--max-results", ""), p.stderr

    blob = "0" * 40
    for args, flag in ((["search", "retry_helper", "--max-tokens", "5"], "--max-tokens"),
                       (["search", "retry_helper", "--context", " bad"], "--context"),
                       (["search", "retry_helper", "--agent", "bad agent "], "--agent"),
                       (["read", "a.py", "xyz"], "BLOB_SHA"), (["read", "a.py", blob, "--agent", ""], "--agent"),
                       (["read", "a.py", blob, "--start", "3", "--end", "2"], "--end must not be before --start"),
                       (["read", "a.py", blob, "--context", "\x01"], "--context")):
        p = run(args, env, tmp_path)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("embeddings:")]
        assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], \
            (args, p.stderr)


def test_status_line_names_the_store_in_its_own_words(env: dict[str, str], tmp_path: Path) -> None:
    p = run(["status"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    line = p.stdout.splitlines()[0]
    if is_distributed(env):
        assert line.startswith("search store: opensearch ") and "data node(s)" in line, line
    else:
        assert line.startswith("search store: SQLite file ") and "shard" not in line and "node" not in line, line


def test_status_names_the_model_of_the_index_vectors(env: dict[str, str], tmp_path: Path) -> None:
    """``status`` says which model the index's vectors come from (read from the index, not the settings) and
    whether this process embeds with it: a process with another model or none answers by keyword only."""
    def vectors_line(e: dict[str, str]) -> str:
        p = run(["status"], e, tmp_path)
        assert p.returncode == 0, p.stderr
        return next(ln for ln in p.stdout.splitlines() if ln.startswith("vectors: "))

    repo = git_repo(tmp_path / "proj", {"a.py": "def retry_helper():\n    return 1\n"})
    local = {**env, "SCOPEKB_EMBEDDING__PROVIDER": "local"}
    assert vectors_line(env) == ("vectors: no chunk index yet (`scopekb init` or the first `scopekb index` "
                                 "creates it)")
    p = run(["status"], env, tmp_path)  # before any index: the health of an alias that does not exist yet was
    # asked with `_cluster/health/<alias>`, which OpenSearch holds open: "green ...; unreachable: ConnectionTimeout"
    assert p.returncode == 0 and "unreachable" not in p.stdout and "problem" not in p.stdout, p.stdout
    assert run(["index", str(repo)], local, tmp_path).returncode == 0
    line = vectors_line(local)
    assert line.startswith("vectors: local:all-MiniLM-L6-v2@") and line.endswith("(384 dimensions)"), line
    model = line.removeprefix("vectors: ").removesuffix(" (384 dimensions)")
    other = git_repo(tmp_path / "kw", {"b.py": "def other():\n    return 2\n"})
    kw_home = {**env, "SCOPEKB_HOME": str(tmp_path / "kw-home")}  # another index: the fixture's names + "-kw"
    if is_distributed(env):
        kw_home.update(SCOPEKB_OPENSEARCH__ALIAS=env["SCOPEKB_OPENSEARCH__ALIAS"] + "-kw",
                       SCOPEKB_OPENSEARCH__SYSTEM_PREFIX=env["SCOPEKB_OPENSEARCH__SYSTEM_PREFIX"] + "-kw")
    assert run(["index", str(other)], kw_home, tmp_path).returncode == 0
    assert vectors_line(kw_home) == "vectors: keyword-only index"
    # hostile review: with the local model, the default mode (hybrid) was refused on a keyword-only index, rc 1
    p = run(["search", "other"], {**kw_home, "SCOPEKB_EMBEDDING__PROVIDER": "local"}, tmp_path)
    assert p.returncode == 0 and "keyword search" in p.stdout and "b.py" in p.stdout, p.stdout + p.stderr
    line = vectors_line(env)  # the index keeps its vectors; this process cannot embed a query
    assert line == f"vectors: {model} (384 dimensions); this process has no embedding model: keyword search only", \
        line
    # hostile review: indexing from such a process named `scopekb reindex`, which without a provider drops the vectors
    p = run(["index", str(repo)], env, tmp_path)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("embeddings:")]
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert "set SCOPEKB_EMBEDDING__PROVIDER" in lines[0] and "would drop the vectors" in lines[0], lines[0]


def test_eval_history_of_a_one_commit_repository_says_why_it_is_empty(env: dict[str, str], tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "one", {"a.py": "def retry_helper():\n    return 1\n"})
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    p = run(["eval", source_id(env, tmp_path, "one"), "--set", "history"], env, tmp_path, timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("embeddings:")]
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert "history set: the ref has 1 commit(s) and none with one parent" in lines[0], lines


def test_embedded_up_starts_without_misleading_warnings(tmp_path: Path) -> None:
    """``scopekb up`` (embedded only): no Celery superuser warning (its broker is this process's memory), no Redis
    visibility-timeout or eviction warning (there is no Redis), no kombu "No hostname was supplied"."""
    import os
    import signal
    import socket
    import time

    from .test_cli_errors import CLI

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "up.log"
    with log.open("w") as f:
        proc = subprocess.Popen([*CLI, "up", "--port", str(port)], env=base_env(tmp_path), cwd=tmp_path, stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "[queues]" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # the worker's startup checks run before its banner; give stragglers a moment
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    assert "[queues]" in out, out
    for bad in ("WARNING", "superuser", "worker_startup_check", "broker visibility_timeout", "No hostname",
                "maxmemory", "Traceback"):
        assert bad not in out, (bad, out)


def test_status_lists_each_tracked_ref_with_its_indexed_commit_and_lag(env: dict[str, str], tmp_path: Path) -> None:
    """``scopekb status`` shows what ``GET /v1/sources/{id}`` reports (the same action, ops.source_report): each
    tracked ref with its indexed commit and lag (README newcomer), in the table and in ``--json``."""
    import json

    repo = git_repo(tmp_path / "tracked", {"a.py": "def retry_helper():\n    return 1\n"})
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    p = run(["status", "--json"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    row = next(r for r in json.loads(p.stdout) if r["scope"].endswith("/tracked"))
    assert row["status"] == "READY" and row["indexed_commit"] == head, row
    assert row["refs"] == [{"ref": "main", "commit": head, "behind": False, "lag_s": 0.0, "pinned": False}], row
    p = run(["status"], {**env, "COLUMNS": "250"}, tmp_path)
    assert p.returncode == 0 and f"main {head[:12]}" in p.stdout and "READY" in p.stdout, p.stdout


def test_eval_of_short_docstrings_states_the_rule(env: dict[str, str], tmp_path: Path) -> None:
    """README newcomer: a repository whose only docstring is two words made "no documented Python function",
    which read as a bug; the line now states the rule a function must meet to make a query."""
    repo = git_repo(tmp_path / "short", {"a.py": 'def retry_helper(x):\n    """Add one."""\n    y = x + 1\n'
                                                 '    return y\n'})
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    p = run(["eval", source_id(env, tmp_path, "short"), "--set", "docstring"], env, tmp_path, timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("embeddings:")]
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert "docstring set: no documented Python function" in lines[0] and "3 or more words" in lines[0], lines


def test_status_keeps_a_source_id_on_one_line_at_80_columns(env: dict[str, str], tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "narrow", {"a.py": "def retry_helper():\n    return 1\n"})
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    sid = source_id(env, tmp_path, "narrow")
    p = run(["status"], {**env, "COLUMNS": "80"}, tmp_path)
    assert p.returncode == 0, p.stderr
    assert sid in p.stdout, p.stdout  # whole, so it can be copied into `scopekb sync` / `eval`


def test_an_embedded_index_waits_for_a_reindex_of_another_process(tmp_path: Path) -> None:
    """Hostile review (embedded profile): ``scopekb index`` run beside ``scopekb reindex`` wrote its chunks into
    tables the rebuild then dropped, recorded the new commit as indexed, and every later run found nothing to do.
    Here the test process holds the rebuild guard of the data folder's index, as a reindex in another process does:
    ``scopekb index`` waits for it, then indexes the change. (The distributed profile's syncs wait for a reindex
    through Redis: the worker's deferral, tests/integration/test_reindex.py.)"""
    from scopekb.stores.sqlite import SqliteChunkStore

    env = base_env(tmp_path)
    repo = git_repo(tmp_path / "proj", {"notes.md": "# notes\nfirst line\n"})
    assert run(["index", str(repo)], env, tmp_path).returncode == 0
    (repo / "notes.md").write_text("# notes\nfirst line\nqline_marker_7731\n")
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "q"],
                   check=True)
    store = SqliteChunkStore(Path(env["SCOPEKB_HOME"]) / "index.sqlite3")
    from .test_cli_errors import CLI

    with store.rebuild_guard(5):
        p = subprocess.Popen([*CLI, "index", str(repo)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            p.wait(timeout=4)
        except subprocess.TimeoutExpired:
            pass
        assert p.returncode is None, "scopekb index ran during the rebuild"
    out, errs = p.communicate(timeout=120)
    assert p.returncode == 0, errs
    found = run(["search", "qline_marker_7731", "--mode", "exact"], env, tmp_path)
    assert found.returncode == 0 and "notes.md" in found.stdout, found.stdout + found.stderr
    store.close()


def test_a_search_without_the_model_of_a_vector_index_says_it_is_keyword(env: dict[str, str],
                                                                          tmp_path: Path) -> None:
    """README newcomer (stop 43): ``scopekb search`` in a process without an embedding model answered a vector
    index by keyword with nothing but the header's "keyword"; now a note on stderr says why and which model the
    index's vectors are of. Asking for a mode, or a keyword-only index, gives no note."""
    repo = git_repo(tmp_path / "repo", {"a.py": "def retry_helper():\n    return 1\n"})
    local = {**env, "SCOPEKB_EMBEDDING__PROVIDER": "local"}
    assert run(["index", str(repo)], local, tmp_path, timeout=600).returncode == 0
    p = run(["search", "retry_helper"], env, tmp_path)
    assert p.returncode == 0 and "a.py" in p.stdout, p.stderr
    assert "note: keyword search: this process has no embedding model (SCOPEKB_EMBEDDING__PROVIDER) while the " \
           "index holds vectors of local:all-MiniLM-L6-v2" in p.stderr, p.stderr
    assert "note:" not in run(["search", "retry_helper", "--mode", "keyword"], env, tmp_path).stderr
