"""Tables for the CLI that never break a name in the middle.

A rich table squeezed into 80 columns folds cells mid-word (``servehall-ope`` /
``nvino-cpu``). :func:`print_table` prints a table whose name-like columns never wrap
and whose other cells wrap only between words; when even that does not fit the
terminal, it prints one block per row instead (``name`` on its own line, then
``column: value`` lines wrapped between words), so every name stays whole at any width.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _column_min(
    col: str, rows: Sequence[Sequence[str]], columns: Sequence[str], no_wrap: Sequence[str]
) -> int:
    """The narrowest a column can be without breaking a word (or a no-wrap cell)."""
    i = list(columns).index(col)
    cells = [row[i] for row in rows]
    if col in no_wrap:
        return max([len(col), *(len(c) for c in cells)])
    return max([len(w) for w in col.split()] + [len(w) for c in cells for w in c.split()])


def _min_width(
    columns: Sequence[str], rows: Sequence[Sequence[str]], no_wrap: Sequence[str]
) -> int:
    """Columns' minimums plus the box: one border per column and one, and 2 of padding."""
    inner = sum(_column_min(col, rows, columns, no_wrap) for col in columns)
    return inner + 3 * len(columns) + 1


def print_table(
    console: Console,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    no_wrap: Sequence[str] = (),
) -> None:
    """Print ``rows`` under ``columns`` as a table, or as blocks when it cannot fit.

    Args:
        console: where to print (its ``width`` decides the layout).
        title: printed above.
        columns: column headers; the first column names the row.
        rows: cell texts, one sequence per row, in column order.
        no_wrap: columns whose cells must never wrap (names, ids, versions).
    """
    if _min_width(columns, rows, no_wrap) <= console.width:
        table = Table(title=title)
        for col in columns:
            # a cell wraps between words; min_width keeps its longest word whole
            table.add_column(
                col, no_wrap=col in no_wrap, min_width=_column_min(col, rows, columns, no_wrap)
            )
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
        return
    console.print(Text(title, style="bold"), soft_wrap=True)
    width = max(console.width - 2, 20)
    for row in rows:
        console.print(Text(row[0]), soft_wrap=True)
        for col, cell in zip(columns[1:], row[1:], strict=True):
            if not cell:
                continue
            text = textwrap.fill(
                cell,
                width=width,
                initial_indent=f"  {col}: ",
                subsequent_indent=" " * (len(col) + 4),
                break_long_words=False,
                break_on_hyphens=False,
            )
            console.print(Text(text), soft_wrap=True)
