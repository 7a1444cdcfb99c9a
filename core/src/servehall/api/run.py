"""The state of one inference request while it runs (:class:`InferenceRun`), and what
the request record and the ``usage`` object take from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from servehall.admission.filters import FilterVerdict
from servehall.admission.principal import Principal
from servehall.api.state import ApiState
from servehall.plugin.host import ServedModel
from servehall.serving.choice import ChoiceStream
from servehall.serving.context import RequestContext
from servehall.structured.request import StructuredRequest


@dataclass
class InferenceRun:
    """Mutable state of one request, readable by the outer handler after cancellation.

    ``created`` is the OpenAI ``created`` time (Unix seconds); ``choices`` holds one
    :class:`ChoiceStream` per choice once the request is admitted (``n`` of them);
    ``prompt_tokens`` counts the rendered prompt's token ids; ``pinned_version`` is the
    ``x-servehall-model-version`` request header (None: absent).
    """

    api: ApiState
    ctx: RequestContext
    principal: Principal
    request_id: str
    created: int
    response_started: bool = False
    choices: list[ChoiceStream] = field(default_factory=list)
    prompt_text: str = ""
    prompt_tokens: int = 0
    input_verdicts: list[FilterVerdict] = field(default_factory=list)
    structured: StructuredRequest | None = None
    pinned_version: str | None = None
    served: ServedModel | None = None


def fill_record(run: InferenceRun) -> None:
    """Copy token counts, the first token's time (TTFT), filter verdicts and the names of
    the tools called into the request record of ``run.ctx`` (safe to call more than
    once)."""
    rec = run.ctx.record
    rec.prompt_tokens = run.prompt_tokens
    if run.choices:
        rec.completion_tokens = sum(c.completion_tokens for c in run.choices)
        firsts = [c.first_token_at for c in run.choices if c.first_token_at is not None]
        if firsts:
            run.ctx.token(min(firsts))
        run.ctx.inter_token_s = [g for c in run.choices for g in c.inter_token_s]
    run.ctx.verdicts = [*run.input_verdicts, *(v for c in run.choices for v in c.verdicts)]
    if any(c.tools is not None for c in run.choices):
        rec.tool_calls = [call.name for c in run.choices for call in c.tool_calls]


def count_tool_calls(run: InferenceRun) -> None:
    """Add the request's parsed and failed tool calls to ``servehall_tool_calls_total``
    (once, when its choices have finished)."""
    model = run.ctx.record.model or ""
    version = run.ctx.record.version or ""
    counter = run.api.metrics.tool_calls
    for c in run.choices:
        if c.tools is not None:
            if c.tools.parsed:
                counter.labels(model, version, "parsed").inc(c.tools.parsed)
            if c.tools.failed:
                counter.labels(model, version, "failed").inc(c.tools.failed)


async def record_before_last_byte(run: InferenceRun) -> None:
    """With a sink that confirms writes (``[[sinks]] options.commit_wait_s``): finish the
    request's record (status 200) now and wait until it is written, so that the client
    receives the response's last bytes only once its request-log row is stored — a
    replica killed afterwards loses no record of a request its client saw complete.
    Without such a sink: nothing (the record is emitted after the response, as usual)."""
    bus = run.api.host.records
    if bus is None or not getattr(bus, "commit_wait", False):
        return
    fill_record(run)
    run.ctx.finish(
        200,
        finish_reason=run.choices[0].finish_reason if run.choices else None,
        prompt_text=run.prompt_text,
        completion_text=completion_text(run),
    )
    await bus.wait_written(run.ctx.record)


def completion_text(run: InferenceRun) -> str | None:
    """The first choice's text so far (what the record stores), or None before admission."""
    return run.choices[0].text if run.choices else None


def usage(run: InferenceRun) -> dict[str, int]:
    """The OpenAI ``usage`` object: prompt, completion (all choices) and total tokens."""
    completion = sum(c.completion_tokens for c in run.choices)
    return {
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": run.prompt_tokens + completion,
    }
