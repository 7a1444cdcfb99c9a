"""``servehall.worker.messages``: engine requests and reports through their msgspec
encoders and decoders."""

from __future__ import annotations

import msgspec

from servehall.worker.messages import (
    EmbedOutput,
    EmbedRequest,
    command_encoder,
    commands_decoder,
    report_decoder,
    report_encoder,
)


def test_embed_messages_round_trip() -> None:
    cmds = commands_decoder.decode(command_encoder.encode([EmbedRequest("e1", [[1, 2], [3]])]))
    assert cmds == [EmbedRequest("e1", [[1, 2], [3]])]
    out = EmbedOutput("e1", [[0.25, -1.0]])
    assert report_decoder.decode(report_encoder.encode(out)) == out
    err = EmbedOutput("e2", [], "bad", "invalid_request")
    assert report_decoder.decode(report_encoder.encode(err)) == err
    assert isinstance(msgspec.msgpack.encode(out), bytes)
