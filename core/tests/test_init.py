"""servehall/__init__.py: the public API module; the database helpers resolve from
:mod:`servehall.db` on first attribute access (module ``__getattr__``)."""

from __future__ import annotations

import pytest

import servehall


def test_lazy_database_helpers_resolve_to_servehall_db() -> None:
    import servehall.db

    assert servehall.DbBase is servehall.db.DbBase
    assert servehall.create_db_engine is servehall.db.create_db_engine


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = servehall.no_such_name  # type: ignore[attr-defined]


def test_public_names_are_exported() -> None:
    for name in servehall.__all__:
        assert getattr(servehall, name) is not None, name
