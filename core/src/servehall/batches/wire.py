"""Pydantic models of what the Batch API answers (OpenAI's batch object as this server
fills it, and the list page).

:meth:`servehall.batches.store.Batch.wire` builds its JSON from :class:`BatchObject`,
and the OpenAPI document (:mod:`servehall.api.openapi`) is generated from these models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
"""OpenAI's batch statuses (this server never stores ``failed``: a bad input file is a
400 when the batch is created; see :mod:`servehall.batches.store`)."""


class BatchRequestCounts(BaseModel):
    """Line counts: ``failed`` holds failed and expired lines."""

    total: int = Field(ge=0)
    completed: int = Field(ge=0)
    failed: int = Field(ge=0)


class BatchObject(BaseModel):
    """OpenAI's batch object: times in Unix seconds (null until reached), ``errors``
    always null, the output and error files' ids null until the batch is finalized."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchRequestCounts
    metadata: dict[str, str] | None


class BatchList(BaseModel):
    """``GET /v1/batches``: a page of batch objects
    (:func:`servehall.api.paging.list_page`); ``first_id`` / ``last_id`` null on an
    empty page."""

    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
