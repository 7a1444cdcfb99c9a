"""``servehall bench soak``: an accounting soak — mixed concurrent traffic (every
request shape, recorded client-library bodies, hostile inputs, generated schemas, client
disconnects, optional faults), then invariants I1–I6 checked after a clean stop.

Modules: ``cli`` (the command), ``mix`` (the traffic), ``corpus`` (hostile inputs,
generated schemas, recorded bodies), ``invariants`` (the checks, pure), ``run`` (server,
clients, faults, reading the records), ``record_sdk`` (records the client-library
bodies; run by hand).
"""
