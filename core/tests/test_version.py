"""``servehall.version``: a plugin's ``SERVEHALL_HOOK_API`` declaration against the hook
contract's major version."""

from __future__ import annotations

import pytest

from servehall.errors import PluginError
from servehall.version import HOOK_API_MAJOR, HOOK_API_VERSION, check_hook_api

M = HOOK_API_MAJOR


def test_the_major_is_the_versions_first_part() -> None:
    assert str(M) == HOOK_API_VERSION.split(".")[0]


def test_no_declaration_is_accepted_and_shows_nothing() -> None:
    assert check_hook_api("p", None) is None


@pytest.mark.parametrize("declared", [M, str(M), f"{M}.0", f"{M}.x", (M, M + 1), [M, M + 1]])
def test_this_major_is_accepted_in_every_spelling(declared: object) -> None:
    assert check_hook_api("p", declared) == f"{M}.x"


def test_a_range_of_majors_is_shown_as_a_range() -> None:
    assert check_hook_api("p", (M - 1, M + 2)) == f">={M - 1},<{M + 2}"


@pytest.mark.parametrize("declared", [M + 1, str(M - 1), (M + 1, M + 3), (M - 2, M)])
def test_another_major_is_refused_naming_both_versions(declared: object) -> None:
    with pytest.raises(PluginError) as err:
        check_hook_api("acme", declared)
    text = str(err.value)
    assert "'acme'" in text and HOOK_API_VERSION in text and "upgrade the plugin" in text


@pytest.mark.parametrize("declared", [True, "two", 2.0, (1,), (1, 2, 3), ("a", "b"), {"v": 2}])
def test_a_malformed_declaration_is_refused(declared: object) -> None:
    with pytest.raises(PluginError) as err:
        check_hook_api("acme", declared)
    assert "is not a major version" in str(err.value)
