"""The batch runner's call into the request path.

The runner sends each line to the app's own ASGI stack with a :class:`BatchCall` under
the scope key :data:`SCOPE_KEY`. Only code in this process can put a Python object into
an ASGI scope (a server builds scopes from the network with fixed keys and plain
values), so the auth middleware trusts the call's principal without authenticating, and
the inference endpoint schedules the request at the call's priority and records its
batch id and ``custom_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servehall.admission.principal import Principal

SCOPE_KEY = "servehall.batch_call"
"""The ASGI scope key of a :class:`BatchCall`."""


@dataclass(slots=True)
class BatchCall:
    """One batch line sent by the runner: it runs as ``principal`` (the batch's owner as
    stored), at most at ``priority``, recorded with ``batch_id`` and ``custom_id``.
    ``preempted`` is set by the runner when it stops the line for online traffic (the
    line's request is then recorded as 499 ``preempted``, not ``cancelled``)."""

    principal: Principal
    batch_id: str
    custom_id: str
    priority: int
    preempted: bool = field(default=False, compare=False)
