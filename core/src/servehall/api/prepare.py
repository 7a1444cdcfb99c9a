"""The input processor: a wire request becomes what the engine and the scheduler take.

:func:`prepare` turns a chat or completion body (steps 1, 3, 4 and 5 of the request path,
DESIGN.md "The request path") into a :class:`Prepared`: the validated request, the model
version it runs on, the prompt's token ids, one set of sampling parameters per choice,
the tool plan and its decoding constraint, the structured-output request, the stop
strings, and the :class:`~servehall.admission.usage.AdmissionRequest` with its
scheduling priority. :meth:`Prepared.choices` then makes the admitted request's choice
streams.

Its parts are shared with the other endpoints that run a model: :func:`serve_model`
(model access, the version choice, an idle-unloaded version loaded, the record's model
fields) and :func:`filter_inputs` (the input filters) serve ``/v1/embeddings`` too;
``/v1/responses`` runs :func:`prepare` on the chat body it translates to.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from servehall.admission.access import check_model_access
from servehall.admission.filters import PromptParts
from servehall.admission.usage import AdmissionRequest
from servehall.api.errors import from_validation_error
from servehall.api.offload import LONG_TEXT, encode_plain, run_heavy
from servehall.api.prompt import chat_turns, prompt_texts
from servehall.api.sampling import check_unsupported, resolve_max_tokens, sampling_params
from servehall.api.state import ApiState
from servehall.api.tools import tool_plan
from servehall.api.tracing import maybe_span
from servehall.api.wire import ChatCompletionRequest, CompletionRequest
from servehall.engines.contract import SamplingParams, StructuredConstraint
from servehall.errors import ContentFilterError, InvalidRequestError, UnsupportedParameterError
from servehall.plugin.host import ServedModel
from servehall.rollout.choose import choose_version
from servehall.rollout.idle import load_on_demand
from servehall.rollout.router import VERSION_HEADER
from servehall.serving.admit import Admitted, admit
from servehall.serving.choice import ChoiceStream
from servehall.serving.priority import request_priority
from servehall.serving.request import RequestState
from servehall.structured.outcome import outcome, requested_kind
from servehall.structured.request import StructuredRequest, structured_request
from servehall.text.budget import check_prompt_chars
from servehall.text.stops import StopMatcher
from servehall.tools.plan import ToolPlan

Kind = Literal["chat", "completion"]


@dataclass(slots=True)
class Prepared:
    """A chat or completion request ready for admission (see the module docstring).

    ``constraint`` is the tool plan's decoding constraint (None: none);
    ``params[i].structured`` is what choice ``i`` decodes under (the tools' constraint or
    the structured request's); ``prompt_param`` is the field a prompt error names
    (``messages`` or ``prompt``).
    """

    req: ChatCompletionRequest | CompletionRequest
    served: ServedModel
    prompt_ids: list[int]
    params: list[SamplingParams]
    stops: list[str]
    plan: ToolPlan | None
    constraint: StructuredConstraint | None
    structured: StructuredRequest | None
    admission: AdmissionRequest
    priority: int

    @property
    def tools_active(self) -> bool:
        """Whether the output is read for tool calls."""
        return self.plan is not None and self.plan.active

    @property
    def constrained(self) -> bool:
        """Whether any choice decodes under a constraint (its first event is awaited
        before the response starts: an engine may refuse the constraint)."""
        return any(p.structured is not None for p in self.params)

    async def admit(self, api: ApiState, state: RequestState) -> Admitted:
        """Steps 3 and 6 for this request (:func:`admit_request`)."""
        return await admit_request(api, state, self.served, self.admission, self.priority)

    def settle_structured(self, state: RequestState) -> None:
        """Note the structured-output outcome of the finished choices (when the request
        asked for structured output)."""
        if self.structured is not None:
            state.structured_outcome = outcome(
                self.structured, ((c.text, c.finish_reason) for c in state.choices)
            )

    def echo(self, state: RequestState) -> str:
        """The prompt text a completion with ``echo`` repeats (else "")."""
        req = self.req
        return state.prompt_text if isinstance(req, CompletionRequest) and req.echo else ""

    def choices(self, state: RequestState) -> list[ChoiceStream]:
        """One choice stream per sampling parameter set, on the request's engine, with
        the model's detokenizer, the stop strings, the output filters and the tool-call
        reader."""
        served, host, plan = self.served, state.host, self.plan
        refusal_param = (
            self.structured.param
            if self.structured is not None
            else (plan.constraint_param() if self.constraint is not None and plan else None)
        )
        return [
            ChoiceStream(
                engine=served.engine,
                index=i,
                request_id=f"{state.request_id}-{i}",
                prompt_ids=self.prompt_ids,
                params=p,
                detok=served.tokenizer.new_detokenizer(),
                stops=StopMatcher(self.stops) if self.stops else None,
                filters=host.plugins.output_filters(host, self.admission)
                if host.plugins.has_output_filters
                else [],
                refusal_param=refusal_param,
                tools=plan.stream(served.tool_parser) if plan and plan.active else None,
            )
            for i, p in enumerate(self.params)
        ]


def validate(kind: Kind, body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
    """Step 1: ``body`` as the wire request of ``kind`` (a 400 naming the first bad
    field)."""
    model = ChatCompletionRequest if kind == "chat" else CompletionRequest
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


async def serve_model(
    api: ApiState, state: RequestState, name: str, user: str | None
) -> ServedModel:
    """Step 3: the version of model ``name`` that serves this request, counted in flight
    (``state.served``; the endpoint's ``finally`` counts it back) and loaded when it was
    idle-unloaded (waiting like a queue); the record names its model, version and
    backend.

    Raises:
        NotFoundError: 404: no such model, or not one the principal may use.
        PermissionDeniedError, InvalidRequestError: a version pin refused
            (:func:`~servehall.rollout.choose.choose_version`).
    """
    check_model_access(state.principal, name, served=bool(api.router.versions(name)))
    served = choose_version(api, name, state.principal, user, state.pinned_version)
    assert served is not None
    served.inflight += 1  # a draining version stops only once this is back to 0
    served.last_used = time.monotonic()
    state.served = served
    if served.state == "unloaded":
        await load_on_demand(api.host, served)
    state.record.model = served.name
    state.record.version = served.version
    state.record.backend = served.backend
    return served


async def admit_request(
    api: ApiState,
    state: RequestState,
    served: ServedModel,
    admission: AdmissionRequest,
    priority: int,
) -> Admitted:
    """Steps 3 and 6 in an ``admission`` span (:func:`servehall.serving.admit.admit`:
    quota reservations, the record bus's check, a scheduler slot); the admitted
    request's response headers are its id, its version and the reservations' ones."""
    with maybe_span(api.tracing, "admission"):
        admitted = await admit(state, served, admission, priority)
    headers = {"x-request-id": state.request_id}
    if served.version:
        headers[VERSION_HEADER] = served.version
    admitted.add_headers(headers)
    return admitted


def filter_inputs(
    api: ApiState, state: RequestState, texts: list[str], endpoint: str, model: str, param: str
) -> list[str]:
    """Step 4: run every input filter over ``texts`` (in a ``filters`` span); their
    verdicts go to ``state``, and the texts as the filters left them (redacted) are
    returned. The first enforced block is a 400 ``content_filter`` naming ``param``."""
    host = api.host
    if not host.input_filters:
        return texts
    parts = PromptParts(list(texts), endpoint, model, state.principal)
    with maybe_span(api.tracing, "filters", servehall__filter_stage="input"):
        for f in host.input_filters:
            verdicts = f.check(parts)
            state.input_verdicts.extend(verdicts)
            for v in verdicts:
                if v.action == "block" and not v.monitor:
                    raise ContentFilterError(
                        f"The prompt was blocked by the content filter (rule '{v.rule}').",
                        param=param,
                    )
    return parts.texts


async def prepare(
    api: ApiState, state: RequestState, kind: Kind, endpoint: str, body: dict[str, Any]
) -> Prepared:
    """The request of ``body`` ready for admission (see the module docstring).

    Raises:
        ServehallError: every refusal before admission, in the request path's order:
            validation, model access and version, the model's task, ``n``, unsupported
            parameters and structured output, tools, input filters, the prompt's length.
    """
    settings = api.host.settings
    req = validate(kind, body)
    state.record.stream = req.stream
    served = await serve_model(api, state, req.model, req.user)
    if served.config is not None and served.config.task == "embed":
        raise InvalidRequestError(
            f"The model '{req.model}' is served for embeddings, not text generation "
            "(use /v1/embeddings).",
            param="model",
            code="wrong_model_task",
        )
    n = req.n or 1
    if n > settings.server.max_n:
        raise InvalidRequestError(
            f"n must be at most {settings.server.max_n} on this server.", param="n"
        )
    state.record.response_format = requested_kind(body)
    try:
        structured = state.structured = structured_request(body)
        check_unsupported(body, req, served.engine.supported_params, structured, served.backend)
    except InvalidRequestError:
        state.structured_outcome = "refused"
        raise
    plan = tool_plan(req) if isinstance(req, ChatCompletionRequest) else None
    constraint, structured = _tool_constraint(state, served, plan, structured)

    prompt_param = "messages" if kind == "chat" else "prompt"
    texts, owners = prompt_texts(req)
    texts = filter_inputs(api, state, texts, endpoint, req.model, prompt_param)
    state.prompt_text = "\n".join(texts)
    prompt_ids = await _tokenize(state, served, req, plan, texts, owners, prompt_param)
    state.prompt_tokens = len(prompt_ids)

    requested = (
        req.max_completion_tokens or req.max_tokens
        if isinstance(req, ChatCompletionRequest)
        else req.max_tokens
    )
    max_tokens = resolve_max_tokens(
        requested,
        len(prompt_ids),
        served.max_model_len,
        settings.server.default_max_tokens,
        prompt_param,
    )
    params = sampling_params(
        req,
        n,
        max_tokens,
        tuple(served.tokenizer.eos_token_ids),
        structured.constraint if structured is not None else None,
    )
    if constraint is not None:
        params = [dataclasses.replace(p, structured=constraint) for p in params]
    admission = AdmissionRequest(
        request_id=state.request_id,
        endpoint=endpoint,
        model=req.model,
        principal=state.principal,
        prompt_tokens=len(prompt_ids),
        max_tokens=max_tokens,
        n=n,
        stream=req.stream,
    )
    priority = request_priority(state.principal, req.priority)
    if state.batch_priority is not None:  # a batch line: below online requests
        priority = min(priority, state.batch_priority)
    state.request_params(max_tokens, req.temperature, req.top_p)
    return Prepared(
        req,
        served,
        prompt_ids,
        params,
        req.stop_list(),
        plan,
        constraint,
        structured,
        admission,
        priority,
    )


def _tool_constraint(
    state: RequestState,
    served: ServedModel,
    plan: ToolPlan | None,
    structured: StructuredRequest | None,
) -> tuple[StructuredConstraint | None, StructuredRequest | None]:
    """The tool plan's decoding constraint and the structured request that remains
    beside it (a forced call drops ``response_format``: OpenAI shapes a forced call's
    arguments by the tool's schema, and ``response_format`` the content, which it has
    not). A constraint beside a structured request, or one the backend cannot decode
    under, is a 400. The model's ``tool_call_grammar = "always"`` applies only without
    a structured request (``response_format`` then shapes the output, as by default)."""
    if plan is None or not plan.active:
        return None, structured
    grammar = served.tool_call_grammar if structured is None else "strict"
    constraint = plan.constraint(served.tool_parser, grammar)
    if constraint is not None and structured is not None and plan.forced:
        structured = state.structured = None
    if constraint is not None and structured is not None:
        state.structured_outcome = "refused"
        raise InvalidRequestError(
            "Strict tools or parallel_tool_calls: false under tool_choice 'auto' "
            "constrain the output already; they cannot be combined with "
            f"'{structured.param.split('.', 1)[0]}'.",
            param=structured.param.split(".", 1)[0],
        )
    if constraint is not None and "structured_output" not in served.engine.supported_params:
        param = plan.constraint_param()
        raise UnsupportedParameterError(
            f"This model's backend cannot constrain decoding, which '{param}' needs here.",
            param=param,
        )
    return constraint, structured


async def _tokenize(
    state: RequestState,
    served: ServedModel,
    req: ChatCompletionRequest | CompletionRequest,
    plan: ToolPlan | None,
    texts: list[str],
    owners: list[int],
    prompt_param: str,
) -> list[int]:
    """Step 5: the prompt's token ids (a chat rendered by the model's template, with the
    tools; a completion's text with the special tokens). A prompt that cannot fit is
    refused before tokenizing, a long one is tokenized on the worker thread; an empty
    one is a 400."""
    tok = served.tokenizer
    check_prompt_chars(
        sum(len(t) for t in texts),
        getattr(tok, "max_token_chars", None),
        served.max_model_len,
        prompt_param,
    )
    if isinstance(req, ChatCompletionRequest):
        turns = chat_turns(req, texts, owners)
        tools = [t.template() for t in plan.tools] if plan and plan.active else None
        if len(state.prompt_text) > LONG_TEXT:
            prompt_ids = await run_heavy(tok.render_chat, turns, tools)
        else:
            prompt_ids = tok.render_chat(turns, tools)
    else:
        prompt_ids = await encode_plain(tok, texts[0])
    if not prompt_ids:
        raise InvalidRequestError("The prompt is empty.", param=prompt_param)
    return prompt_ids
