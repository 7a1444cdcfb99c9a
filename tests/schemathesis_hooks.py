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

The Files, Batch and admin routes add refusals that depend on stored state or on file
content no JSON schema describes:

* 400 ``invalid_batch_file`` on ``POST /v1/files``: the uploaded bytes must be JSONL
  batch requests (:mod:`servehall.files.validate`); the schema says "binary";
* 400 naming ``after`` on ``GET /v1/files`` / ``GET /v1/batches``: the cursor must be
  the id of a file / batch the caller has (an id of nothing is refused, not an empty
  page);
* 400 naming ``input_file_id`` on ``POST /v1/batches``: the file exists but its
  purpose or its lines do not fit the batch (each line's ``url`` must be the batch's
  ``endpoint``) — a schema-valid body with an unknown id is a 404, which the check
  allows anyway;
* 400 ``config_invalid`` on ``POST /admin/config``: ``text`` must be a whole valid
  config that differs from the running one only in ``[[models]]``; a fuzzed string
  never is. (So the fuzz cannot change the running config; see
  ``tests/test_openapi_schemathesis.py``.)

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


def _state_dependent(case: Any, response: Any) -> bool:
    """A 400 of the Files, Batch or admin routes that a schema cannot rule out (see the
    module docstring)."""
    if response.status_code != 400:
        return False
    op = (case.method.upper(), case.path)
    code, param = _error_code(response), _error_param(response)
    if op == ("POST", "/v1/files"):
        return code == "invalid_batch_file"
    if op in (("GET", "/v1/files"), ("GET", "/v1/batches")):
        return param == "after"
    if op == ("POST", "/v1/batches"):
        return param == "input_file_id"
    if op == ("POST", "/admin/config"):
        return code == "config_invalid"
    return False


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
    if _state_dependent(case, response):
        return None
    result: bool | None = positive_data_acceptance(ctx, response, case)
    return result
