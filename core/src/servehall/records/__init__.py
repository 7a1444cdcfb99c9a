"""Records: the request log and audit events, and the sinks they go to.

The request path builds one :class:`RequestRecord` per request and calls
``RecordBus.emit``; admin and security actions call ``RecordBus.audit``. Sinks (the
core's ``sql`` and ``jsonl``, or a plugin's) are registered through
``servehall_register_sinks`` and fed from the bus's bounded async queues
(:mod:`servehall.records.runner`). The ``sql`` sink writes ``request_log`` and the
hash-chained ``audit_event`` table (:mod:`servehall.records.chain`).
"""

from servehall.records.types import AuditEvent, Record, RequestRecord, Sink, SinkSpec

__all__ = ["AuditEvent", "Record", "RequestRecord", "Sink", "SinkSpec"]
