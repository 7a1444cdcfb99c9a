"""``servehall.admission.access``: model access decided in one place (scope, allow-list,
404 versus 403)."""

from __future__ import annotations

import pytest

from servehall import ANONYMOUS, NotFoundError, PermissionDeniedError, Policy, Principal
from servehall.admission.access import check_model_access


def _p(**policy: object) -> Principal:
    return Principal(id="k", policy=Policy(**policy))  # type: ignore[arg-type]


def test_model_access_in_one_place() -> None:
    check_model_access(ANONYMOUS, "m", served=True)
    check_model_access(_p(models=frozenset({"m"})), "m", served=True)
    with pytest.raises(NotFoundError) as nf:
        check_model_access(ANONYMOUS, "nope", served=False)
    assert nf.value.code == "model_not_found"
    hidden = _p(models=frozenset({"x"}))  # hide_forbidden_models defaults to True
    with pytest.raises(NotFoundError):
        check_model_access(hidden, "m", served=True)
    shown = _p(models=frozenset({"x"}), hide_forbidden_models=False)
    with pytest.raises(PermissionDeniedError) as pd:
        check_model_access(shown, "m", served=True)
    assert pd.value.code == "model_not_allowed"
    with pytest.raises(PermissionDeniedError) as sc:
        check_model_access(_p(scopes=frozenset({"admin"})), "m", served=True)
    assert sc.value.code == "insufficient_scope"
