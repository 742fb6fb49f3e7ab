"""What CLI commands print: a table for people (bold headers where the terminal supports
them) or JSON for programs, from the same rows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import click


def emit(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, as_json: bool,
         empty: str = "(none)") -> None:
    if as_json:
        click.echo(json.dumps(list(rows), indent=2, sort_keys=True))
        return
    if not rows:
        click.echo(empty)
        return
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells))
              for i, column in enumerate(columns)]
    header = "  ".join(column.upper().ljust(width) for column, width in zip(columns, widths,
                                                                           strict=True))
    click.echo(click.style(header.rstrip(), bold=True))
    for line in cells:
        click.echo("  ".join(_align(value, width) for value, width in zip(line, widths,
                                                                          strict=True)).rstrip())


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _align(value: str, width: int) -> str:
    return value.rjust(width) if value.lstrip("-").isdigit() else value.ljust(width)
