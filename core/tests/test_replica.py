"""``servehall.replica``: this replica's name, configured or ``<hostname>-<pid>``."""

from __future__ import annotations

import os
import socket

import pytest

from servehall.replica import default_replica_name, replica_name


def test_replica_name_default_and_configured() -> None:
    assert default_replica_name().endswith(f"-{os.getpid()}")
    assert replica_name(None) == default_replica_name()
    assert replica_name("  ") == default_replica_name()
    assert replica_name(" pod-a ") == "pod-a"


def test_the_default_fits_128_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 300)
    name = default_replica_name()
    assert len(name) <= 128 and name.startswith("h" * 100 + "-")
