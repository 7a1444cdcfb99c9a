"""The accuracy gate: a version answers a golden set before it takes traffic.

``[[models]] gate = { golden = "golden.jsonl", metric = "exact", min = 0.95 }``
(:class:`~servehall.config.models.GateSettings`). :func:`run_gate` sends every prompt
of the golden file through the version's engine greedily (temperature 0, at most
``max_tokens`` tokens, all prompts at once so the engine batches them) and scores the
answers against the file's references — or, with ``against = "serving"``, against the
answers of the name's version now serving, computed the same way at the same moment.
:func:`~servehall.host.versions.start_version` runs it after the engine started and
before the version exists for the router, so a version below ``min`` never receives a
request: :class:`GateFailed` (a :class:`~servehall.errors.ConfigError` carrying the
:class:`GateReport`) refuses it. ``servehall models eval`` runs the same check offline.

Metrics (each a number in [0, 1]; the gate's score is the mean over prompts):

* ``exact``: 1 when the answer's text equals the reference's, both with leading and
  trailing whitespace removed, else 0 — the share of prompts answered exactly.
* ``token_agreement``: the answer and the reference are both tokenized with the
  version's tokenizer (no special tokens), giving ``a`` and ``r``; the prompt's figure
  is ``|{i < min(len a, len r) : a[i] = r[i]}| / max(len a, len r)`` (1 when both are
  empty): matching positions over the longer length, so a missing or extra tail counts
  against it and one early divergence does not zero a prompt whose later tokens
  realign.
* ``logprob_kl`` is refused by :func:`check_gates`: no engine of servehall exposes
  per-token log-probabilities, which a KL divergence needs.

The golden file is JSON lines: ``{"prompt": "...", "reference": "..."}`` per line (blank
lines skipped; ``reference`` optional with ``against = "serving"``; other keys ignored),
at most :data:`MAX_CASES` lines. Prompts are plain completion text (like
``/v1/completions``: the tokenizer's special tokens such as BOS added, no chat
template).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servehall.config.models import GateSettings, ModelConfig
from servehall.engines.contract import SamplingParams
from servehall.errors import ConfigError

if TYPE_CHECKING:
    from servehall.engines.contract import Engine
    from servehall.plugin.host import Host

log = logging.getLogger("servehall.gate")

#: Most cases one golden file may hold.
MAX_CASES = 10_000
#: Metrics a gate can compute.
METRICS = ("exact", "token_agreement")
_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class GoldenCase:
    """One golden line: its 1-based ``line`` number, ``prompt`` and ``reference``
    (None when the file gives none)."""

    line: int
    prompt: str
    reference: str | None


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One prompt's outcome: the ``answer`` text, the ``reference`` it was compared
    with and the metric's ``score`` in [0, 1]."""

    line: int
    prompt: str
    reference: str
    answer: str
    score: float


@dataclass
class GateReport:
    """A gate run: ``score`` (mean of the cases' scores) against ``minimum``; ``key``
    the version, ``against`` ``"reference"`` or the serving version's key."""

    key: str
    metric: str
    minimum: float
    golden: str
    against: str
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        """Mean score over the cases (0 for none)."""
        return sum(c.score for c in self.cases) / len(self.cases) if self.cases else 0.0

    @property
    def passed(self) -> bool:
        """True when ``score >= minimum``."""
        return self.score >= self.minimum

    def summary(self) -> str:
        """One line: ``accuracy gate of m@v2 failed: exact 0.333 < min 0.950 over 3 prompts
        (golden.jsonl, against references)``."""
        n = len(self.cases)
        verdict = "passed" if self.passed else "failed"
        op = ">=" if self.passed else "<"
        against = "references" if self.against == "reference" else f"{self.against} (serving)"
        return (
            f"accuracy gate of {self.key} {verdict}: {self.metric} {self.score:.3f} {op} "
            f"min {self.minimum:.3f} over {n} prompt{'' if n == 1 else 's'} ({self.golden}, "
            f"against {against})"
        )

    def figures(self, per_prompt: int = 50) -> dict[str, Any]:
        """JSON-able figures for the audit event: metric, score, min, prompts, golden,
        against, seconds and the first ``per_prompt`` prompts' ``[line, score]``."""
        return {
            "metric": self.metric,
            "score": round(self.score, 6),
            "min": self.minimum,
            "prompts": len(self.cases),
            "golden": self.golden,
            "against": self.against,
            "seconds": round(self.seconds, 3),
            "per_prompt": [[c.line, round(c.score, 6)] for c in self.cases[:per_prompt]],
        }


class GateFailed(ConfigError):
    """A version scored below its gate's ``min``; ``report`` holds the figures."""

    def __init__(self, report: GateReport) -> None:
        super().__init__(report.summary())
        self.report = report


# --- the golden file -------------------------------------------------------------------


def read_golden(path: Path, *, need_reference: bool = True) -> list[GoldenCase]:
    """The cases of golden file ``path`` (see the module docstring).

    Raises:
        ConfigError: the file is missing or unreadable, not UTF-8, a line is not a JSON
            object with a non-empty string ``prompt`` (and a string ``reference`` when
            ``need_reference``), it has no case, or more than :data:`MAX_CASES`. The
            message names the file and the line.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"golden file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"golden file {path} is not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"golden file {path} cannot be read: {exc.strerror or exc}") from None
    cases: list[GoldenCase] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"golden file {path} line {n}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise ConfigError(f'{where}: expected an object {{"prompt": ..., "reference": ...}}')
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ConfigError(f'{where}: "prompt" must be a non-empty string')
        reference = obj.get("reference")
        if reference is not None and not isinstance(reference, str):
            raise ConfigError(f'{where}: "reference" must be a string')
        if reference is None and need_reference:
            raise ConfigError(
                f'{where}: no "reference" (needed unless the gate compares against = "serving")'
            )
        cases.append(GoldenCase(n, prompt, reference))
        if len(cases) > MAX_CASES:
            raise ConfigError(f"golden file {path}: more than {MAX_CASES} cases")
    if not cases:
        raise ConfigError(f"golden file {path} has no cases")
    return cases


def check_gate(gate: GateSettings, task: str = "generate") -> list[tuple[str, str]]:
    """``(key, message)`` problems of one gate (keys relative to ``gate``): the metric,
    the task and the golden file (:func:`read_golden`)."""
    errs: list[tuple[str, str]] = []
    if gate.metric not in METRICS:
        errs.append(
            (
                "metric",
                f"{gate.metric!r} is not available: servehall's engines do not expose "
                f"per-token log-probabilities; use one of {', '.join(METRICS)}",
            )
        )
    if task != "generate":
        errs.append(("", f'a gate checks generated text; task = "{task}" has none'))
    try:
        read_golden(gate.golden, need_reference=gate.against == "reference")
    except ConfigError as exc:
        errs.append(("golden", exc.message))
    return errs


def check_gates(models: Sequence[ModelConfig | None]) -> list[tuple[str, str]]:
    """Every ``(key path, message)`` problem of the ``[[models]]`` entries' gates (used
    by ``config check``, ``serve`` and live config changes). ``None`` entries (set aside
    by ``config check``) are skipped; indexes refer to the list as given."""
    errs: list[tuple[str, str]] = []
    for i, mc in enumerate(models):
        if mc is not None and mc.gate is not None:
            for key, msg in check_gate(mc.gate, mc.task):
                errs.append((f"models[{i}].gate" + (f".{key}" if key else ""), msg))
    return errs


# --- metrics ---------------------------------------------------------------------------


def exact_score(answer: str, reference: str) -> float:
    """1.0 when ``answer`` equals ``reference`` after stripping surrounding whitespace,
    else 0.0."""
    return 1.0 if answer.strip() == reference.strip() else 0.0


def token_agreement(answer: Sequence[int], reference: Sequence[int]) -> float:
    """Matching token positions over the longer sequence's length, in [0, 1]: 1.0 for
    two empty sequences (see the module docstring)."""
    longest = max(len(answer), len(reference))
    if longest == 0:
        return 1.0
    same = sum(1 for a, r in zip(answer, reference, strict=False) if a == r)
    return same / longest


def score_case(metric: str, answer: str, reference: str, tokenizer: Any) -> float:
    """The ``metric`` figure of one answer against its reference; ``tokenizer`` (a
    :class:`~servehall.text.tokenizer.TextTokenizer`) tokenizes both for
    ``token_agreement``."""
    if metric == "exact":
        return exact_score(answer, reference)
    if metric == "token_agreement":
        return token_agreement(tokenizer.encode_plain(answer), tokenizer.encode_plain(reference))
    raise ConfigError(f"unknown gate metric {metric!r}; known: {', '.join(METRICS)}")


# --- running ---------------------------------------------------------------------------


async def greedy_answer(engine: Engine, tokenizer: Any, prompt: str, max_tokens: int) -> str:
    """The engine's greedy answer to completion prompt ``prompt`` (at most
    ``max_tokens`` tokens; EOS and special tokens left out of the text).

    Raises:
        RuntimeError: the engine ended the request with an error.
    """
    ids = tokenizer.encode_plain(prompt, add_special_tokens=True) or [0]
    eos = set(engine.model_info.eos_token_ids)
    rid = f"gate-{next(_ids)}"
    out: list[int] = []
    stream: Any = engine.add_request(
        rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0)
    )
    try:
        async for delta in stream:
            out.extend(t for t in delta.token_ids if t not in eos)
            if delta.finish_reason == "error":
                raise RuntimeError(delta.error or "engine error")
            if delta.finish_reason is not None:
                break
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()
    return str(tokenizer.decode(out))


async def answers(
    engine: Engine, tokenizer: Any, prompts: Sequence[str], max_tokens: int
) -> list[str]:
    """Greedy answers to every prompt, sent at once (the engine batches them)."""
    return list(
        await asyncio.gather(*(greedy_answer(engine, tokenizer, p, max_tokens) for p in prompts))
    )


def _serving_peer(host: Host, mc: ModelConfig) -> Any:
    """The version of ``mc.name`` now serving with the highest weight (not ``mc``), or
    None."""
    from servehall.plugin.host import model_key

    key = model_key(mc.name, mc.version)
    peers = [
        s
        for s in host.models.values()
        if s.name == mc.name and s.key != key and s.state == "serving" and s.weight > 0
    ]
    return max(peers, key=lambda s: s.weight, default=None)


async def evaluate(
    key: str,
    gate: GateSettings,
    engine: Engine,
    tokenizer: Any,
    *,
    reference_engine: Engine | None = None,
    reference_tokenizer: Any = None,
    against: str = "reference",
) -> GateReport:
    """Run ``gate``'s golden set through ``engine`` and score it (see the module
    docstring). With ``reference_engine`` the references are its greedy answers
    (``against`` names it in the report).

    Raises:
        ConfigError: the golden file cannot be read (:func:`read_golden`), or the run
            took longer than ``gate.timeout_s`` or the engine failed (the message says
            which).
    """
    cases = read_golden(gate.golden, need_reference=reference_engine is None)
    prompts = [c.prompt for c in cases]
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(gate.timeout_s):
            got = await answers(engine, tokenizer, prompts, gate.max_tokens)
            if reference_engine is not None:
                refs = await answers(
                    reference_engine, reference_tokenizer or tokenizer, prompts, gate.max_tokens
                )
            else:
                refs = [c.reference or "" for c in cases]
    except TimeoutError:
        raise ConfigError(
            f"accuracy gate of {key}: {len(cases)} prompts not answered within "
            f"timeout_s = {gate.timeout_s:g}"
        ) from None
    except Exception as exc:
        raise ConfigError(f"accuracy gate of {key}: the engine failed: {exc}") from None
    report = GateReport(
        key=key,
        metric=gate.metric,
        minimum=gate.min,
        golden=str(gate.golden),
        against=against,
        seconds=time.monotonic() - t0,
    )
    for case, answer, ref in zip(cases, got, refs, strict=True):
        score = score_case(gate.metric, answer, ref, tokenizer)
        report.cases.append(CaseResult(case.line, case.prompt, ref, answer, score))
    return report


async def run_gate(host: Host, mc: ModelConfig, engine: Engine, tokenizer: Any) -> GateReport:
    """The gate of version ``mc`` on its started ``engine``: evaluated, logged and
    audited (``model.gate_passed`` / ``model.gate_failed``, target the version, with
    :meth:`GateReport.figures` and the replica).

    Raises:
        GateFailed: the score is below ``min`` (the report is attached).
        ConfigError: the golden file, a timeout, an engine failure, or ``against =
            "serving"`` with no other version of the name serving.
    """
    from servehall.plugin.host import model_key

    gate = mc.gate
    assert gate is not None
    key = model_key(mc.name, mc.version)
    peer = None
    if gate.against == "serving":
        peer = _serving_peer(host, mc)
        if peer is None:
            raise ConfigError(
                f'accuracy gate of {key}: against = "serving", but no other version of '
                f"{mc.name!r} is serving with weight > 0"
            )
    log.info("model %s: running its accuracy gate (%s)", key, gate.golden)
    report = await evaluate(
        key,
        gate,
        engine,
        tokenizer,
        reference_engine=peer.engine if peer is not None else None,
        reference_tokenizer=peer.tokenizer if peer is not None else None,
        against=peer.key if peer is not None else "reference",
    )
    (log.info if report.passed else log.error)("%s", report.summary())
    if host.records is not None:
        from servehall.records.types import AuditEvent

        host.records.audit(
            AuditEvent(
                action="model.gate_passed" if report.passed else "model.gate_failed",
                target=key,
                details={**report.figures(), "replica": host.replica},
            )
        )
    if not report.passed:
        raise GateFailed(report)
    return report
