"""Records: the request log and audit events, and the sinks they go to.

The request path builds one :class:`RequestRecord` per request and calls
``RecordBus.emit``; admin and security actions call ``RecordBus.audit``. Sinks (the
core's ``sql`` and ``jsonl``, or a plugin's) are registered through
``servehall_register_sinks`` and fed from the bus's bounded async queue.
"""

from servehall.records.types import AuditEvent, Record, RequestRecord, Sink, SinkSpec

__all__ = ["AuditEvent", "Record", "RequestRecord", "Sink", "SinkSpec"]
