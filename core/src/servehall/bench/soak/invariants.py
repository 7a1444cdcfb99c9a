"""The soak's invariants I1–I6, as pure functions over what the clients saw and what the
server left behind (rows, files, the audit verdict, RSS samples).

Each check returns an :class:`InvariantResult`: the number of things checked, the
violations (one line each, capped when printed) and notes (explained exceptions, the
figures). :func:`exit_status` is 1 when any invariant has a violation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

STATUS_CLIENT_CLOSED = 499
"""What ``request_log.status_code`` says for a client that left (nginx's code)."""

UNRECORDED_PATHS = frozenset({"/tokenize", "/detokenize", "/v1/files", "/v1/batches"})
"""Routes that write no ``request_log`` row and send no ``x-request-id`` (they generate
nothing; see :mod:`servehall.api.tokenize`, :mod:`servehall.api.files` and
:mod:`servehall.api.batches`): I2 and I3 leave their answers out."""


@dataclass(slots=True)
class Observation:
    """One request as the client saw it.

    Attributes:
        shape: the mix's name of the request shape (``chat_stream``, ``bad_json``...).
        path: the URL path posted to.
        started: monotonic seconds when the request was sent.
        ended: monotonic seconds when the client was done with it.
        status: the HTTP status; 0 when no response came (connection error, timeout).
        request_id: the response's ``x-request-id`` (None when it had none).
        stream: the response was an SSE stream.
        disconnected: the client left on purpose after the first event.
        usage: ``(prompt_tokens, completion_tokens)`` the client was told (the JSON's
            ``usage``, or the stream's usage chunk); None when it was not told.
        stream_error: the status of an error event inside a 200 stream (500 when the
            envelope names no status), None when there was none.
        error: a transport failure, or the code and message of a 5xx envelope (one line).
    """

    shape: str
    path: str
    started: float
    ended: float
    status: int
    request_id: str | None = None
    stream: bool = False
    disconnected: bool = False
    usage: tuple[int, int] | None = None
    stream_error: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Row:
    """The ``request_log`` columns the soak compares."""

    request_id: str
    status_code: int
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """``[start, end]`` monotonic seconds during which a declared fault allows 503s."""

    name: str
    start: float
    end: float

    def covers(self, obs: Observation) -> bool:
        """The request overlapped the window."""
        return obs.started <= self.end and obs.ended >= self.start


@dataclass(slots=True)
class InvariantResult:
    """One invariant's verdict."""

    key: str
    title: str
    checked: int = 0
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def lines(self, limit: int = 10) -> list[str]:
        """Printable lines: the verdict with its counts, then notes and violations."""
        if self.skipped is not None:
            return [f"{self.key} SKIP  {self.title}: {self.skipped}"]
        verdict = "PASS" if self.ok else "FAIL"
        out = [
            f"{self.key} {verdict}  {self.title}: {self.checked} checked, "
            f"{len(self.violations)} violation(s)"
        ]
        out += [f"     note: {n}" for n in self.notes]
        out += [f"     - {v}" for v in self.violations[:limit]]
        if len(self.violations) > limit:
            out.append(f"     ... and {len(self.violations) - limit} more")
        return out


def _in_fault(obs: Observation, faults: Sequence[FaultWindow]) -> FaultWindow | None:
    """The fault window ``obs`` overlapped: the one its answer came in, if any (a long
    request may overlap two windows; its failure belongs to the later one), else the
    first it overlapped."""
    ended_in = (w for w in faults if w.start <= obs.ended <= w.end)
    return next(ended_in, None) or next((w for w in faults if w.covers(obs)), None)


def check_no_5xx(
    observations: Sequence[Observation], faults: Sequence[FaultWindow] = ()
) -> InvariantResult:
    """I1: no 5xx status, no 5xx error event inside a stream and no request left without
    an answer — except 503s (and, for a transport failure, no answer) during a declared
    fault window."""
    res = InvariantResult("I1", "no 5xx outside declared faults", checked=len(observations))
    allowed = Counter[str]()
    for o in observations:
        window = _in_fault(o, faults)
        code = o.status if o.status >= 500 else (o.stream_error or 0)
        if (o.status == 0 or (o.error and o.status < 500)) and not o.disconnected:
            what = "no answer" if o.status == 0 else f"status {o.status}, then cut"
            if window is not None:
                allowed[f"{what.split(',')[0]} during {window.name}"] += 1
            else:
                res.violations.append(f"{o.shape} {o.path}: {what} ({o.error})")
        elif code >= 500:
            if code == 503 and window is not None:
                why = (o.error or "").split(":", 1)[0] if o.status == 503 else "stream event"
                allowed[f"503 ({why or 'no code'}) during {window.name}"] += 1
            else:
                where = "stream error event" if o.status < 500 else "status"
                res.violations.append(
                    f"{o.shape} {o.path}: {where} {code} ({o.request_id}; {o.error})"
                )
    res.notes += [f"{n} allowed: {what}" for what, n in sorted(allowed.items())]
    return res


def check_one_row_each(
    observations: Sequence[Observation],
    row_ids: Iterable[str],
    rejected_ids: Iterable[str] = (),
) -> InvariantResult:
    """I2: every response's ``x-request-id`` has exactly one ``request_log`` row.

    ``row_ids`` is every ``request_id`` of the rows found for the soak's ids (one entry
    per row, so duplicates show); an id with no row that is among ``rejected_ids`` (a
    rejected record kept with its error) is explained, not a violation. A response
    without an id is a violation unless no answer came at all. Answers of
    :data:`UNRECORDED_PATHS` are left out (one that carries an id is a violation)."""
    counts = Counter(row_ids)
    rejected = set(rejected_ids)
    res = InvariantResult("I2", "one request_log row per x-request-id")
    explained = 0
    no_id = 0
    unrecorded = 0
    for o in observations:
        if o.path in UNRECORDED_PATHS:
            unrecorded += 1
            if o.request_id is not None:
                res.violations.append(
                    f"{o.shape} {o.path}: status {o.status} with x-request-id "
                    f"{o.request_id} on a route that records nothing"
                )
            continue
        if o.request_id is None:
            if o.status != 0:
                no_id += 1
                res.violations.append(f"{o.shape} {o.path}: status {o.status} without x-request-id")
            continue
        res.checked += 1
        n = counts.get(o.request_id, 0)
        if n == 1:
            continue
        if n == 0 and o.request_id in rejected:
            explained += 1
            continue
        what = "no row" if n == 0 else f"{n} rows"
        res.violations.append(f"{o.shape} {o.request_id} (status {o.status}): {what}")
    if explained:
        res.notes.append(f"{explained} missing row(s) explained by a rejected record")
    if unrecorded:
        res.notes.append(
            f"{unrecorded} answer(s) of {', '.join(sorted(UNRECORDED_PATHS))} left out "
            "(not recorded)"
        )
    missing = sum(1 for v in res.violations if v.endswith(": no row"))
    if missing:
        res.notes.append(f"{missing} of {res.checked} response(s) have no row")
    return res


def check_rows_match(
    observations: Sequence[Observation], rows: Mapping[str, Row]
) -> InvariantResult:
    """I3: the row's status and token counts equal what the client got.

    Status: the client's status, or 499 for a client that left or whose connection was
    cut after the response began (or the client's status when the server had finished
    before it noticed); a stream that carried an error event may record
    that error's status. Tokens: compared when the client was told a usage (JSON
    ``usage``, or a streamed ``include_usage`` chunk)."""
    res = InvariantResult("I3", "row status and tokens equal what the client got")
    for o in observations:
        if o.request_id is None or o.request_id not in rows:
            continue
        row = rows[o.request_id]
        res.checked += 1
        if o.disconnected or (o.error is not None and o.status < 500):
            # left on purpose, or cut (e.g. its frontend process was killed): the server
            # saw a client that left, unless it had finished first
            ok_status = {STATUS_CLIENT_CLOSED, o.status}
        elif o.status == 0:
            ok_status = {STATUS_CLIENT_CLOSED}
        else:
            ok_status = {o.status}
        if o.stream_error is not None:
            ok_status.add(o.stream_error)
        if row.status_code not in ok_status:
            res.violations.append(
                f"{o.shape} {o.request_id}: client got {o.status}, row says {row.status_code}"
            )
            continue
        if o.usage is not None and (row.prompt_tokens, row.completion_tokens) != o.usage:
            res.violations.append(
                f"{o.shape} {o.request_id}: client usage {o.usage}, "
                f"row ({row.prompt_tokens}, {row.completion_tokens})"
            )
    told = sum(1 for o in observations if o.usage is not None)
    res.notes.append(f"token counts compared for {told} response(s) that reported usage")
    return res


@dataclass(frozen=True, slots=True)
class LeftoverFile:
    """A spill or quarantine file found after the stop: its path, the records it holds,
    and how many of them carry an error (an explained rejection)."""

    path: str
    kind: str  # "spill" | "quarantine"
    records: int
    explained: int


@dataclass(frozen=True, slots=True)
class Rejection:
    """One rejected record (a ``record_rejected`` row or a quarantine file line)."""

    request_id: str | None
    error: str | None


def check_no_leftovers(
    files: Sequence[LeftoverFile], rejections: Sequence[Rejection]
) -> InvariantResult:
    """I4: after a clean stop no spill file holds records, and a quarantine file or
    ``record_rejected`` table exists only with rejections, each with its error."""
    res = InvariantResult(
        "I4", "no spill/quarantine left unless rejected, each rejection explained"
    )
    res.checked = len(files) + len(rejections)
    for f in files:
        if f.kind == "spill" and f.records:
            res.violations.append(f"spill file {f.path} still holds {f.records} record(s)")
        elif f.kind == "quarantine" and f.records > f.explained:
            res.violations.append(
                f"quarantine file {f.path}: {f.records - f.explained} of {f.records} "
                "record(s) without an error"
            )
    for r in rejections:
        if not r.error:
            res.violations.append(f"rejected record {r.request_id}: no error given")
    if rejections:
        res.notes.append(f"{len(rejections)} rejected record(s), each with its error")
    return res


def check_audit(returncode: int | None, output: str) -> InvariantResult:
    """I5: ``servehall audit verify`` exits 0 (None: it could not be run)."""
    res = InvariantResult("I5", "servehall audit verify passes", checked=1)
    first = next((line for line in output.splitlines() if line.strip()), "")
    if returncode != 0:
        res.violations.append(f"exit status {returncode}: {output.strip()[-600:]}")
    elif first:
        res.notes.append(first.strip()[:200])
    return res


def rss_growth_mib(samples: Sequence[tuple[float, int]], warmup_s: float) -> tuple[float, float]:
    """``(baseline, growth)`` in MiB from ``(seconds since start, RSS bytes)`` samples.

    The baseline is the highest sample of the warm-up (``t <= warmup_s``; the first
    sample when none is), so that caches filling up to their bound (compiled grammars,
    a restarted worker loading its model) are not counted; the growth is the highest
    sample after the warm-up minus the baseline (0 when there is none)."""
    if not samples:
        return 0.0, 0.0
    warm = [b for t, b in samples if t <= warmup_s] or [samples[0][1]]
    after = [b for t, b in samples if t > warmup_s]
    base = max(warm)
    return base / 2**20, (max(after) - base) / 2**20 if after else 0.0


def check_rss(
    samples: Sequence[tuple[float, int]], bound_mib: float, warmup_s: float = 10.0
) -> InvariantResult:
    """I6: the server's RSS (process tree, summed) after the warm-up grows by at most
    ``bound_mib`` over its highest warm-up figure (:func:`rss_growth_mib`)."""
    res = InvariantResult("I6", "server RSS growth bounded", checked=len(samples))
    if not samples:
        res.skipped = "no server process to sample (give --pid or let the soak start it)"
        return res
    base, growth = rss_growth_mib(samples, warmup_s)
    mib = [b / 2**20 for _, b in samples]
    res.notes.append(
        f"RSS first {mib[0]:.0f} MiB, warm-up high {base:.0f} MiB (first {warmup_s:.0f} s), "
        f"end {mib[-1]:.0f} MiB, peak {max(mib):.0f} MiB; growth after warm-up "
        f"{growth:+.0f} MiB (bound {bound_mib:g} MiB)"
    )
    if growth > bound_mib:
        res.violations.append(
            f"RSS grew by {growth:.0f} MiB after the warm-up (> {bound_mib:g} MiB)"
        )
    return res


def check_api_restarts(
    faults: Sequence[FaultWindow],
    observations: Sequence[Observation],
    restarts: float | None,
    pids: Sequence[int],
    api_processes: int,
) -> InvariantResult:
    """A: after ``api-kill``, the killed frontend processes came back.

    Every ``api-kill`` window counts once: ``servehall_api_process_restarts_total``
    (``restarts``, read from ``/metrics`` after the traffic) must be at least the number
    of kills, and ``api_processes`` frontends (``pids``) must be running. The notes say,
    for the requests in flight at each kill (started before it, ended after), how many
    were cut and how many were answered whole: the other frontends' streams."""
    kills = [w for w in faults if w.name == "api-kill"]
    res = InvariantResult("A", "killed API processes came back", checked=len(kills))
    if restarts is None:
        res.violations.append("servehall_api_process_restarts_total could not be read")
    elif restarts < len(kills):
        res.violations.append(
            f"{len(kills)} API process(es) killed, {restarts:g} restart(s) counted"
        )
    if len(pids) != api_processes:
        res.violations.append(
            f"{len(pids)} frontend process(es) running after the traffic, "
            f"{api_processes} configured"
        )
    cut = whole = 0
    for w in kills:
        for o in observations:
            if o.started < w.start < o.ended and not o.disconnected:
                if o.status == 0 or o.error is not None:
                    cut += 1
                else:
                    whole += 1
    res.notes.append(
        f"restarts counted {restarts if restarts is None else format(restarts, 'g')}, "
        f"frontends now {list(pids)}; in flight at the kill(s): {cut} cut, "
        f"{whole} answered whole"
    )
    return res


def exit_status(results: Sequence[InvariantResult]) -> int:
    """0 when no invariant has a violation, else 1."""
    return 1 if any(r.violations for r in results) else 0
