"""The core's config sections. Plugins contribute their own via ``servehall_settings_models``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servehall.config.secrets import Secret, SecretReference
from servehall.config.worker import WorkerSettings


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PluginsSettings(_Section):
    """``[plugins]``: which entry points of group ``servehall`` load (defaults always load)."""

    enabled: list[str] = Field(default_factory=list)


class ServerSettings(_Section):
    """``[server]``: listening sockets, TLS, limits and auth allow-list.

    ``bind`` entries are ``host:port``; each serves HTTP/1.1, h2c (prior knowledge and
    upgrade) and, with ``certfile``/``keyfile``, TLS with ALPN ``h2``. ``replica`` names
    this replica in ``request_log.replica`` (default ``<hostname>-<pid>``).
    """

    bind: list[str] = Field(default_factory=lambda: ["127.0.0.1:8000"])
    certfile: Path | None = None
    keyfile: Path | None = None
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    graceful_timeout_s: float = Field(default=60.0, ge=0)
    keep_alive_timeout_s: float = Field(default=75.0, ge=1)
    keep_alive_max_requests: int = Field(default=1_000_000, ge=1)
    early_response_drain_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    early_response_drain_s: float = Field(default=10.0, ge=0)
    #: A response write (a streamed event or the last body) that the client has not
    #: accepted after this many seconds — it stopped reading, its HTTP/2 window stays
    #: shut — ends the request as 499 ``client_stalled`` and frees its slot, like
    #: nginx's ``send_timeout`` (0: wait forever). :mod:`servehall.api.disconnect`.
    send_timeout_s: float = Field(default=60.0, ge=0, allow_inf_nan=False)
    auth_allow_paths: list[str] = Field(default_factory=lambda: ["/health/live", "/health/ready"])
    default_max_tokens: int = Field(default=256, ge=1)
    max_n: int = Field(default=8, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    replica: str | None = Field(default=None, max_length=128)
    #: One INFO line per request on logger ``servehall.access`` (client, method, path
    #: without query, status, bytes, duration, request id, principal id); never headers,
    #: query strings or bodies. See :mod:`servehall.api.access_log`.
    access_log: bool = False
    #: ``host:port`` of the HAProxy agent endpoint (weight from free KV cache and queue,
    #: ``drain`` on SIGTERM, ``down`` when no model is ready; :mod:`servehall.server.agent`).
    agent_bind: str | None = Field(default=None, pattern=r"^.+:\d+$")
    #: Store every applied config as a revision in the database (``config_revision``,
    #: audited) and follow the newest one: each replica polls every ``config_poll_s``
    #: seconds and applies a new revision's ``[[models]]`` live (docs/versions.md).
    config_revisions: bool = False
    config_poll_s: float = Field(default=1.0, gt=0, le=60)
    #: Redis (``redis://[user:password@]host:port/db``, ``rediss://``, ``unix://``) over
    #: which a new revision is announced to every replica at once; the poll every
    #: ``config_poll_s`` stays as the catch-up (:mod:`servehall.rollout.broadcast`).
    config_broadcast_url: Secret | None = None
    #: HTTP frontend processes that share the listeners and send every request to this
    #: process, which keeps the engines, admission, records and live config
    #: (:mod:`servehall.server.frontends`). 1: this process serves HTTP itself.
    #: ``"auto"``: one per four usable CPUs, 1 to 8.
    api_processes: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = 1

    @field_validator("bind")
    @classmethod
    def _check_bind(cls, v: list[str]) -> list[str]:
        for b in v:
            host, sep, port = b.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"bind entry {b!r} is not host:port")
        return v


class RollbackIf(_Section):
    """``[[models]] rollback_if``: when a canary version is rolled back automatically.

    Over the last ``window_s`` seconds, once the version has served ``min_requests``:
    its error rate (5xx and engine errors / requests) above ``error_rate_above``, or its
    TTFT P99 above ``ttft_p99_above_baseline`` × the P99 of the name's other versions
    (the baseline; checked once those have ``min_requests`` too) sets its weight to 0
    (:mod:`servehall.rollout.guard`). Unset thresholds are not checked.
    """

    error_rate_above: float | None = Field(default=None, ge=0, le=1)
    ttft_p99_above_baseline: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    min_requests: int = Field(default=200, ge=1)
    window_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)


class RolledBack(_Section):
    """``[[models]] rolled_back``: written by the canary guard, never needed by hand.

    The version's entry in the config revision that took it out of rotation carries
    ``weight = 0`` and this table: the ``weight`` it had before, the ``reason``
    (``error_rate``, ``ttft_p99``), the ``detail`` (the figures), when (``at``, ISO 8601
    UTC) and which replica judged it (``by``). A later config that gives the version
    this same ``weight`` without the table keeps the rollback
    (:mod:`servehall.rollout.sticky`); another weight, or the table kept with a weight
    above 0, ends it.
    """

    weight: float = Field(ge=0, allow_inf_nan=False)
    reason: str = Field(min_length=1, max_length=64)
    detail: str = Field(default="", max_length=500)
    at: str = Field(default="", max_length=64)
    by: str = Field(default="", max_length=128)


class GateSettings(_Section):
    """``[[models]] gate``: the accuracy gate a version passes before it takes traffic.

    ``golden`` is a JSON-lines file (relative paths are relative to the server's working
    directory), one object per line: ``{"prompt": "...", "reference": "..."}`` (blank
    lines are skipped). The version's engine answers every prompt greedily (temperature
    0, at most ``max_tokens`` tokens) before it gets any weight; ``metric`` scores its
    answers against the references — or, with ``against = "serving"``, against the
    answers of the name's version now serving (``reference`` is then optional) — and a
    score below ``min`` (in [0, 1]) refuses the version (:mod:`servehall.host.gate`).
    ``metric``: ``exact`` (share of prompts answered exactly) or ``token_agreement``
    (mean share of matching token positions); ``logprob_kl`` is named for the issue's
    spelling but refused by ``config check``: no engine exposes log-probabilities.
    ``timeout_s`` bounds the whole run.
    """

    golden: Path
    metric: Literal["exact", "token_agreement", "logprob_kl"] = "exact"
    min: float = Field(ge=0, le=1, allow_inf_nan=False)
    against: Literal["reference", "serving"] = "reference"
    max_tokens: int = Field(default=32, ge=1, le=4096)
    timeout_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)

    @field_validator("golden")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()


class ModelConfig(_Section):
    """``[[models]]``: one served model.

    ``backend`` is a backend name or ``"auto"``; ``options`` are backend-specific
    (e.g. ``inference_precision`` for ``openvino_cpu``, ``dtype`` for torch backends).
    ``max_model_len`` caps the context (tokens); None uses the model's own.
    ``isolation``: ``"process"`` (default) runs the engine in a supervised worker process
    (crash isolation, restart; :mod:`servehall.worker`), ``"thread"`` on a thread of the
    API process (debugging). ``worker`` tunes the supervision (:class:`WorkerSettings`).
    ``tool_parser`` names the tool-call format the model writes (``hermes``,
    ``llama3_json`` or one a plugin registers); None picks one from the chat template
    (:func:`servehall.tools.parsers.guess_parser_name`). ``tool_call_grammar`` says when
    tool calls under ``tool_choice: "auto"`` are constrained by a grammar that starts at
    the parser's trigger (a "lazy grammar", :mod:`servehall.tools.plan`): ``"strict"``
    (default) only when the request asks for it (a ``strict`` tool or
    ``parallel_tool_calls: false``), ``"always"`` for every request with tools (the name
    must be an offered tool, the arguments follow its schema) — for weak models; it
    needs a backend that compiles structural tags, else the model fails to start with a
    config error. ``task`` is what the model is
    served for: ``"generate"`` (default: ``/v1/chat/completions``, ``/v1/completions``) or
    ``"embed"`` (``/v1/embeddings`` only; the backend's engine must implement
    :class:`~servehall.engines.contract.EmbeddingEngine`, else the model fails to start
    with a config error). A request to the other task's routes is a 400.

    Versions (docs/versions.md): several entries may share a ``name``, each with its own
    ``version`` label (letters, digits, ``.``, ``_``, ``-``) and a ``weight`` (>= 0, a
    relative share of that name's traffic; 0 takes none unless pinned by the
    ``x-servehall-model-version`` header). A name served by one entry may leave
    ``version`` empty. :func:`check_versions` checks the set. ``rollback_if`` guards a
    canary (:class:`RollbackIf`); ``rolled_back`` marks a version the guard took out of
    rotation (:class:`RolledBack`); ``gate`` runs a golden set through the version before
    it takes traffic (:class:`GateSettings`). ``idle_unload_s`` stops the version's
    engine after that many seconds without requests; the next request loads it again
    (:mod:`servehall.rollout.idle`).

    ``path`` may also be a URL (docs/models.md, "Model sources"): ``s3://bucket/prefix``
    or ``https://host/dir`` (``http://`` too, for a mirror on a trusted network). The
    URL is then kept in ``source`` and the files are pulled into the node's cache
    (``[model_store]``, :mod:`servehall.sources`) when the version starts; the engine is
    given the cached directory.
    """

    name: str = Field(min_length=1)
    version: str = Field(default="", max_length=64, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*)?$")
    weight: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    rollback_if: RollbackIf | None = None
    rolled_back: RolledBack | None = None
    gate: GateSettings | None = None
    idle_unload_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    path: Path
    backend: str = "auto"
    max_model_len: int | None = Field(default=None, ge=16)
    options: dict[str, Any] = Field(default_factory=dict)
    isolation: Literal["process", "thread"] = "process"
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    tool_parser: str | None = Field(default=None, min_length=1)
    #: ``"strict"`` (default): a lazy tool-call grammar under ``tool_choice: "auto"``
    #: only for a ``strict`` tool or ``parallel_tool_calls: false``; ``"always"``: for
    #: every request with tools (see the class docstring and docs/api.md, "Tools").
    tool_call_grammar: Literal["strict", "always"] = "strict"
    task: Literal["generate", "embed"] = "generate"
    #: The URL the model is pulled from, when ``path`` was given as one (set from it).
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _source_from_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("path"), str):
            path = data["path"]
            if _URL.match(path):
                try:
                    check_source_url(path)
                except ValueError:
                    return data  # reported by _no_bad_url under the key "path"
                return {**data, "source": path, "path": remote_placeholder(path)}
        return data

    @field_validator("path", mode="before")
    @classmethod
    def _no_bad_url(cls, v: Any) -> Any:
        if isinstance(v, str) and _URL.match(v):
            check_source_url(v)  # raises: a valid URL never gets here
        return v

    @field_validator("source")
    @classmethod
    def _check_source(cls, v: str | None) -> str | None:
        return None if v is None else check_source_url(v)

    @field_validator("path")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
REMOTE_SCHEMES = ("s3", "https", "http")
"""The URL schemes a ``[[models]] path`` may use (:mod:`servehall.sources`)."""


def check_source_url(url: str) -> str:
    """``url`` when it is a model source URL servehall can pull from, else ValueError
    (reported with its key path): ``s3://bucket[/prefix]``, ``https://host[/dir]`` or
    ``http://host[/dir]``; no query or fragment."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in REMOTE_SCHEMES:
        raise ValueError(
            f"unknown scheme {scheme + '://'!r} in {url!r}: a model path is a local directory, "
            "s3://bucket/prefix or https://host/dir"
        )
    host = rest.split("/", 1)[0]
    if not host:
        raise ValueError(f"{url!r} names no {'bucket' if scheme == 's3' else 'host'}")
    if "?" in url or "#" in url:
        raise ValueError(f"{url!r}: a model source URL has no query or fragment")
    return url


def remote_placeholder(url: str) -> Path:
    """The ``path`` of an entry whose files come from ``url`` until they are pulled: a
    relative path that names no directory (the cached directory replaces it at start)."""
    return Path("remote-model-not-pulled") / url.partition("://")[2]


def check_versions(models: list[ModelConfig | None]) -> list[tuple[str, str]]:
    """Every ``(key path, message)`` problem of the ``[[models]]`` list as a set of
    versions: a name given by several entries needs a distinct, non-empty ``version`` on
    each, and a name needs some weight > 0 (else nothing routes to it). ``None`` entries
    (set aside by ``config check``) are skipped; indexes refer to the list as given."""
    errs: list[tuple[str, str]] = []
    by_name: dict[str, list[tuple[int, ModelConfig]]] = {}
    for i, m in enumerate(models):
        if m is not None:
            by_name.setdefault(m.name, []).append((i, m))
    for name, entries in by_name.items():
        if len(entries) > 1:
            seen: dict[str, int] = {}
            for i, m in entries:
                if not m.version:
                    errs.append(
                        (
                            f"models[{i}].version",
                            f"model {name!r} has {len(entries)} entries: each needs a "
                            "version label",
                        )
                    )
                elif m.version in seen:
                    errs.append(
                        (
                            f"models[{i}].version",
                            f"version {m.version!r} of model {name!r} is already "
                            f"models[{seen[m.version]}]",
                        )
                    )
                else:
                    seen[m.version] = i
        if all(m.weight == 0 for _, m in entries):
            i = entries[0][0]
            errs.append((f"models[{i}].weight", f"model {name!r}: every version has weight 0"))
    return errs


class SchedulerTenantSettings(_Section):
    """``[scheduler.tenants.<name>]``: one tenant's scheduling settings.

    ``weight`` (``fair`` only, > 0): the tenant's share of service relative to others
    (2 = twice the tokens of a weight-1 tenant while both are backlogged). ``max_queue``
    (``fair`` and ``priority``): this tenant's queue cap, overriding
    ``[scheduler] max_queue_per_tenant``. See docs/scheduling.md.
    """

    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    max_queue: int | None = Field(default=None, ge=0)


class SchedulerSettings(_Section):
    """``[scheduler]``: policy name, concurrency and queue limits (per model).

    ``max_queue_per_tenant`` caps each tenant's queued requests (None: only ``max_queue``).
    ``aging_s`` (``priority``): seconds of waiting worth one priority level, so low
    priority always progresses (0: strict priority). ``burst_slots`` (``fair``):
    slots above ``max_concurrency`` that only a tenant with nothing queued and fewer
    running requests than its weighted share of ``max_concurrency`` may take, so it
    starts at once instead of waiting for another tenant's request to end (0: none).
    ``tenants`` holds per-tenant sections for policies that read them
    (docs/scheduling.md).
    """

    policy: str = "fcfs"
    max_concurrency: int = Field(default=16, ge=1)
    max_queue: int = Field(default=256, ge=0)
    queue_timeout_s: float = Field(default=30.0, gt=0)
    retry_after_s: int = Field(default=1, ge=1)
    max_queue_per_tenant: int | None = Field(default=None, ge=0)
    aging_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    burst_slots: int = Field(default=0, ge=0)
    tenants: dict[str, SchedulerTenantSettings] = Field(default_factory=dict)


class DatabaseSettings(_Section):
    """``[database]``: where request logs and audit events go."""

    url: Secret = Field(default="sqlite+aiosqlite:///servehall.db", validate_default=True)
    store_prompts: bool = False
    auto_migrate: bool = False
    #: PostgreSQL: most seconds one statement may take (asyncpg ``command_timeout`` and
    #: the server's ``statement_timeout``) and a connect may take; 0 = no limit
    command_timeout_s: float = Field(default=30.0, ge=0)
    #: PostgreSQL ``lock_timeout``: most seconds a statement waits for a lock (e.g. the
    #: audit chain head held by another replica); 0 = no limit
    lock_timeout_s: float = Field(default=10.0, ge=0)
    #: PostgreSQL ``idle_in_transaction_session_timeout``: a session that stalls inside
    #: a transaction (a replica stopped while it holds the audit chain head) is ended
    #: by the server after this many seconds, releasing its locks; 0 = no limit
    idle_in_transaction_timeout_s: float = Field(default=30.0, ge=0)


class AuditSettings(_Section):
    """``[audit]``: signed checkpoints of the audit chain (docs/operations.md, "Audit").

    ``signing_key`` is an Ed25519 private key in PEM (PKCS#8), given only as a reference
    (``{ file = "/etc/servehall/audit.key" }`` or ``{ env = "NAME" }``, never literally):
    each replica's ``sql`` sink then signs the chain head every ``checkpoint_interval_s``
    seconds while events arrive, and on shutdown, into ``audit_checkpoint``.
    ``public_key`` is the PEM public key file ``servehall audit verify`` checks the
    checkpoints with (``servehall audit keygen`` writes both).
    """

    signing_key: SecretReference | None = None
    public_key: Path | None = None
    checkpoint_interval_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)


class FilesSettings(_Section):
    """``[files]``: uploaded files (``/v1/files``, docs/api.md "Files").

    ``dir`` is the directory the file contents are kept in (relative paths are relative
    to the server's working directory, like the default SQLite database; created on
    first upload); each file is written to a temporary file there and renamed into
    place. ``max_bytes`` is the largest file one upload may carry (a larger one is
    refused with 413). The files' metadata lives in the records database
    (``file_object``).
    """

    dir: Path = Path("servehall-files")
    max_bytes: int = Field(default=100 * 1024 * 1024, ge=1)


class BatchesSettings(_Section):
    """``[batches]``: the batch runner (``/v1/batches``, docs/api.md "Batches").

    Every ``servehall serve`` replica runs one runner: it claims batch lines from the
    records database and sends each through the replica's own request path.
    ``max_concurrent_lines`` is the most lines one replica sends at once (it claims up
    to as many more ahead, waiting for a send slot); the runner
    claims no new line while any model's scheduler queue has a waiting request (online
    traffic first). Lines are scheduled at ``priority`` (or lower: the owner's own
    priority when that is lower), below every online request at the default 0.
    ``lease_s`` is how long a claimed line stays another replica's after its claim was
    last renewed (a runner renews its claims every ``lease_s / 3``; a line of a replica
    that died is claimed again after it). ``poll_s`` is how often the runner looks for
    work. ``max_lines_per_tenant`` caps the lines of one tenant (a principal without a
    tenant counts alone) in flight on one replica, so one tenant's large batch leaves
    room for another's (None: only ``max_concurrent_lines``).

    ``preempt`` (default true) makes batches use idle capacity only: when an online
    request asks for a slot on the replica, the runner stops its running lines at once
    (the engine drops them at its next step; each is recorded 499 ``preempted``, goes
    back to ``pending`` and runs again later from its prompt), and it claims no line
    while an online request is in flight or for ``online_quiet_s`` seconds after the
    last one ended. Work is lost on every preempted line, so under steady online
    traffic a batch waits; false: running lines finish beside online requests (they
    share the engine's steps) and only new claims wait for the queue to empty.
    """

    enabled: bool = True
    max_concurrent_lines: int = Field(default=4, ge=1, le=1024)
    max_lines_per_tenant: int | None = Field(default=None, ge=1, le=1024)
    priority: int = -1000
    lease_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    poll_s: float = Field(default=0.25, gt=0, le=60, allow_inf_nan=False)
    preempt: bool = True
    online_quiet_s: float = Field(default=0.5, ge=0, le=3600, allow_inf_nan=False)


class ResponsesSettings(_Section):
    """``[responses]``: stored responses of ``/v1/responses`` (docs/api.md "Responses").

    A request with ``store: true`` (the default, as in OpenAI) keeps its response and
    conversation in the records database (``response_object``) for ``retention_days``
    days, readable by ``GET /v1/responses/{id}`` and continued by
    ``previous_response_id``, by the principal that made it only; expired rows are
    invisible and purged as new ones are stored. ``store = false`` here keeps nothing
    (a request's ``store: true`` is then answered but not stored: its ``store`` field
    says false).
    """

    store: bool = True
    retention_days: float = Field(default=30.0, gt=0, allow_inf_nan=False)


class TracingSettings(_Section):
    """``[tracing]``: OpenTelemetry traces of inference requests (docs/operations.md,
    "Traces"). Off by default; needs the ``tracing`` extra (``opentelemetry-sdk`` and the
    OTLP/HTTP exporter).

    ``endpoint`` is the OTLP/HTTP traces URL (protobuf POSTs); ``sample_ratio`` the share
    of new traces kept (a caller's sampled ``traceparent`` is always followed);
    ``headers`` extra HTTP headers for the collector (e.g. an auth token);
    ``export_timeout_s`` the timeout of one export.
    """

    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = Field(default="servehall", min_length=1)
    sample_ratio: float = Field(default=1.0, ge=0, le=1)
    headers: dict[str, Secret] = Field(default_factory=dict)
    export_timeout_s: float = Field(default=10.0, gt=0)


def _default_cache_dir() -> Path:
    """``$SERVEHALL_CACHE_DIR/models``, else ``~/.cache/servehall/models`` (like the
    other caches, :func:`servehall.engines.cache.servehall_cache_dir`)."""
    base = os.environ.get("SERVEHALL_CACHE_DIR") or "~/.cache/servehall"
    return Path(base).expanduser() / "models"


class ModelStoreSettings(_Section):
    """``[model_store]``: where models given by URL (``[[models]] path = "s3://…"`` or
    ``"https://…"``) are cached, and how the S3 store is reached (docs/models.md, "Model
    sources"; :mod:`servehall.sources`).

    ``cache_dir`` (default ``$SERVEHALL_CACHE_DIR/models``, else
    ``~/.cache/servehall/models``) is the node-local cache every servehall process shares
    (a complete model per directory, renamed into place once every file matched the
    manifest). ``cache_max_bytes`` bounds it (0: no bound): before and after a pull the
    least recently used models no process holds are removed until the cache fits.
    ``s3_endpoint_url`` (any S3-compatible store; None: AWS, or ``AWS_ENDPOINT_URL``),
    ``s3_region`` and the key pair (secrets: ``{ env = "NAME" }`` or ``{ file = … }``)
    default to the standard ``AWS_*`` variables and files when unset. ``timeout_s``
    bounds a connect and each read of a download; ``pull_attempts`` is how often a
    version's start tries a pull while the store does not answer.
    """

    cache_dir: Path = Field(default_factory=_default_cache_dir)
    cache_max_bytes: int = Field(default=0, ge=0)
    s3_endpoint_url: str | None = Field(default=None, pattern=r"^https?://")
    s3_region: str | None = None
    s3_access_key_id: Secret | None = None
    s3_secret_access_key: Secret | None = None
    timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    #: A version's start tries the pull this many times while the store does not answer
    #: (waiting 1, 2, 4… seconds in between) before it fails.
    pull_attempts: int = Field(default=3, ge=1, le=10)

    @field_validator("cache_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()


class SinkConfig(_Section):
    """``[[sinks]]``: one record sink (``sql``, ``jsonl``, or a plugin's)."""

    name: str
    required: bool = False
    options: dict[str, Any] = Field(default_factory=dict)
