#!/usr/bin/env bash
# GPU smoke test of the `cuda` backend, end to end, in under five minutes.
#
# Run it on a machine with an NVIDIA GPU, a CUDA build of torch (2.13) and servehall +
# servehall-cuda installed (e.g. `pip install -e ./core -e ./plugins/cuda` in a venv
# whose torch came from https://pytorch.org/get-started):
#
#     bench/gpu_smoke.sh                 # uses .venv/bin/python if present, else python3
#     PYTHON=/opt/venv/bin/python CUDA_VISIBLE_DEVICES=1 bench/gpu_smoke.sh
#
# What it does (each step prints PASS/FAIL; exit status 0 only if all pass):
#   1. probe: `cuda` must be available (prints the probe reason otherwise, exit 2);
#   2. builds the demo model locally (`servehall demo-model`);
#   3. serves it twice: backend `cuda` (float32, sdpa) and backend `cpu` (the reference);
#   4. cuda: a completion, a streamed chat completion (ordered SSE chunks, one
#      finish_reason, [DONE]), 16 concurrent requests;
#   5. abort: a long stream closed after a few chunks; the KV-cache gauge
#      (servehall_kv_cache_blocks_used on /metrics) must return to 0;
#   6. parity: greedy completions of a set of prompts are identical on cuda and cpu.
# ENGINE=onnxruntime runs the ONNX Runtime GenAI engine on the CUDA execution provider instead
# of the torch engine (needs onnxruntime-genai-cuda and `pip install -e './core[onnxruntime]'`;
# DTYPE then names the build precision: float32 -> fp32 keeps parity strict, float16 -> fp16
# builds a PagedAttention model for continuous batching and makes parity advisory).
# ENGINE=vllm runs the shared vLLM engine instead (vLLM's CUDA build, `pip install vllm`, in
# this environment, or WORKER_PYTHON=/venv/bin/python naming an environment that has
# servehall + vLLM: the model's worker.python). VLLM_COMPARE=1 (with ENGINE=vllm) then builds a
# random-weight Llama of ~0.9 B parameters in bf16 with the demo tokenizer and runs
# `servehall bench compare vllm-server:big launch:h2` (c = 16, 64 tokens, ignore_eos): vLLM's
# own OpenAI server against servehall on vLLM, targets >= 0.95 of its throughput and TTFT P50
# <= 1.05x. NOT RUN YET: no GPU was lent to the session that wrote these steps.
# API_SWEEP=1 adds the API-process sweep (issue 38 item 3) over API_COUNTS (default "1 2 4 8"):
#   8. the `null` engine (256 sequences, 5 ms steps: 51,200 tok/s nominal, more than one API
#      process carries) with [server] api_processes = N, one N after the other, driven by
#      h2load (`bench/bench_api_cpu.py --api-processes 1,2,4,8 --no-bare --stagger-ms 20`: tok/s of 64-token
#      streams x256, req/s of one-token streams x64, CPU per process); without h2load
#      (nghttp2-client) the bench's own client over HTTP/1.1 (`bench compare launch:h1
#      --api-processes ...`); figures only (advisory: N = 2 >= 1.5x N = 1 is the 2-core target);
#   9. with ENGINE=vllm VLLM_COMPARE=1: for each N, `bench compare vllm-server:big,api=N
#      launch:h1,api=N` (vLLM's `vllm serve --api-server-count N` against servehall on vLLM
#      with api_processes = N; HTTP/1.1, c = 64, short outputs so that the API side is
#      loaded); each server is started for its target only: ~2 vLLM starts per N (budget
#      ~1.5 min per start; API_COUNTS="1 2" halves it). SWEEP_OUT names the directory the
#      sweep's outputs are copied to (default /tmp/servehall-api-sweep).
# Env knobs: DTYPE (float32; bfloat16/float16 make parity advisory), ATTN (sdpa),
# DEVICE_INDEX (0), KEEP=1 keeps the work directory with server logs,
# BACKEND=cpu dry-runs the whole script without a GPU (checks the script, not a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
PY=$(cd "$(dirname "$(command -v "$PY")")" && pwd)/$(basename "$PY")
DTYPE=${DTYPE:-float32}
ATTN=${ATTN:-sdpa}
DEVICE_INDEX=${DEVICE_INDEX:-0}
BACKEND=${BACKEND:-cuda}
ENGINE=${ENGINE:-torch}
API_SWEEP=${API_SWEEP:-0}
API_COUNTS=${API_COUNTS:-1 2 4 8}
SWEEP_OUT=${SWEEP_OUT:-/tmp/servehall-api-sweep}
WORK=$(mktemp -d -t servehall-gpu-smoke.XXXXXX)
PIDS=()
START=$(date +%s)

cleanup() {
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = "1" ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

servehall() { "$PY" -c 'from servehall.cli import main; main()' "$@"; }

echo "== 1. probe"
"$PY" - "$BACKEND" <<'EOF' || exit 2
import sys
from servehall.plugin.manager import PluginHost
backend = sys.argv[1]
reg = PluginHost(["cuda"] if backend == "cuda" else []).backends()
r = reg.probe(backend)
print(f"{backend}: available={r.available} ({r.reason})")
print(f"cpu:  available={reg.probe('cpu').available} ({reg.probe('cpu').reason})")
sys.exit(0 if r.available else 1)
EOF

echo "== 2. demo model"
MODEL=$(servehall demo-model --out "$WORK/demo" | tail -n 1)
echo "model: $MODEL"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
CUDA_PORT=$(free_port)
CPU_PORT=$(free_port)

if [ "$BACKEND" = "cuda" ]; then ENABLED='["cuda"]'; else ENABLED='[]'; fi
WORKER_LINE=""
if [ -n "${WORKER_PYTHON:-}" ]; then WORKER_LINE="worker = { python = \"$WORKER_PYTHON\" }"; fi
if [ "$ENGINE" = "vllm" ]; then
  OPTIONS="{ engine = \"vllm\", dtype = \"$DTYPE\", gpu_memory_utilization = 0.6 }"
elif [ "$ENGINE" = "onnxruntime" ]; then
  case "$DTYPE" in float16) PREC=fp16 ;; bfloat16) PREC=bf16 ;; *) PREC=fp32 ;; esac
  OPTIONS="{ engine = \"onnxruntime\", precision = \"$PREC\", device_index = $DEVICE_INDEX, cache_dir = \"$WORK/onnx\" }"
elif [ "$BACKEND" = "cuda" ]; then
  OPTIONS="{ dtype = \"$DTYPE\", attn_implementation = \"$ATTN\", device_index = $DEVICE_INDEX }"
else
  OPTIONS="{ dtype = \"$DTYPE\" }"
fi
echo "engine: $ENGINE, options: $OPTIONS"
cat >"$WORK/cuda.toml" <<EOF
[plugins]
enabled = $ENABLED
[[models]]
name = "demo"
path = "$MODEL"
backend = "$BACKEND"
options = $OPTIONS
$WORKER_LINE
[database]
url = "sqlite+aiosqlite:///$WORK/cuda.db"
auto_migrate = true
EOF
cat >"$WORK/cpu.toml" <<EOF
[[models]]
name = "demo"
path = "$MODEL"
backend = "cpu"
options = { dtype = "float32" }
[database]
url = "sqlite+aiosqlite:///$WORK/cpu.db"
auto_migrate = true
EOF

echo "== 3. serve ($BACKEND on :$CUDA_PORT, cpu on :$CPU_PORT)"
(cd "$WORK" && servehall serve --config cuda.toml --bind "127.0.0.1:$CUDA_PORT" >cuda.log 2>&1) &
PIDS+=($!)
(cd "$WORK" && servehall serve --config cpu.toml --bind "127.0.0.1:$CPU_PORT" >cpu.log 2>&1) &
PIDS+=($!)

set +e
"$PY" - "$CUDA_PORT" "$CPU_PORT" "$WORK" "$DTYPE" "${PIDS[0]}" "${PIDS[1]}" <<'EOF'
import asyncio, json, os, re, sys, time
import httpx

cuda_port, cpu_port, work, dtype = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
pids = {"cuda.log": int(sys.argv[5]), "cpu.log": int(sys.argv[6])}
CUDA, CPU = f"http://127.0.0.1:{cuda_port}", f"http://127.0.0.1:{cpu_port}"
results: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    results.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""), flush=True)


def alive(pid: int) -> bool:
    """The server process still runs (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_ready(base: str, log: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pids[log]):
            break
        try:
            if httpx.get(base + "/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    print(open(f"{work}/{log}").read()[-3000:])
    raise SystemExit(f"{base} exited or was not ready after {timeout} s (log above)")


def kv_used(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    m = re.search(r'^servehall_kv_cache_blocks_used\{model="demo"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else -1.0


wait_ready(CUDA, "cuda.log")
wait_ready(CPU, "cpu.log")
check("servers ready", True)

with httpx.Client(base_url=CUDA, http1=False, http2=True, timeout=60) as c:
    r = c.post("/v1/completions", json={"model": "demo", "prompt": "Hello", "max_tokens": 16, "temperature": 0})
    check("cuda completion", r.status_code == 200 and bool(r.json()["choices"][0]["text"]), r.text[:120])

    chunks, finishes, done = [], [], False
    body = {"model": "demo", "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 32, "temperature": 0, "stream": True}
    with c.stream("POST", "/v1/chat/completions", json=body) as s:
        for line in s.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                ch = json.loads(line[6:])["choices"][0]
                chunks.append(ch.get("delta", {}).get("content") or "")
                if ch.get("finish_reason"):
                    finishes.append(ch["finish_reason"])
    check("cuda streamed chat", done and len(finishes) == 1 and len(chunks) > 2,
          f"{len(chunks)} chunks, finish={finishes}")

    before = kv_used(c)
    with c.stream("POST", "/v1/completions", json={"model": "demo", "prompt": "Once upon a time",
                                                   "max_tokens": 1500, "temperature": 0.8,
                                                   "seed": 1, "stream": True}) as s:
        n = 0
        for line in s.iter_lines():
            n += line.startswith("data: {")
            if n >= 5:
                break
        during = kv_used(c)
    deadline, after = time.monotonic() + 10, kv_used(c)
    while after > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        after = kv_used(c)
    check("cuda abort frees KV blocks", during > 0 and after == 0,
          f"before={before} during={during} after={after}")


async def burst() -> list[int]:
    async with httpx.AsyncClient(base_url=CUDA, http1=False, http2=True, timeout=120) as ac:
        rs = await asyncio.gather(*(ac.post("/v1/completions", json={
            "model": "demo", "prompt": f"Story {i}:", "max_tokens": 48, "temperature": 0.7, "seed": i})
            for i in range(16)))
        return [r.status_code for r in rs]

codes = asyncio.run(burst())
check("cuda 16 concurrent requests", codes == [200] * 16, str(sorted(set(codes))))

prompts = ["Hello", "The cat sat on", "Once upon a time, the old house", "The last train", "1 2 3"]
def greedy(base: str) -> list[tuple[str, int]]:
    with httpx.Client(base_url=base, timeout=120) as c:
        out = []
        for p in prompts:
            b = c.post("/v1/completions", json={"model": "demo", "prompt": p, "max_tokens": 32,
                                                "temperature": 0}).json()
            out.append((b["choices"][0]["text"], b["usage"]["completion_tokens"]))
        return out
gpu, ref = greedy(CUDA), greedy(CPU)
same = sum(a == b for a, b in zip(gpu, ref))
detail = f"{same}/{len(prompts)} identical" + ("" if dtype == "float32" else f" (advisory at {dtype})")
check("parity cuda vs cpu (greedy)", same == len(prompts) or dtype != "float32", detail)
for p, a, b in zip(prompts, gpu, ref):
    if a != b:
        print(f"      {p!r}: cuda={a!r}\n      {'':{len(p)+2}}  cpu ={b!r}")

failed = [n for n, ok, _ in results if not ok]
sys.exit(1 if failed else 0)
EOF
STATUS=$?

if [ "$STATUS" = "0" ] && [ "$ENGINE" = "vllm" ] && [ "${VLLM_COMPARE:-0}" = "1" ]; then
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
  echo "== 7. bench compare: vLLM's own server vs servehall on vLLM (~0.9 B params, bf16)"
  # the worker's interpreter (if any) builds it: it has transformers and torch for the GPU
  "${WORKER_PYTHON:-$PY}" - "$MODEL" "$WORK/big" <<'EOF'
import shutil, sys
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
demo, out = Path(sys.argv[1]), Path(sys.argv[2])
vocab = LlamaConfig.from_pretrained(demo).vocab_size
cfg = LlamaConfig(vocab_size=vocab, hidden_size=2048, intermediate_size=5632,
                  num_hidden_layers=18, num_attention_heads=16, num_key_value_heads=8,
                  max_position_embeddings=4096, torch_dtype="bfloat16",
                  bos_token_id=0, eos_token_id=1, pad_token_id=2)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
print(f"parameters: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B")
model.save_pretrained(out)
for f in demo.iterdir():
    if f.name.startswith(("tokenizer", "special_tokens")):
        shutil.copy(f, out / f.name)
EOF
  cat >"$WORK/bench.toml" <<EOF
[plugins]
enabled = $ENABLED
[[models]]
name = "big"
path = "$WORK/big"
backend = "$BACKEND"
options = { engine = "vllm", dtype = "bfloat16", gpu_memory_utilization = 0.4 }  # two servers share the GPU
$WORKER_LINE
[scheduler]
max_concurrency = 16
EOF
  (cd "$WORK" && servehall bench compare vllm-server:big launch:h2 --config bench.toml \
      --model big --concurrency 16 --num-requests 64 --output-len 64 --ignore-eos \
      --output-json "$WORK/compare.json") || STATUS=1
  cp "$WORK/compare.json" "${COMPARE_OUT:-/tmp/servehall-gpu-compare.json}" 2>/dev/null || true
fi

if [ "$API_SWEEP" = "1" ]; then
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
  mkdir -p "$SWEEP_OUT"
  COUNTS_CSV=$(echo "$API_COUNTS" | tr -s ' ' ',')
  echo "== 8. API-process sweep, null engine (api_processes = $COUNTS_CSV; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
  if command -v h2load >/dev/null; then
    SERVEHALL_BENCH_DEMO_DIR="$MODEL" "$PY" bench/bench_api_cpu.py --api-processes "$COUNTS_CSV" --stagger-ms 20 \
        --no-bare --stream-requests "${SWEEP_STREAMS:-4096}" --short-requests "${SWEEP_SHORT:-8192}" \
        --json | tee "$WORK/api-sweep-null.txt" || STATUS=1
  else
    echo "SKIP  h2load (nghttp2-client) not found: the bench's own client over HTTP/1.1 instead"
    cat >"$WORK/null.toml" <<EOF
sinks = []
[[models]]
name = "null"
path = "$MODEL"
backend = "null"
options = { step_time_ms = 5.0, max_num_seqs = 256 }
[scheduler]
max_concurrency = 256
[database]
url = "sqlite+aiosqlite:///$WORK/null.db"
auto_migrate = true
EOF
    for out_len in 64 1; do
      conc=256; [ "$out_len" = 1 ] && conc=64
      (cd "$WORK" && servehall bench compare launch:h1 --api-processes "$COUNTS_CSV" \
          --config null.toml --model null --concurrency "$conc" \
          --num-requests "${SWEEP_SHORT:-4096}" --input-len 16 --output-len "$out_len" \
          --ignore-eos --quiet --output-json "$WORK/api-sweep-null-$out_len.json") \
          | tail -n 20 || STATUS=1
    done
  fi
  cp "$WORK"/api-sweep-null* "$SWEEP_OUT"/ 2>/dev/null || true
  if [ "$ENGINE" = "vllm" ] && [ "${VLLM_COMPARE:-0}" = "1" ] && [ -d "$WORK/big" ]; then
    echo "== 9. API-process sweep: vLLM's own server vs servehall on vLLM, N in $API_COUNTS"
    sed -e 's/^max_concurrency = 16$/max_concurrency = 64/' "$WORK/bench.toml" >"$WORK/sweep.toml"
    for n in $API_COUNTS; do
      echo "-- N = $n ($(( $(date +%s) - START )) s in)"
      (cd "$WORK" && servehall bench compare "vllm-server:big,api=$n" "launch:h1,api=$n" \
          --config sweep.toml --model big --concurrency 64 --num-requests 512 --input-len 128 \
          --output-len 16 --ignore-eos --quiet --output-json "$WORK/api-sweep-vllm-$n.json") \
          | tail -n 12 || STATUS=1
    done
    cp "$WORK"/api-sweep-vllm-* "$SWEEP_OUT"/ 2>/dev/null || true
    # shellcheck disable=SC2086  # API_COUNTS: one argument per count
    "$PY" - "$WORK" $API_COUNTS <<'EOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
print(f"{'N':>3} {'vLLM tok/s':>11} {'servehall tok/s':>16} {'ratio':>6}  TTFT P50 ms vLLM / servehall")
for n in sys.argv[2:]:
    f = work / f"api-sweep-vllm-{n}.json"
    if not f.exists():
        print(f"{n:>3} (no result)")
        continue
    v, s = json.loads(f.read_text())["rows"]
    print(f"{n:>3} {v['output_throughput']:>11.1f} {s['output_throughput']:>16.1f} "
          f"{s['throughput_ratio']:>6.3f}  {v['ttft_p50_ms']:.1f} / {s['ttft_p50_ms']:.1f}")
EOF
  fi
  echo "sweep outputs: $SWEEP_OUT"
fi
echo "== done in $(( $(date +%s) - START )) s"
exit $STATUS

