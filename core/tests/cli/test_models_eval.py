"""Tests of servehall.cli.models_eval's own logic: picking the ``[[models]]`` entry,
the version compared with, the table cells, pydantic error lines, and the argument errors
``servehall models eval`` raises before any engine starts (each one ConfigError). Runs on
a real engine are in core/tests/host/test_gate.py
(test_models_eval_writes_a_golden_set_and_reports_per_prompt and the against tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servehall.cli import build_cli
from servehall.cli.models_eval import _peer, _pick, _pydantic_lines, _short
from servehall.config.models import GateSettings, ModelConfig
from servehall.errors import ConfigError


def _m(name: str, version: str = "", weight: float = 1.0) -> ModelConfig:
    return ModelConfig(name=name, version=version, path=Path("/m"), weight=weight)


def _message(fn: Any, *args: Any) -> str:
    with pytest.raises(ConfigError) as exc:
        fn(*args)
    return exc.value.message


def test_pick_by_key_or_by_a_name_with_one_entry() -> None:
    a1, a2, b = _m("a", "v1"), _m("a", "v2"), _m("b")
    models = [a1, a2, b]
    assert _pick(models, "a@v2") is a2
    assert _pick(models, "b") is b
    assert _pick([a1], "a") is a1  # one version: its name is enough
    assert _message(_pick, models, "a") == "model 'a' has 2 versions: name one (a@v1, a@v2)"
    assert _message(_pick, models, "c") == "no model 'c' in the config; known: a@v1, a@v2, b"
    assert _message(_pick, [], "c") == "no model 'c' in the config; known: none"


def test_peer_is_the_named_version_or_the_heaviest_other() -> None:
    v1, v2, v3 = _m("a", "v1", 1), _m("a", "v2", 5), _m("a", "v3", 2)
    models = [v1, v2, v3, _m("b", "v9", 9)]
    assert _peer(models, v1, "v3") is v3
    assert _peer(models, v1, None) is v2  # highest weight of the name's others
    assert _peer(models, v2, None) is v3
    assert _message(_peer, models, v1, "v9") == (
        "--against 'v9': no such version of 'a'; others: v2, v3"
    )
    assert _message(_peer, models, v1, "v1") == (  # not itself
        "--against 'v1': no such version of 'a'; others: v2, v3"
    )
    assert _message(_peer, [v1], v1, None) == (
        "gate against = \"serving\": 'a' has no other version"
    )
    assert "others: none" in _message(_peer, [v1], v1, "v2")


def test_short_flattens_newlines_and_cuts_with_an_ellipsis() -> None:
    assert _short("a\nb", 10) == "a\\nb"
    assert _short("abcdef", 6) == "abcdef"
    assert _short("abcdefg", 6) == "abcde…" and len(_short("x" * 50, 28)) == 28


def test_pydantic_lines_name_each_field() -> None:
    try:
        GateSettings(golden=Path("g.jsonl"), min=2, max_tokens=0)
    except Exception as exc:
        lines = _pydantic_lines(exc)
    assert lines.startswith("min: ") and "; max_tokens: " in lines
    assert _pydantic_lines(ValueError("plain")) == "plain"


def _config(tmp_path: Path, *, gate: bool = False) -> Path:
    cfg = tmp_path / "c.toml"
    text = ""
    for version in ("v1", "v2"):
        text += f'[[models]]\nname = "m"\nversion = "{version}"\npath = "/m"\nbackend = "null"\n'
        if gate and version == "v2":
            text += (
                f'gate = {{ golden = "{tmp_path / "g.jsonl"}", min = 0.5, against = "serving" }}\n'
            )
    cfg.write_text(text + '[[models]]\nname = "e"\npath = "/m"\nbackend = "null"\ntask = "embed"\n')
    (tmp_path / "g.jsonl").write_text('{"prompt": "a", "reference": "b"}\n')
    return cfg


def _eval(*args: str) -> str:
    """The ConfigError message ``models eval ARGS`` raises (the console script prints it
    as one ``error:`` line)."""
    res = CliRunner().invoke(build_cli(["models", "eval"]), ["models", "eval", *args])
    assert isinstance(res.exception, ConfigError), res.output
    return res.exception.message


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("m",), "model 'm' has 2 versions: name one (m@v1, m@v2)"),
        (("m@v1",), "model 'm@v1' has no gate: give --golden FILE"),
        (("m@v1", "--golden", "{g}", "--metric", "bleu"), "gate settings: metric: "),
        (("m@v1", "--golden", "{g}", "--min", "-1"), "gate settings: min: "),
        (("m@v1", "--golden", "{d}/none.jsonl"), "does not exist"),
        (("m@v1", "--golden", "{g}", "--against", "v7"), "--against 'v7': no such version"),
        (("e", "--golden", "{g}"), 'task = "embed" has none'),
    ],
)
def test_argument_errors_before_any_engine_starts(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    cfg = _config(tmp_path)
    given = [a.format(g=tmp_path / "g.jsonl", d=tmp_path) for a in args]
    message = _eval(*given, "-c", str(cfg))
    assert expected in message, message


def test_a_gate_from_config_is_overridden_by_the_options(tmp_path: Path) -> None:
    cfg = _config(tmp_path, gate=True)
    # the entry's gate supplies golden (no --golden needed) and against = "serving"; the
    # option overrides the gate's min (a bad one is refused)
    assert _eval("m@v2", "-c", str(cfg), "--min", "3").startswith("gate settings: min: ")
    # --against names another version even without a gate of against = "serving"
    golden = str(tmp_path / "g.jsonl")
    assert "others: v2" in _eval("m@v1", "-c", str(cfg), "--golden", golden, "--against", "x")
