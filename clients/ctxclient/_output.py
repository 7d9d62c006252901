"""How ctxctl prints what a command got: as JSON, or its parts (a listing, fields, lines,
notes) as a rich table fitted to the terminal, plain rows, or TSV.

A command hands its result and its parts to `Output.emit`, which prints the one or the
others by ``--format``. A table never cuts a state or one of ctxd's ids (a longer id, an
agent's, is shortened: `ID_SHOWN`): when the terminal is too narrow for every column, the
columns that matter least are left out, and text columns wrap. Plain output (the default
when standard output is not a terminal) is one row per line, columns aligned with spaces,
no box drawing, so ``grep``, ``awk`` and ``wc -l`` work on it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import msgspec
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "plain", "tsv", "json")
ESSENTIAL = 100
"""A column's `keep` that is never left out (ids, states)."""
ID_SHOWN = 20
"""The widest an id is shown in a table: ctxd's own (``ses_`` and 16 hex digits). A longer
one (Claude Code's UUIDs, OpenCode's ids) is cut to its first 19 characters and ``…``, as
docker and git shorten theirs, so a table fits 80 columns; plain, TSV and JSON output
keep it whole. A session's command takes the id as shown (`cli.whole_session_id`)."""
IDS_SHORTENED = "(ids shortened: commands take them as shown; --format plain shows them whole)"


@dataclass(frozen=True)
class Column:
    """A column of a listing.

    Args:
        header: its name (upper-cased, spaces as ``_``, in plain output).
        keep: the higher, the later it is left out of a table too wide for the terminal;
            `ESSENTIAL` columns are always shown, whole.
        wrap: its text may wrap onto more lines in a table (titles, descriptions); the
            other columns are shown whole on one line.
        right: right-justified (numbers).
        min_width: the narrowest a wrapping column is made before columns are left out.
        ident: its values are ids, shown at most `ID_SHOWN` wide in a table.
    """

    header: str
    keep: int = ESSENTIAL
    wrap: bool = False
    right: bool = False
    min_width: int = 12
    ident: bool = False


class Cell(NamedTuple):
    """A value as a table shows it (styled) and as plain and TSV output write it."""

    shown: Text
    plain: str


def cell(value: str | Text, plain: str | None = None) -> Cell:
    """A cell; ``plain`` when its plain form differs (a bar in a table, a number in text).

    A string is shown as text, never as rich markup (brackets stay brackets).
    """
    shown = value if isinstance(value, Text) else Text(value)
    return Cell(shown, shown.plain if plain is None else plain)


class Part(Protocol):
    """A piece of what a command prints in the text formats (table, plain, TSV)."""

    def show(self, out: Output) -> None:
        """Print it as ``out.format`` says."""


@dataclass
class Listing:
    """Rows under columns, with a title that only a table shows."""

    columns: Sequence[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    title: str | None = None
    empty: str = ""
    """What is said instead when there are no rows (see `Output.listing`)."""

    def show(self, out: Output) -> None:
        out.listing(self, self.empty)


FIELD_COLUMNS = (Column("field"), Column("value", wrap=True, min_width=20))


@dataclass(frozen=True)
class Fields:
    """Name/value pairs of one thing, shown whole: aligned lines without a frame in a
    table; without a header line in plain and TSV output."""

    pairs: Sequence[tuple[str, str]]

    def show(self, out: Output) -> None:
        if out.format == "table":
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold", no_wrap=True)
            grid.add_column(overflow="fold")
            for name, value in self.pairs:
                grid.add_row(name, Text(value))
            out.console.print(grid)
            return
        listing = Listing(FIELD_COLUMNS, [[cell(name), cell(value)] for name, value in self.pairs])
        out.lines(plain_lines(listing, headers=False) if out.format == "plain"
                  else tsv_lines(listing, headers=False))


@dataclass(frozen=True)
class Lines:
    """Lines as they are, on standard output, whatever the text format."""

    lines: Sequence[str]

    def show(self, out: Output) -> None:
        out.lines(self.lines)


@dataclass(frozen=True)
class Raw:
    """Text as it is, without a newline added (a page of an offloaded result), except on a
    terminal (a table's format), where a text that stops mid-line gets one: what follows
    (a note) starts on a line of its own."""

    text: str

    def show(self, out: Output) -> None:
        sys.stdout.write(self.text)
        if out.format == "table" and self.text and not self.text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()


@dataclass(frozen=True)
class Note:
    """A remark about the output (`Output.note`)."""

    text: str
    style: str = "dim"

    def show(self, out: Output) -> None:
        out.note(self.text, self.style)


@dataclass(frozen=True)
class Stderr:
    """A line on standard error, in every text format (the JSON says it otherwise)."""

    text: str

    def show(self, out: Output) -> None:
        print(self.text, file=sys.stderr)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _long_id(column: Column, value: Cell) -> bool:
    return column.ident and cell_len(value.shown.plain) > ID_SHOWN


def _in_table(listing: Listing, row: list[Cell], index: int) -> Text:
    """A cell as a table shows it: an id longer than `ID_SHOWN` shortened."""
    value = row[index]
    if not _long_id(listing.columns[index], value):
        return value.shown
    return Text(value.shown.plain[:ID_SHOWN - 1] + "…", style=value.shown.style)


def ids_shortened(listing: Listing) -> bool:
    """Whether a table of ``listing`` shortens an id."""
    return any(_long_id(column, row[index]) for row in listing.rows
               for index, column in enumerate(listing.columns))


def fitted_columns(listing: Listing, width: int) -> list[int]:
    """The columns (indices) a table ``width`` cells wide shows: all of them when they fit,
    else without the least kept ones, one at a time, until they fit."""
    needs = [_needs(listing, index) for index in range(len(listing.columns))]
    shown = list(range(len(listing.columns)))
    while sum(needs[i][0] for i in shown) + 3 * len(shown) + 1 > width:
        droppable = [i for i in shown if listing.columns[i].keep < ESSENTIAL]
        if not droppable:
            break
        shown.remove(min(droppable, key=lambda i: (listing.columns[i].keep, -i)))
    return shown


def _needs(listing: Listing, index: int) -> tuple[int, int]:
    """The least and the most width a column's content takes."""
    column = listing.columns[index]
    longest = max([cell_len(_one_line(_in_table(listing, row, index).plain))
                   for row in listing.rows] + [cell_len(column.header)])
    if not column.wrap:
        return longest, longest
    return min(longest, column.min_width), longest


def table(listing: Listing, width: int) -> Table:
    """The listing as a rich table at most ``width`` cells wide (when its essential columns
    fit): wrapping columns get their least width, then share what the others leave."""
    shown = fitted_columns(listing, width)
    needs = {i: _needs(listing, i) for i in shown}
    room = width - 3 * len(shown) - 1 - sum(
        needs[i][1] for i in shown if not listing.columns[i].wrap)
    wrapping = sorted((i for i in shown if listing.columns[i].wrap), key=lambda i: needs[i][1])
    widths = {i: needs[i][0] for i in wrapping}  # each at its least, then the rest shared
    extra = room - sum(widths.values())
    for position, index in enumerate(wrapping):
        grow = min(needs[index][1] - widths[index], max(0, extra // (len(wrapping) - position)))
        widths[index] += grow
        extra -= grow
    rendered = Table(title=listing.title, title_justify="left", expand=False)
    for index in shown:
        column = listing.columns[index]
        rendered.add_column(column.header, justify="right" if column.right else "left",
                            no_wrap=not column.wrap, width=widths.get(index),
                            overflow="fold")
    for row in listing.rows:
        rendered.add_row(*(_in_table(listing, row, index) for index in shown))
    return rendered


def plain_lines(listing: Listing, headers: bool) -> list[str]:
    """One line a row, columns aligned with two spaces; an empty cell is ``-``."""
    rows = [[_one_line(c.plain) or "-" for c in row] for row in listing.rows]
    if headers:
        rows.insert(0, [column.header.upper().replace(" ", "_") for column in listing.columns])
    if not rows:
        return []
    widths = [max(cell_len(row[i]) for row in rows) for i in range(len(listing.columns))]
    lines = []
    for row in rows:
        parts = []
        for value, column, size in zip(row, listing.columns, widths, strict=True):
            pad = " " * (size - cell_len(value))
            parts.append(pad + value if column.right else value + pad)
        lines.append("  ".join(parts).rstrip())
    return lines


def _tsv_field(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace(
        "\r", "\\r")


def tsv_lines(listing: Listing, headers: bool) -> list[str]:
    """Tab-separated values: the full text of each cell, with backslash, tab and newline
    escaped as ``\\\\``, ``\\t`` and ``\\n``."""
    lines = ["\t".join(column.header.replace(" ", "_") for column in listing.columns)
             ] if headers else []
    lines += ["\t".join(_tsv_field(c.plain) for c in row) for row in listing.rows]
    return lines


class Output:
    """Where and how a command prints: its console, the format, column headers or not.

    Args:
        console: the rich console on standard output.
        chosen: ``--format`` (``--json``), or None: a table on a terminal, else plain.
        headers: False with ``--no-headers``.
    """

    def __init__(self, console: Console, chosen: str | None, headers: bool = True):
        self.console = console
        self.format = chosen or ("table" if console.is_terminal else "plain")
        self.headers = headers

    @property
    def json(self) -> bool:
        return self.format == "json"

    def emit(self, value: Any, *parts: Part, one_line: bool = False) -> None:
        """Print what a command got: ``value`` as JSON (indented, or on ``one_line`` for a
        stream of them), else its ``parts`` in order in the text format chosen."""
        if not self.json:
            self.text(*parts)
        elif one_line:
            self.lines([msgspec.json.encode(value).decode()])
        else:
            self.print_json(value)

    def text(self, *parts: Part) -> None:
        """Print ``parts``, unless the format is JSON (whose value says the same)."""
        if not self.json:
            for part in parts:
                part.show(self)

    def row(self, value: Any, fields: Sequence[str]) -> None:
        """One row of a stream (an event), printed at once: ``value`` as JSON on one line,
        or its ``fields`` separated by a tab (TSV, as they are) or by two spaces."""
        if self.json:
            line = msgspec.json.encode(value).decode()
        else:
            line = ("\t" if self.format == "tsv" else "  ").join(fields)
        self.lines([line])

    @staticmethod
    def print_json(value: Any) -> None:
        """``value`` as indented JSON, whatever the format (`ctxctl call`)."""
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
                         + "\n")

    def listing(self, listing: Listing, empty: str) -> None:
        """Print a listing, or ``empty`` when it has no rows (on standard error, unless in
        a table: plain output stays empty)."""
        if not listing.rows:
            self.note(empty, style="")
        elif self.format == "table":
            self.console.print(table(listing, self.console.width))
            if ids_shortened(listing):
                self.note(IDS_SHORTENED)
        else:
            self.lines(plain_lines(listing, self.headers) if self.format == "plain"
                       else tsv_lines(listing, self.headers))

    def lines(self, lines: Sequence[str]) -> None:
        """Lines as they are, on standard output."""
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()

    def note(self, text: str, style: str = "dim") -> None:
        """A remark about the output: under a table, or on standard error when the output
        is meant for programs."""
        if self.format == "table":
            self.console.print(Text(text, style=style))
        else:
            sys.stderr.write(text + "\n")
