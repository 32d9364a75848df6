"""Data contracts shared by the ingester, the query service, the workers and the CLI.

Scope = ``(agent_name, context_id)`` (DESIGN §2). Names follow the aimon seed's contracts: SearchQuery /
SearchResult / IndexStatus.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from scopekb.fields import metadata_text
from scopekb.filetypes import LANGUAGES
from scopekb.patterns import SOURCE_LIMITS, PatternRefused, compile_globs

#: Agent names and context ids: printable, no whitespace at the ends, no control characters. Case-sensitive.
_SCOPE_RE = re.compile(r"^[^\x00-\x1f\x7f\s](?:[^\x00-\x1f\x7f]{0,198}[^\x00-\x1f\x7f\s])?$")
ZERO_SHA = "0" * 40


def utcnow() -> datetime:
    """Current time, timezone-aware UTC."""
    return datetime.now(UTC)


def check_scope_part(value: str, name: str) -> str:
    """``value`` when it is a valid agent name or context id (1-200 printable characters, no control character,
    no whitespace at the ends); ``name`` names it in the error.

    Raises:
        ValueError: it is not (REST/MCP/CLI answer with this message).
    """
    if not _SCOPE_RE.match(value):
        raise ValueError(f"{name} must be 1-200 printable characters without leading/trailing spaces")
    return value


class Scope(BaseModel):
    """Who owns indexed chunks. ``agent_name`` and ``context_id`` match exactly and case-sensitively."""

    agent_name: str
    context_id: str

    @field_validator("agent_name")
    @classmethod
    def _agent(cls, v: str) -> str:
        return check_scope_part(v, "agent_name")

    @field_validator("context_id")
    @classmethod
    def _context(cls, v: str) -> str:
        return check_scope_part(v, "context_id")


class KeyCreate(BaseModel):
    """A request to create an API key bound to one agent (optionally to some of its contexts); names follow the
    rules of :class:`Scope`."""

    #: an unknown field is a 422 naming it (hostile review L3), never silently dropped
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    agent_name: str = Field(min_length=1, max_length=200)
    context_ids: list[str] | None = Field(default=None, max_length=1000)
    label: str | None = Field(default=None, max_length=200)

    @field_validator("agent_name")
    @classmethod
    def _agent(cls, v: str) -> str:
        return Scope(agent_name=v, context_id="x").agent_name

    @field_validator("context_ids")
    @classmethod
    def _contexts(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:  # hostile review 5: [] was stored as null, a key for every context
            raise ValueError("context_ids must name at least one context, or be null for all of the agent's contexts")
        # each once, in the order given (hostile review: ["a", "a"] made a one-context key ask for cross_context)
        return None if v is None else list(dict.fromkeys(Scope(agent_name="x", context_id=c).context_id for c in v))


#: Names git gives to special refs, never a branch or tag to track (``git check-ref-format --branch`` refuses them).
_SPECIAL_REFS = frozenset({"HEAD", "FETCH_HEAD", "ORIG_HEAD", "MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD",
                           "BISECT_HEAD", "AUTO_MERGE", "@"})


def ref_name_problem(name: str, glob: bool) -> str | None:
    """Why ``name`` (a branch/tag name, ``refs/heads/`` already removed) is not a ref name to track, or ``None``.

    Rules of ``git check-ref-format`` (git-check-ref-format(1)): no ASCII control character, space, ``~ ^ : ? [ \\``,
    ``..``, ``@{``, ``//``; no component starting with ``.`` or ending in ``.lock``; not starting with ``/`` or
    ``-`` (an option to git) nor ending with ``/`` or ``.``. ``*`` only when ``glob`` (at most 8, a refs pattern).
    Also refused: git's special refs (``HEAD``, ``FETCH_HEAD``, ``@`` …), which name no branch, and more than 256
    characters. Returns a short phrase for the error message.
    """
    if not name:
        return "empty"
    if len(name) > 256:
        return "more than 256 characters"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "control character"
    bad = [c for c in " ~^:?[\\" if c in name] + ([] if glob else ["*"] if "*" in name else [])
    if bad:
        return f"character {bad[0]!r} not allowed"
    if glob and name.count("*") > 8:
        return "more than 8 '*'"
    if name.startswith("-"):
        return "starts with '-'"
    for seq in ("..", "@{", "//"):
        if seq in name:
            return f"contains {seq!r}"
    if name.startswith("/") or name.endswith("/") or name.endswith("."):
        return "starts or ends with '/' or ends with '.'"
    if any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        return "a component starts with '.' or ends with '.lock'"
    if name.removeprefix("refs/tags/") in _SPECIAL_REFS:
        return f"{name!r} is a special ref, not a branch or tag"
    return None


#: Longest repo_url (characters), bucket (characters) and prefix (UTF-8 bytes) a new source may have; see
#: :meth:`SourceCreate._bounded_location`.
SOURCE_LOCATION_LIMITS = {"repo_url": 2048, "bucket": 63, "prefix": 1024}
#: Longest local repository path (characters): Linux's PATH_MAX.
LOCAL_PATH_LIMIT = 4096
#: An S3 bucket name (AWS S3 bucket naming rules: 3-63 characters, lowercase letters, digits, '.' and '-',
#: beginning and ending with a letter or digit; adjacent periods are refused separately).
_S3_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")


def bucket_name_problem(name: str) -> str | None:
    """Why ``name`` is not an S3 bucket name (AWS S3 bucket naming rules: 3-63 characters, lowercase letters,
    digits, '.' and '-', beginning and ending with a letter or digit, no adjacent periods), or None when it is."""
    if len(name) > SOURCE_LOCATION_LIMITS["bucket"]:
        return f"bucket is {len(name)} characters; at most {SOURCE_LOCATION_LIMITS['bucket']} are allowed"
    if not _S3_BUCKET_RE.match(name) or ".." in name:
        return ("bucket must be an S3 bucket name: 3-63 lowercase letters, digits, '.' and '-', starting and ending "
                "with a letter or digit")
    return None


class SourceCreate(Scope):
    """A git repository + ref, or an object-store prefix, bound to one scope (a request to register a source).

    An unknown field (``secret`` for ``webhook_secret``, ``source``, a typo) is refused, 422 naming it (hostile
    review L3), rather than dropped; the stored :class:`Source` ignores unknown fields."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: Literal["git", "s3"] = Field(default="git", description="git repository or object-store prefix")
    repo_url: str = Field(default="", description="git: https/ssh clone URL, or a local path where allowed")
    bucket: str | None = Field(default=None, description="s3: bucket (default: the configured one)")
    prefix: str | None = Field(default=None, description="s3: key prefix whose objects are the documents")
    ref: str = Field(default="main", description="branch name (refs/heads/ prefix optional); with ``refs`` empty, "
                                                 "the one ref the source tracks")
    refs: list[str] = Field(
        default_factory=list, max_length=64,
        description="branches and tags the source tracks, by name or glob ('main', 'release/*', 'v*'); a name "
                    "matches a branch or a tag (a branch wins when both exist; 'refs/tags/v*' asks for tags only). "
                    "Empty: just 'ref'. At most 64 patterns")
    repo_name: str | None = Field(
        default=None, description="the host's full name, e.g. 'owner/repo'; also matches webhook payloads")
    webhooks: bool = Field(
        default=True, description="driven by push webhooks (needs a secret: one is generated when none is given and "
                                  "shown once); false: deliveries for this source are refused, it is synced by the "
                                  "CLI, the API and the reconcile only")
    webhook_secret: SecretStr | None = None
    webhook_secret_previous: SecretStr | None = Field(
        default=None, description="still accepted while a secret rotation is rolled out to the host")
    include: list[str] = Field(default_factory=list, description="globs; empty means everything")
    exclude: list[str] = Field(default_factory=list)

    @field_validator("include", "exclude")
    @classmethod
    def _bounded_globs(cls, v: list[str], info: Any) -> list[str]:
        try:
            compile_globs(v, SOURCE_LIMITS, classes=True, what=info.field_name)
        except PatternRefused as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        # git check-ref-format: no ASCII control characters (< 0x20, DEL), space, ~ ^ : ? * [ \\ or "..".
        v = v.removeprefix("refs/heads/")
        if cls is not SourceCreate:  # a stored record loads as it was stored (never lose a source by a new rule)
            return v
        problem = ref_name_problem(v, glob=False)
        if problem:
            raise ValueError(f"ref must be a branch name such as 'main' ({problem})")
        return v

    @field_validator("refs")
    @classmethod
    def _refs(cls, v: list[str]) -> list[str]:
        out: list[str] = []
        for pat in v:
            name = pat.removeprefix("refs/heads/")
            problem = ref_name_problem(name, glob=True) if cls is SourceCreate else None
            if problem:
                raise ValueError(f"refs must be branch or tag names or globs such as 'main', 'release/*', 'v*' "
                                 f"({problem}: {pat[:80]!r})")
            if pat not in out:
                out.append(pat)
        return out

    @field_validator("repo_url", "bucket", "prefix")
    @classmethod
    def _bounded_location(cls, v: str | None, info: Any) -> str | None:
        # A new registration only (a stored record loads as it was stored). Bounds: S3 bucket names are 3-63
        # characters and object keys at most 1,024 bytes (AWS S3 naming rules); a clone URL gets the 2,048
        # characters git hosts' URLs fit in, so a caller cannot grow the ingester's URL-key cache without bound.
        if cls is not SourceCreate or v is None:
            return v
        if "\x00" in v:
            raise ValueError(f"{info.field_name} must not hold a NUL character")
        limit = SOURCE_LOCATION_LIMITS[info.field_name]
        if info.field_name == "repo_url" and v.strip().startswith(("/", "file://")):
            limit = LOCAL_PATH_LIMIT  # a local path (PATH_MAX); never cached by URL key
        size = len(v.encode("utf-8", "surrogatepass")) if info.field_name == "prefix" else len(v)
        if size > limit:
            unit = "bytes" if info.field_name == "prefix" else "characters"
            raise ValueError(f"{info.field_name} is {size} {unit}; at most {limit} are allowed")
        problem = bucket_name_problem(v) if info.field_name == "bucket" else None
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("repo_name")
    @classmethod
    def _repo_name(cls, v: str | None) -> str | None:
        if cls is SourceCreate and v is not None and not _SCOPE_RE.match(v):
            raise ValueError("repo_name must be 1-200 printable characters without leading/trailing spaces")
        return v

    @model_validator(mode="after")
    def _kind_fields(self) -> SourceCreate:
        if self.kind == "git":
            if not self.repo_url.strip():
                raise ValueError("repo_url is required for a git source")
        else:
            prefix = (self.prefix or "").strip("/")
            if not prefix or ".." in prefix.split("/"):
                raise ValueError("prefix is required for an s3 source (e.g. 'agents/alpha/docs')")
            self.prefix = prefix
            self.repo_url = f"s3://{self.bucket or ''}/{prefix}"
        return self


class Source(SourceCreate):
    """A registered source, as stored (fields a record holds beyond these are ignored)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    created_at: datetime = Field(default_factory=utcnow)

    @staticmethod
    def new_id() -> str:
        """Return a fresh source id (``src_`` + 16 hex characters)."""
        return "src_" + uuid.uuid4().hex[:16]

    @property
    def ref_patterns(self) -> list[str]:
        """The branch/tag names and globs this source tracks: ``refs``, or ``[ref]`` when that is empty."""
        return list(self.refs) or [self.ref]

    @property
    def scope(self) -> Scope:
        return Scope(agent_name=self.agent_name, context_id=self.context_id)

    def secrets(self) -> list[str]:
        """Webhook secrets currently accepted (current first, then the previous one during a rotation); empty for
        a source that is not webhook-driven, so no delivery can ever verify against it."""
        if not self.webhooks:
            return []
        return [s.get_secret_value() for s in (self.webhook_secret, self.webhook_secret_previous) if s]

    def public(self) -> dict[str, Any]:
        """JSON-able view without the secrets."""
        d = self.model_dump(mode="json", exclude={"webhook_secret", "webhook_secret_previous"})
        d["has_webhook_secret"] = self.webhook_secret is not None
        return d


@dataclass(slots=True)
class Chunk:
    """One piece of a document as produced by a chunker (before it is tagged with a scope).

    Lines are 1-based and inclusive. ``chunk_index`` is 0-based within the document.
    """

    content: str
    start_line: int
    end_line: int
    chunk_index: int = 0
    kind: str = "lines"
    symbol: str | None = None
    signature: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Every definition whose name line lies in this chunk (nested ones and methods of a class kept whole
    #: included): ``{"name", "path", "kind", "signature", "line"}`` with ``path`` the qualified name
    #: (``Class.method``) and ``line`` the absolute 1-based line of its header. Empty for non-code chunks.
    defs: list[dict[str, Any]] = field(default_factory=list)


#: Bounds of a search's ``max_tokens`` budget: the smallest leaves room for the answer's summary and the note
#: saying what was cut; the largest is far above any useful answer (the result cap × the largest chunks).
MIN_ANSWER_TOKENS = 100
MAX_ANSWER_TOKENS = 100_000


class SearchMode(StrEnum):
    """How a query is matched. ``keyword`` BM25, ``vector`` kNN, ``hybrid`` both fused; ``exact`` a literal
    substring of a line, ``regex`` an RE2 pattern on each line (a safe subset, :mod:`scopekb.textsearch`),
    ``symbol`` definitions by name or qualified path."""

    keyword = "keyword"
    vector = "vector"
    hybrid = "hybrid"
    exact = "exact"
    regex = "regex"
    symbol = "symbol"


#: Modes that match text line by line (every hit lists its matching lines).
LINE_MODES = frozenset({SearchMode.exact, SearchMode.regex})
#: Most whitespace-separated terms of a keyword/vector/hybrid query (each becomes clauses on the boosted fields).
MAX_QUERY_TERMS = 256
#: Metadata filter limits: keys per request, values per key, characters per key or value.
MAX_METADATA_KEYS, MAX_METADATA_VALUES, MAX_METADATA_CHARS = 16, 32, 256


def ref_given(ref: str | None, omit: str) -> str | None:
    """``ref`` unchanged, or ValueError when it is empty or only whitespace (``omit`` says what leaving it out
    does). A request's ``ref`` is either absent or names something: an empty one meant "every ref" in one place
    and was refused in another."""
    if ref is not None and not ref.strip():
        raise ValueError(f"ref must not be empty; {omit}")
    return ref


class SearchRequest(BaseModel):
    """A search (REST and MCP share it). The scope's agent comes from the credential, never from here.

    An unknown field (``agent_name``, ``source``, a typo such as ``max_result`` or ``cross_contexts``) is a 422
    naming it (hostile review L3): silently dropped, a typo searched without the filter the caller meant."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # mode first: the query's check reads it (a blank query is a literal in exact/regex, refused elsewhere)
    mode: SearchMode = SearchMode.keyword
    query: str = Field(min_length=1, max_length=4096)
    fusion: Literal["weighted", "rrf"] = Field(
        default="weighted", description="hybrid only: min-max 0.3/0.7 weighted sum, or Reciprocal Rank Fusion")
    max_results: int = Field(default=5, ge=1)
    min_score: float = Field(default=0.0, ge=0.0, le=1.0)
    context_id: str | None = None
    cross_context: bool = False
    file_patterns: list[str] = Field(
        default_factory=list, max_length=64,
        description="path globs (* ** ? and **/); bounded by the query.max_pattern* settings (400 over a limit)")
    languages: list[str] = Field(default_factory=list, max_length=50)
    source_id: str | None = None
    repo: str | None = None
    ref: str | None = Field(default=None, max_length=256,
                            description="a branch or tag name, or a commit id that is the indexed head of one")
    case_sensitive: bool | None = Field(
        default=None, description="exact/regex/symbol: match case exactly. Default: true for exact and regex "
                                  "(like grep), false for symbol")
    symbol_match: Literal["exact", "prefix"] = Field(
        default="exact", description="symbol mode: the name (or dotted path such as 'Class.method') equals the "
                                     "query, or starts with it")
    kinds: list[str] = Field(
        default_factory=list, max_length=20,
        description="symbol mode: definition kinds to keep (function, method, class, interface, struct, enum, "
                    "trait, impl, module, type, macro, constructor, property, ...); empty keeps all")
    metadata: dict[str, str | int | float | bool | list[str | int | float | bool]] = Field(
        default_factory=dict,
        description="key/value filters on chunk metadata: a Markdown document's front matter "
                    "('front_matter.status'), an S3 object's user metadata ('s3.team' for x-amz-meta-team), chunker "
                    "fields such as 'parent'; nested keys joined by '.'; a list means any of its values; every key "
                    "must match. Values compare as text ('true', '3')")
    group_by: Literal["chunk", "file"] = Field(
        default="chunk", description="chunk: one result per chunk; file: one result per file (its best chunks "
                                     "merged when adjacent or overlapping, its other matching line ranges listed), "
                                     "max_results then counts files")
    max_tokens: int | None = Field(
        default=None, ge=MIN_ANSWER_TOKENS, le=MAX_ANSWER_TOKENS,
        description=f"text answers only (format=text, MCP): pack the answer into this many tokens of the embedding "
                    f"model's tokenizer, best first, cutting chunks at line boundaries and saying what was cut "
                    f"({MIN_ANSWER_TOKENS}..{MAX_ANSWER_TOKENS}; none: no budget)")

    @field_validator("context_id")
    @classmethod
    def _context(cls, v: str | None) -> str | None:
        return None if v is None else check_scope_part(v, "context_id")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, v: str, info: ValidationInfo) -> str:
        # a literal or pattern of whitespace is a grep-like question (lines holding a tab); ranked and symbol
        # searches have no term in it (hostile review: exact mode refused a tab as blank)
        if not v.strip() and info.data.get("mode") not in LINE_MODES:
            raise ValueError("query must not be blank")
        return v

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str | None) -> str | None:
        # "" searched every ref over REST while `read` refused it (hostile review)
        return ref_given(v, "omit it to search every indexed ref")

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        if any(not k or len(k) > 40 for k in v):
            raise ValueError("each kind must be 1-40 characters")
        return [k.lower() for k in v]

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(v) > MAX_METADATA_KEYS:
            raise ValueError(f"metadata has {len(v)} keys; at most {MAX_METADATA_KEYS} are allowed")
        for k, val in v.items():
            vals = val if isinstance(val, list) else [val]
            if not k or len(k) > MAX_METADATA_CHARS or any(ord(c) < 32 for c in k) or k.startswith(".") \
                    or k.endswith(".") or ".." in k:
                raise ValueError(f"metadata key {k[:40]!r} must be 1-{MAX_METADATA_CHARS} printable characters, "
                                 "dot-separated parts not empty")
            if not vals or len(vals) > MAX_METADATA_VALUES:
                raise ValueError(f"metadata[{k[:40]!r}] must have 1-{MAX_METADATA_VALUES} values")
            if any(len(metadata_text(x)) > MAX_METADATA_CHARS for x in vals):
                raise ValueError(f"metadata[{k[:40]!r}]: each value must be at most {MAX_METADATA_CHARS} characters")
        return v

    @model_validator(mode="after")
    def _mode_fields(self) -> SearchRequest:
        # BM25/kNN only: OpenSearch refuses more than 1,024 clauses across the boosted fields; exact and regex match
        # the query as one literal or pattern (hostile review 2, H8), bounded by max_length and query.regex_*.
        if self.mode not in LINE_MODES and self.mode != SearchMode.symbol and len(self.query.split()) > MAX_QUERY_TERMS:
            raise ValueError(f"query has more than {MAX_QUERY_TERMS} terms (modes keyword, vector, hybrid)")
        if self.mode in LINE_MODES and ("\n" in self.query or "\r" in self.query):
            raise ValueError(f"{self.mode.value} search matches within one line; the query must not contain a "
                             "line break")
        if self.mode == SearchMode.symbol and (len(self.query) > 512 or any(c.isspace() for c in self.query)):
            raise ValueError("symbol search takes one name or dotted path (no spaces, at most 512 characters)")
        # a field the chosen mode cannot honour is named, not ignored (hostile review: `--mode exact --prefix`
        # searched without the prefix rule the caller asked for)
        if self.kinds and self.mode != SearchMode.symbol:
            raise ValueError("kinds applies to mode 'symbol' only")
        if self.symbol_match == "prefix" and self.mode != SearchMode.symbol:
            raise ValueError("symbol_match 'prefix' applies to mode 'symbol' only")
        if self.fusion == "rrf" and self.mode != SearchMode.hybrid:
            raise ValueError("fusion 'rrf' applies to mode 'hybrid' only")
        if self.case_sensitive and self.mode not in LINE_MODES and self.mode != SearchMode.symbol:
            raise ValueError(f"case_sensitive applies to modes exact, regex and symbol; {self.mode.value} search "
                             "ignores case")
        return self

    def effective_case_sensitive(self) -> bool:
        """``case_sensitive`` or the mode's default (true for exact and regex, false for symbol)."""
        if self.case_sensitive is not None:
            return self.case_sensitive
        return self.mode != SearchMode.symbol

    @field_validator("languages")
    @classmethod
    def _short_items(cls, v: list[str]) -> list[str]:
        if any(len(x) > 300 for x in v):
            raise ValueError("each entry must be at most 300 characters")
        # names as the index writes them (hostile review: "Python" and "klingon" matched nothing, silently)
        out = [x.strip().lower() for x in v]
        unknown = [x for x in out if x not in LANGUAGES]
        if unknown:
            raise ValueError(f"unknown language {unknown[0][:40]!r}; the index knows: {', '.join(sorted(LANGUAGES))}")
        return out

    @field_validator("file_patterns")
    @classmethod
    def _pattern_ceiling(cls, v: list[str]) -> list[str]:
        if any(len(x) > 1024 for x in v):  # the stores' ceiling; the configured limits give 400 in run_search
            raise ValueError("each file pattern must be at most 1024 characters")
        return v


class FieldMatch(BaseModel):
    """Query terms found in one field of a hit (terms as the keyword analyzer sees them: identifiers whole and
    lower-cased, also matching the parts of a camelCase / snake_case identifier)."""

    field: Literal["symbol", "signature", "path", "content"]
    terms: list[str]


class HitReason(BaseModel):
    """Why a hit was chosen: which query terms matched which fields, its rank in the keyword (BM25) and vector
    (kNN) candidate lists (1-based; None when absent from that list or not run), each list's normalised score
    and how the two were fused into ``score``."""

    matched: list[FieldMatch] = Field(default_factory=list)
    keyword_rank: int | None = None
    vector_rank: int | None = None
    keyword_score: float | None = Field(default=None, description="BM25 min-max normalised over the candidates "
                                                                  "(keyword mode: divided by the best)")
    vector_score: float | None = Field(default=None, description="kNN similarity (1 + cos) / 2")
    fusion: str = Field(description="ranked modes: keyword | vector | weighted k×keyword + v×vector | rrf k=60; "
                                    "exact / regex / symbol: the kind of match")


class LineRange(BaseModel):
    """Lines ``start``..``end`` (1-based, inclusive) of a file that also matched, with the best score there."""

    start_line: int
    end_line: int
    score: float


class SearchHit(BaseModel):
    """One result: where it is, what it says, how well it matched (score in [0, 1], higher is better).

    Grouped by file (``group_by="file"``), ``content`` and the lines are the file's best chunk merged with its
    other hits that overlap or touch it (``chunks`` of them), and ``other_ranges`` lists the file's remaining
    matching line ranges, best first.
    """

    path: str
    start_line: int
    end_line: int
    content: str
    score: float
    chunk_index: int
    language: str | None = None
    kind: str | None = None
    symbol: str | None = None
    repo: str | None = None
    ref: str | None = None
    refs: list[str] | None = Field(default=None, description="every indexed ref whose commit holds this chunk")
    commit: str | None = None
    #: The chunk's document id (not serialised), to list the overlay refs that hold it (issue 23).
    _chunk_id: str | None = PrivateAttr(default=None)
    blob_sha: str | None = Field(
        default=None, description="git blob id (or object ETag) of the whole document; with path it names what "
                                  "GET /v1/read returns")
    source_id: str | None = None
    agent_name: str
    context_id: str
    indexed_at: datetime | None = None
    match_lines: list[int] | None = Field(
        default=None, description="exact/regex: every line of the chunk that matches (absolute 1-based file line "
                                  "numbers, ascending); symbol: the header lines of the matching definitions")
    definitions: list[dict[str, Any]] | None = Field(
        default=None, description="symbol mode: the matching definitions in this chunk, each {name, path, kind, "
                                  "signature, line}")
    signature: str | None = None
    why: HitReason | None = None
    chunks: int = Field(default=1, description="chunks merged into this hit (group_by=file)")
    other_ranges: list[LineRange] = Field(default_factory=list)


class SearchScope(BaseModel):
    """The scope a search ran in: the key's agent and its contexts (None: every context of the agent)."""

    agent_name: str
    context_ids: list[str] | None = None


#: A git blob id (40 hex, SHA-1 repositories; 64 hex, SHA-256 ones) or a content hash used as a blob key.
BLOB_SHA_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


class ReadRequest(BaseModel):
    """Lines of one indexed blob (``GET /v1/read``, the MCP ``read`` tool, ``scopekb read``).

    ``path`` and ``blob_sha`` are what a search hit names; lines are 1-based and inclusive (``end_line`` None: to
    the end of the blob). The scope comes from the credential, as for a search.
    """

    path: str = Field(min_length=1, max_length=4096)
    blob_sha: str = Field(description="40 or 64 lowercase hex digits, as a hit's blob_sha")
    start_line: int = Field(default=1, ge=1)
    end_line: int | None = Field(default=None, ge=1)
    repo: str | None = Field(default=None, max_length=1000)
    ref: str | None = Field(default=None, max_length=256,
                            description="only the blob as this branch, tag or indexed head commit holds it; it is "
                                        "the ref the answer names")
    context_id: str | None = None
    cross_context: bool = False

    @field_validator("context_id")
    @classmethod
    def _context(cls, v: str | None) -> str | None:
        return None if v is None else check_scope_part(v, "context_id")

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str | None) -> str | None:
        return ref_given(v, "omit it to read the blob as any indexed ref holds it")

    @field_validator("blob_sha")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not BLOB_SHA_RE.match(v):
            raise ValueError("blob_sha must be 40 or 64 lowercase hex digits (a hit's blob_sha)")
        return v

    @model_validator(mode="after")
    def _range(self) -> ReadRequest:
        if self.end_line is not None and self.end_line < self.start_line:
            raise ValueError("end_line must not be before start_line")
        return self


class ReadResult(BaseModel):
    """Exactly the bytes of lines ``start_line..end_line`` of a blob, with where they come from.

    Lines end as in the blob (LF, CRLF or CR, the last one possibly without an end). ``content`` holds them when
    the blob is UTF-8 (then ``content.encode("utf-8")`` is the bytes), else ``content_base64`` does, and ``text``
    holds them decoded from the blob's ``encoding`` (as the index decoded them for the hits).
    """

    repo: str | None = None
    ref: str | None = None
    commit: str | None = None
    source_id: str | None = None
    blob_sha: str
    path: str
    start_line: int
    end_line: int
    total_lines: int = Field(description="lines in the whole blob")
    content: str | None = None
    content_base64: str | None = None
    text: str | None = Field(default=None, description="the lines decoded from the blob's encoding, when the blob "
                             "is not UTF-8 (content is then null and content_base64 holds the exact bytes)")
    encoding: str = Field(default="utf-8", description="the encoding the blob was indexed in (utf-8, utf-16-le, "
                          "windows-1252, ...)")
    agent_name: str
    context_id: str


class SearchResponse(BaseModel):
    query: str
    mode: SearchMode
    hits: list[SearchHit]
    took_ms: float
    notice: str | None = Field(default=None, description="set when the answer was degraded, e.g. keyword only")
    group_by: Literal["chunk", "file"] = "chunk"
    scope: SearchScope | None = None
    #: Set (to ``query.max_results_cap``) when ``notice`` says more chunks match than the results (exact/regex
    #: search, :func:`scopekb.render.more_match_note`), so the text answer counts the results its text shows
    #: (hostile review L5). Not serialised.
    _more_match_cap: int | None = PrivateAttr(default=None)
    #: With ``_more_match_cap``: the results are files (``group_by="file"``), and ``max_results`` is at the cap.
    _more_match_files: bool = PrivateAttr(default=False)
    _more_match_at_cap: bool = PrivateAttr(default=False)


class JobStage(StrEnum):
    """Which stage of indexing a job is in (issue 19): ``syncing`` (git, chunks, writes), ``embedding`` (the
    chunks are written and keyword-searchable; their vectors are being computed by embedding tasks), ``done``
    (both finished; the index is complete only now)."""

    syncing = "syncing"
    embedding = "embedding"
    done = "done"


class JobState(StrEnum):
    queued = "queued"
    running = "running"
    done = "done"
    partial = "partial"
    failed = "failed"


class Job(BaseModel):
    """The record of one sync (DESIGN §4.8). ``id`` is the webhook delivery id or a generated one."""

    id: str
    state: JobState = JobState.queued
    source_ids: list[str] = Field(default_factory=list)
    repo: str | None = None
    ref: str | None = None
    from_commit: dict[str, str | None] = Field(default_factory=dict, description="per source id")
    to_commit: str | None = None
    ref_commits: dict[str, str] = Field(
        default_factory=dict, description="each tracked ref this sync brought to a commit: ref name -> commit")
    files_seen: int = 0
    files_indexed: int = 0
    files_deleted: int = 0
    files_skipped: dict[str, int] = Field(default_factory=dict, description="count per skip reason")
    chunks_written: int = 0
    chunks_deleted: int = 0
    chunks_linked: int = Field(
        default=0, description="chunks that joined a ref without being written: the store held them for another "
                               "ref of the source (issue 23)")
    embeddings_computed: int = 0
    embeddings_cached: int = 0
    errors: list[str] = Field(default_factory=list)
    retries: dict[str, int] = Field(
        default_factory=dict,
        description="retries by kind, summed over the task's attempts: task (re-run after a transient error), "
                    "redelivered (re-run after the worker died), bulk_items (chunks re-sent while OpenSearch was "
                    "unavailable or busy), embedding (embedding requests retried after 429/5xx)")
    drift: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="per source id, what a verifying sync (reconcile) found and repaired although the source "
                    "was already at the ref: paths missing, changed and stale in the index")
    stage: JobStage | None = Field(
        default=None, description="syncing -> embedding -> done (issue 19); the job stays running until both the "
                                  "sync and the embedding stage finished")
    embed_run: str | None = Field(default=None, description="token of the sync run whose embedding parts count")
    embed_parts: int = Field(default=0, description="embedding tasks the sync stage enqueued (0: none)")
    trigger: str = "webhook"
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.state in (JobState.done, JobState.partial, JobState.failed)


class DeadLetter(BaseModel):
    """A task parked after failing ``worker.max_retries`` times, with what is needed to replay it."""

    id: str
    task: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    error: str
    attempts: int
    #: A file parked on its own (its chunking crashed the worker every time); None for a whole task.
    path: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    replayed_at: datetime | None = None
