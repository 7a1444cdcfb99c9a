"""servehall.engines.vllm.params under ``.venv-vllm`` (a subprocess: vLLM is not in this
environment): our sampling fields become vLLM's ``SamplingParams`` (EOS ids as stop ids
unless ``ignore_eos``, delta outputs, no detokenization), each constraint kind becomes
``StructuredOutputsParams`` (a length-bounded string as a JSON-safe pattern), and the
engine-level config carries the whitespace bound."""

from __future__ import annotations

import json

from servehall.testing.vllm_env import run_in_vllm_env

_SCRIPT = r"""
import json, sys
from servehall.engines.contract import SamplingParams, StructuredConstraint
from servehall.engines.vllm.params import (
    structured_outputs, structured_outputs_config, vllm_sampling_params)

def sp(**kw):
    p = vllm_sampling_params(SamplingParams(**kw), (2, 3))
    return {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
            "min_p": p.min_p, "seed": p.seed, "max_tokens": p.max_tokens,
            "stop_token_ids": list(p.stop_token_ids), "ignore_eos": p.ignore_eos,
            "output_kind": p.output_kind.name, "detokenize": p.detokenize, "n": p.n,
            "repetition_penalty": p.repetition_penalty,
            "structured": p.structured_outputs is not None}

bounded = json.dumps({"type": "object", "properties": {"c": {"type": "string", "maxLength": 3}}})
so = structured_outputs(StructuredConstraint(json_schema=bounded))
ch = structured_outputs(StructuredConstraint(choice=("yes", "no")))
rx = structured_outputs(StructuredConstraint(regex="[a-z]+"))
cfg = structured_outputs_config()
json.dump({
    "plain": sp(max_tokens=7, temperature=0.5, top_k=0, seed=3, stop_token_ids=(5,),
                repetition_penalty=1.2, min_p=0.1),
    "ignore_eos": sp(max_tokens=4, stop_token_ids=(5,), ignore_eos=True, top_k=8),
    "eos_listed": sp(max_tokens=4, stop_token_ids=(3,)),
    "constrained": sp(max_tokens=4, structured=StructuredConstraint(regex="a+")),
    "none": structured_outputs(None),
    "json": json.loads(so.json), "choice": ch.choice, "regex": rx.regex,
    "json_other_fields": [so.regex, so.choice, so.grammar],
    "config": [cfg.backend, cfg.disable_any_whitespace],
}, sys.stdout)
"""


def test_params_become_vllm_objects() -> None:
    got = run_in_vllm_env(_SCRIPT)
    plain = got["plain"]
    assert plain == {
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": plain["top_k"],
        "min_p": 0.1,
        "seed": 3,
        "max_tokens": 7,
        "stop_token_ids": [5, 2, 3],  # the model's EOS ids after the request's own
        "ignore_eos": False,
        "output_kind": "DELTA",
        "detokenize": False,
        "n": 1,
        "repetition_penalty": 1.2,
        "structured": False,
    }
    assert plain["top_k"] in (0, -1)  # off (vLLM normalises 0 to -1 in some builds)
    assert got["ignore_eos"]["stop_token_ids"] == [5] and got["ignore_eos"]["top_k"] == 8
    assert got["eos_listed"]["stop_token_ids"] == [3, 2]  # no id twice
    assert got["constrained"]["structured"] is True
    assert got["none"] is None
    c = got["json"]["properties"]["c"]
    assert "maxLength" not in c and "pattern" in c, json.dumps(c)  # JSON-safe pattern
    assert got["json_other_fields"] == [None, None, None]
    assert (got["choice"], got["regex"]) == (["yes", "no"], "[a-z]+")
    assert got["config"] == ["xgrammar", True]
