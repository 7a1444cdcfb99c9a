"""The plugin through the real host: entry point, settings section, hooks, metrics."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from servehall import AdmissionRequest, Host, Principal, PromptParts, load_settings
from servehall.errors import ConfigError
from servehall.plugin.manager import PluginHost
from servehall_safety_filter.policy import PolicyBook

CONFIG = {
    "plugins": {"enabled": ["safety_filter"]},
    "safety_filter": {
        "default_policy": "std",
        "tenant_policies": {"acme": "strict"},
        "rules": [
            {"name": "plugin-test-banned", "keywords": ["plugh"]},
            {"name": "plugin-test-email", "detector": "email", "action": "redact"},
        ],
        "policies": {
            "std": {"rules": ["plugin-test-email"]},
            "strict": {"rules": ["plugin-test-banned", "plugin-test-email"]},
        },
    },
}


def _host() -> tuple[PluginHost, Host]:
    plugins = PluginHost(["safety_filter"])
    settings = load_settings(data=CONFIG, section_models=plugins.settings_models())
    return plugins, Host(settings=settings, plugins=plugins)


def _admission(principal: Principal) -> AdmissionRequest:
    return AdmissionRequest(
        request_id="chatcmpl-1",
        endpoint="/v1/chat/completions",
        model="demo",
        principal=principal,
        prompt_tokens=3,
        max_tokens=8,
    )


def test_entry_point_loads_and_section_validates() -> None:
    host, _ = _host()
    info = {i["name"]: i for i in host.describe()}["safety_filter"]
    assert info["loaded"] and info["distribution"] == "servehall-safety-filter"
    assert "servehall_output_filters" in info["hooks"]
    bad = {
        **CONFIG,
        "safety_filter": {"rules": [{"name": "x", "detector": "regex", "patterns": ["(a+)+"]}]},
    }
    with pytest.raises(ConfigError, match="catastrophic"):
        load_settings(data=bad, section_models=host.settings_models())


def test_input_and_output_filters_through_the_host() -> None:
    host, running = _host()
    filters = host.input_filters(running)
    assert running.state.get(PolicyBook) is not None  # state on the host, not the module
    assert [f.name for f in filters] == ["safety_filter"]
    acme = Principal(id="k", tenant="acme")
    parts = PromptParts(
        texts=["say PLUGH"], endpoint="/v1/completions", model="demo", principal=acme
    )
    verdicts = filters[0].check(parts)
    assert [(v.action, v.rule) for v in verdicts] == [("block", "plugin-test-banned")]

    before = (
        REGISTRY.get_sample_value(
            "servehall_content_filter_blocks_total",
            {"rule": "plugin-test-banned", "stage": "output"},
        )
        or 0.0
    )
    (flt,) = host.output_filters(running, _admission(acme))
    r1 = flt.feed("and then plu")
    r2 = flt.feed("gh happened")
    # the policy's e-mail rule holds back 129 characters: the block shows on finish
    assert r1.text + r2.text == "" and not r2.blocked
    r3 = flt.finish()
    assert r3.text == "and then " and r3.blocked
    after = REGISTRY.get_sample_value(
        "servehall_content_filter_blocks_total",
        {"rule": "plugin-test-banned", "stage": "output"},
    )
    assert after == before + 1

    other = Principal(id="k2", tenant=None)
    (flt,) = host.output_filters(running, _admission(other))
    text = flt.feed("plugh x@y.io done").text + flt.finish().text
    assert text == "plugh [EMAIL] done"
    assert (
        REGISTRY.get_sample_value(
            "servehall_content_filter_verdicts_total",
            {"rule": "plugin-test-email", "stage": "output", "action": "redact", "mode": "enforce"},
        )
        or 0
    ) >= 1


def test_no_output_rules_means_no_stream_filter() -> None:
    host = PluginHost(["safety_filter"])
    cfg = {
        "plugins": {"enabled": ["safety_filter"]},
        "safety_filter": {"rules": [{"name": "in", "keywords": ["a"], "stages": ["input"]}]},
    }
    settings = load_settings(data=cfg, section_models=host.settings_models())
    running = Host(settings=settings, plugins=host)
    host.input_filters(running)
    assert host.output_filters(running, _admission(Principal(id="p"))) == []
    # a second host gets its own compiled policies (no module-global state)
    other = Host(
        settings=load_settings(data=CONFIG, section_models=host.settings_models()), plugins=host
    )
    assert [f.name for f in host.input_filters(other)] == ["safety_filter"]
    assert running.state.get(PolicyBook) is not other.state.get(PolicyBook)


def test_filters_satisfy_the_core_protocols() -> None:
    from servehall import InputFilter, OutputStreamFilter
    from servehall_safety_filter import Detector
    from servehall_safety_filter.input_filter import SafetyInputFilter
    from servehall_safety_filter.stream import SafetyStreamFilter
    from servehall_safety_filter.testing import RepeatDetector, book

    b = book(rules=[{"name": "k", "keywords": ["x"]}])
    assert isinstance(SafetyInputFilter(b), InputFilter)
    assert isinstance(SafetyStreamFilter(b.default.output), OutputStreamFilter)
    assert isinstance(RepeatDetector({}), Detector)
