"""Tests of servehall.bench.targets' own parts: a native runner's record turned into a
RequestOutput (times, token counts, errors) and the progress callback (quiet: a no-op;
else counts finished and failed requests). Runs against servers and engines:
test_runner.py and the bench e2e tests."""

from __future__ import annotations

import pytest

from servehall.bench.metrics import RequestOutput
from servehall.bench.targets import output_from_record, progress_bar


def test_output_from_a_record_with_arrivals() -> None:
    out = output_from_record(
        {"start": 1.0, "prompt_tokens": 7, "arrivals": [(1.25, 1), (1.5, 2), (2.0, 1)]}
    )
    assert out.success and out.error == ""
    assert (out.prompt_tokens, out.output_tokens, out.start) == (7, 4, 1.0)
    assert out.ttft == pytest.approx(0.25) and out.latency == pytest.approx(1.0)
    assert out.itl == pytest.approx([0.25, 0.5]) and out.token_times == [1.25, 1.5, 2.0]


def test_records_without_tokens_or_with_an_error_fail() -> None:
    empty = output_from_record({"start": 0.5, "prompt_tokens": 3})
    assert not empty.success and empty.error == "the engine produced no token"
    assert empty.output_tokens == 0 and empty.start == 0.5
    failed = output_from_record({"arrivals": [["0.1", "2"]], "error": "cut short"})
    assert not failed.success and failed.error == "cut short"
    assert failed.output_tokens == 2 and failed.ttft == pytest.approx(0.1)  # strings coerced
    assert output_from_record({"error": "oom"}).error == "oom"


def test_progress_bar_counts_failures(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar("x", 3, quiet=True) as tick:
        assert tick(RequestOutput(success=True)) is None
    assert capsys.readouterr().err == ""
    with progress_bar("run", 2, quiet=False) as tick:
        tick(RequestOutput(success=True))
        tick(RequestOutput(success=False))
        cells = tick.__closure__ or ()
        bound = dict(zip(tick.__code__.co_freevars, (c.cell_contents for c in cells), strict=True))
        (task,) = bound["progress"].tasks
        assert (task.completed, task.fields["failed"]) == (2, 1)
