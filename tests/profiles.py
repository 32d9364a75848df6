"""Settings of one profile for in-process API tests (tests/integration/test_api_profiles.py,
test_hostile_api.py): embedded (SQLite, in-memory coordination, a data folder) or distributed (real OpenSearch,
Redis and S3 under names of the run's own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopekb.settings import Settings


def profile_settings(profile: str, tmp: Path, services: dict[str, Any], run: str, admin: str,
                     **extra: Any) -> Settings:
    """Settings for ``profile`` with the admin token ``admin``, keyword-only, local paths allowed; ``services``
    (``opensearch_url``, ``redis_url``, ``s3_config``) and ``run`` (a prefix) are used by the distributed one.
    ``extra`` adds top-level settings sections (e.g. ``ingester={...}``)."""
    common: dict[str, Any] = {"query": {"admin_token": admin}, "embedding": {"provider": "none"},
                              "git": {"allow_local_paths": True, "cache_dir": str(tmp / "git")},
                              "log_format": "json", "log_level": "WARNING", "profile": profile, **extra}
    if profile == "embedded":
        return Settings(data_dir=tmp / "data", **common)
    return Settings(opensearch={"url": services["opensearch_url"], "alias": f"{run}-chunks",
                                "system_prefix": f"{run}-sys"},
                    redis={"url": services["redis_url"]}, worker={"queue": f"{run}-queue"},
                    s3={**services["s3_config"], "bucket": run}, **common)
