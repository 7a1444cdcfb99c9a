"""The example plugin is not installed in the workspace's environment (tests/test_wheels.py
installs it from its wheel); its unit tests import it from ``src``."""

import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)
