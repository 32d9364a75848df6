"""The webhook routes: push webhooks of git hosts and S3 event notifications.

``POST /webhooks/{github,gitlab,gitea,forgejo,bitbucket}``: read the raw body (size-capped), find the
registered sources of the repository, verify the provider's signature or token against their secrets, answer
pings, drop a repeated delivery, enqueue ``scopekb.sync_sources`` by name and answer 202. A delivery is keyed
by (host kind, the sources its signature admitted, delivery id) (:func:`scopekb.ops.delivery_key`): that key is
the dedupe key and the task and job id stem, so a sender-chosen id never dedupes against or names another
scope's job (through :func:`scopekb.ops.enqueue_delivery`, queued marker included). Bad input gets
400/401/404/413, never 5xx, and enqueues nothing; an unavailable queue or registry gets 503.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from typing import Annotated
from urllib.parse import unquote_plus

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from prometheus_client import Counter
from starlette.concurrency import run_in_threadpool

from scopekb import ops
from scopekb.coordination import SourcesChanged
from scopekb.http.jsonlimits import loads_bounded
from scopekb.logging import bind_context, clear_context, get_logger
from scopekb.models import Source, ref_name_problem
from scopekb.refs import HEADS, TAGS, ref_matcher, short_name
from scopekb.render import field
from scopekb.sources import delivery_targets, matching_sources, sources_of_owner
from scopekb_ingester.providers import PROVIDERS, BadRequest, Parsed, Provider, PushEvent, decode_body
from scopekb_ingester.state import Ingester, ingester

log = get_logger("scopekb.ingester")
#: A delivery id kept as task and job id: GitHub/Gitea send UUIDs, GitLab a UUID, Bitbucket ``{uuid}``.
_DELIVERY_ID = re.compile(r"[A-Za-z0-9._:{}-]{1,200}")

WEBHOOKS = Counter("scopekb_webhooks_total", "Webhook deliveries by provider and outcome",
                   ["provider", "outcome"])

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
Ing = Annotated[Ingester, Depends(ingester)]


def _err(status: int, detail: str, provider: str, outcome: str) -> JSONResponse:
    WEBHOOKS.labels(provider, outcome).inc()
    return JSONResponse({"detail": detail}, status_code=status)


def _enqueue(ing: Ingester, provider: str, key: str, specs: list[ops.SyncSpec],
             delivery: str | None = None, sources_version: int | None = None) -> JSONResponse | None:
    """Claim ``key`` (:func:`scopekb.ops.delivery_key`) and enqueue; None when queued, else the answer (duplicate
    200 naming this delivery's own job, unavailable 503).

    Raises:
        SourcesChanged: ``sources_version`` is no longer current (nothing was written or sent)."""
    try:
        if not ops.enqueue_delivery(ing.rt, provider, key, specs, delivery_id=delivery,
                                    sources_version=sources_version):
            WEBHOOKS.labels(provider, "duplicate").inc()
            log.info("webhook_duplicate")
            return JSONResponse({"status": "duplicate", "job_id": specs[0].job_id}, status_code=200)
    except SourcesChanged:
        raise
    except Exception as e:  # broker or coordination down: let the sender retry, nothing remembered
        log.error("webhook_enqueue_failed", error=str(e))
        return _err(503, "queue unavailable, retry later", provider, "enqueue_failed")
    WEBHOOKS.labels(provider, "queued").inc()
    return None


def _sources(ing: Ingester, provider: str, force: bool = False) -> list[Source] | JSONResponse:
    try:
        return ing.sources.get(force=force)
    except Exception as e:  # the source registry is unreachable: the sender retries later
        log.error("webhook_sources_unavailable", error=str(e))
        return _err(503, "source registry unavailable, retry later", provider, "unavailable")


class _Lookup:
    """The registered sources one push delivery is judged against, and the sources version they belong to.

    ``verified`` False (the first judgement of a delivery): the first lookup takes the cached list without reading
    the sources version; the version is confirmed where the delivery is acted on - inside the delivery claim for a
    queued push (one Redis round trip less per accepted push; issue 20), by one read (:meth:`confirm`) before
    every other answer - and the delivery is judged again, verified, when it moved. ``verified`` True: every
    lookup reads the version first, as :class:`scopekb_ingester.state.SourceCache` does by default. A forced
    lookup (a miss, a signature no cached secret verifies) always reads it. So a source registered before a push
    is matched by that push, as before.
    """

    def __init__(self, ing: Ingester, provider: str, verified: bool) -> None:
        self.ing = ing
        self.provider = provider
        self.verified = verified
        self.version: int | None = None

    def get(self, force: bool = False) -> list[Source] | JSONResponse:
        """The sources (forced: reloaded at most once a second), or the 503 answer when the registry is down."""
        try:
            found, self.version = self.ing.sources.load(force=force, check=force or self.verified)
        except Exception as e:  # the source registry is unreachable: the sender retries later
            log.error("webhook_sources_unavailable", error=str(e))
            return _err(503, "source registry unavailable, retry later", self.provider, "unavailable")
        self.verified = self.verified or force
        return found

    def claim_version(self) -> int | None:
        """The version the delivery claim must still find (None: the list was read after a version read)."""
        return None if self.verified else self.version

    def confirm(self) -> None:
        """Before an answer the delivery claim does not check: confirm the list judged against is the current one
        (one version read unless verified already).

        Raises:
            SourcesChanged: the version moved since the list was loaded."""
        if self.verified or self.version is None:
            return
        now = self.ing.sources.current_version()
        if now is not None and now != self.version:
            raise SourcesChanged(f"sources version {now}, judged against {self.version}")


@router.post("/s3", status_code=202)
async def s3_events(request: Request, ing: Ing) -> JSONResponse:
    """S3 event notifications (``{"Records": [{"s3": {"bucket": {"name"}, "object": {"key"}}}]}``, keys
    URL-encoded as AWS sends them): every object-store source whose bucket and prefix cover a changed key is
    synced. Protected by ``X-Scopekb-Token`` (``ingester.s3_event_token``)."""
    clear_context()
    cfg = ing.rt.settings.ingester
    if cfg.s3_event_token is None:
        return _err(404, "object-store events are not enabled", "s3", "disabled")
    # The token is a header: judged before a byte of the body is read (the body cap holds while streaming).
    given = request.headers.get("x-scopekb-token") or ""
    if not hmac.compare_digest(given.encode("utf-8", "replace"), cfg.s3_event_token.get_secret_value().encode()):
        return _err(401, "invalid token", "s3", "bad_signature")
    raw = await request.body()
    if len(raw) > cfg.max_body_bytes:
        return _err(413, "body too large", "s3", "too_large")
    return await run_in_threadpool(_process_s3, ing, raw)


def _process_s3(ing: Ingester, raw: bytes) -> JSONResponse:
    """Find the covering sources, dedupe and enqueue (blocking clients, off the event loop)."""
    settings = ing.rt.settings
    try:
        records = loads_bounded(raw).get("Records")
        changed = {(r["s3"]["bucket"]["name"], unquote_plus(r["s3"]["object"]["key"])) for r in records}
    except (ValueError, AttributeError, TypeError, KeyError):
        return _err(400, "body must be an S3 event with Records[].s3.bucket.name and .object.key", "s3",
                    "bad_request")
    found = _sources(ing, "s3")
    if isinstance(found, JSONResponse):
        return found
    targets = [x for x in found if x.kind == "s3"
               and any(b == (x.bucket or settings.s3.bucket) and k.startswith((x.prefix or "") + "/")
                       for b, k in changed)]
    if not targets:
        return JSONResponse({"status": "ignored", "reason": "no source covers these keys"}, status_code=202)
    delivery = "s3-" + hashlib.sha256(raw).hexdigest()[:32]
    bind_context(delivery_id=delivery, provider="s3")
    key = ops.delivery_key("s3", delivery, [src.id for src in targets])
    specs = [ops.SyncSpec(job_id=f"{key}:{n}", source_ids=[src.id], trigger="s3-event", ref=src.ref)
             for n, src in enumerate(targets)]
    answer = _enqueue(ing, "s3", key, specs, delivery)
    if answer is not None:
        return answer
    return JSONResponse({"status": "queued", "job_ids": [s.job_id for s in specs]}, status_code=202)


@router.post("/{provider}", status_code=202)
async def webhook(provider: str, request: Request, ing: Ing) -> JSONResponse:
    """Push webhooks from GitHub, GitLab, Gitea/Forgejo and Bitbucket Cloud (``provider`` in the path)."""
    clear_context()
    prov = PROVIDERS.get(provider)
    if prov is None:
        return _err(404, "unknown provider", "unknown", "unknown_provider")
    cap = ing.rt.settings.ingester.max_body_bytes
    clen = request.headers.get("content-length")
    if clen and clen.isdigit() and int(clen) > cap:
        return _err(413, f"body larger than {cap} bytes", provider, "too_large")
    body = bytearray()
    async for part in request.stream():
        body.extend(part)
        if len(body) > cap:
            return _err(413, f"body larger than {cap} bytes", provider, "too_large")
    # The record store, coordination and the broker are blocking clients: run them off the event loop.
    return await run_in_threadpool(_process, ing, provider, prov, bytes(body), dict(request.headers))


def _process(ing: Ingester, provider: str, prov: Provider, raw: bytes, headers: dict[str, str]) -> JSONResponse:
    """Everything after the body is read: parse, find sources, verify, dedupe, enqueue."""
    event = prov.header(headers, prov.event_headers)
    delivery = prov.header(headers, prov.delivery_headers)
    if not event or not delivery or len(event) > 100:
        return _err(400, "missing event or delivery header", provider, "bad_request")
    if not _DELIVERY_ID.fullmatch(delivery):  # it becomes the task and job id (URLs, logs): hostile review 2, H5
        return _err(400, "invalid delivery id: 1-200 letters, digits and . _ : - { } only", provider, "bad_request")
    bind_context(delivery_id=delivery, provider=provider, event=event)
    try:
        parsed = prov.parse(event, decode_body(raw, headers.get("content-type")))
    except BadRequest as e:
        return _err(400, str(e), provider, "bad_request")
    answer = _judge(ing, provider, prov, parsed, raw, headers, delivery, _Lookup(ing, provider, verified=False))
    if answer is None:  # the registered sources changed under the cached list: judge again, reading the version
        answer = _judge(ing, provider, prov, parsed, raw, headers, delivery, _Lookup(ing, provider, verified=True))
    assert answer is not None  # a verified lookup never asks for another judgement
    return answer


def _judge(ing: Ingester, provider: str, prov: Provider, parsed: Parsed, raw: bytes, headers: dict[str, str],
           delivery: str, lookup: _Lookup) -> JSONResponse | None:
    """The answer to a parsed delivery against ``lookup``'s sources: find and verify, dedupe, enqueue; None when
    the sources version moved under an unverified lookup (before anything was written, counted or logged)."""
    try:
        return _decide(ing, provider, prov, parsed, raw, headers, delivery, lookup)
    except SourcesChanged:
        return None


def _decide(ing: Ingester, provider: str, prov: Provider, parsed: Parsed, raw: bytes, headers: dict[str, str],
            delivery: str, lookup: _Lookup) -> JSONResponse:
    """See :func:`_judge`. Every answer after the lookup is either the delivery claim's (which checks the lookup's
    version itself) or comes after :meth:`_Lookup.confirm`.

    Raises:
        SourcesChanged: the sources version moved under an unverified lookup (nothing was written)."""
    eligible = _eligible(provider, prov, parsed, raw, headers, lookup)
    if isinstance(eligible, JSONResponse):
        return eligible
    if parsed.kind == "ping":
        lookup.confirm()
        return _pong(provider, parsed, eligible)
    for push in parsed.pushes:  # git check-ref-format rules, as for a registered ref (hostile review 2, H4)
        problem = ref_name_problem(short_name(push.ref), glob=False) if push.ref.startswith((HEADS, TAGS)) else None
        if problem is None and len(push.ref) > 300:
            problem = "more than 300 characters"
        if problem:
            lookup.confirm()
            return _err(400, f"pushed ref {field(push.ref, 100)} is not a valid ref name: {problem}", provider,
                        "bad_request")
    work = _work(eligible, parsed.pushes)
    if parsed.kind == "ignored" or not work:
        lookup.confirm()
        reason = parsed.reason if parsed.kind == "ignored" and parsed.reason else "no source tracks this ref"
        WEBHOOKS.labels(provider, "ignored").inc()
        log.info("webhook_ignored", refs=[p.ref for p in parsed.pushes], reason=reason)
        return JSONResponse({"status": "ignored", "reason": reason}, status_code=202)
    # Keyed by the sources this signature admitted, not the sender-chosen id alone (hostile review 6)
    key = ops.delivery_key(provider, delivery, [s.id for s in eligible])
    specs = [ops.SyncSpec(job_id=key if len(work) == 1 else f"{key}:{n}",
                          source_ids=[s.id for s in targets], trigger="webhook",
                          ref=short_name(pushes[0].ref) if len(pushes) == 1 else None,
                          to_commit=None if len(pushes) > 1 or pushes[0].deleted else pushes[0].after,
                          task_kwargs={"after": pushes[0].after if len(pushes) == 1 else None,
                                       "branch_deleted": len(pushes) == 1 and pushes[0].deleted})
             for n, (pushes, targets) in enumerate(work)]
    answer = _enqueue(ing, provider, key, specs, delivery, sources_version=lookup.claim_version())
    if answer is not None:
        return answer
    job_ids = [s.job_id for s in specs]
    log.info("webhook_queued", refs=[field(p.ref, 100) for pushes, _ in work for p in pushes[:20]],
             pushes=sum(len(pushes) for pushes, _ in work), jobs=len(job_ids))
    return JSONResponse({"status": "queued", "job_id": job_ids[0], "job_ids": job_ids,
                         "sources": sorted({s.id for _, t in work for s in t})}, status_code=202)


def _work(eligible: list[Source], pushes: Sequence[PushEvent]) -> list[tuple[list[PushEvent], list[Source]]]:
    """The syncs a delivery's ``pushes`` ask of the ``eligible`` sources: ``(pushes, sources)`` per job, in the
    order the pushes came. A push concerns the sources that track its ref (:func:`scopekb.refs.source_tracks`,
    each source's patterns compiled once). Pushes whose sources all track ref patterns (``refs``) are one job per
    set of sources, since such a sync brings every ref its patterns match to its current commit (hostile review
    4: a Bitbucket push naming 10,000 branches queued 10,000 jobs, each syncing every ref); a source tracking its
    one ``ref`` gets a job per push (its branch and a tag of that name), which carries the push's commit and a
    deletion."""
    matchers = [(src, ref_matcher(src.ref_patterns)) for src in eligible]
    out: list[tuple[list[PushEvent], list[Source]]] = []
    merged: dict[tuple[str, ...], int] = {}  # the ids of a pattern-only set of sources -> its entry in out
    for push in pushes:
        targets = [src for src, matches in matchers if push.ref.startswith((HEADS, TAGS)) and matches(push.ref)]
        if not targets:
            continue
        ids = tuple(s.id for s in targets)
        if all(s.refs for s in targets):
            if ids in merged:
                out[merged[ids]][0].append(push)
                continue
            merged[ids] = len(out)
        out.append(([push], targets))
    return out


def _pong(provider: str, parsed: Parsed, eligible: list[Source]) -> JSONResponse:
    """200 to a host's ping or test event, naming the hook (from the payload's validated fields, else the host)
    and what it belongs to, so the host shows the new hook as working from its first delivery."""
    WEBHOOKS.labels(provider, "ping").inc()
    log.info("webhook_ping", hook=parsed.hook, repository=parsed.repository.full_name, owner=parsed.owner)
    return JSONResponse({"status": "pong", "hook": parsed.hook or f"{provider} webhook",
                         "repository": parsed.repository.full_name, "owner": parsed.owner,
                         "sources": len(eligible)}, status_code=200)


def _candidates(sources: list[Source], parsed: Parsed) -> list[Source]:
    """The registered sources a delivery may concern: those of its repository; for a ping or an event scopekb
    does not act on, else those of its organisation, group or workspace (an organisation hook); for a ping that
    names neither (Bitbucket Server's test connection), every source with a secret (the signature decides)."""
    repo = parsed.repository
    found = matching_sources(sources, repo.urls, [repo.full_name]) if repo.urls or repo.full_name else []
    if found or parsed.kind == "push":
        return found
    if parsed.owner:
        return sources_of_owner(sources, parsed.owner)
    if parsed.kind == "ping" and not (repo.urls or repo.full_name):
        return [s for s in sources if s.secrets()]
    return []


def _eligible(provider: str, prov: Provider, parsed: Parsed, raw: bytes, headers: dict[str, str],
              lookup: _Lookup) -> list[Source] | JSONResponse:
    """The registered sources the delivery concerns (:func:`_candidates`) whose own secret (current or previous,
    during rotation) signed this body; or the answer: 503 registry down, 404 unknown repository or none of its
    sources takes deliveries (no secret, or ``webhooks: false``), 401 bad or missing signature."""
    repo = parsed.repository
    cached = lookup.get()
    if isinstance(cached, JSONResponse):
        return cached
    found = _candidates(cached, parsed)
    if not found:
        fresh = lookup.get(force=True)
        if isinstance(fresh, JSONResponse):
            return fresh
        found = _candidates(fresh, parsed)
    if not found:
        log.info("webhook_unknown_repository", repository=repo.full_name, owner=parsed.owner)
        return _err(404, "not found", provider, "unknown_repo")
    sig = prov.header(headers, prov.signature_headers)
    # Only webhook-driven sources with a secret take part (issue 16): an unsigned delivery changes nothing.
    eligible, refusal = delivery_targets(found, lambda secrets: prov.verify(secrets, raw, sig))
    if not eligible:  # a secret rotated a moment ago may not be cached yet: look once more (at most once a second)
        fresh = lookup.get(force=True)
        if isinstance(fresh, JSONResponse):
            return fresh
        found = _candidates(fresh, parsed) or found
        eligible, refusal = delivery_targets(found, lambda secrets: prov.verify(secrets, raw, sig))
    if refusal == 404:
        log.info("webhook_refused_not_webhook_driven", repository=repo.full_name)
        return _err(404, "not found", provider, "not_webhook_driven")
    if not eligible:
        log.warning("webhook_bad_signature", repository=repo.full_name, owner=parsed.owner)
        anonymous = not (repo.urls or repo.full_name or parsed.owner)
        if anonymous:  # a ping naming nothing that no secret signed: as unknown as an unknown repository
            return _err(404, "not found", provider, "unknown_repo")
        return _err(401, "invalid signature", provider, "bad_signature")
    return eligible
