"""The outcome of a structured-output request, for ``servehall_structured_output_requests_total``.

``valid``: every choice ended with ``stop`` and its text matches the constraint (JSON
parsed and validated with ``jsonschema`` against the normalised schema; a regex with
Python's ``re.fullmatch`` where Python's dialect compiles it; a choice by equality; an
EBNF grammar is trusted to its engine); ``invalid``: one did not; ``length``: a choice was
cut at ``max_tokens`` (or ended otherwise: filter, abort); ``refused``: a 400 for the
constraint (malformed, unenforceable, or the backend cannot serve it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from servehall.structured.request import GUIDED_FIELDS, StructuredRequest

_SO_KINDS = {"json": "json_schema", "json_object": "json_object", "regex": "regex"}


def requested_kind(body: dict[str, Any]) -> str | None:
    """The kind a body asks for, read without validating (for counting refusals)."""
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
        return str(rf["type"])
    so = body.get("structured_outputs")
    if isinstance(so, dict):
        for key in ("json", "json_object", "regex", "choice", "grammar"):
            if so.get(key) not in (None, False):
                return _SO_KINDS.get(key, key)
    for name in GUIDED_FIELDS:
        if body.get(name) is not None:
            kind = name.removeprefix("guided_")
            return "json_schema" if kind == "json" else kind
    return None


def _matches(sr: StructuredRequest, text: str) -> bool:
    c = sr.constraint
    if c.json_schema is not None:
        import jsonschema

        try:
            value = json.loads(text)
        except ValueError:
            return False
        if sr.schema is True:
            return True
        cls = jsonschema.validators.validator_for(
            sr.schema, default=jsonschema.Draft202012Validator
        )
        return bool(cls(sr.schema).is_valid(value))
    if c.choice is not None:
        return text in c.choice
    if c.regex is not None:
        try:
            return re.fullmatch(c.regex, text) is not None
        except re.error:
            return True  # not Python's dialect: trusted to the engine's grammar
    return True


def outcome(sr: StructuredRequest, results: Iterable[tuple[str, str | None]]) -> str:
    """``valid``, ``invalid`` or ``length`` for the choices' ``(text, finish_reason)``."""
    verdict = "valid"
    for text, finish in results:
        if finish != "stop":
            return "length"
        if not _matches(sr, text):
            verdict = "invalid"
    return verdict
