"""Pydantic models of what the Files API answers (OpenAI's shapes, as this server fills
them): the file object, the list page and the delete answer.

:meth:`servehall.files.catalog.FileRow.wire` and ``DELETE /v1/files/{file_id}`` build
their JSON from these models, and the OpenAPI document (:mod:`servehall.api.openapi`)
is generated from them, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FileObject(BaseModel):
    """OpenAI's file object: ``created_at`` in Unix seconds, ``bytes`` the stored size;
    ``status`` is always ``processed`` (a file is checked before it is stored) and
    ``status_details`` always null."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    id: str
    object: Literal["file"] = "file"
    bytes: int = Field(ge=0)
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: None = None


class FileList(BaseModel):
    """``GET /v1/files``: a page of file objects (:func:`servehall.api.paging.list_page`);
    ``first_id`` / ``last_id`` null on an empty page."""

    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    """``DELETE /v1/files/{file_id}``'s answer."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    id: str
    object: Literal["file"] = "file"
    deleted: Literal[True] = True
