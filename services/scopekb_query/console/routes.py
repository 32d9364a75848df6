"""The console's pages and forms (issue 25): server-rendered HTML under ``/console``.

Who sees what: the admin (signed in with the admin token) sees and manages everything; an agent (signed in
with its API key) sees, read-only, the sources, jobs and search results of its own scope — the key's agent and,
when the key is bound to contexts, only those. Keys, dead letters and health are admin pages.

Every POST needs a session and the session's CSRF token (403 otherwise); admin actions go through
:class:`~scopekb_query.console.actions.ConsoleActions`, the same code the ``/v1`` API runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import ValidationError

from scopekb.auth import ApiKey, AuthError, resolve_scope, tokens_equal
from scopekb.errors import Refused
from scopekb.logging import get_logger
from scopekb.models import LOCAL_PATH_LIMIT, Job, SearchRequest, Source, SourceCreate
from scopekb.render import one_line, terminal_text, validation_message, why_line
from scopekb.runtime import Runtime
from scopekb.search import SearchUnavailable, run_search
from scopekb.status import source_status
from scopekb.stores.base import ScopeFilter

from .actions import ActionRefused, ConsoleActions
from .health import health_checks
from .highlight import highlight
from .session import SessionCodec, SessionData, csrf_ok

log = get_logger("scopekb.console")
HERE = Path(__file__).resolve().parent
STATIC = {"console.css": "text/css", "job.js": "text/javascript"}
#: Content-Security-Policy of every console page: nothing from elsewhere, no inline script or style.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
#: Fixed messages a redirect may ask a page to show (never text from the request itself).
NOTICES = {"removed": "Source removed and its chunks deleted.", "revoked": "Key revoked.",
           "signed_out": "Signed out."}
JOB_FIELDS = ("state", "trigger", "repo", "ref", "to_commit", "files_seen", "files_indexed", "files_deleted",
              "chunks_written", "chunks_deleted", "embeddings_computed", "embeddings_cached", "created_at",
              "started_at", "finished_at")


class ConsoleError(ActionRefused):
    """A page or form refused (403 for CSRF and permission, 404 for unknown ids). It and a refused action
    (:class:`ActionRefused`) are rendered as the error page with their status."""


class SignInRequired(Exception):
    """A page was asked for without a valid session: redirect to the sign-in page."""


@dataclass(frozen=True)
class Viewer:
    """The signed-in operator: the admin, or an agent key (read-only, its own scope)."""

    session: SessionData
    key: ApiKey | None

    @property
    def admin(self) -> bool:
        return self.key is None

    def sees(self, src: Source) -> bool:
        """True when this viewer may see the source (the admin sees all; an agent its own scope)."""
        if self.key is None:
            return True
        allowed = self.key.context_ids
        return src.agent_name == self.key.agent_name and (allowed is None or src.context_id in allowed)


def _visible(value: Any) -> Any:
    """The console templates' ``finalize``: text with :func:`scopekb.render.terminal_text`'s escapes, markup and
    other values as they are."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return terminal_text(value)
    return value


class Console:
    """The console's state and handlers; :meth:`router` returns them as an :class:`APIRouter`."""

    def __init__(self, rt: Runtime, actions: ConsoleActions) -> None:
        self.rt, self.settings, self.actions = rt, rt.settings, actions
        admin = rt.settings.query.admin_token
        self.admin_token = admin.get_secret_value() if admin is not None else None
        self.codec = SessionCodec(self.admin_token)
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        # a hit's reasons as the text answer words them (a HitReason is no JSON for ``tojson``; autoescaped)
        self.templates.env.filters["why_line"] = why_line
        # a name (path, repository, ref, symbol) on one line: a newline in it shown as \n, as the other escapes are
        # (hostile review: `a\nb.py` showed as `a b.py`, the same as a real `a b.py`)
        self.templates.env.filters["name"] = lambda v: one_line(v, 2000) if isinstance(v, str) else v
        # every value a template prints shows control, bidi (U+202E ...) and separator characters as visible escapes
        # before autoescaping (hostile review: a file name starting with U+202E showed reversed, its line range
        # too); markup built here (highlighted lines) escapes its own pieces the same way
        self.templates.env.finalize = _visible

    # ---- plumbing ----------------------------------------------------------------------------------------

    def page(self, request: Request, viewer: Viewer | None, name: str, status: int = 200,
             **context: Any) -> HTMLResponse:
        """Render template ``name`` with the viewer, its CSRF token and the security headers."""
        context.update(viewer=viewer, csrf=viewer.session.csrf if viewer else "",
                       embedded=self.rt.profile == "embedded")
        resp = self.templates.TemplateResponse(request, name, context, status_code=status)
        resp.headers.update(SECURITY_HEADERS)
        return resp

    def viewer(self, request: Request) -> Viewer:
        """The signed-in viewer; a revoked or deleted agent key ends the session (:class:`SignInRequired`)."""
        session = self.codec.read(request)
        if session is None:
            raise SignInRequired()
        if session.role == "admin":
            if self.admin_token is None:
                raise SignInRequired()
            return Viewer(session, None)
        doc = self.rt.records.get("keys", session.key_id or "")
        key = ApiKey.model_validate(doc) if doc else None
        if key is None or key.revoked_at is not None:
            raise SignInRequired()
        return Viewer(session, key)

    def form_viewer(self, request: Request, csrf: str) -> Viewer:
        """The viewer of a state-changing form: a session and its CSRF token are required (403 otherwise)."""
        try:
            viewer = self.viewer(request)
        except SignInRequired:
            raise ConsoleError(403, "sign in first") from None
        if not csrf_ok(viewer.session, csrf):
            raise ConsoleError(403, "the form's CSRF token is missing or wrong; reload the page and try again")
        return viewer

    def admin_form(self, request: Request, csrf: str) -> Viewer:
        """A state-changing form only the admin may send (CSRF checked first)."""
        viewer = self.form_viewer(request, csrf)
        if not viewer.admin:
            raise ConsoleError(403, "this action needs the admin token")
        return viewer

    def admin_page(self, request: Request) -> Viewer:
        """A page only the admin may see."""
        viewer = self.viewer(request)
        if not viewer.admin:
            raise ConsoleError(403, "this page needs the admin token")
        return viewer

    def visible_sources(self, viewer: Viewer) -> list[Source]:
        if viewer.key is None:
            return self.rt.records.list_sources()
        return [s for s in self.rt.records.list_sources(agent_name=viewer.key.agent_name) if viewer.sees(s)]

    def visible_source(self, viewer: Viewer, source_id: str) -> Source:
        src = self.rt.records.get_source(source_id)
        if src is None or not viewer.sees(src):
            raise ConsoleError(404, "no such source")
        return src

    # ---- sign-in -----------------------------------------------------------------------------------------

    def login_page(self, request: Request, error: str | None = None, status: int = 200) -> HTMLResponse:
        token = self.codec.new_login_token()
        resp = self.page(request, None, "login.html", status=status, error=error, login_csrf=token,
                         notice=NOTICES.get(request.query_params.get("notice", "")),
                         admin_enabled=self.admin_token is not None)
        self.codec.set_login_cookie(request, resp, token)
        return resp

    def show_login(self, request: Request) -> Response:
        try:
            self.viewer(request)
            return RedirectResponse("/console/sources", status_code=303)
        except SignInRequired:
            return self.login_page(request)

    def sign_in(self, request: Request, token: Annotated[str, Form()] = "",
                csrf: Annotated[str, Form()] = "") -> Response:
        """Sign in with the admin token or an agent key, sent in the form body (never in the URL)."""
        if not self.codec.login_token_ok(request, csrf):
            raise ConsoleError(403, "the sign-in form's CSRF token is missing or wrong; reload the page")
        token = token.strip()
        role, key_id = None, None
        if self.admin_token is not None and token and tokens_equal(token, self.admin_token):
            role = "admin"
        elif token:
            key = self.rt.keys(token)  # the runtime's key lookup, shared with REST and MCP (None: unknown/revoked)
            if key is not None:
                role, key_id = "agent", key.id
        if role is None:
            log.info("console_sign_in_refused")
            return self.login_page(request, error="Unknown or revoked key.", status=401)
        log.info("console_sign_in", role=role, key_id=key_id)
        resp = RedirectResponse("/console/sources", status_code=303)
        self.codec.start(resp, request, role, key_id)
        return resp

    def sign_out(self, request: Request, csrf: Annotated[str, Form()] = "") -> Response:
        self.form_viewer(request, csrf)
        resp = RedirectResponse("/console/login?notice=signed_out", status_code=303)
        self.codec.end(resp)
        return resp

    # ---- sources -----------------------------------------------------------------------------------------

    def sources(self, request: Request) -> HTMLResponse:
        viewer = self.viewer(request)
        rows = [(s, source_status(self.rt.records, self.rt.chunks, s)) for s in self.visible_sources(viewer)]
        return self.page(request, viewer, "sources.html", rows=rows,
                         notice=NOTICES.get(request.query_params.get("notice", "")))

    def source(self, request: Request, source_id: str) -> HTMLResponse:
        viewer = self.viewer(request)
        src = self.visible_source(viewer, source_id)
        return self.page(request, viewer, "source.html", src=src,
                         st=source_status(self.rt.records, self.rt.chunks, src),
                         jobs=self.rt.records.list_jobs(src.id, size=20))

    def add_source(self, request: Request, csrf: Annotated[str, Form()] = "",
                   agent_name: Annotated[str, Form()] = "", context_id: Annotated[str, Form()] = "",
                   repo_url: Annotated[str, Form()] = "", ref: Annotated[str, Form()] = "main",
                   repo_name: Annotated[str, Form()] = "", webhook_secret: Annotated[str, Form()] = "",
                   include: Annotated[str, Form()] = "", exclude: Annotated[str, Form()] = "",
                   sync: Annotated[str, Form()] = "") -> Response:
        """Register a git source; with ``sync`` set, enqueue its first sync and show that job."""
        viewer = self.admin_form(request, csrf)
        form = _refill({"agent_name": agent_name, "context_id": context_id, "repo_url": repo_url, "ref": ref,
                        "repo_name": repo_name})
        try:
            body = SourceCreate(kind="git", agent_name=agent_name.strip(), context_id=context_id.strip(),
                                repo_url=repo_url.strip(), ref=ref.strip() or "main",
                                repo_name=repo_name.strip() or None, webhook_secret=webhook_secret or None,
                                include=_lines(include), exclude=_lines(exclude))
            created = self.actions.add_source(body)
            job_id = self.actions.sync_source(created["id"]) if sync else None
        except (ValidationError, ActionRefused) as e:
            viewer_rows = [(s, source_status(self.rt.records, self.rt.chunks, s))
                           for s in self.visible_sources(viewer)]
            return self.page(request, viewer, "sources.html", status=422, rows=viewer_rows, form=form,
                             error=_reason(e))
        log.info("console_source_added", source_id=created["id"])
        target = f"/console/jobs/{job_id}" if job_id else f"/console/sources/{created['id']}"
        return RedirectResponse(target, status_code=303)

    def sync_source(self, request: Request, source_id: str, csrf: Annotated[str, Form()] = "") -> Response:
        self.admin_form(request, csrf)
        job_id = self.actions.sync_source(source_id)
        return RedirectResponse(f"/console/jobs/{job_id}", status_code=303)

    def remove_source(self, request: Request, source_id: str, csrf: Annotated[str, Form()] = "") -> Response:
        self.admin_form(request, csrf)
        self.actions.remove_source(source_id)
        return RedirectResponse("/console/sources?notice=removed", status_code=303)

    # ---- jobs --------------------------------------------------------------------------------------------

    def visible_job(self, viewer: Viewer, job_id: str) -> dict[str, Any] | None:
        """The job record if the viewer may see it; None for an unknown job (the admin's page then waits)."""
        job = self.actions.get_job(job_id)
        if job is None:
            if viewer.admin:
                return None
            raise ConsoleError(404, "no such job")
        if not viewer.admin:
            ids = job.get("source_ids") or []
            if not ids or not all(self._sees_id(viewer, i) for i in ids):
                raise ConsoleError(404, "no such job")
        return job

    def _sees_id(self, viewer: Viewer, source_id: str) -> bool:
        src = self.rt.records.get_source(source_id)
        return src is not None and viewer.sees(src)

    def job(self, request: Request, job_id: str) -> HTMLResponse:
        viewer = self.viewer(request)
        job = self.visible_job(viewer, job_id)
        return self.page(request, viewer, "job.html", job_id=job_id, job=job and _job_view(job))

    def job_progress(self, request: Request, job_id: str) -> JSONResponse:
        """The job page's live progress (polled by ``job.js``): the fields shown on the page, as JSON."""
        try:
            viewer = self.viewer(request)
        except SignInRequired:
            return JSONResponse({"detail": "signed out"}, status_code=401, headers=SECURITY_HEADERS)
        job = self.visible_job(viewer, job_id)
        body = _job_view(job) if job else {"state": "unknown", "finished": False}
        return JSONResponse(body, headers=SECURITY_HEADERS)

    # ---- dead letters and keys ---------------------------------------------------------------------------

    def dead_letters(self, request: Request) -> HTMLResponse:
        viewer = self.admin_page(request)
        show_all = request.query_params.get("all") == "1"
        return self.page(request, viewer, "deadletters.html", show_all=show_all,
                         letters=self.actions.list_dead_letters(include_replayed=show_all))

    def replay(self, request: Request, dl_id: str, csrf: Annotated[str, Form()] = "") -> Response:
        self.admin_form(request, csrf)
        job_id = self.actions.replay_dead_letter(dl_id)
        return RedirectResponse(f"/console/jobs/{job_id}", status_code=303)

    def keys(self, request: Request) -> HTMLResponse:
        return self._keys(request, self.admin_page(request))

    def _keys(self, request: Request, viewer: Viewer, created: dict[str, Any] | None = None,
              error: str | None = None, status: int = 200) -> HTMLResponse:
        keys = [ApiKey.model_validate(d) for d in self.rt.records.find("keys", sort="created_at")]
        return self.page(request, viewer, "keys.html", status=status, keys=keys, created=created, error=error,
                         notice=NOTICES.get(request.query_params.get("notice", "")))

    def create_key(self, request: Request, csrf: Annotated[str, Form()] = "",
                   agent_name: Annotated[str, Form()] = "", context_ids: Annotated[str, Form()] = "",
                   label: Annotated[str, Form()] = "") -> HTMLResponse:
        """Create a key and show it on this response only (it is never stored or shown again)."""
        viewer = self.admin_form(request, csrf)
        try:
            created = self.actions.create_key(agent_name.strip(), _lines(context_ids) or None,
                                              label.strip() or None)
        except ActionRefused as e:
            return self._keys(request, viewer, error=e.message, status=e.status)
        log.info("console_key_created", key_id=created["id"])
        return self._keys(request, viewer, created=created, status=201)

    def revoke_key(self, request: Request, key_id: str, csrf: Annotated[str, Form()] = "") -> Response:
        self.admin_form(request, csrf)
        self.actions.revoke_key(key_id)
        log.info("console_key_revoked", key_id=key_id)
        return RedirectResponse("/console/keys?notice=revoked", status_code=303)

    # ---- search and health -------------------------------------------------------------------------------

    def search(self, request: Request) -> HTMLResponse:
        """Search within a scope with the API's ranking (:func:`scopekb.search.run_search`)."""
        viewer = self.viewer(request)
        q = request.query_params
        form = {k: q.get(k, "") for k in ("q", "mode", "agent", "context", "cross", "files", "languages",
                                           "repo", "ref", "source", "max")}
        echo = _refill(form)  # the page shows the form again; the search reads what was sent
        agents = sorted({s.agent_name for s in self.visible_sources(viewer)})
        ctx = dict(form=echo, agents=agents, resp=None, error=None, lines={},
                   contexts=viewer.key.context_ids if viewer.key else None,
                   modes=["keyword", "vector", "hybrid", "exact", "regex", "symbol"],  # newcomer: all modes
                   can_embed=self.rt.embedder is not None)
        if form["q"].strip():
            try:
                resp = self._run_search(viewer, form)
                ctx["resp"] = resp
                literal = resp.mode.value in ("exact", "regex", "symbol")  # a regex's words are no terms to mark
                ctx["lines"] = {i: highlight(h.content, h.start_line, "" if resp.mode.value == "regex" else form["q"],
                                             h.match_lines if literal else None) for i, h in enumerate(resp.hits)}
            except (ValidationError, AuthError, SearchUnavailable, Refused, ValueError) as e:
                ctx["error"] = _reason(e)  # Refused: an unknown ref or commit gives REST's 404 reason
            except Exception as e:  # noqa: BLE001 - a backend failure is shown on the page, not as a 500
                log.warning("console_search_failed", error=type(e).__name__)
                ctx["error"] = "the search backend is unavailable; try again"
        return self.page(request, viewer, "search.html", **ctx)

    def _run_search(self, viewer: Viewer, form: dict[str, str]) -> Any:
        if form["max"].strip() and not form["max"].strip().isdigit():
            raise ValueError("max must be a whole number")
        req = SearchRequest(query=form["q"], mode=form["mode"] or "keyword",
                            max_results=int(form["max"]) if form["max"].strip() else 10,
                            file_patterns=_split(form["files"]), languages=_split(form["languages"]),
                            repo=form["repo"].strip() or None, ref=form["ref"].strip() or None,
                            source_id=form["source"].strip() or None,
                            context_id=form["context"].strip() or None, cross_context=form["cross"] == "1")
        if viewer.key is not None:
            scope = resolve_scope(viewer.key, req.context_id, req.cross_context or req.context_id is None)
        else:
            agent = form["agent"].strip()
            if not agent:
                raise ValueError("choose the agent whose scope to search")
            scope = ScopeFilter(agent, (req.context_id,) if req.context_id else None)
        return run_search(self.rt.chunks, req, scope, self.settings.query,
                          embed=self.rt.embed_query if self.rt.embedder is not None else None, records=self.rt.records)

    def health(self, request: Request) -> HTMLResponse:
        viewer = self.admin_page(request)
        jobs = self.rt.records.list_jobs(None, size=10)
        return self.page(request, viewer, "health.html", checks=health_checks(self.rt), jobs=jobs,
                         dead_letters=len(self.actions.list_dead_letters(include_replayed=False)))

    def static(self, name: str) -> Response:
        if name not in STATIC:
            raise ConsoleError(404, "not found")
        return FileResponse(HERE / "static" / name, media_type=STATIC[name],
                            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "max-age=300"})

    def router(self) -> APIRouter:
        """The console's routes, to be included with prefix ``/console``."""
        r = APIRouter(include_in_schema=False)
        get, post = ["GET"], ["POST"]
        r.add_api_route("", lambda: RedirectResponse("/console/sources", status_code=303), methods=get)
        r.add_api_route("/", lambda: RedirectResponse("/console/sources", status_code=303), methods=get)
        for path, fn, methods in (
            ("/login", self.show_login, get), ("/login", self.sign_in, post), ("/logout", self.sign_out, post),
            ("/sources", self.sources, get), ("/sources", self.add_source, post),
            ("/sources/{source_id}", self.source, get), ("/sources/{source_id}/sync", self.sync_source, post),
            ("/sources/{source_id}/remove", self.remove_source, post),
            ("/jobs/{job_id}", self.job, get), ("/jobs/{job_id}/progress", self.job_progress, get),
            ("/deadletters", self.dead_letters, get), ("/deadletters/{dl_id}/replay", self.replay, post),
            ("/keys", self.keys, get), ("/keys", self.create_key, post),
            ("/keys/{key_id}/revoke", self.revoke_key, post),
            ("/search", self.search, get), ("/health", self.health, get), ("/static/{name}", self.static, get),
        ):
            r.add_api_route(path, fn, methods=methods, response_model=None)
        return r


def _job_view(job: dict[str, Any]) -> dict[str, Any]:
    """The job fields the page shows (JSON-safe), with ``finished``, retries and errors."""
    j = Job.model_validate(job)
    out = {k: job.get(k) for k in JOB_FIELDS}
    out.update(state=j.state.value, finished=j.finished, files_skipped=sum(j.files_skipped.values()),
               retries=sum(int(v) for v in j.retries.values()) if j.retries else 0, errors=j.errors[-20:],
               stage=job.get("stage") or job.get("phase"), source_ids=j.source_ids)
    return out


def _lines(text: str) -> list[str]:
    """Non-empty stripped items of a textarea or comma-separated field."""
    return [p.strip() for p in text.replace(",", "\n").splitlines() if p.strip()]


def _split(text: str) -> list[str]:
    return _lines(text)


#: Longest form value a console page shows again in its form (characters): the longest any field accepts (a local
#: repository path, :data:`scopekb.models.LOCAL_PATH_LIMIT`; a query, ``SearchRequest.query``). A longer one is
#: refused anyway; echoing it would make the answer as large as the request (hostile review: a 314 KB repo_url came
#: back whole in the 422 page).
ECHO_LIMIT = LOCAL_PATH_LIMIT


def _refill(form: dict[str, str]) -> dict[str, str]:
    """``form`` for a page to show again: each value of at most :data:`ECHO_LIMIT` characters as sent, a longer
    one emptied (its error names the bound)."""
    return {k: v if len(v) <= ECHO_LIMIT else "" for k, v in form.items()}


def _reason(e: Exception) -> str:
    """One line for a refused input: pydantic's messages without their URLs, or the exception's text."""
    if isinstance(e, ValidationError):
        return validation_message(e.errors(include_url=False))  # bounded, as REST and MCP say it
    if isinstance(e, ActionRefused):
        return e.message
    return str(e)
