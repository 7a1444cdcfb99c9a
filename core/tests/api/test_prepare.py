"""The input processor (:mod:`servehall.api.prepare`): a chat or completion body becomes
prompt ids, sampling parameters, stops and the admission request, refusals come in the
request path's order, and its shared parts (model choice, input filters) fill the
request's state."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall.api.app import create_app
from servehall.api.intake import open_state
from servehall.api.prepare import filter_inputs, prepare
from servehall.api.state import ApiState
from servehall.errors import ContentFilterError, InvalidRequestError, NotFoundError
from servehall.serving.request import RequestState


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _api(tok_dir: Path, settings: dict[str, Any] | None = None) -> ApiState:
    host = make_host(tok_dir, ScriptedEngine([5, 6, 7]), settings=settings)
    api: ApiState = create_app(host).state.api
    return api


def _state(api: ApiState, **scope: Any) -> RequestState:
    full = {"type": "http", "path": "/v1/completions", "headers": [], **scope}
    return open_state(api, full, "cmpl-1", "/v1/completions")


async def test_a_completion_becomes_ids_params_and_an_admission(tok_dir: Path) -> None:
    api = _api(tok_dir)
    state = _state(api)
    body = {"model": "m", "prompt": "hi there", "max_tokens": 4, "n": 2, "seed": 7}
    body |= {"stop": ["x"], "echo": True}
    prep = await prepare(api, state, "completion", "/v1/completions", body)
    tok = api.host.models["m"].tokenizer
    assert prep.prompt_ids == tok.encode_plain("hi there", add_special_tokens=True)
    assert state.prompt_tokens == len(prep.prompt_ids) and state.prompt_text == "hi there"
    assert [(p.max_tokens, p.seed) for p in prep.params] == [(4, 7), (4, 8)]
    assert prep.stops == ["x"] and prep.echo(state) == "hi there"
    a = prep.admission
    assert (a.endpoint, a.model, a.prompt_tokens, a.max_tokens, a.n) == (
        "/v1/completions",
        "m",
        len(prep.prompt_ids),
        4,
        2,
    )
    assert prep.served is api.host.models["m"] and prep.served.inflight == 1
    assert (state.record.model, state.served) == ("m", prep.served)
    assert not prep.constrained and not prep.tools_active
    assert state.request_attrs["gen_ai.request.max_tokens"] == 4
    choices = prep.choices(state)
    assert [c.request_id for c in choices] == ["cmpl-1-0", "cmpl-1-1"]


async def test_a_chat_renders_the_template(tok_dir: Path) -> None:
    api = _api(tok_dir)
    state = _state(api)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    prep = await prepare(api, state, "chat", "/v1/chat/completions", body)
    assert prep.prompt_ids and state.prompt_text == "hi"
    assert prep.echo(state) == "" and prep.plan is not None and not prep.plan.active


async def test_a_batch_line_runs_below_its_ceiling(tok_dir: Path) -> None:
    from servehall.admission.principal import ANONYMOUS
    from servehall.batches.call import SCOPE_KEY, BatchCall

    api = _api(tok_dir)
    call = BatchCall(principal=ANONYMOUS, batch_id="b", custom_id="c", priority=-3)
    state = _state(api, **{SCOPE_KEY: call})
    body = {"model": "m", "prompt": "hi", "max_tokens": 1, "priority": 5}
    prep = await prepare(api, state, "completion", "/v1/completions", body)
    assert prep.priority == -3


@pytest.mark.parametrize(
    ("body", "error", "param"),
    [
        ({"model": "m", "prompt": 3}, InvalidRequestError, "prompt"),  # validation first
        ({"model": "nope", "prompt": "hi", "n": 99}, NotFoundError, None),  # then the model
        ({"model": "m", "prompt": "hi", "n": 99}, InvalidRequestError, "n"),
        ({"model": "m", "prompt": "", "max_tokens": 1}, InvalidRequestError, "prompt"),
    ],
)
async def test_refusals_come_in_the_request_paths_order(
    tok_dir: Path, body: dict[str, Any], error: type[Exception], param: str | None
) -> None:
    api = _api(tok_dir, settings={"server": {"max_n": 4}})
    with pytest.raises(error) as raised:
        await prepare(api, _state(api), "completion", "/v1/completions", body)
    if param is not None:
        assert getattr(raised.value, "param", None) == param


async def test_filter_inputs_redact_or_block(tok_dir: Path) -> None:
    from servehall import FilterVerdict

    class Redact:
        name = "r"

        def check(self, parts: Any) -> list[FilterVerdict]:
            if any("block" in t for t in parts.texts):
                return [FilterVerdict("block", "no-block", "input", 1)]
            parts.texts = [t.replace("secret", "xx") for t in parts.texts]
            return [FilterVerdict("redact", "redact", "input", 1)]

    api = _api(tok_dir)
    api.host.input_filters = [Redact()]
    state = _state(api)
    out = filter_inputs(api, state, ["my secret"], "/v1/completions", "m", "prompt")
    assert out == ["my xx"] and [v.rule for v in state.input_verdicts] == ["redact"]
    with pytest.raises(ContentFilterError) as raised:
        filter_inputs(api, state, ["block me"], "/v1/completions", "m", "input")
    assert raised.value.param == "input"
