"""``servehall.api.paging``: the ``limit`` query parameter and the list envelope shared by
``GET /v1/files`` and ``GET /v1/batches``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.requests import Request

from servehall.api.paging import list_page, query_limit
from servehall.errors import InvalidRequestError


def _request(query: str) -> Request:
    return Request({"type": "http", "method": "GET", "query_string": query.encode()})


@dataclass
class _Item:
    id: str

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "object": "thing"}


def test_absent_limit_is_the_default() -> None:
    assert query_limit(_request(""), default=20, most=100) == 20


@pytest.mark.parametrize("raw", ["1", "37", "100"])
def test_a_limit_in_range_is_taken(raw: str) -> None:
    assert query_limit(_request(f"limit={raw}"), default=20, most=100) == int(raw)


@pytest.mark.parametrize("raw", ["0", "101", "-3", "ten", "1.5", ""])
def test_a_limit_out_of_range_or_not_an_integer_is_a_400_naming_limit(raw: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        query_limit(_request(f"limit={raw}"), default=20, most=100)
    assert err.value.param == "limit"
    assert "from 1 to 100" in str(err.value)


def test_list_envelope_names_the_first_and_last_ids() -> None:
    body = json.loads(bytes(list_page([_Item("a"), _Item("b"), _Item("c")], True).body))
    assert body == {
        "object": "list",
        "data": [{"id": x, "object": "thing"} for x in "abc"],
        "first_id": "a",
        "last_id": "c",
        "has_more": True,
    }


def test_an_empty_page_has_no_ids() -> None:
    body = json.loads(bytes(list_page([], False).body))
    assert body == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
