"""``servehall models eval``: a version's accuracy gate, run offline.

Starts the engine of one ``[[models]]`` entry of ``--config`` (as ``serve`` would: its
backend, options and isolation), answers the golden set greedily and prints the same
figures the gate judges a starting version on (:mod:`servehall.host.gate`): one line per
prompt (its line number, score, prompt, answer and reference) and the overall figure.
The gate's settings come from the entry's ``gate`` table; ``--golden``, ``--metric``,
``--min``, ``--max-tokens`` and ``--against`` override them (an entry without a gate
needs ``--golden``). ``--against VERSION`` compares with another version of the same
name (its greedy answers are the references); a gate with ``against = "serving"`` is
compared with the name's other version of the highest weight. ``--write-golden FILE``
writes the model's own answers as a golden file (prompts from ``--golden``), the way to
make a golden set from a version you trust.

Exit status: 0 when the figure reaches ``min`` (or no ``min`` is set), 1 below it, 2 on
a bad input (one ``error:`` line, never a traceback).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML/YAML); default $SERVEHALL_CONFIG."),
]


def _pick(models: list[Any], which: str) -> Any:
    """The ``[[models]]`` entry ``which``: ``name@version``, or a name with one entry."""
    from servehall.errors import ConfigError
    from servehall.plugin.host import model_key

    keys = [model_key(m.name, m.version) for m in models]
    if which in keys:
        return models[keys.index(which)]
    named = [m for m in models if m.name == which]
    if len(named) == 1:
        return named[0]
    if named:
        raise ConfigError(
            f"model {which!r} has {len(named)} versions: name one "
            f"({', '.join(model_key(m.name, m.version) for m in named)})"
        )
    raise ConfigError(f"no model {which!r} in the config; known: {', '.join(keys) or 'none'}")


def _short(text: str, width: int) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def eval_command(
    model: Annotated[str, typer.Argument(help="The [[models]] entry: name or name@version.")],
    config: ConfigOpt = None,
    golden: Annotated[
        Path | None, typer.Option("--golden", help="Golden JSON-lines file (prompt, reference).")
    ] = None,
    metric: Annotated[
        str | None, typer.Option("--metric", help="exact or token_agreement.")
    ] = None,
    minimum: Annotated[
        float | None, typer.Option("--min", help="Threshold in [0, 1]; below it exit 1.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="Most tokens per answer.")
    ] = None,
    against: Annotated[
        str | None,
        typer.Option(
            "--against", help="Another version of the name: its answers are the references."
        ),
    ] = None,
    write_golden: Annotated[
        Path | None,
        typer.Option("--write-golden", help="Write the model's answers as a golden file."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run a version's accuracy gate offline: per-prompt agreement and the overall figure."""
    from servehall.config.models import GateSettings
    from servehall.errors import ConfigError
    from servehall.host.gate import check_gate
    from servehall.server.bootstrap import load_deployment

    settings, plugins = load_deployment(config)
    mc = _pick(list(settings.models), model)
    base: dict[str, Any] = mc.gate.model_dump() if mc.gate is not None else {"min": 0.0}
    for key, value in (
        ("golden", golden),
        ("metric", metric),
        ("min", minimum),
        ("max_tokens", max_tokens),
    ):
        if value is not None:
            base[key] = value
    if against is not None:
        base["against"] = "serving"
    if "golden" not in base:
        raise ConfigError(f"model {model!r} has no gate: give --golden FILE")
    try:
        gate = GateSettings(**base)
    except Exception as exc:
        raise ConfigError(f"gate settings: {_pydantic_lines(exc)}") from None
    problems = check_gate(
        gate.model_copy(update={"against": "serving"}) if write_golden else gate, mc.task
    )
    if problems:
        raise ConfigError("; ".join(f"gate.{k}: {m}" if k else m for k, m in problems))
    peer = None
    if gate.against == "serving" and write_golden is None:
        peer = _peer(list(settings.models), mc, against)
    report = asyncio.run(_run(settings, plugins, mc, gate, peer, write_golden))
    if isinstance(report, int):
        typer.echo(f"{write_golden}: {report} prompts with {model}'s answers")
        return
    if as_json:
        out = {
            "model": report.key,
            "passed": report.passed,
            **report.figures(per_prompt=len(report.cases)),
            "cases": [
                {
                    "line": c.line,
                    "score": c.score,
                    "prompt": c.prompt,
                    "answer": c.answer,
                    "reference": c.reference,
                }
                for c in report.cases
            ],
        }
        typer.echo(json.dumps(out))
    else:
        typer.echo(f"{'line':>5}  {'score':>6}  {'prompt':<28}  {'answer':<28}  reference")
        for c in report.cases:
            typer.echo(
                f"{c.line:>5}  {c.score:6.3f}  {_short(c.prompt, 28):<28}  "
                f"{_short(c.answer, 28):<28}  {_short(c.reference, 28)}"
            )
        typer.echo(report.summary())
    if not report.passed:
        raise typer.Exit(1)


def _pydantic_lines(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors()
        )
    return str(exc)


def _peer(models: list[Any], mc: Any, against: str | None) -> Any:
    """The version answers are compared with: ``against`` (a label of ``mc``'s name),
    else the name's other version of the highest weight."""
    from servehall.errors import ConfigError

    others = [m for m in models if m.name == mc.name and m.version != mc.version]
    if against is not None:
        for m in others:
            if m.version == against:
                return m
        labels = ", ".join(m.version for m in others) or "none"
        raise ConfigError(
            f"--against {against!r}: no such version of {mc.name!r}; others: {labels}"
        )
    if not others:
        raise ConfigError(f'gate against = "serving": {mc.name!r} has no other version')
    return max(others, key=lambda m: m.weight)


async def _run(
    settings: Any, plugins: Any, mc: Any, gate: Any, peer: Any, write_golden: Path | None
) -> Any:
    """Start the engines (``mc``'s, and ``peer``'s when given), evaluate (the report) or
    write the golden file (the number of prompts), stop them."""
    from servehall.host.gate import evaluate
    from servehall.host.versions import make_engine
    from servehall.plugin.host import Host, model_key
    from servehall.text.tokenizer import load_tokenizer

    host = Host(settings=settings, plugins=plugins)
    started: list[Any] = []

    async def start(m: Any) -> tuple[Any, Any]:
        from servehall.engines.model_dir import check_model_dir

        check_model_dir(m.name, m.path)
        spec = plugins.backends().select(m.backend)
        tokenizer = load_tokenizer(m.path)
        engine = make_engine(host, m, spec, tokenizer)
        started.append(engine)
        await engine.start()
        return engine, tokenizer

    try:
        engine, tokenizer = await start(mc)
        key = model_key(mc.name, mc.version)
        if write_golden is not None:
            return await _write_golden(write_golden, gate, engine, tokenizer)
        if peer is None:
            return await evaluate(key, gate, engine, tokenizer)
        ref_engine, ref_tok = await start(peer)
        return await evaluate(
            key,
            gate,
            engine,
            tokenizer,
            reference_engine=ref_engine,
            reference_tokenizer=ref_tok,
            against=model_key(peer.name, peer.version),
        )
    finally:
        for engine in started:
            with contextlib.suppress(Exception):
                await engine.shutdown()


async def _write_golden(path: Path, gate: Any, engine: Any, tokenizer: Any) -> int:
    """Write the engine's greedy answers to the prompts of ``gate.golden`` as golden
    file ``path``; the number of prompts."""
    from servehall.host.gate import answers, read_golden

    cases = read_golden(gate.golden, need_reference=False)
    got = await answers(engine, tokenizer, [c.prompt for c in cases], gate.max_tokens)
    lines = [
        json.dumps({"prompt": c.prompt, "reference": a}, ensure_ascii=False)
        for c, a in zip(cases, got, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)
