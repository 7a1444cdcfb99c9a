"""``servehall.config.options``: dtype spellings and backend option tables validated with
every problem keyed ``models.<name>.options.<key>``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from servehall.config.options import DTYPE_SPELLINGS, canonical_dtype, parse_model_options
from servehall.errors import ConfigError


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("bf16", "bfloat16"),
        ("BF16", "bfloat16"),
        ("half", "float16"),
        ("fp32", "float32"),
        ("Auto", "auto"),
    ],
)
def test_dtype_spellings(spelling: str, name: str) -> None:
    assert canonical_dtype(spelling) == name


@pytest.mark.parametrize("value", ["int8", "", None, 16, ["bf16"]])
def test_other_dtypes_are_none(value: object) -> None:
    assert canonical_dtype(value) is None


def test_every_spelling_names_a_torch_dtype_or_auto() -> None:
    assert set(DTYPE_SPELLINGS.values()) == {"auto", "float32", "bfloat16", "float16"}


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threads: int = Field(1, ge=1)
    dtype: str = "auto"


def test_a_valid_table_is_the_model() -> None:
    opts = parse_model_options(_Options, {"threads": 4}, model="m", what="cpu options")
    assert opts == _Options(threads=4)


def test_every_problem_is_keyed_by_its_path() -> None:
    with pytest.raises(ConfigError) as err:
        parse_model_options(_Options, {"threads": 0, "typo": 1}, model="tiny", what="cpu options")
    keys = [k for k, _ in err.value.errors]
    assert keys == ["models.tiny.options.threads", "models.tiny.options.typo"]
    text = str(err.value)
    assert text.startswith("invalid cpu options: models.tiny.options.threads: ")
    assert "; models.tiny.options.typo: " in text
