"""Probe for backend ``ascend``: ``torch_npu`` importable and an NPU visible.

It never imports ``torch_npu`` (nor torch) in the host process: a static check first
(``torch_npu`` on the path, CANN toolkit present, ``/dev/davinci<N>`` device nodes, the
``ASCEND_RT_VISIBLE_DEVICES`` filter), then, only when all of that passes, a short
subprocess that imports ``torch_npu`` and counts devices — so a broken install can fail
there without touching the host. The result is cached per process.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from servehall import ProbeResult
from servehall.devices import VllmBuild, vllm_status
from servehall_ascend_stub.guard import cann_home, torch_npu_installed

VISIBLE_ENV = "ASCEND_RT_VISIBLE_DEVICES"
SUBPROCESS_TIMEOUT_S = 60.0
_COUNT_CODE = "import torch, torch_npu; print('NPU_COUNT', torch.npu.device_count())"


def device_nodes(dev: Path = Path("/dev")) -> list[int]:
    """Indices of ``/dev/davinci<N>`` nodes (the Ascend driver's per-NPU devices)."""
    try:
        names = [p.name for p in dev.iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"davinci(\d+)", n)))


def visible_after_filter(nodes: list[int], env: str | None) -> list[int]:
    """Apply ``ASCEND_RT_VISIBLE_DEVICES`` (comma-separated physical ids) to ``nodes``."""
    if env is None:
        return nodes
    wanted = [int(x) for x in env.replace(" ", "").split(",") if x.isdigit()]
    return [n for n in wanted if n in nodes]


def count_in_subprocess(timeout: float = SUBPROCESS_TIMEOUT_S) -> tuple[int, str]:
    """Import torch_npu in a child interpreter and count NPUs: ``(count, detail)``."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", _COUNT_CODE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return 0, f"importing torch_npu took longer than {timeout:g} s"
    m = re.search(r"NPU_COUNT (\d+)", out.stdout)
    if out.returncode != 0 or not m:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return 0, f"import torch_npu failed: {tail[:300]}"
    return int(m.group(1)), f"{m.group(1)} NPU(s) visible to torch_npu"


def probe_ascend(
    *,
    installed: Callable[[], bool] = torch_npu_installed,
    cann: Callable[[], Path | None] = cann_home,
    nodes: Callable[[], list[int]] = device_nodes,
    counter: Callable[[], tuple[int, str]] = count_in_subprocess,
) -> ProbeResult:
    """Available when torch_npu imports and sees an NPU; the first failing check's reason
    otherwise. The keyword arguments replace machine checks in tests (fakes)."""
    if not installed():
        return ProbeResult(
            False, "torch_npu is not installed (pip install torch-npu on an Ascend host)"
        )
    home = cann()
    if home is None:
        return ProbeResult(
            False,
            "torch_npu is installed but the Ascend CANN toolkit is not "
            "(ASCEND_HOME_PATH unset, /usr/local/Ascend missing)",
        )
    found = nodes()
    if not found:
        return ProbeResult(False, "no Ascend NPU device nodes (/dev/davinci<N>) on this host")
    env = os.environ.get(VISIBLE_ENV)
    visible = visible_after_filter(found, env)
    if not visible:
        return ProbeResult(False, f"{VISIBLE_ENV}={env!r} hides every NPU (present: {found})")
    count, detail = counter()
    if count < 1:
        return ProbeResult(False, detail)
    return ProbeResult(True, f"{detail}; CANN at {home}")


@functools.lru_cache(maxsize=1)
def probe_ascend_cached() -> ProbeResult:
    """:func:`probe_ascend` on this machine, computed once per process."""
    return probe_ascend()


def probe_vllm_ascend(npu: ProbeResult | None = None, vllm: VllmBuild | None = None) -> ProbeResult:
    """Available when vLLM with the ``vllm-ascend`` platform plugin is installed and
    :func:`probe_ascend` finds a usable NPU (``npu``: its result, for tests)."""
    return vllm_status("ascend", npu if npu is not None else probe_ascend_cached(), vllm)


def probe_ascend_engines() -> ProbeResult:
    """The ``ascend`` backend's probe: the NPU checks, then which engines can run."""
    npu = probe_ascend_cached()
    v = probe_vllm_ascend(npu)
    return ProbeResult(npu.available, f"{npu.reason}; engine vllm: {v.reason}")


def default_engine() -> str:
    """``vllm`` where vllm-ascend is installed and an NPU is usable, else ``torch``."""
    return "vllm" if probe_vllm_ascend().available else "torch"
