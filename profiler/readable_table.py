"""Tables that show every name whole, at any width (a log, a CI job, ``| tee`` at 80 columns).

A kernel engineer acts on a row by its Definition's name, so no cell is cut or wrapped. Where the
table with whole names is wider than the console, the longest names in its first column become
keys (``[1]``, ``[2]``, ..., as many as it takes to fit) listed whole under it; where even the
keyed table is too wide, its columns are split over as many tables as it takes, each led by the
first column, so no number is cut either. Long words (why
a row has no native) are not cells: :class:`Notes` turns them into numbered notes printed under
the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


@dataclass
class Notes:
    """Long texts of a table's cells, each numbered once and printed under the table."""

    texts: list[str] = field(default_factory=list)

    def mark(self, text: str) -> str:
        """The mark that stands for ``text`` in a cell: ``(1)``, ``(2)``, ..."""
        if text not in self.texts:
            self.texts.append(text)
        return f"({self.texts.index(text) + 1})"


def print_table(console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                left: Sequence[str] = (), notes: Notes | None = None) -> None:
    """A table whose cells never wrap or shorten; the longest of the first column's names keyed
    under it where they would not fit whole, and its other columns split over further tables where
    even that is too wide. ``left``: the headers of the left-justified columns (the first one always is)."""
    names = [row[0] for row in rows]
    keyed: set[str] = set()  # the names keyed, longest first, until the table fits
    for name in sorted(set(names), key=len, reverse=True):
        if _fits(console, _table(title, headers, _keyed(rows, _numbered(names, keyed)), left)):
            break
        keyed.add(name)
    keys = _numbered(names, keyed)
    cells = _keyed(rows, keys)
    for n, columns in enumerate(_column_groups(console, title, headers, cells, left)):
        console.print(_table(title if n == 0 else "(continued)", [headers[c] for c in columns],
                             [[row[c] for c in columns] for row in cells], left))
    for name, key in keys.items():
        console.print(f"  {key} {name}", markup=False, highlight=False, soft_wrap=True)
    for i, text in enumerate(notes.texts if notes is not None else (), 1):
        console.print(f"  ({i}) {text}", markup=False, highlight=False, soft_wrap=True)


def _column_groups(console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                   left: Sequence[str]) -> list[list[int]]:
    """The columns of each table printed: all in one where it fits, else the first column and as
    many of the next as fit, then again for the rest (a column too wide alone still gets its table)."""
    groups: list[list[int]] = [[0]]
    for column in range(1, len(headers)):
        trial = groups[-1] + [column]
        table = _table(title, [headers[c] for c in trial], [[row[c] for c in trial] for row in rows], left)
        if len(groups[-1]) > 1 and not _fits(console, table):
            groups.append([0, column])
        else:
            groups[-1] = trial
    return groups


def _numbered(names: Sequence[str], keyed: set[str]) -> dict[str, str]:
    """Keys for the ``keyed`` names, numbered in the order the rows have them."""
    keys: dict[str, str] = {}
    for name in names:
        if name in keyed and name not in keys:
            keys[name] = f"[{len(keys) + 1}]"
    return keys


def _keyed(rows: Sequence[Sequence[str]], keys: dict[str, str]) -> list[list[str]]:
    return [[keys.get(row[0], row[0]), *row[1:]] for row in rows]


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for n, header in enumerate(headers):
        table.add_column(header, justify="left" if n == 0 or header in left else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def _fits(console: Console, table: Table) -> bool:
    return _width(console, table) <= console.width


def _width(console: Console, table: Table) -> int:
    """The width the table takes with no cell wrapped."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum
