"""The query service's REST routes, one router per resource; each calls :mod:`scopekb.ops` or the search."""

from __future__ import annotations

from fastapi import APIRouter

from scopekb_query.routes import health, jobs, keys, read, search, sources

#: Every router of the query service's REST API, in the order they are included.
ROUTERS: tuple[APIRouter, ...] = (health.router, search.router, read.router, sources.router, keys.router,
                                  jobs.job_router, jobs.router)
