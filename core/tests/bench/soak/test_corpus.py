"""Tests of servehall.bench.soak.corpus's builders: the multipart upload body (parsed by
a real multipart parser), Shape.content/stream, the recorded client-library bodies
(model replaced, max_tokens capped, /v1 paths) and the schema shapes' field rotation
and streaming. (The hostile corpus: test_invariants.py and the API tests.)"""

from __future__ import annotations

import email.parser
import email.policy
import json
from importlib import resources

from servehall.bench.soak.corpus import (
    CHAT,
    MULTIPART_CTYPE,
    Shape,
    multipart_upload,
    schema_shapes,
    sdk_libraries,
    sdk_shapes,
)


def test_multipart_upload_parses_into_purpose_and_file() -> None:
    data = b'{"custom_id": "a"}\n{"custom_id": "b"}\n'
    raw = multipart_upload(data, purpose="batch")
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {MULTIPART_CTYPE}\r\n\r\n".encode() + raw
    )
    parts = {p.get_param("name", header="content-disposition"): p for p in msg.iter_parts()}
    assert set(parts) == {"purpose", "file"}
    assert parts["purpose"].get_payload(decode=True) == b"batch"
    assert parts["file"].get_filename() == "soak.jsonl"
    assert parts["file"].get_payload(decode=True) == data


def test_shape_content_and_stream() -> None:
    body = Shape("s", CHAT, body={"model": "m", "stream": True})
    assert body.stream and json.loads(body.content()) == {"model": "m", "stream": True}
    assert not Shape("s", CHAT, body={"stream": "yes"}).stream  # only a real true
    raw = Shape("r", CHAT, raw=b"{not json", body={"stream": True})
    assert raw.content() == b"{not json"
    assert not Shape("n", CHAT, raw=b"").stream


def test_sdk_shapes_use_the_model_and_short_answers() -> None:
    shapes = sdk_shapes("soak-model")
    assert shapes and len({s.name for s in shapes}) == len(shapes)
    data = resources.files("servehall.bench.soak") / "data"
    recorded = [
        json.loads(e.read_text(encoding="utf-8"))
        for e in data.iterdir()
        if e.name.startswith("sdk_bodies_") and e.name.endswith(".json")
    ]
    assert len(shapes) == sum(len(r["bodies"]) for r in recorded)
    for s in shapes:
        assert s.body is not None and s.path.startswith("/v1/"), s.name
        assert s.body.get("model", "soak-model") == "soak-model"
        limits = [s.body[k] for k in ("max_tokens", "max_completion_tokens") if k in s.body]
        assert limits and all(v <= 16 for v in limits if isinstance(v, int)), s.name
    libs = sdk_libraries()
    assert len(libs) == len(recorded)
    assert all(lib.endswith(" bodies)") for lib in libs)


def test_schema_shapes_rotate_fields_and_stream_every_other_round() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    shapes = schema_shapes("m", [schema] * 8)
    names = [s.name for s in shapes]
    assert len(set(names)) == 4 and names[:4] == names[4:]  # the four schema fields, in turn
    assert [s.stream for s in shapes] == [False] * 4 + [True] * 4
    assert all(s.path == CHAT and s.body and s.body["model"] == "m" for s in shapes)
    assert all(json.dumps(schema) in json.dumps(s.body) for s in shapes)  # carried as is
    assert schema_shapes("m", []) == []
