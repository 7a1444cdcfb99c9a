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
in :mod:`servehall.api.auth` before this endpoint is reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from servehall.api.body import check_media_type, drain_body, parse_json_object, read_body
from servehall.api.errors import error_response, from_validation_error
from servehall.api.models import ChatCompletionRequest, CompletionRequest
from servehall.api.state import ApiState
from servehall.errors import (
    ContentFilterError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ServehallError,
)
from servehall.filters import FilterVerdict, PromptParts
from servehall.principal import ANONYMOUS, Principal
from servehall.scheduling import Slot, Ticket
from servehall.serving.choice import ChoiceEvent, ChoiceStream
from servehall.serving.context import RequestContext
from servehall.serving.params import check_unsupported, resolve_max_tokens, sampling_params
from servehall.text.stops import StopMatcher
from servehall.text.tokenizer import ChatTurn
from servehall.usage import AdmissionRequest, Reservation

log = logging.getLogger("servehall.api")

_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_LONG_TEXT = 20_000  # characters; longer prompts are tokenized off the event loop
STATUS_CLIENT_CLOSED = 499


@dataclass
class _Run:
    """Mutable state of one request, readable by the outer handler after cancellation."""

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


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class InferenceEndpoint:
    """ASGI endpoint for one of the two inference routes."""

    def __init__(self, kind: Literal["chat", "completion"]) -> None:
        self.kind = kind
        self.endpoint = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        self.prefix = "chatcmpl-" if kind == "chat" else "cmpl-"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api: ApiState = scope["app"].state.api
        request = Request(scope, receive)
        principal = scope.get("state", {}).get("principal") or ANONYMOUS
        client = scope.get("client")
        rid = self.prefix + uuid.uuid4().hex
        ctx = RequestContext(
            api.host, api.metrics, rid, self.endpoint, client[0] if client else None
        )
        ctx.set_principal(principal)
        run = _Run(api, ctx, principal, rid, int(time.time()))
        try:
            body_read = False
            try:
                check_media_type(request)
                raw = await read_body(request, api.host.settings.server.max_body_bytes)
                body_read = True
            except ClientDisconnect:
                ctx.finish(STATUS_CLIENT_CLOSED, finish_reason="client_disconnect")
                return
            body = parse_json_object(raw)
            work = asyncio.ensure_future(self._handle(run, body, send))
            watcher = asyncio.ensure_future(_wait_disconnect(receive))
            try:
                await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not work.done():
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await work
                    self._fill(run)
                    ctx.finish(
                        STATUS_CLIENT_CLOSED,
                        finish_reason="client_disconnect",
                        prompt_text=run.prompt_text,
                        completion_text=self._text(run),
                    )
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            work.result()
        except ServehallError as exc:
            self._fill(run)
            if not run.response_started:
                close = isinstance(exc, PayloadTooLargeError) and scope.get("http_version") in (
                    "1.0",
                    "1.1",
                )
                resp = error_response(exc, close=close)
                resp.headers["x-request-id"] = rid
                await resp(scope, receive, send)
                if not body_read:
                    await drain_body(receive)
            ctx.finish(exc.status, error_code=exc.code, prompt_text=run.prompt_text or None)
        except Exception:
            log.exception("request %s failed", rid)
            self._fill(run)
            if not run.response_started:
                await error_response(
                    ServehallError("The server had an error processing the request.")
                )(scope, receive, send)
            ctx.finish(500, error_code="server_error", finish_reason="error")
        finally:
            # cancellation from outside (server shutdown) still leaves one record
            self._fill(run)
            ctx.finish(
                STATUS_CLIENT_CLOSED, finish_reason="client_disconnect", error_code="cancelled"
            )

    # --- helpers -----------------------------------------------------------------------

    @staticmethod
    def _fill(run: _Run) -> None:
        rec = run.ctx.record
        rec.prompt_tokens = run.prompt_tokens
        if run.choices:
            rec.completion_tokens = sum(c.completion_tokens for c in run.choices)
            firsts = [c.first_token_at for c in run.choices if c.first_token_at is not None]
            if firsts:
                run.ctx.token(min(firsts))
        run.ctx.verdicts = [*run.input_verdicts, *(v for c in run.choices for v in c.verdicts)]

    @staticmethod
    def _text(run: _Run) -> str | None:
        return run.choices[0].text if run.choices else None

    def _validate(self, body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
        model = ChatCompletionRequest if self.kind == "chat" else CompletionRequest
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise from_validation_error(exc) from None

    # --- the request path ----------------------------------------------------------------

    async def _handle(self, run: _Run, body: dict[str, Any], send: Send) -> None:
        host = run.api.host
        ctx = run.ctx
        settings = host.settings
        req = self._validate(body)
        ctx.record.stream = req.stream
        name = req.model
        served = host.models.get(name)
        allowed = run.principal.may_use(name)
        # A model outside the caller's list is a 404 like an unknown one, unless the auth
        # plugin says the deployment does not hide models (then 403).
        hide = bool(run.principal.attributes.get("hide_forbidden_models", True))
        if served is None or (not allowed and hide):
            raise NotFoundError(
                "The requested model does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        if not allowed:
            raise PermissionDeniedError(
                f"This credential may not use the model `{name}`.",
                param="model",
                code="model_not_allowed",
            )
        ctx.record.model = served.name
        ctx.record.backend = served.backend
        n = req.n or 1
        if n > settings.server.max_n:
            raise InvalidRequestError(
                f"n must be at most {settings.server.max_n} on this server.", param="n"
            )
        check_unsupported(body, req, served.engine.supported_params)

        # 4 input filters over every text of the prompt
        prompt_param = "messages" if self.kind == "chat" else "prompt"
        texts, owners = self._prompt_texts(req)
        if host.input_filters:
            parts = PromptParts(list(texts), self.endpoint, name, run.principal)
            for f in host.input_filters:
                verdicts = f.check(parts)
                run.input_verdicts.extend(verdicts)
                for v in verdicts:
                    if v.action == "block" and not v.monitor:
                        raise ContentFilterError(
                            f"The prompt was blocked by the content filter (rule '{v.rule}').",
                            param=prompt_param,
                        )
            texts = parts.texts
        run.prompt_text = "\n".join(texts)

        # 5 tokenize + context check
        tok = served.tokenizer
        if isinstance(req, ChatCompletionRequest):
            turns = self._turns(req, texts, owners)
            if len(run.prompt_text) > _LONG_TEXT:
                prompt_ids = await asyncio.to_thread(tok.render_chat, turns)
            else:
                prompt_ids = tok.render_chat(turns)
            requested = req.max_completion_tokens or req.max_tokens
        else:
            text = texts[0]
            if len(text) > _LONG_TEXT:
                prompt_ids = await asyncio.to_thread(
                    tok.encode_plain, text, add_special_tokens=True
                )
            else:
                prompt_ids = tok.encode_plain(text, add_special_tokens=True)
            requested = req.max_tokens
        if not prompt_ids:
            raise InvalidRequestError("The prompt is empty.", param=prompt_param)
        run.prompt_tokens = len(prompt_ids)
        max_tokens = resolve_max_tokens(
            requested,
            len(prompt_ids),
            served.max_model_len,
            settings.server.default_max_tokens,
            prompt_param,
        )
        params = sampling_params(req, n, max_tokens, tuple(tok.eos_token_ids))
        stops = req.stop_list()

        # 3 authorize + reserve quota, then 6 admission
        admission = AdmissionRequest(
            request_id=run.request_id,
            endpoint=self.endpoint,
            model=name,
            principal=run.principal,
            prompt_tokens=len(prompt_ids),
            max_tokens=max_tokens,
            n=n,
            stream=req.stream,
        )
        reservations: list[Reservation] = await host.plugins.authorize(admission)
        slot: Slot | None = None
        try:
            if host.records is not None:
                host.records.check_admission()
            slot = await served.scheduler.acquire(
                Ticket(
                    request_id=run.request_id,
                    model=name,
                    tenant=run.principal.tenant,
                    principal_id=run.principal.id,
                    priority=int(run.principal.attributes.get("priority", 0) or 0),
                    cost_tokens=admission.token_estimate,
                )
            )
        except BaseException:
            for r in reservations:
                with contextlib.suppress(Exception):
                    await r.release()
            raise
        ctx.admitted = True
        ctx.record.queue_time_s = slot.queue_time_s
        headers: dict[str, str] = {"x-request-id": run.request_id}
        for r in reservations:
            with contextlib.suppress(Exception):
                headers.update(r.headers())
        try:
            run.choices = [
                ChoiceStream(
                    engine=served.engine,
                    index=i,
                    request_id=f"{run.request_id}-{i}",
                    prompt_ids=prompt_ids,
                    params=p,
                    detok=tok.new_detokenizer(),
                    stops=StopMatcher(stops) if stops else None,
                    filters=host.plugins.output_filters(admission, run.principal)
                    if host.plugins.has_output_filters
                    else [],
                )
                for i, p in enumerate(params)
            ]
            echo = run.prompt_text if isinstance(req, CompletionRequest) and req.echo else ""
            if req.stream:
                await self._stream(run, req, send, headers, echo)
            else:
                await self._complete(run, req, send, headers, echo)
            run.api.readiness.mark_ok(name)
        finally:
            slot.release()
            completion = sum(c.completion_tokens for c in run.choices)
            for r in reservations:
                with contextlib.suppress(Exception):
                    await r.settle(len(prompt_ids), completion)
        self._fill(run)
        finish = run.choices[0].finish_reason if run.choices else None
        ctx.finish(
            200, finish_reason=finish, prompt_text=run.prompt_text, completion_text=self._text(run)
        )

    def _prompt_texts(
        self, req: ChatCompletionRequest | CompletionRequest
    ) -> tuple[list[str], list[int]]:
        """Every text part and the message index it belongs to."""
        if isinstance(req, CompletionRequest):
            return [req.prompt_text()], [0]
        texts: list[str] = []
        owners: list[int] = []
        for i, m in enumerate(req.messages):
            if isinstance(m.content, list):
                for p in m.content:
                    texts.append(p.text)
                    owners.append(i)
            else:
                texts.append(m.content or "")
                owners.append(i)
        return texts, owners

    @staticmethod
    def _turns(req: ChatCompletionRequest, texts: list[str], owners: list[int]) -> list[ChatTurn]:
        joined: dict[int, list[str]] = {}
        for t, i in zip(texts, owners, strict=True):
            joined.setdefault(i, []).append(t)
        return [
            ChatTurn("system" if m.role == "developer" else m.role, "\n".join(joined.get(i, [])))
            for i, m in enumerate(req.messages)
        ]

    # --- responses -------------------------------------------------------------------

    def _usage(self, run: _Run) -> dict[str, int]:
        completion = sum(c.completion_tokens for c in run.choices)
        return {
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": run.prompt_tokens + completion,
        }

    async def _complete(
        self, run: _Run, req: Any, send: Send, headers: dict[str, str], echo: str
    ) -> None:
        async def drain(c: ChoiceStream) -> None:
            events = c.events()
            try:
                async for _ in events:
                    pass
            finally:
                await events.aclose()

        tasks = [asyncio.ensure_future(drain(c)) for c in run.choices]
        try:
            await asyncio.gather(*tasks)  # the first failure propagates as itself
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        base = {"id": run.request_id, "created": run.created, "model": req.model}
        if self.kind == "chat":
            body: dict[str, Any] = {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": c.index,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": None,
                        "finish_reason": c.finish_reason,
                    }
                    for c in run.choices
                ],
            }
        else:
            body = {
                **base,
                "object": "text_completion",
                "choices": [
                    {
                        "index": c.index,
                        "text": echo + c.text,
                        "logprobs": None,
                        "finish_reason": c.finish_reason,
                    }
                    for c in run.choices
                ],
            }
        body["usage"] = self._usage(run)
        data = _DUMPS(body).encode("utf-8")
        run.response_started = True
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": self._headers(headers, "application/json", len(data)),
            }
        )
        await send({"type": "http.response.body", "body": data, "more_body": False})

    @staticmethod
    def _headers(
        extra: dict[str, str], ctype: str, length: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", ctype.encode())]
        if length is not None:
            out.append((b"content-length", str(length).encode()))
        else:
            out.append((b"cache-control", b"no-cache"))
            out.append((b"x-accel-buffering", b"no"))
        for k, v in extra.items():
            try:
                out.append((k.lower().encode("latin-1"), v.encode("latin-1")))
            except UnicodeEncodeError:
                log.warning("dropping a response header that is not latin-1: %r", k[:50])
        return out

    async def _events(self, run: _Run) -> AsyncGenerator[ChoiceEvent, None]:
        """Events of every choice, merged in arrival order (direct for n = 1)."""
        if len(run.choices) == 1:
            events = run.choices[0].events()
            try:
                async for ev in events:
                    yield ev
            finally:
                await events.aclose()
            return
        queue: asyncio.Queue[ChoiceEvent | BaseException | None] = asyncio.Queue()

        async def pump(c: ChoiceStream) -> None:
            events = c.events()
            try:
                async for ev in events:
                    queue.put_nowait(ev)
            except Exception as exc:
                queue.put_nowait(exc)
            finally:
                await events.aclose()
                queue.put_nowait(None)

        tasks = [asyncio.ensure_future(pump(c)) for c in run.choices]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream(
        self, run: _Run, req: Any, send: Send, headers: dict[str, str], echo: str
    ) -> None:
        chat = self.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (
            f'data: {{"id":"{run.request_id}","object":"{obj}","created":{run.created},'
            f'"model":{_DUMPS(req.model)},"choices":['
        ).encode()
        tail = b"]}\n\n"

        async def emit(choice: dict[str, Any]) -> None:
            await send(
                {
                    "type": "http.response.body",
                    "body": head + _DUMPS(choice).encode() + tail,
                    "more_body": True,
                }
            )

        run.response_started = True
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": self._headers(headers, "text/event-stream; charset=utf-8"),
            }
        )
        for c in run.choices:
            if chat:
                await emit(
                    {
                        "index": c.index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                )
            elif echo:
                await emit(
                    {"index": c.index, "text": echo, "logprobs": None, "finish_reason": None}
                )
        try:
            events = self._events(run)
            try:
                async for ev in events:
                    if chat:
                        delta = {"content": ev.text} if ev.text else {}
                        if ev.text and ev.finish_reason is not None:
                            await emit(
                                {
                                    "index": ev.index,
                                    "delta": delta,
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            )
                            delta = {}
                        await emit(
                            {
                                "index": ev.index,
                                "delta": delta,
                                "logprobs": None,
                                "finish_reason": ev.finish_reason,
                            }
                        )
                    else:
                        await emit(
                            {
                                "index": ev.index,
                                "text": ev.text,
                                "logprobs": None,
                                "finish_reason": ev.finish_reason,
                            }
                        )
            finally:
                await events.aclose()
        except ServehallError as exc:
            err = _DUMPS(exc.envelope()).encode()
            await send(
                {"type": "http.response.body", "body": b"data: " + err + b"\n\n", "more_body": True}
            )
            run.ctx.record.error_code = exc.code
        if req.include_usage:
            usage = {
                "id": run.request_id,
                "object": obj,
                "created": run.created,
                "model": req.model,
                "choices": [],
                "usage": self._usage(run),
            }
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + _DUMPS(usage).encode() + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
