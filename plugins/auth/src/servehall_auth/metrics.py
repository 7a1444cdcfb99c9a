"""Prometheus counters of the auth plugin (``prometheus_client``'s default registry,
which the host's ``GET /metrics`` includes).

``servehall_auth_limiter_errors_total{operation, outcome}``: shared rate-limit store
(``[auth] limits_url``) calls that failed. ``operation`` is ``acquire`` (admission),
``settle`` or ``release``; ``outcome`` is ``rejected`` (fail closed: 503), ``admitted``
(fail open: admitted without limits) or ``lost`` (a settle/release refund that could not
be applied; the bucket refills on its own within a minute).
``servehall_auth_key_cache_invalidations_total{source}``: key-cache entries dropped
because a key was revoked or rotated, ``source`` = ``local`` (changed by this
process) or ``broadcast`` (a change announced over Redis pub/sub, this process's own
included).
"""

from __future__ import annotations

from servehall import plugin_counter

LIMITER_ERRORS = plugin_counter(
    "servehall_auth_limiter_errors",
    "Shared rate-limit store calls that failed, by operation and outcome.",
    ("operation", "outcome"),
)
KEY_CACHE_INVALIDATIONS = plugin_counter(
    "servehall_auth_key_cache_invalidations",
    "Key-cache entries dropped after a revocation or rotation, by source.",
    ("source",),
)
