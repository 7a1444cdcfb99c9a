"""The accuracy gate (:mod:`servehall.host.gate`): golden-file parsing and its one-line
errors, the metrics, ``config check`` on bad gates, a gate run on a real engine (the
``null`` engine, which echoes the prompt, with the demo model's tokenizer), and a live
config change whose new version fails its gate: refused whole, never registered, the
refusal audited as ``config.refused`` with the figures (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, cast

import pytest

from servehall.config.check import check_config
from servehall.config.models import GateSettings
from servehall.config.settings import load_settings
from servehall.db import create_db_engine
from servehall.errors import ConfigError
from servehall.host.gate import (
    GateFailed,
    answers,
    check_gate,
    evaluate,
    exact_score,
    read_golden,
    token_agreement,
)
from servehall.plugin.host import Host, ServedModel
from servehall.plugin.manager import PluginHost
from servehall.rollout import revisions
from servehall.rollout.live import LiveConfig


def _write(path: Path, *lines: Any) -> Path:
    path.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n",
        encoding="utf-8",
    )
    return path


# --- golden file --------------------------------------------------------------------------


def test_golden_lines_blank_lines_and_extra_keys(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "g.jsonl",
        {"prompt": "a", "reference": "b", "note": "ignored"},
        "",
        {"prompt": "c", "reference": ""},
    )
    cases = read_golden(f)
    assert [(c.line, c.prompt, c.reference) for c in cases] == [(1, "a", "b"), (3, "c", "")]
    # against the serving version, references are optional
    g = _write(tmp_path / "p.jsonl", {"prompt": "x"})
    assert read_golden(g, need_reference=False)[0].reference is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        ("", "has no cases"),
        ('{"prompt": "a", "reference": "b"}\n{"prompt": "a"', "line 2: not JSON"),
        ('["a", "b"]', "line 1: expected an object"),
        ('{"prompt": "", "reference": "b"}', 'line 1: "prompt" must be a non-empty string'),
        ('{"prompt": 3, "reference": "b"}', 'line 1: "prompt" must be a non-empty string'),
        ('{"prompt": "a", "reference": 1}', 'line 1: "reference" must be a string'),
        ('{"prompt": "a"}', 'line 1: no "reference"'),
        (b"\xff\xfe", "is not UTF-8"),
    ],
)
def test_bad_golden_files_are_one_line_naming_file_and_line(
    tmp_path: Path, content: str | bytes | None, expected: str
) -> None:
    f = tmp_path / "golden.jsonl"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content)
    with pytest.raises(ConfigError) as info:
        read_golden(f)
    assert expected in info.value.message and str(f) in info.value.message
    assert "\n" not in info.value.message


# --- metrics --------------------------------------------------------------------------------


def test_exact_ignores_surrounding_whitespace_only() -> None:
    assert exact_score(" the cat\n", "the cat") == 1.0
    assert exact_score("the  cat", "the cat") == 0.0


@pytest.mark.parametrize(
    ("answer", "reference", "figure"),
    [
        ([], [], 1.0),
        ([1, 2, 3], [1, 2, 3], 1.0),
        ([1, 2, 3, 4], [1, 2, 3], 0.75),  # an extra token counts against
        ([1, 2], [1, 2, 3, 4], 0.5),  # a missing tail too
        ([1, 9, 3, 4], [1, 2, 3, 4], 0.75),  # positions realign after a divergence
        ([5], [], 0.0),
    ],
)
def test_token_agreement_is_matching_positions_over_the_longer(
    answer: list[int], reference: list[int], figure: float
) -> None:
    assert token_agreement(answer, reference) == figure


# --- config check ---------------------------------------------------------------------------


def _config(tmp_path: Path, gate: str, task: str = "generate") -> Path:
    f = tmp_path / "c.toml"
    f.write_text(
        f'[[models]]\nname = "m"\npath = "{tmp_path}"\nbackend = "null"\ntask = "{task}"\n'
        f"gate = {gate}\n"
    )
    return f


@pytest.mark.parametrize(
    ("gate", "key", "expected"),
    [
        ('{ golden = "g.jsonl", metric = "bleu", min = 0.9 }', "models[0].gate.metric", "exact"),
        ('{ golden = "g.jsonl", min = 1.5 }', "models[0].gate.min", "less than or equal to 1"),
        ('{ golden = "g.jsonl", min = -0.1 }', "models[0].gate.min", "greater than or equal"),
        ('{ golden = "g.jsonl" }', "models[0].gate.min", "required"),
        ('{ golden = "missing.jsonl", min = 0.9 }', "models[0].gate.golden", "does not exist"),
        ('{ golden = "bad.jsonl", min = 0.9 }', "models[0].gate.golden", "line 1: not JSON"),
        (
            '{ golden = "g.jsonl", metric = "logprob_kl", min = 0.9 }',
            "models[0].gate.metric",
            "log-probabilities",
        ),
    ],
)
def test_config_check_names_each_bad_gate_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: str, key: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "g.jsonl", {"prompt": "a", "reference": "b"})
    (tmp_path / "bad.jsonl").write_text("{nope\n")
    errors = check_config(_config(tmp_path, gate))
    assert len(errors) == 1, errors
    assert errors[0][0] == key and expected in errors[0][1], errors


def test_a_gate_on_an_embedding_model_is_refused(tmp_path: Path) -> None:
    g = _write(tmp_path / "g.jsonl", {"prompt": "a", "reference": "b"})
    errs = check_gate(GateSettings(golden=g, min=0.5), task="embed")
    assert len(errs) == 1 and "generated text" in errs[0][1]


# --- a run on a real engine -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from servehall.demo import build_demo_model, default_demo_dir

    return Path(build_demo_model(default_demo_dir()))


async def _null_engine(model_dir: Path) -> tuple[Any, Any]:
    from servehall.config.models import ModelConfig
    from servehall.engines.null import NullEngine
    from servehall.text.tokenizer import load_tokenizer

    engine = NullEngine(ModelConfig(name="n", path=model_dir, backend="null"))
    await engine.start()
    return engine, load_tokenizer(model_dir)


async def test_evaluate_scores_greedy_answers(model_dir: Path, tmp_path: Path) -> None:
    engine, tok = await _null_engine(model_dir)
    try:
        prompts = ["the cat sat", "a tall tree", "hello there", "once upon"]
        got = await answers(engine, tok, prompts, 6)
        assert all(got)
        # two right references, one half right, one wrong
        half = tok.decode(tok.encode_plain(got[2])[:3])
        g = _write(
            tmp_path / "g.jsonl",
            *[{"prompt": p, "reference": r} for p, r in zip(prompts[:2], got[:2], strict=True)],
            {"prompt": prompts[2], "reference": half},
            {"prompt": prompts[3], "reference": "something else entirely"},
        )
        exact = await evaluate("m@v2", GateSettings(golden=g, min=0.5, max_tokens=6), engine, tok)
        assert [c.score for c in exact.cases] == [1.0, 1.0, 0.0, 0.0]
        assert exact.score == 0.5 and exact.passed
        assert "exact 0.500 >= min 0.500 over 4 prompts" in exact.summary()
        agree = await evaluate(
            "m@v2",
            GateSettings(golden=g, metric="token_agreement", min=0.9, max_tokens=6),
            engine,
            tok,
        )
        third = agree.cases[2].score
        assert 0 < third < 1 and agree.cases[3].score < 1 and not agree.passed
        assert agree.figures()["per_prompt"][0] == [1, 1.0]
        # against another engine: the same model agrees with itself
        other, _ = await _null_engine(model_dir)
        try:
            same = await evaluate(
                "m@v2",
                GateSettings(golden=g, min=1.0, max_tokens=6),
                engine,
                tok,
                reference_engine=other,
                against="m@v1",
            )
        finally:
            await other.shutdown()
        assert same.score == 1.0 and same.against == "m@v1"
    finally:
        await engine.shutdown()


# --- a live config change: refused by the gate, audited ---------------------------------------


def _text(model_dir: Path, golden: Path | None, min_: float = 0.9) -> str:
    out = "[server]\nconfig_revisions = true\nconfig_poll_s = 5\n"
    versions = [("v1", None), ("v2", golden)] if golden is not None else [("v1", None)]
    for version, g in versions:
        out += (
            f'\n[[models]]\nname = "m"\nversion = "{version}"\npath = "{model_dir}"\n'
            'backend = "null"\nisolation = "thread"\n'
        )
        if g is not None:
            out += f'gate = {{ golden = "{g}", min = {min_}, max_tokens = 4 }}\n'
    return out


async def test_a_version_below_its_gate_is_refused_and_audited(
    migrated: str, model_dir: Path, tmp_path: Path
) -> None:
    from servehall.host.versions import start_version

    text = _text(model_dir, None)
    settings = load_settings(data=tomllib.loads(text))
    host = Host(settings=settings, plugins=PluginHost([]), replica="r1")
    host.models["m@v1"] = await start_version(host, settings.models[0])
    live = LiveConfig(host, cast(Any, _AlwaysReady()), text, "toml", None)
    await live.open_revisions(create_db_engine(migrated))
    try:
        engine, tok = host.models["m@v1"].engine, host.models["m@v1"].tokenizer
        got = await answers(engine, tok, ["the cat", "a tree"], 4)
        wrong = _write(
            tmp_path / "wrong.jsonl",
            {"prompt": "the cat", "reference": "no"},
            {"prompt": "a tree", "reference": got[1]},
        )
        with pytest.raises(ConfigError) as info:
            await live.apply_text(_text(model_dir, wrong), "toml", "api:tester")
        assert "accuracy gate of m@v2 failed: exact 0.500 < min 0.900 over 2 prompts" in (
            info.value.message
        )
        assert set(host.models) == {"m@v1"} and live.revision == 1
        assert live.db is not None
        refused = await revisions.refusals(live.db)
        assert len(refused) == 1
        r = refused[0]
        assert (r.actor, r.target) == ("api:tester", "config")
        gates = cast(dict[str, Any], r.details["gates"])
        assert gates["m@v2"]["score"] == 0.5 and gates["m@v2"]["per_prompt"] == [[1, 0.0], [2, 1.0]]
        assert r.details["replica"] == "r1"
        # references the version meets: applied, the version serves
        right = _write(
            tmp_path / "right.jsonl",
            *[
                {"prompt": p, "reference": a}
                for p, a in zip(("the cat", "a tree"), got, strict=True)
            ],
        )
        result = await live.apply_text(_text(model_dir, right), "toml", "api:tester")
        assert result.added == ["m@v2"] and host.models["m@v2"].state == "serving"
        assert live.revision == 2
    finally:
        for served in list(host.models.values()):
            await served.engine.shutdown()
        await live.close()


async def test_a_failed_gate_stops_the_engine(model_dir: Path, tmp_path: Path) -> None:
    from servehall.host.versions import start_version

    g = _write(tmp_path / "g.jsonl", {"prompt": "the cat", "reference": "no"})
    text = _text(model_dir, g)
    settings = load_settings(data=tomllib.loads(text))
    host = Host(settings=settings, plugins=PluginHost([]), replica="r1")
    with pytest.raises(GateFailed) as info:
        await start_version(host, settings.models[1])
    assert info.value.report.score == 0.0 and not info.value.report.passed
    assert not host.models


class _AlwaysReady:
    last_error: dict[str, str] = {}  # noqa: RUF012

    async def probe(self, served: ServedModel) -> bool:
        return True


# --- servehall models eval ---------------------------------------------------------------


def _eval(*args: str) -> Any:
    from typer.testing import CliRunner

    from servehall.cli import build_cli

    return CliRunner().invoke(build_cli(list(args)), ["models", "eval", *args])


def test_models_eval_writes_a_golden_set_and_reports_per_prompt(
    model_dir: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(_text(model_dir, None))
    prompts = _write(tmp_path / "p.jsonl", {"prompt": "the cat"}, {"prompt": "a tree"})
    golden = tmp_path / "golden.jsonl"
    res = _eval(
        "m@v1", "-c", str(cfg), "--golden", str(prompts), "--write-golden", str(golden),
        "--max-tokens", "4",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "2 prompts with m@v1's answers" in res.stdout
    refs = [json.loads(line) for line in golden.read_text().splitlines()]
    assert [r["prompt"] for r in refs] == ["the cat", "a tree"] and all(
        r["reference"] for r in refs
    )
    # the same model against its own answers: 1.0, exit 0; a table line per prompt
    res = _eval("m", "-c", str(cfg), "--golden", str(golden), "--min", "1", "--max-tokens", "4")
    assert res.exit_code == 0, res.output
    assert "accuracy gate of m@v1 passed: exact 1.000 >= min 1.000 over 2 prompts" in res.stdout
    assert len([ln for ln in res.stdout.splitlines() if ln.strip().startswith(("1 ", "2 "))]) == 2
    # a wrong reference: below the threshold, exit 1, the figures as JSON
    refs[1]["reference"] = "no"
    _write(golden, *refs)
    res = _eval(
        "m@v1", "-c", str(cfg), "--golden", str(golden), "--min", "0.9", "--metric",
        "token_agreement", "--max-tokens", "4", "--json",
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert report["passed"] is False and report["metric"] == "token_agreement"
    assert report["cases"][0]["score"] == 1.0 and report["score"] < 0.9
    # bad inputs: one ConfigError (the console script prints it as one error: line)
    for args, expected in [
        (("m@v9",), "no model 'm@v9'"),
        (("m@v1",), "has no gate: give --golden FILE"),
        (("m@v1", "--golden", str(tmp_path / "none.jsonl")), "does not exist"),
        (("m@v1", "--golden", str(golden), "--metric", "logprob_kl"), "log-probabilities"),
        (("m@v1", "--golden", str(golden), "--min", "2"), "gate settings: min"),
    ]:
        res = _eval(*args, "-c", str(cfg))
        assert isinstance(res.exception, ConfigError), (args, res.output)
        assert expected in res.exception.message, (args, res.exception.message)


async def test_an_idle_reload_below_its_gate_takes_the_version_out(
    model_dir: Path, tmp_path: Path
) -> None:
    from servehall.errors import EngineUnavailableError
    from servehall.host.versions import start_version
    from servehall.plugin.outcomes import Breach
    from servehall.rollout.idle import load_on_demand

    g = _write(tmp_path / "g.jsonl", {"prompt": "the cat", "reference": "no"})
    settings = load_settings(data=tomllib.loads(_text(model_dir, g)))
    host = Host(settings=settings, plugins=PluginHost([]), replica="r1")
    host.models["m@v1"] = await start_version(host, settings.models[0])
    v2 = settings.models[1]
    # v2 passed once (another golden file then), was unloaded; its reload fails the gate
    unloaded = ServedModel(
        name="m",
        backend="null",
        engine=cast(Any, None),
        scheduler=cast(Any, None),
        tokenizer=None,
        max_model_len=64,
        version="v2",
        weight=1,
        state="unloaded",
        config=v2,
    )
    host.models["m@v2"] = unloaded
    rolled: list[tuple[str, Breach]] = []
    host.on_canary_rollback = lambda served, found: rolled.append((served.key, found))
    try:
        with pytest.raises(EngineUnavailableError) as info:
            await load_on_demand(host, unloaded)
        assert "accuracy gate of m@v2 failed" in info.value.message
        assert unloaded.weight == 0 and unloaded.state == "unloaded"
        [(key, found)] = rolled
        assert key == "m@v2" and found.reason == "gate" and found.figures["score"] == 0.0
    finally:
        await host.models["m@v1"].engine.shutdown()


async def test_against_serving_compares_with_the_weighted_version(
    model_dir: Path, tmp_path: Path
) -> None:
    from servehall.host.versions import start_version

    g = _write(tmp_path / "g.jsonl", {"prompt": "the cat"}, {"prompt": "a tree"})
    text = _text(model_dir, g, min_=1.0).replace("max_tokens = 4", 'against = "serving"')
    settings = load_settings(data=tomllib.loads(text))
    host = Host(settings=settings, plugins=PluginHost([]), replica="r1")
    # nothing serving yet: refused with a clear line
    with pytest.raises(ConfigError) as info:
        await start_version(host, settings.models[1])
    assert 'against = "serving", but no other version' in info.value.message
    assert not isinstance(info.value, GateFailed)
    host.models["m@v1"] = await start_version(host, settings.models[0])
    try:
        v2 = await start_version(host, settings.models[1])  # the same model agrees
        await v2.engine.shutdown()
    finally:
        await host.models["m@v1"].engine.shutdown()
