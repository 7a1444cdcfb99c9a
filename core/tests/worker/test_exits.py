"""``servehall.worker.exits``: a worker's end in words an operator can act on."""

from __future__ import annotations

import signal

import pytest

from servehall.worker.exits import describe_exit, oom_kill_count, signal_name, with_stderr


def test_signal_names() -> None:
    assert signal_name(9) == "SIGKILL"
    assert signal_name(int(signal.SIGSEGV)) == "SIGSEGV"
    assert signal_name(77) == "signal 77"


@pytest.mark.parametrize(
    ("exitcode", "phrase"),
    [
        (None, "still running"),
        (0, "exited with status 0"),
        (3, "exited with status 3"),
        (-int(signal.SIGSEGV), "killed by SIGSEGV"),
        (-9, "killed by SIGKILL"),
    ],
)
def test_describe_exit(exitcode: int | None, phrase: str) -> None:
    assert describe_exit(exitcode) == phrase


def test_sigkill_is_the_oom_killer_only_when_the_counter_rose() -> None:
    assert (
        describe_exit(-9, oom_before=2, oom_after=3)
        == "killed by the kernel's OOM killer (SIGKILL)"
    )
    assert describe_exit(-9, oom_before=3, oom_after=3) == "killed by SIGKILL"
    assert describe_exit(-9, oom_before=None, oom_after=3) == "killed by SIGKILL"
    assert describe_exit(-int(signal.SIGSEGV), oom_before=0, oom_after=1) == "killed by SIGSEGV"


def test_stderr_tail_keeps_the_last_non_blank_lines_cut_at_300() -> None:
    lines = ["first", "", "  ", "second", "third", "x" * 400]
    assert with_stderr("exited with status 1", []) == "exited with status 1"
    assert with_stderr("r", ["", "  "]) == "r"
    text = with_stderr("r", lines, keep=3)
    assert text == "r; last stderr: second | third | " + "x" * 300


def test_oom_kill_count_is_a_count_or_none() -> None:
    count = oom_kill_count()
    assert count is None or count >= 0
