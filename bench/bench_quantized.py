"""openvino_cpu weight formats side by side: fp32 against int8 and int4 (NNCF weight
compression at conversion time, option ``weight_format``).

Usage::

    python bench/bench_quantized.py [--size demo|small] [-n 50] [--max-tokens 32]
        [--formats fp32,int8,int4] [--json out.json]

For each format the demo model (``servehall demo-model --size``; built if missing) is
converted into a fresh cache directory (conversion time, IR ``.bin`` size on disk), then a
child process serves it with the openvino_cpu engine (``inference_precision = "f32"``)
and reports its RSS: the engine's share (after start, less the process after importing
OpenVINO GenAI and xgrammar, which the engine loads anyway: weights, compiled model,
KV pool), the whole process after start and its peak; single-stream greedy tokens/s (``-n``
prompts one after another, ``--max-tokens`` each, EOS ignored) and batched tokens/s (the
same prompts at once). Prompts are the starts (3-6 words) of sentences from the demo
model's own training grammar (:func:`servehall.demo.corpus.sentence`, seed 1), so the
model continues them in distribution. Agreement with fp32 over the single-stream outputs:
``prefix`` = mean fraction of the output that equals fp32's before the first differing
token, ``exact`` = fraction of prompts whose whole output equals fp32's. Figures:
docs/performance.md ("Quantized weights on openvino_cpu").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def prompts(n: int, seed: int = 1) -> list[str]:
    """``n`` prompt texts: the first 3-6 words of demo-corpus sentences."""
    from servehall.demo.corpus import sentence

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = sentence(rng).split()
        out.append(" ".join(words[: rng.randint(3, min(6, max(3, len(words) - 1)))]))
    return out


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _serve(ir_dir: Path, ids: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from servehall import ModelConfig, SamplingParams
    from servehall_openvino_cpu import plugin

    model = ModelConfig(
        name="q",
        path=ir_dir,
        backend="openvino_cpu",
        options={"inference_precision": "f32", "num_kv_blocks": 512},
    )
    import openvino_genai  # noqa: F401  (the libraries first: the baseline RSS holds them)

    from servehall_openvino_cpu.engine import _import_grammar_backend

    _import_grammar_backend()
    rss_base = _rss_kib()
    engine = plugin.factory(model)
    t0 = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - t0
    rss_started = _rss_kib()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def one(rid: str, p: list[int]) -> list[int]:
        return [t async for d in engine.add_request(rid, p, params) for t in d.token_ids]

    try:
        await one("warm", ids[0])
        t0 = time.perf_counter()
        outs = [await one(f"s{i}", p) for i, p in enumerate(ids)]
        single_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        batched = await asyncio.gather(*(one(f"b{i}", p) for i, p in enumerate(ids)))
        batch_s = time.perf_counter() - t0
    finally:
        await engine.shutdown()
    n_tokens = sum(len(o) for o in outs)
    return {
        "start_s": start_s,
        "rss_libs_mib": rss_base / 1024,
        "rss_engine_mib": (rss_started - rss_base) / 1024,
        "rss_started_mib": rss_started / 1024,
        "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "single_tok_s": n_tokens / single_s,
        "batched_tok_s": sum(len(o) for o in batched) / batch_s,
        "outputs": outs,
    }


def child(ir_dir: Path, ids_file: Path, max_tokens: int) -> None:
    """Serve ``ir_dir`` in this process; print the figures as one JSON line."""
    ids = json.loads(ids_file.read_text())
    print(json.dumps(asyncio.run(_serve(ir_dir, ids, max_tokens))))


def agreement(ref: list[list[int]], got: list[list[int]]) -> tuple[float, float]:
    """(mean prefix agreement, exact-match rate) of ``got`` against ``ref``."""
    prefix = []
    for a, b in zip(ref, got, strict=True):
        same = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            same += 1
        prefix.append(same / max(len(a), 1))
    exact = sum(a == b for a, b in zip(ref, got, strict=True)) / len(ref)
    return sum(prefix) / len(prefix), exact


def main() -> int:
    """Run the comparison and print a Markdown table (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="demo", help="demo model size (demo, small)")
    ap.add_argument("-n", type=int, default=50, help="prompts")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--formats", default="fp32,int8,int4")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", nargs=3, metavar=("IR", "IDS", "MAX"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), int(args.child[2]))
        return 0

    from transformers import AutoTokenizer

    from servehall.demo import build_demo_model, default_demo_dir
    from servehall_openvino_cpu.convert import resolve_ir_dir

    src = build_demo_model(default_demo_dir(args.size), size=args.size)
    tok = AutoTokenizer.from_pretrained(src)
    ids = [tok(p).input_ids for p in prompts(args.n)]
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        ids_file = Path(tmp) / "ids.json"
        ids_file.write_text(json.dumps(ids))
        for fmt in args.formats.split(","):
            t0 = time.perf_counter()
            ir = resolve_ir_dir(src, cache_dir=Path(tmp) / fmt, weight_format=fmt, quiet=True)
            convert_s = time.perf_counter() - t0
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(ir), str(ids_file), str(args.max_tokens)],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["convert_s"] = convert_s
            row["bin_mib"] = (ir / "openvino_model.bin").stat().st_size / 2**20
            rows[fmt] = row
    ref = rows[next(iter(rows))]["outputs"]
    print(f"model {args.size}, {args.n} prompts x {args.max_tokens} tokens, greedy")
    print(
        "| format | convert s | IR .bin MiB | engine RSS MiB | process RSS / peak MiB "
        "| 1-stream tok/s "
        "| batched tok/s | prefix agreement | exact match |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for fmt, r in rows.items():
        prefix, exact = agreement(ref, r["outputs"])
        r["prefix_agreement"], r["exact_match"] = prefix, exact
        print(
            f"| {fmt} | {r['convert_s']:.1f} | {r['bin_mib']:.2f} | {r['rss_engine_mib']:.0f} "
            f"| {r['rss_started_mib']:.0f} / {r['rss_peak_mib']:.0f} | {r['single_tok_s']:.0f} "
            f"| {r['batched_tok_s']:.0f} | {prefix:.2f} | {exact:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
