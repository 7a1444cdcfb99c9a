"""Keep a half-installed Ascend stack from breaking ``import torch`` in the host.

``torch_npu`` registers itself in the ``torch.backends`` entry-point group, and torch
(>= 2.5) imports every such extension at ``import torch`` unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. Without the Ascend CANN toolkit, that import fails,
and with it every torch backend (``cpu`` included). When this plugin loads, before torch is
imported, and finds ``torch_npu`` installed but no CANN toolkit, it sets
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (unless the operator set it) so torch imports cleanly;
the ``ascend`` backend then reports itself unavailable with the reason. The NPU adapter
imports ``torch_npu`` explicitly when it is selected, so autoload is never needed.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger("servehall.ascend")

AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"
CANN_ENVS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
CANN_DEFAULT_PATHS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")


def torch_npu_installed() -> bool:
    """``torch_npu`` is importable in principle (found on the path; never imported here)."""
    try:
        return importlib.util.find_spec("torch_npu") is not None
    except (ImportError, ValueError):
        return False


def cann_home() -> Path | None:
    """The Ascend CANN toolkit directory (from its env variables or default paths)."""
    for env in CANN_ENVS:
        value = os.environ.get(env)
        if value and Path(value).is_dir():
            return Path(value)
    for p in CANN_DEFAULT_PATHS:
        if Path(p).is_dir():
            return Path(p)
    return None


def protect_torch_import() -> bool:
    """Disable torch's device-extension autoload when ``torch_npu`` cannot load.

    Returns True when it set ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. Does nothing when torch
    is already imported, when the operator set the variable, or when CANN is present.
    """
    if "torch" in sys.modules or AUTOLOAD_ENV in os.environ:
        return False
    if not torch_npu_installed() or cann_home() is not None:
        return False
    os.environ[AUTOLOAD_ENV] = "0"
    log.warning(
        "torch_npu is installed but no Ascend CANN toolkit was found: set %s=0 so that "
        "`import torch` keeps working; backend 'ascend' is unavailable",
        AUTOLOAD_ENV,
    )
    return True
