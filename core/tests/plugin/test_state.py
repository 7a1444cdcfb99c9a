"""``servehall.plugin.state.PluginState``: per-plugin objects keyed by their class."""

from __future__ import annotations

import pytest

from servehall.errors import ServiceUnavailableError
from servehall.plugin.state import PluginState


class _Runtime:
    def __init__(self, n: int) -> None:
        self.n = n


class _SubRuntime(_Runtime):
    pass


def test_put_get_and_replace() -> None:
    state = PluginState()
    assert state.get(_Runtime) is None and _Runtime not in state
    state.put(_Runtime(1))
    assert _Runtime in state
    got = state.get(_Runtime)
    assert got is not None and got.n == 1
    state.put(_Runtime(2))
    assert state.require(_Runtime).n == 2


def test_keys_are_exact_classes() -> None:
    state = PluginState()
    state.put(_SubRuntime(1))
    assert state.get(_Runtime) is None
    assert state.get(_SubRuntime) is not None


def test_require_is_a_503_naming_the_class_while_absent() -> None:
    state = PluginState()
    with pytest.raises(ServiceUnavailableError, match="_Runtime is not ready yet"):
        state.require(_Runtime)


def test_pop_removes() -> None:
    state = PluginState()
    state.put(_Runtime(3))
    popped = state.pop(_Runtime)
    assert popped is not None and popped.n == 3
    assert state.pop(_Runtime) is None and _Runtime not in state
