"""Shared engine helpers: DeltaStream, LiveStreams, HfModelFacts, stop_token_set,
build_atomically, parse_model_options, canonical_dtype (unit level; the engines' own tests
cover their use)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict

from servehall import (
    ConfigError,
    DeltaStream,
    HfModelFacts,
    LiveStreams,
    SamplingParams,
    TokenDelta,
    build_atomically,
    canonical_dtype,
    parse_model_options,
    stop_token_set,
)


async def test_delta_stream_ends_after_terminal_delta_and_drops_later_ones() -> None:
    closed: list[str] = []
    stream = DeltaStream("r1", closed.append)
    stream.push(TokenDelta((1, 2)))
    stream.push(TokenDelta((3,), "stop"))
    stream.push(TokenDelta((4,)))  # after the terminal delta: dropped
    assert [d async for d in stream] == [TokenDelta((1, 2)), TokenDelta((3,), "stop")]
    await stream.aclose()
    assert closed == []  # finished requests are not aborted


async def test_live_streams_post_delivers_a_step_on_the_loop_without_a_sink() -> None:
    live = LiveStreams()
    live.loop = asyncio.get_running_loop()
    a, b = DeltaStream("a", lambda _: None), DeltaStream("b", lambda _: None)
    live["a"], live["b"] = a, b
    thread = threading.Thread(
        target=live.post, args=([(a, TokenDelta((1,))), (b, TokenDelta((2,), "stop"))],)
    )
    thread.start()
    thread.join()
    assert await anext(a) == TokenDelta((1,))
    assert await anext(b) == TokenDelta((2,), "stop")
    assert list(live) == ["a"]  # the finished request is forgotten


async def test_live_streams_step_sink_gets_the_step_on_the_step_thread() -> None:
    """With a step sink the step's deltas go to it on the posting thread, as one batch of
    (request_id, delta); ended streams are skipped; the loop only forgets finished ones."""
    live = LiveStreams()
    live.loop = asyncio.get_running_loop()
    calls: list[tuple[str, list[tuple[str, TokenDelta]]]] = []
    live.step_sink = lambda batch: calls.append((threading.current_thread().name, batch))
    a, b, c = (DeltaStream(r, lambda _: None) for r in "abc")
    live.update(a=a, b=b, c=c)
    c.push(TokenDelta((), "abort"))  # aborted on the loop before the step's output
    step = [(a, TokenDelta((1,))), (b, TokenDelta((2,), "length")), (c, TokenDelta((3,)))]
    thread = threading.Thread(target=live.post, args=(step,), name="step")
    thread.start()
    thread.join()
    assert calls == [("step", [("a", TokenDelta((1,))), ("b", TokenDelta((2,), "length"))])]
    assert b.done and not a.done
    await asyncio.sleep(0)  # the loop's forget callback
    assert sorted(live) == ["a", "c"]
    live.post([(b, TokenDelta((9,)))])  # after its terminal delta: dropped
    assert len(calls) == 1


async def test_delta_stream_aclose_before_the_end_calls_on_close() -> None:
    closed: list[str] = []
    stream = DeltaStream("r2", closed.append)
    stream.push(TokenDelta((1,)))
    await stream.aclose()
    assert closed == ["r2"]
    assert [d async for d in stream] == []


def test_hf_model_facts(tmp_path: Path) -> None:
    cfg = {"text_config": {"max_position_embeddings": 4096, "vocab_size": 99}, "eos_token_id": 7}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, -1, 3]}))
    facts = HfModelFacts.read(tmp_path)
    assert facts.eos_token_ids == (2, 3)
    assert (facts.max_position_embeddings, facts.vocab_size) == (4096, 99)
    assert HfModelFacts.read(tmp_path / "missing") == HfModelFacts()
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        HfModelFacts.read(tmp_path)


def test_stop_token_set() -> None:
    params = SamplingParams(max_tokens=1, stop_token_ids=(5,))
    assert stop_token_set(params, (2,)) == {2, 5}
    ignore = SamplingParams(max_tokens=1, stop_token_ids=(5,), ignore_eos=True)
    assert stop_token_set(ignore, (2,)) == {5}


def test_build_atomically_builds_once_replaces_on_force_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "m"
    calls: list[Path] = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "done").write_text(str(len(calls)))

    def ready(d: Path) -> bool:
        return (d / "done").is_file()

    assert build_atomically(target, build, is_ready=ready) == target
    assert build_atomically(target, build, is_ready=ready) == target
    assert len(calls) == 1 and (target / "done").read_text() == "1"
    build_atomically(target, build, is_ready=ready, force=True)
    assert (target / "done").read_text() == "2"

    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        build_atomically(tmp_path / "n", broken, is_ready=ready)
    assert not (tmp_path / "n").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", ".n.lock", "m"]


class _Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dtype: Literal["float32", "bfloat16"] = "float32"
    blocks: int = 1


def test_parse_model_options_reports_key_paths() -> None:
    assert parse_model_options(_Opts, {"blocks": 3}, model="m", what="x").blocks == 3
    with pytest.raises(ConfigError) as info:
        parse_model_options(_Opts, {"blocks": "many", "nope": 1}, model="m", what="demo options")
    assert str(info.value).startswith("invalid demo options: models.m.options.blocks: ")
    assert [k for k, _ in info.value.errors] == ["models.m.options.blocks", "models.m.options.nope"]


def test_canonical_dtype() -> None:
    assert canonical_dtype("BF16") == "bfloat16"
    assert canonical_dtype("fp32") == canonical_dtype("float") == "float32"
    assert canonical_dtype("half") == "float16"
    assert canonical_dtype("int4") is None and canonical_dtype(16) is None


async def test_delta_stream_coalesces_the_backlog() -> None:
    from servehall.engines.contract import TokenDelta
    from servehall.engines.kit import DeltaStream

    s = DeltaStream("r", lambda rid: None)
    s.push(TokenDelta((1,)))
    s.push(TokenDelta((2, 3)))
    s.push(TokenDelta((4,), "length"))
    first = await anext(s)
    merged = s.coalesce(first)
    assert merged == TokenDelta((1, 2, 3, 4), "length")
    assert s.ended
    with pytest.raises(StopAsyncIteration):
        await anext(s)
    t = DeltaStream("t", lambda rid: None)
    t.push(TokenDelta((5,)))
    one = await anext(t)
    assert t.coalesce(one) is one  # nothing queued: unchanged
    assert not t.ended


async def test_delta_stream_listener_gets_backlog_then_pushes() -> None:
    from servehall.engines.contract import TokenDelta
    from servehall.engines.kit import DeltaStream

    got: list[tuple[str, TokenDelta]] = []
    s = DeltaStream("r", lambda rid: None)
    s.push(TokenDelta((1,)))
    s.listen(lambda rid, d: got.append((rid, d)))
    s.push(TokenDelta((2,), "stop"))
    s.push(TokenDelta((3,)))  # after the terminal delta: dropped
    assert got == [("r", TokenDelta((1,))), ("r", TokenDelta((2,), "stop"))]


async def test_delta_stream_reader_waits_for_a_push_and_survives_cancellation() -> None:
    s = DeltaStream("r", lambda rid: None)
    reader = asyncio.ensure_future(anext(s))
    await asyncio.sleep(0)
    assert not reader.done()  # nothing pushed yet: the reader waits
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    s.push(TokenDelta((1,), None))  # a push after the cancelled wait is kept, not lost
    assert await anext(s) == TokenDelta((1,), None)
    waiting = asyncio.ensure_future(anext(s))
    await asyncio.sleep(0)
    s.push(TokenDelta((2,), None))
    s.push(TokenDelta((3,), "length"))
    assert await waiting == TokenDelta((2,), None)
    assert [d async for d in s] == [TokenDelta((3,), "length")]
