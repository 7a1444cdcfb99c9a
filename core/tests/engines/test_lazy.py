"""``servehall.engines.lazy``: a package's names imported on first access only."""

from __future__ import annotations

import re
import sys

import pytest

from servehall.engines.lazy import lazy_names


def test_a_listed_name_is_imported_on_first_access() -> None:
    sys.modules.pop("colorsys", None)
    getattr_ = lazy_names("pkg", {"rgb_to_hsv": "colorsys"})
    assert "colorsys" not in sys.modules  # nothing imported by making the function
    fn = getattr_("rgb_to_hsv")
    assert "colorsys" in sys.modules
    assert fn is sys.modules["colorsys"].rgb_to_hsv


def test_another_name_is_an_attribute_error_naming_the_module() -> None:
    getattr_ = lazy_names("servehall.engines.torch", {"TorchEngine": "x"})
    with pytest.raises(
        AttributeError, match=re.escape("module 'servehall.engines.torch' has no attribute 'Nope'")
    ):
        getattr_("Nope")


def test_the_engine_packages_use_it() -> None:
    import servehall.engines.torch as torch_pkg

    assert torch_pkg.TorchEngine.__name__ == "TorchEngine"
    with pytest.raises(AttributeError):
        _ = torch_pkg.NoSuchEngine
