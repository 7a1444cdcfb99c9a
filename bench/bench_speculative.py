"""openvino_cpu speculative decoding: the ``demo`` model drafting for the ``small`` model
(options ``draft_model`` and ``num_assistant_tokens``), against ``small`` alone.

Usage::

    python bench/bench_speculative.py [--main small|demo] [-n 40] [--max-tokens 32]
        [--k 2,4,8] [--rounds 3] [--concurrency 8] [--pruned 2] [--json out.json]

Both models come from ``servehall demo-model`` (``--size small`` and the default size;
built if missing): the same tokenizer (trained on the same corpus with the same seed,
byte-identical ``tokenizer.json``) and the same training recipe, 24.6 M and 1.3 M
parameters. ``--pruned N`` (default 2) adds a draft: the main model cut to its first N decoder
layers (of 8 in ``small``, 4 in ``demo``; :func:`pruned_draft`: shares its embedding and
head). ``--main demo`` serves ``demo`` with only the pruned draft. One engine per
configuration (``small`` alone, then with each draft and each ``num_assistant_tokens``
in ``--k``; ``inference_precision = "f32"``,
``num_kv_blocks = 512``) is started in this process; then, ``--rounds`` times, each
engine in turn runs the ``-n`` prompts one after another (1-stream) and all at once with at
most ``--concurrency`` in flight (batched), greedy, ``--max-tokens`` each, EOS ignored.
Interleaving the configurations round by round spreads the machine's load changes over
all of them; the tables give the median tokens/s over the rounds and the speedup against
``small`` alone. ``identical`` = share of prompts whose 1-stream output equals ``small``
alone's (speculative greedy decoding must keep it at 1.00). Acceptance comes from
OpenVINO GenAI's own counters: a second pipeline of each speculative engine runs the
prompts through ``ContinuousBatchingPipeline.generate()``, whose results carry
``SDPerModelsPerfMetrics`` (draft tokens offered, accepted); the engine's step API does
not report them per request. Prompts: the first 3-6 words of sentences of the demo
models' training grammar (:func:`bench_quantized.prompts`). Figures: docs/performance.md
("Speculative decoding on openvino_cpu").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_quantized import prompts


async def run_engine(engine: Any, ids: list[list[int]], max_tokens: int, conc: int) -> dict:
    """One 1-stream pass and one batched pass; tokens/s of each and the outputs."""
    from servehall import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def one(rid: str, p: list[int]) -> list[int]:
        return [t async for d in engine.add_request(rid, p, params) for t in d.token_ids]

    t0 = time.perf_counter()
    outs = [await one(f"s{i}", p) for i, p in enumerate(ids)]
    single_s = time.perf_counter() - t0
    gate = asyncio.Semaphore(conc)

    async def limited(i: int, p: list[int]) -> list[int]:
        async with gate:
            return await one(f"b{i}", p)

    t0 = time.perf_counter()
    batched = await asyncio.gather(*(limited(i, p) for i, p in enumerate(ids)))
    batch_s = time.perf_counter() - t0
    return {
        "single_tok_s": sum(map(len, outs)) / single_s,
        "batched_tok_s": sum(map(len, batched)) / batch_s,
        "outputs": outs,
    }


def acceptance(engine: Any, ids: list[list[int]], max_tokens: int) -> tuple[int, int]:
    """(draft tokens offered, accepted) over ``ids`` from OpenVINO GenAI's counters."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    pipe = engine.new_pipeline()
    config = engine.assist(openvino_genai.GenerationConfig())
    config.max_new_tokens, config.do_sample, config.ignore_eos = max_tokens, False, True
    offered = accepted = 0
    for p in ids:  # one at a time, as the 1-stream pass
        (r,) = pipe.generate([ov.Tensor(np.asarray([p], dtype=np.int64))], [config])
        offered += r.extended_perf_metrics.get_num_draft_tokens()
        accepted += r.extended_perf_metrics.get_num_accepted_tokens()
    return offered, accepted


def pruned_draft(src: Path, layers: int) -> Path:
    """``src`` (a Hugging Face Llama directory) cut to its first ``layers`` decoder layers
    (embedding, final norm and LM head kept): a draft that shares the model's tokenizer
    and weights. Built once into ``$SERVEHALL_CACHE_DIR/bench-draft-<name>-<layers>l``."""
    from servehall import build_atomically, servehall_cache_dir

    target = servehall_cache_dir(f"bench-draft-{src.name}-{layers}l")

    def build(tmp: Path) -> None:
        import shutil

        from safetensors.torch import load_file, save_file

        for f in src.iterdir():
            if f.is_file() and f.name not in ("model.safetensors", "config.json"):
                shutil.copy2(f, tmp / f.name)
        cfg = json.loads((src / "config.json").read_text())
        cfg["num_hidden_layers"] = layers
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        keep = {
            k: v
            for k, v in load_file(src / "model.safetensors").items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
        }
        save_file(keep, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "bench-draft.json").write_text(json.dumps({"source": str(src), "layers": layers}))

    return build_atomically(target, build, is_ready=lambda d: (d / "bench-draft.json").is_file())


async def bench(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from transformers import AutoTokenizer

    from servehall import ModelConfig
    from servehall.demo import build_demo_model, default_demo_dir
    from servehall_openvino_cpu import plugin

    main = build_demo_model(default_demo_dir(args.main), size=args.main)
    drafts: dict[str, Path] = {}
    if args.main == "small":
        draft = build_demo_model(default_demo_dir("demo"), size="demo")
        same = (main / "tokenizer.json").read_bytes() == (draft / "tokenizer.json").read_bytes()
        if not same:
            raise SystemExit("the demo and small models' tokenizers differ")
        drafts["demo"] = draft
    if args.pruned:
        drafts[f"{args.main}-{args.pruned}L"] = pruned_draft(main, args.pruned)
    tok = AutoTokenizer.from_pretrained(main)
    ids = [tok(p).input_ids for p in prompts(args.n)]
    base = {"inference_precision": "f32", "num_kv_blocks": 512}
    configs: dict[str, dict[str, Any]] = {f"{args.main} alone": base}
    for dname, dpath in drafts.items():
        for k in (int(x) for x in args.k.split(",")):
            configs[f"+ {dname} draft, k={k}"] = {
                **base,
                "draft_model": str(dpath),
                "num_assistant_tokens": k,
            }
    engines = {}
    for name, opts in configs.items():
        engines[name] = plugin.factory(
            ModelConfig(name="s", path=main, backend="openvino_cpu", options=opts)
        )
        await engines[name].start()
    rows: dict[str, dict[str, Any]] = {n: {"single": [], "batched": []} for n in configs}
    try:
        for engine in engines.values():  # warm-up
            await run_engine(engine, ids[:2], args.max_tokens, args.concurrency)
        for rnd in range(args.rounds):
            for name, engine in engines.items():
                r = await run_engine(engine, ids, args.max_tokens, args.concurrency)
                rows[name]["single"].append(r["single_tok_s"])
                rows[name]["batched"].append(r["batched_tok_s"])
                rows[name]["outputs"] = r["outputs"]
                print(
                    f"round {rnd + 1} {name}: {r['single_tok_s']:.0f} / "
                    f"{r['batched_tok_s']:.0f} tok/s",
                    file=sys.stderr,
                )
        for name, engine in engines.items():
            if "draft_model" in configs[name]:
                offered, accepted = await asyncio.to_thread(
                    acceptance, engine, ids, args.max_tokens
                )
                rows[name]["offered"], rows[name]["accepted"] = offered, accepted
    finally:
        for engine in engines.values():
            await engine.shutdown()
    return rows


def main() -> int:
    """Run the comparison and print a Markdown table (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--main", default="small", choices=("small", "demo"), help="main model")
    ap.add_argument("-n", type=int, default=40, help="prompts")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--k", default="2,4,8", help="num_assistant_tokens values")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--pruned",
        type=int,
        default=2,
        help="also draft with the main model's first N layers (0: not)",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = asyncio.run(bench(args))
    ref_name = next(iter(rows))
    ref = rows[ref_name]
    s0, b0 = statistics.median(ref["single"]), statistics.median(ref["batched"])
    print(
        f"{args.main} (main), {args.n} prompts x {args.max_tokens} tokens, greedy, "
        f"median of {args.rounds} rounds"
    )
    print(
        "| configuration | 1-stream tok/s | speedup | batched tok/s (≤ "
        f"{args.concurrency} in flight) | speedup | draft tokens accepted | identical |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        s, b = statistics.median(r["single"]), statistics.median(r["batched"])
        same = sum(a == o for a, o in zip(ref["outputs"], r["outputs"], strict=True))
        acc = (
            f"{r['accepted']} / {r['offered']} ({r['accepted'] / max(r['offered'], 1):.0%})"
            if "offered" in r
            else "—"
        )
        print(
            f"| {name} | {s:.0f} | {s / s0:.2f}× | {b:.0f} | {b / b0:.2f}× | {acc} "
            f"| {same / len(ref['outputs']):.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
