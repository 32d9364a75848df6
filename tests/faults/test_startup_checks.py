"""A worker checks its limits and the broker at start, and says clearly what can lose tasks."""

from __future__ import annotations

import json


def _events(text: str, name: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        start = line.find("{")
        if start >= 0 and f'"{name}"' in line:
            try:
                out.append(json.loads(line[start:]))
            except ValueError:
                continue
    return out


def test_worker_warns_about_an_evicting_broker_and_logs_its_limits(make_stack, report) -> None:
    stack = make_stack("startup")
    rds = stack.redis()
    before = rds.config_get("maxmemory-policy")["maxmemory-policy"]
    rds.config_set("maxmemory-policy", "allkeys-lru")
    try:
        risky = stack.start_worker("worker-allkeys-lru")
    finally:
        rds.config_set("maxmemory-policy", before)
    safe = stack.start_worker("worker-noeviction")
    limits = _events(risky.log_text(), "worker_limits")
    problems = [e["problem"] for e in _events(risky.log_text(), "worker_startup_check")]
    safe_problems = [e["problem"] for e in _events(safe.log_text(), "worker_startup_check")]
    report("injected", fault="broker maxmemory-policy allkeys-lru at worker start", policy_restored=before)
    report("checked", limits=limits[0] if limits else None, problems=problems, problems_with_noeviction=safe_problems)
    assert len(limits) == 1, "the effective limits are logged once, by the main process"
    assert limits[0]["time_limit_s"] < limits[0]["visibility_timeout_s"]
    assert limits[0]["soft_time_limit_s"] and limits[0]["result_expires_s"] and limits[0]["max_tasks_per_child"]
    assert any("allkeys-lru" in p and "noeviction" in p for p in problems), problems
    assert safe_problems == []
