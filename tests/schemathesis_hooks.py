"""Schemathesis hooks for ``tests/test_openapi_schemathesis.py`` (loaded through
``SCHEMATHESIS_HOOKS``).

One check replaces ``positive_data_acceptance``: the same rule (a schema-valid request
must not be refused), except for the refusals that depend on the model or on rules across
fields that a static schema cannot express (docs/api.md lists them):

* 400 ``context_length_exceeded``: the tokenized prompt plus ``max_tokens`` exceeds the
  model's context;
* 400 ``invalid_messages``: the model's own chat template refuses the conversation
  (e.g. a second system message), as Hugging Face templates do with
  ``raise_exception``;
* 400 ``invalid_tools``: tools that break a rule across fields (``tool_choice`` naming a
  function not in ``tools``, a ``tool_call_id`` no earlier call made, a ``parameters``
  that is no valid schema of an object);
* 400 ``unsupported_parameter`` naming ``tool_choice``, ``parallel_tool_calls`` or
  ``tools``: a forced tool choice, a single call, or ``strict`` tools need an engine that
  constrains decoding.

* 404 ``previous_response_not_found``: ``/v1/responses`` continuing a
  ``previous_response_id`` the caller has not stored.

Every other 4xx for schema-valid data is still a failure.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance


def _error_code(response: Any) -> str | None:
    try:
        code = response.json()["error"]["code"]
    except Exception:
        return None
    return code if isinstance(code, str) else None


MODEL_DEPENDENT = frozenset({"context_length_exceeded", "invalid_messages", "invalid_tools"})
CONSTRAINT_PARAMS = frozenset({"tool_choice", "parallel_tool_calls", "tools"})


def _error_param(response: Any) -> str | None:
    try:
        param = response.json()["error"]["param"]
    except Exception:
        return None
    return param if isinstance(param, str) else None


@schemathesis.check
def positive_data_acceptance_within_context(ctx: Any, response: Any, case: Any) -> bool | None:
    """``positive_data_acceptance``, allowing only the model-dependent 400s above."""
    if response.status_code == 400 and _error_code(response) in MODEL_DEPENDENT:
        return None
    if (
        response.status_code == 400
        and _error_code(response) == "unsupported_parameter"
        and _error_param(response) in CONSTRAINT_PARAMS
    ):
        return None
    if response.status_code == 404 and _error_code(response) == "previous_response_not_found":
        return None
    result: bool | None = positive_data_acceptance(ctx, response, case)
    return result
