"""JSON-safe length-bounded strings and bounded "any JSON" values (structured/json_text.py).

* Unit: what the rewrites change and what they leave alone.
* Property, grammar level (xgrammar 0.1.31, the torch/openvino_cpu line): for random
  ``minLength``/``maxLength`` the compiled grammar accepts every instance
  hypothesis-jsonschema draws from the schema, and every string it accepts — raw control
  characters included in the candidates — parses with ``json.loads`` and validates.
* Property, model level (torch engine, the demo model, temperature 1): for random schemas
  and seeds, every output that ends with ``stop`` parses and validates — validation
  excepted for an output with U+FFFD: xgrammar 0.1.31 admits ill-formed UTF-8 bytes in
  strings, replaced by the detokenizer, so a bounded string can exceed its maxLength.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servehall.engines.contract import SamplingParams, StructuredConstraint
from servehall.structured.json_text import (
    ANY_DEF,
    JSON_STRING_UNIT,
    bounded_any_values,
    json_safe_lengths,
    json_safe_schema_text,
    json_safe_structural_tag,
)
from servehall.structured.schema import NUMBER_BOUND, check_json_schema

xgr = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

from servehall.structured.grammar import constraint_ebnf  # noqa: E402


def test_bounded_strings_become_json_safe_patterns() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 12},
            "b": {"type": ["string", "null"], "minLength": 2},
            "c": {"type": "string", "maxLength": 3, "enum": ["x", "yy"]},
            "d": {"type": "string", "format": "date", "maxLength": 10},
            "e": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 4}},
        },
    }
    out = json_safe_lengths(schema)
    props = out["properties"]
    assert props["a"] == {"type": "string", "pattern": f"^{JSON_STRING_UNIT}{{0,12}}$"}
    assert props["b"] == {"type": ["string", "null"], "pattern": f"^{JSON_STRING_UNIT}{{2,}}$"}
    assert props["c"] == schema["properties"]["c"]  # an enum/format has its own grammar
    assert props["d"] == schema["properties"]["d"]
    assert props["e"]["items"]["pattern"] == f"^{JSON_STRING_UNIT}{{1,4}}$"
    assert schema["properties"]["a"] == {"type": "string", "maxLength": 12}  # not modified
    text = json.dumps({"type": "integer"})
    assert json_safe_schema_text(text) is text


def test_structural_tag_schemas_are_rewritten() -> None:
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "tags": [
                {
                    "begin": "<tool_call>",
                    "content": {
                        "type": "json_schema",
                        "json_schema": {"type": "string", "maxLength": 5},
                    },
                    "end": "</tool_call>",
                }
            ],
        },
    }
    out = json.loads(json_safe_structural_tag(json.dumps(tag)))
    assert "pattern" in out["format"]["tags"][0]["content"]["json_schema"]
    assert json_safe_structural_tag("not json") == "not json"


def test_any_values_get_bounded_numbers() -> None:
    out = bounded_any_values({"type": "object", "additionalProperties": True})
    assert out["additionalProperties"] == {"$ref": f"#/$defs/{ANY_DEF}"}
    number = out["$defs"][ANY_DEF]["anyOf"][2]
    assert number == {"type": "number", "minimum": -NUMBER_BOUND, "maximum": NUMBER_BOUND}
    root = bounded_any_values(True)
    assert ANY_DEF in root["$defs"] and "anyOf" in root
    plain = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert bounded_any_values(plain) == plain
    nested = bounded_any_values({"type": "array", "items": {}})
    assert nested["items"] == {"$ref": f"#/$defs/{ANY_DEF}"}
    jsonschema.validate({"a": [1, {"b": None}], "c": "x"}, out)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"a": 10**16}, out)


def _grammar(schema: dict[str, Any]) -> Any:
    c = StructuredConstraint(json_schema=json.dumps(check_json_schema(schema, "s")))
    return xgr.Grammar.from_ebnf(constraint_ebnf(c))


def test_control_characters_are_refused_in_bounded_strings() -> None:
    g = _grammar({"type": "string", "maxLength": 12})
    assert not accepts(g, '"\x15ab"')
    assert accepts(g, '"ab"') and accepts(g, '"a\\nb"') and accepts(g, '"\\u00e9\u00e9"')
    assert not accepts(g, '"' + "a" * 13 + '"')


LENGTHS = st.tuples(st.integers(0, 6), st.integers(0, 10)).map(lambda t: (t[0], t[0] + t[1]))
CANDIDATES = st.lists(
    st.sampled_from([*'ab"\\\x00\x01\x15\x1f\n\té€', "\\n", "\\u0041"]),
    max_size=14,
).map("".join)


@settings(max_examples=40, deadline=None)
@given(bounds=LENGTHS, data=st.data())
def test_bounded_string_grammar_is_sound_and_complete(
    bounds: tuple[int, int], data: st.DataObject
) -> None:
    from hypothesis_jsonschema import from_schema

    low, high = bounds
    schema = {"type": "string", "minLength": low, "maxLength": high}
    g = _grammar(schema)
    instance = data.draw(from_schema(schema))
    for ensure_ascii in (True, False):
        assert accepts(g, json.dumps(instance, ensure_ascii=ensure_ascii)), instance
    candidate = '"' + data.draw(CANDIDATES) + '"'
    if accepts(g, candidate):
        jsonschema.validate(json.loads(candidate), schema)


# --- the model level: the torch engine on the demo model -------------------------------

STRING = st.builds(
    lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra},
    st.integers(0, 3),
    st.integers(0, 12),
)
LEAF = st.one_of(
    STRING,
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    st.just({"enum": ["red", "green"]}),
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 100),
    ),
)
SCHEMAS = st.one_of(
    STRING,
    st.dictionaries(st.sampled_from(["city", "n", "ok", "tag"]), LEAF, min_size=1, max_size=3).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props)}
    ),
    st.builds(
        lambda item, n: {"type": "array", "items": item, "maxItems": n}, LEAF, st.integers(1, 3)
    ),
)


@pytest.fixture(scope="module")
def demo_model() -> Path:
    from servehall.demo import build_demo_model, default_demo_dir

    return Path(build_demo_model(default_demo_dir()))


@pytest.fixture(scope="module")
def torch_engine(demo_model: Path) -> Any:
    pytest.importorskip("torch")
    from servehall import ModelConfig
    from servehall.engines.torch import CpuDevice
    from servehall.engines.torch.engine import TorchEngine

    model = ModelConfig(
        name="demo",
        path=demo_model,
        backend="cpu",
        max_model_len=256,
        options={"kv_cache_blocks": 64, "block_size": 16, "dtype": "float32"},
    )
    loop = asyncio.new_event_loop()
    engine = TorchEngine(model, CpuDevice(), "cpu")
    loop.run_until_complete(engine.start())
    yield loop, engine
    loop.run_until_complete(engine.shutdown())
    loop.close()


_TOKENIZERS: dict[Any, Any] = {}
_IDS = itertools.count()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, seed=st.integers(0, 2**31 - 1))
def test_torch_outputs_that_finish_parse_and_validate(
    torch_engine: Any, schema: dict[str, Any], seed: int
) -> None:
    from transformers import AutoTokenizer

    from servehall.testing.conformance import collect, tokens_of

    loop, engine = torch_engine
    norm = check_json_schema(schema, "s")
    constraint = StructuredConstraint(json_schema=json.dumps(norm))
    params = SamplingParams(32, temperature=1.0, seed=seed, structured=constraint)
    prompt = [1, 5, 9, 14, 3]

    async def run() -> list[Any]:
        return await collect(engine.add_request(f"p-{next(_IDS)}", prompt, params), 120)

    deltas = loop.run_until_complete(run())
    if deltas[-1].finish_reason != "stop":
        return
    tok = _TOKENIZERS.get(engine.path) or AutoTokenizer.from_pretrained(engine.path)
    _TOKENIZERS[engine.path] = tok
    text = tok.decode(tokens_of(deltas), skip_special_tokens=True)
    value = json.loads(text)  # every finished output parses
    if "\ufffd" not in text:  # ill-formed UTF-8 from xgrammar 0.1.31: a known limit
        jsonschema.validate(value, schema)
