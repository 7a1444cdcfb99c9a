"""Hypercorn's :class:`~hypercorn.config.Config` for ``[server]``.

Used by the serve process and by every HTTP frontend (``[server] api_processes``), so a
frontend's connections have the limits of a single-process server. Hypercorn's
defaults that break streaming services are raised from config: ``graceful_timeout``
(3 s → ``server.graceful_timeout_s``, so streams in flight finish on SIGTERM),
``keep_alive_max_requests`` (1000 → ``server.keep_alive_max_requests``, so long-lived
HTTP/2 connections are not cut) and ``keep_alive_timeout``.
"""

from __future__ import annotations

import logging
from typing import Any

from servehall.config.models import ServerSettings
from servehall.errors import ConfigError


def server_config(s: ServerSettings) -> Any:
    """The Hypercorn config for ``s`` (binds as configured: ``host:port`` entries).

    Raises:
        ConfigError: only one of ``certfile`` and ``keyfile`` is set.
    """
    from hypercorn.config import Config

    from servehall.server.hypercorn import h1_early_response

    cfg = Config()
    cfg.bind = list(s.bind)
    if s.certfile and s.keyfile:
        cfg.certfile = str(s.certfile)
        cfg.keyfile = str(s.keyfile)
    elif s.certfile or s.keyfile:
        raise ConfigError("server.certfile and server.keyfile must be set together")
    cfg.alpn_protocols = ["h2", "http/1.1"]
    cfg.graceful_timeout = s.graceful_timeout_s
    cfg.keep_alive_timeout = s.keep_alive_timeout_s
    cfg.keep_alive_max_requests = s.keep_alive_max_requests
    cfg.h2_max_concurrent_streams = 256
    setattr(cfg, h1_early_response.DRAIN_BYTES_ATTR, s.early_response_drain_bytes)
    setattr(cfg, h1_early_response.DRAIN_S_ATTR, s.early_response_drain_s)
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("hypercorn.error")
    cfg.include_server_header = False
    return cfg
