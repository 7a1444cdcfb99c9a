"""``servehall.config.models``: the core's config sections — bind entries, model versions
and weights, model source URLs (kept in ``source``, a placeholder ``path``), the
``[[models]]`` version checks, and defaults that depend on the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from servehall.config.models import (
    GateSettings,
    ModelConfig,
    ModelStoreSettings,
    RolledBack,
    SchedulerSettings,
    ServerSettings,
    check_source_url,
    check_versions,
    remote_placeholder,
)


def _model(**kw: Any) -> ModelConfig:
    return ModelConfig(**{"name": "m", "path": "/models/m", **kw})


@pytest.mark.parametrize("bind", ["127.0.0.1:8000", "[::1]:8443", "host.example:1"])
def test_bind_accepts_host_port(bind: str) -> None:
    assert ServerSettings(bind=[bind]).bind == [bind]


@pytest.mark.parametrize("bind", ["8000", ":8000", "host:", "host:http"])
def test_bind_refuses_what_is_not_host_port(bind: str) -> None:
    with pytest.raises(ValidationError, match="is not host:port"):
        ServerSettings(bind=["127.0.0.1:1", bind])


def test_sections_forbid_unknown_keys() -> None:
    with pytest.raises(ValidationError, match="Extra inputs"):
        SchedulerSettings(polcy="fair")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        SchedulerSettings(max_concurrency=0)


@pytest.mark.parametrize("version", ["", "v1", "2026.12.01", "a_b-c"])
def test_version_labels(version: str) -> None:
    assert _model(version=version).version == version


@pytest.mark.parametrize("version", ["-v1", ".x", "v 1", "v/1", "x" * 65])
def test_bad_version_labels(version: str) -> None:
    with pytest.raises(ValidationError):
        _model(version=version)


def test_weight_is_finite_and_not_negative() -> None:
    assert _model(weight=0).weight == 0
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValidationError):
            _model(weight=bad)


def test_local_path_expands_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    m = _model(path="~/llama")
    assert m.path == tmp_path / "llama" and m.source is None


@pytest.mark.parametrize(
    "url", ["s3://bucket/prefix/model", "https://mirror.example/models/x", "http://h/d"]
)
def test_url_path_becomes_source(url: str) -> None:
    m = _model(path=url)
    assert m.source == url
    assert m.path == remote_placeholder(url)
    assert m.path == Path("remote-model-not-pulled") / url.partition("://")[2]
    assert not m.path.is_absolute()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://host/x", "unknown scheme 'ftp://'"),
        ("s3:///prefix", "names no bucket"),
        ("https:///dir", "names no host"),
        ("https://h/d?x=1", "no query or fragment"),
        ("https://h/d#frag", "no query or fragment"),
    ],
)
def test_bad_source_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_source_url(url)
    with pytest.raises(ValidationError, match=message) as info:
        _model(path=url)
    assert info.value.errors()[0]["loc"] == ("path",)


def test_source_url_scheme_is_case_insensitive() -> None:
    assert check_source_url("S3://bucket") == "S3://bucket"


def test_check_versions() -> None:
    ok = [_model(), _model(name="n", version="a"), _model(name="n", version="b", weight=0)]
    assert check_versions(list(ok)) == []
    errs = check_versions(
        [
            _model(name="n", version="a"),
            None,  # set aside by config check: skipped, indexes kept
            _model(name="n"),
            _model(name="n", version="a"),
        ]
    )
    assert errs == [
        ("models[2].version", "model 'n' has 3 entries: each needs a version label"),
        ("models[3].version", "version 'a' of model 'n' is already models[0]"),
    ]
    zero = check_versions([_model(weight=0, version="x"), _model(weight=0, version="y")])
    assert zero == [("models[0].weight", "model 'm': every version has weight 0")]


def test_gate_and_rollback_sections() -> None:
    g = GateSettings(golden="~/golden.jsonl", min=0.9)  # type: ignore[arg-type]
    assert g.metric == "exact" and g.against == "reference" and "~" not in str(g.golden)
    with pytest.raises(ValidationError):
        GateSettings(golden=Path("g"), min=1.5)
    with pytest.raises(ValidationError):
        GateSettings(golden=Path("g"), min=0.5, metric="bleu")  # type: ignore[arg-type]
    assert RolledBack(weight=1, reason="error_rate").detail == ""
    with pytest.raises(ValidationError):
        RolledBack(weight=1, reason="")


def test_model_store_cache_dir_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVEHALL_CACHE_DIR", str(tmp_path))
    assert ModelStoreSettings().cache_dir == tmp_path / "models"
    monkeypatch.delenv("SERVEHALL_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ModelStoreSettings().cache_dir == tmp_path / "home" / ".cache/servehall/models"
    with pytest.raises(ValidationError):
        ModelStoreSettings(s3_endpoint_url="minio:9000")


def test_model_defaults() -> None:
    m = _model()
    assert (m.backend, m.isolation, m.task, m.version, m.weight) == (
        "auto",
        "process",
        "generate",
        "",
        1.0,
    )
    with pytest.raises(ValidationError):
        _model(max_model_len=8)
    with pytest.raises(ValidationError):
        _model(task="rerank")


def test_tool_call_grammar() -> None:
    assert _model().tool_call_grammar == "strict"
    assert _model(tool_call_grammar="always").tool_call_grammar == "always"
    with pytest.raises(ValidationError):
        _model(tool_call_grammar="lazy")


def test_a_bad_tool_call_grammar_is_a_config_error_naming_the_key() -> None:
    from servehall.config.settings import load_settings
    from servehall.errors import ConfigError

    model = {"name": "m", "path": "/m", "tool_call_grammar": "sometimes"}
    with pytest.raises(ConfigError) as info:
        load_settings(data={"sinks": [], "models": [model]})
    assert [k for k, _ in info.value.errors] == ["models[0].tool_call_grammar"]
