"""``servehall.cli.tables.print_table``: a table whose names never break, or one block
per row when even that cannot fit the terminal."""

from __future__ import annotations

from rich.console import Console

from servehall.cli.tables import print_table

COLUMNS = ["plugin", "version", "description"]
ROWS = [
    ["servehall-openvino-cpu", "0.1.0", "Run models with OpenVINO on the CPU of this machine"],
    ["servehall-auth", "1.2.3", "API keys, see https://example.com/docs/auth/keys.html"],
]


def _render(width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    print_table(console, "Plugins", COLUMNS, ROWS, no_wrap=["plugin", "version"])
    return console.export_text()


def test_a_wide_terminal_gets_a_table_with_whole_names() -> None:
    text = _render(120)
    assert "Plugins" in text and "┃ plugin" in text and "│" in text
    assert "servehall-openvino-cpu" in text and "servehall-auth" in text


def test_a_narrow_table_wraps_between_words_never_in_names() -> None:
    text = _render(78)  # the narrowest that still fits a table
    assert "servehall-openvino-cpu" in text  # the no-wrap column stays whole
    assert "│" in text  # still a table
    for line in text.splitlines():
        assert len(line) <= 78


def test_too_narrow_for_any_table_prints_blocks() -> None:
    text = _render(30)
    lines = text.splitlines()
    assert lines[0] == "Plugins"
    assert "servehall-openvino-cpu" in lines
    assert "  version: 0.1.0" in lines
    assert "│" not in text
    words = [w for line in lines for w in line.split()]
    assert "OpenVINO" in words and "machine" in words  # words are never cut
    assert "https://example.com/docs/auth/keys.html" in words  # not even a long one
