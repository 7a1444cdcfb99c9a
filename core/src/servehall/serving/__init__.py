"""The generation loop of one request: sampling parameters, per-choice streams,
admission and the request record."""
