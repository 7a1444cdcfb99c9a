"""The inference endpoints (``/v1/chat/completions``, ``/v1/completions``) as ASGI apps.

They are raw ASGI callables rather than request/response functions so that the request
path controls the wire: the response starts only after admission (a 503 is still a
status code), each SSE event is one send, and a watcher task notices the client going
away (``http.disconnect``, HTTP/2 ``RST_STREAM``) at any point after the body was read —
waiting in the queue or generating, streaming or not — and cancels the work, which
aborts the engine requests and frees their KV cache.

Steps (DESIGN.md "The request path"): 1 parse + validate → 3 model access (404) and
unsupported parameters → 4 input filters → 5 tokenize + context check → 3 authorize
(reservations) → 6 record-bus admission check + scheduler slot → 7/8/9 engine, output
filters, detokenize, stop strings, SSE → 10 one request record. Authentication (2) runs
in :mod:`servehall.api.auth` before this endpoint is reached. A line of a batch
(:mod:`servehall.batches.runner`) takes the same path; its
:class:`~servehall.batches.call.BatchCall` caps its scheduling priority and names its
batch and ``custom_id`` in the record.

The per-request state is :class:`servehall.serving.request.RequestState` (one object
from the first byte to the record). The parts live beside it: :mod:`servehall.api.prompt`
(prompt texts and chat turns),
:mod:`servehall.api.response` (the JSON response) and :mod:`servehall.api.sse` (the
SSE stream).

``/v1/responses`` (:mod:`servehall.api.responses`) runs this same path: its endpoint
replaces three steps — ``_prepare`` (its body → a chat body), ``_respond`` (the answer's
shape) and ``_public_error`` (errors name its fields).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from typing import Any, Literal

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from servehall.admission.access import check_model_access
from servehall.admission.filters import InputFilter, PromptParts
from servehall.admission.principal import ANONYMOUS
from servehall.admission.scheduler import Slot, Ticket
from servehall.admission.usage import AdmissionRequest, Reservation
from servehall.api.body import check_media_type, drain_body, parse_json_object, read_body
from servehall.api.disconnect import ClientGone, DisconnectWatch
from servehall.api.errors import error_response, from_validation_error
from servehall.api.offload import run_heavy
from servehall.api.prompt import chat_turns, prompt_texts
from servehall.api.response import send_completion
from servehall.api.sampling import check_unsupported, resolve_max_tokens, sampling_params
from servehall.api.sse import send_stream
from servehall.api.state import ApiState
from servehall.api.tools import tool_plan
from servehall.api.tracing import maybe_span, request_span
from servehall.api.wire import ChatCompletionRequest, CompletionRequest
from servehall.batches.call import SCOPE_KEY as BATCH_CALL
from servehall.batches.call import BatchCall
from servehall.errors import (
    ContentFilterError,
    InvalidRequestError,
    PayloadTooLargeError,
    ServehallError,
    UnsupportedParameterError,
)
from servehall.plugin.host import ServedModel
from servehall.rollout.choose import choose_version
from servehall.rollout.idle import load_on_demand
from servehall.rollout.router import VERSION_HEADER
from servehall.serving.choice import ChoiceStream
from servehall.serving.priority import request_priority
from servehall.serving.request import RequestState
from servehall.structured.outcome import outcome, requested_kind
from servehall.structured.request import structured_request
from servehall.text.budget import check_prompt_chars
from servehall.text.stops import StopMatcher

log = logging.getLogger("servehall.api")

_LONG_TEXT = 20_000  # characters; longer prompts are tokenized off the event loop
STATUS_CLIENT_CLOSED = 499


class InferenceEndpoint:
    """ASGI endpoint for one of the two inference routes."""

    def __init__(self, kind: Literal["chat", "completion"]) -> None:
        self.kind: Literal["chat", "completion"] = kind
        self.endpoint = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        self.prefix = "chatcmpl-" if kind == "chat" else "cmpl-"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api: ApiState = scope["app"].state.api
        request = Request(scope, receive)
        principal = scope.get("state", {}).get("principal") or ANONYMOUS
        client = scope.get("client")
        rid = self.prefix + uuid.uuid4().hex
        state = RequestState(
            api.host, api.metrics, rid, self.endpoint, client[0] if client else None
        )
        state.set_principal(principal)
        call = scope.get(BATCH_CALL)
        if isinstance(call, BatchCall):
            state.batch_priority = call.priority
            state.record.batch_id = call.batch_id
            state.record.custom_id = call.custom_id
        state.trace(api.tracing, request_span(scope))
        state.pinned_version = request.headers.get(VERSION_HEADER)
        try:
            body_read = False
            try:
                check_media_type(request)
                raw = await read_body(request, api.host.settings.server.max_body_bytes)
                body_read = True
            except ClientDisconnect:
                state.finish(STATUS_CLIENT_CLOSED, finish_reason="client_disconnect")
                return
            body = parse_json_object(raw)
            raw = b""  # the parsed body is all that is needed from here
            # the client may leave at any point from here: see servehall.api.disconnect
            watch = DisconnectWatch(receive, send)
            watcher = watch.start()
            api.stalls.add(watch)
            work = asyncio.ensure_future(self._handle(api, state, body, watch.send))
            try:
                await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not work.done() and not watch.gone:
                    await asyncio.wait({work})  # response complete: let the work finish
            finally:
                gone = not work.done() or (
                    not work.cancelled() and isinstance(work.exception(), ClientGone)
                )
                if not work.done():
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await work
                api.stalls.discard(watch)
                if gone:
                    if watch.stalled:
                        log.warning(
                            "request %s: the client accepted no response data for %.0f s; "
                            "ended (499 client_stalled)",
                            rid,
                            api.stalls.timeout_s,
                        )
                    state.finish(
                        STATUS_CLIENT_CLOSED,
                        finish_reason="client_disconnect",
                        error_code="client_stalled" if watch.stalled else None,
                        prompt_text=state.prompt_text,
                        completion_text=state.completion_text(),
                    )
                await watch.stop()
            if gone:
                return
            work.result()
        except ServehallError as raised:
            exc = self._public_error(raised)
            if not state.response_started:
                close = isinstance(exc, PayloadTooLargeError) and scope.get("http_version") in (
                    "1.0",
                    "1.1",
                )
                resp = error_response(exc, close=close)
                resp.headers["x-request-id"] = rid
                if state.served is not None and state.served.version:
                    resp.headers[VERSION_HEADER] = state.served.version
                await resp(scope, receive, send)
                if not body_read:
                    await drain_body(receive)
            state.finish(exc.status, error_code=exc.code, prompt_text=state.prompt_text or None)
        except Exception:
            log.exception("request %s failed", rid)
            if not state.response_started:
                await error_response(
                    ServehallError("The server had an error processing the request.")
                )(scope, receive, send)
            state.finish(500, error_code="server_error", finish_reason="error")
        finally:
            if state.served is not None:
                state.served.inflight -= 1
                state.served.last_used = time.monotonic()
            # cancellation from outside (server shutdown) still leaves one record
            state.finish(
                STATUS_CLIENT_CLOSED, finish_reason="client_disconnect", error_code="cancelled"
            )

    # --- what a route built on this path (``/v1/responses``) replaces --------------------

    async def _prepare(
        self, api: ApiState, state: RequestState, body: dict[str, Any]
    ) -> dict[str, Any]:
        """The body the chat/completion path runs on (here: ``body`` itself)."""
        return body

    def _public_error(self, exc: ServehallError) -> ServehallError:
        """``exc`` as the caller sees it (here: itself)."""
        return exc

    async def _respond(
        self,
        state: RequestState,
        req: ChatCompletionRequest | CompletionRequest,
        send: Send,
        headers: dict[str, str],
        echo: str,
        first_before_headers: bool,
    ) -> None:
        """Send the response of the admitted request (its choices made)."""
        if req.stream:
            await send_stream(
                state,
                self.kind,
                req,
                send,
                headers,
                echo,
                first_before_headers=first_before_headers,
            )
        else:
            await send_completion(state, self.kind, req.model, send, headers, echo)

    # --- helpers -----------------------------------------------------------------------

    def _validate(self, body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
        model = ChatCompletionRequest if self.kind == "chat" else CompletionRequest
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise from_validation_error(exc) from None

    @staticmethod
    def _input_filters(
        state: RequestState, filters: list[InputFilter], parts: PromptParts, param: str
    ) -> None:
        """Step 4: run every input filter; the first enforced block is a 400."""
        for f in filters:
            verdicts = f.check(parts)
            state.input_verdicts.extend(verdicts)
            for v in verdicts:
                if v.action == "block" and not v.monitor:
                    raise ContentFilterError(
                        f"The prompt was blocked by the content filter (rule '{v.rule}').",
                        param=param,
                    )

    @staticmethod
    async def _admit(
        state: RequestState, served: ServedModel, admission: AdmissionRequest, priority: int
    ) -> tuple[Slot, list[Reservation]]:
        """Steps 3 and 6: authorize (quota reservations), the record bus's admission
        check, then wait for a scheduler slot; reservations are released on failure."""
        host = state.host
        reservations: list[Reservation] = await host.plugins.authorize(host, admission)
        try:
            if host.records is not None:
                host.records.check_admission()
            slot = await served.scheduler.acquire(
                Ticket(
                    request_id=state.request_id,
                    model=served.name,
                    tenant=state.principal.tenant,
                    principal_id=state.principal.id,
                    priority=priority,
                    cost_tokens=admission.token_estimate,
                    prompt_tokens=admission.prompt_tokens,
                )
            )
        except BaseException:
            for r in reservations:
                with contextlib.suppress(Exception):
                    await r.release()
            raise
        return slot, reservations

    # --- the request path ----------------------------------------------------------------

    async def _handle(
        self, api: ApiState, state: RequestState, body: dict[str, Any], send: Send
    ) -> None:
        host = api.host
        settings = host.settings
        body = await self._prepare(api, state, body)
        req = self._validate(body)
        state.record.stream = req.stream
        name = req.model
        check_model_access(state.principal, name, served=bool(api.router.versions(name)))
        served = choose_version(api, name, state.principal, req.user, state.pinned_version)
        assert served is not None
        served.inflight += 1  # a draining version stops only once this is back to 0
        served.last_used = time.monotonic()
        state.served = served
        if served.state == "unloaded":  # idle-unloaded: load it, waiting like a queue
            await load_on_demand(host, served)
        state.record.model = served.name
        state.record.version = served.version
        state.record.backend = served.backend
        if served.config is not None and served.config.task == "embed":
            raise InvalidRequestError(
                f"The model '{name}' is served for embeddings, not text generation "
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
            structured = structured_request(body)
            state.structured = structured
            check_unsupported(body, req, served.engine.supported_params, structured, served.backend)
        except InvalidRequestError:
            state.structured_outcome = "refused"
            raise
        plan = tool_plan(req) if isinstance(req, ChatCompletionRequest) else None
        constraint = None
        if plan is not None and plan.active:
            constraint = plan.constraint(served.tool_parser)
            if constraint is not None and structured is not None and plan.forced:
                # OpenAI: a forced call's arguments follow the tool's schema, and
                # response_format shapes the content, which a forced call does not have
                structured = state.structured = None
            if constraint is not None and structured is not None:
                state.structured_outcome = "refused"
                raise InvalidRequestError(
                    "Strict tools or parallel_tool_calls: false under tool_choice 'auto' "
                    "constrain the output already; they cannot be combined with "
                    f"'{structured.param.split('.', 1)[0]}'.",
                    param=structured.param.split(".", 1)[0],
                )
            if constraint is not None and "structured_output" not in (
                served.engine.supported_params
            ):
                param = plan.constraint_param()
                raise UnsupportedParameterError(
                    f"This model's backend cannot constrain decoding, which '{param}' needs here.",
                    param=param,
                )

        # 4 input filters over every text of the prompt
        prompt_param = "messages" if self.kind == "chat" else "prompt"
        texts, owners = prompt_texts(req)
        if host.input_filters:
            parts = PromptParts(list(texts), self.endpoint, name, state.principal)
            with maybe_span(api.tracing, "filters", servehall__filter_stage="input"):
                self._input_filters(state, host.input_filters, parts, prompt_param)
            texts = parts.texts

        state.prompt_text = "\n".join(texts)

        # 5 tokenize + context check; a prompt that cannot fit is refused before
        # tokenizing, a long one is tokenized on the worker thread (N31)
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
            if len(state.prompt_text) > _LONG_TEXT:
                prompt_ids = await run_heavy(tok.render_chat, turns, tools)
            else:
                prompt_ids = tok.render_chat(turns, tools)
            requested = req.max_completion_tokens or req.max_tokens
        else:
            text = texts[0]
            if len(text) > _LONG_TEXT:
                prompt_ids = await run_heavy(tok.encode_plain, text, add_special_tokens=True)
            else:
                prompt_ids = tok.encode_plain(text, add_special_tokens=True)
            requested = req.max_tokens
        if not prompt_ids:
            raise InvalidRequestError("The prompt is empty.", param=prompt_param)
        state.prompt_tokens = len(prompt_ids)
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
            tuple(tok.eos_token_ids),
            structured.constraint if structured is not None else None,
        )
        if constraint is not None:
            params = [dataclasses.replace(p, structured=constraint) for p in params]
        stops = req.stop_list()

        # 3 authorize + reserve quota, then 6 admission
        admission = AdmissionRequest(
            request_id=state.request_id,
            endpoint=self.endpoint,
            model=name,
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
        with maybe_span(api.tracing, "admission"):
            slot, reservations = await self._admit(state, served, admission, priority)
        state.admitted = True
        state.admitted_at = time.monotonic()
        state.record.queue_time_s = slot.queue_time_s
        headers: dict[str, str] = {"x-request-id": state.request_id}
        if served.version:
            headers[VERSION_HEADER] = served.version
        for r in reservations:
            with contextlib.suppress(Exception):
                headers.update(r.headers())
        try:
            state.choices = [
                ChoiceStream(
                    engine=served.engine,
                    index=i,
                    request_id=f"{state.request_id}-{i}",
                    prompt_ids=prompt_ids,
                    params=p,
                    detok=tok.new_detokenizer(),
                    stops=StopMatcher(stops) if stops else None,
                    filters=host.plugins.output_filters(host, admission)
                    if host.plugins.has_output_filters
                    else [],
                    refusal_param=structured.param
                    if structured is not None
                    else (plan.constraint_param() if constraint is not None and plan else None),
                    tools=plan.stream(served.tool_parser) if plan and plan.active else None,
                )
                for i, p in enumerate(params)
            ]
            track = getattr(slot, "track", None)
            if track is not None:  # the scheduler reads generated tokens when it decides
                choices = state.choices
                track(lambda: sum(c.completion_tokens for c in choices))
            echo = state.prompt_text if isinstance(req, CompletionRequest) and req.echo else ""
            try:
                await self._respond(
                    state,
                    req,
                    send,
                    headers,
                    echo,
                    any(p.structured is not None for p in params),
                )
            except InvalidRequestError:
                if structured is not None:
                    state.structured_outcome = "refused"  # the engine refused the constraint
                raise
            api.readiness.mark_ok(served.key)
            if plan is not None and plan.active:
                state.count_tool_calls()
        finally:
            slot.release()
            completion = sum(c.completion_tokens for c in state.choices)
            for r in reservations:
                with contextlib.suppress(Exception):
                    await r.settle(len(prompt_ids), completion)
        finish = state.choices[0].finish_reason if state.choices else None
        if structured is not None:
            state.structured_outcome = outcome(
                structured, ((c.text, c.finish_reason) for c in state.choices)
            )
        state.finish(
            200,
            finish_reason=finish,
            prompt_text=state.prompt_text,
            completion_text=state.completion_text(),
        )
