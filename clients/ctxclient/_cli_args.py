"""What ctxctl's command line accepts: the parser class that suggests the closest command,
the options every command takes, and argument types checked against the wire's limits (so
a bad value is a usage error naming the flag, not the daemon's JSON path)."""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, get_args

import msgspec

from ctxclient._output import FORMATS
from ctxd.wire import types as wire

PAGE_ALL: int = get_args(wire.PageLimit)[1].le
"""Items per call for `--all` (the largest page memory.list and message.list give)."""
MIN_INTERVAL_S = 0.1
"""The shortest `status --watch --interval`: faster only loads the daemon."""


# ---- the parser ------------------------------------------------------------------------

def _within(short: str, long: str) -> bool:
    """Whether the letters of ``short`` appear in ``long`` in order (rm in remove)."""
    letters = iter(long)
    return all(letter in letters for letter in short)


def closest(word: str, known: Sequence[str]) -> str | None:
    """The known word ``word`` most likely meant: a close spelling, else an abbreviation
    either way that starts with the same letter (remove -> rm, ls -> list)."""
    close = difflib.get_close_matches(word, known, n=1)
    if close:
        return close[0]
    for name in known:
        if name[:1] == word[:1] and (_within(name, word) or _within(word, name)):
            return name
    return None


class ParagraphsFormatter(argparse.RawDescriptionHelpFormatter):
    """A description or epilog as paragraphs (split by blank lines): a paragraph whose
    lines all start flush left is filled to the terminal's width; one with an indented
    line (a list, examples) is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith(" ") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(textwrap.fill(" ".join(lines), width, initial_indent=indent,
                                                subsequent_indent=indent))
        return "\n\n".join(paragraphs)


class Parser(argparse.ArgumentParser):
    """argparse, with an unknown command or choice answered by the closest one; each
    parser is its namespace's ``command_parser`` when it parses (the deepest command's
    wins), for an error about that command's arguments to show that command's usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.set_defaults(command_parser=self)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        known = [str(choice) for choice in action.choices]
        close = closest(str(value), known)
        hint = f"; did you mean {close!r}?" if close else ""
        if isinstance(action, argparse._SubParsersAction):
            raise argparse.ArgumentError(None, f"unknown command {value!r}{hint} (choose from "
                                               f"{', '.join(known)})")
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint} (choose from "
                                             f"{', '.join(known)})")


if TYPE_CHECKING:
    Commands: TypeAlias = argparse._SubParsersAction[Parser]
    """Where a command group adds its commands (generic for the type checker only)."""


def common_options(parser: argparse.ArgumentParser, defaults: bool,
                   socket: bool = True) -> None:
    # Accepted before and after the command; a subcommand's default must not clobber a
    # value given before it, hence SUPPRESS there. ``socket``: False for a command that
    # talks to no running daemon (replay starts its own).
    suppress: dict[str, Any] = {} if defaults else {"default": argparse.SUPPRESS}
    if socket:
        parser.add_argument("--socket", metavar="PATH", **suppress,
                            help="the daemon's socket (default: $CTXD_SOCKET or ctxd's)")
    parser.add_argument("--format", choices=FORMATS, **suppress,
                        help="table (the default on a terminal), plain (one row a line, the "
                             "default otherwise), tsv or json")
    parser.add_argument("--json", dest="format", action="store_const", const="json",
                        **suppress, help="print JSON (the same as --format json)")
    parser.add_argument("--no-headers", dest="headers", action="store_false", **suppress,
                        help="leave out the header line of plain and TSV output")


def group(commands: Commands, name: str, common: Parser, help_text: str) -> Commands:
    """A command with commands of its own (``memory``, ``session``)."""
    grouped = commands.add_parser(name, parents=[common], help=help_text,
                                  description=help_text[0].upper() + help_text[1:] + ".")
    grouped.set_defaults(run=None, group=grouped)
    return grouped.add_subparsers(dest="action", metavar="COMMAND", parser_class=Parser)


# ---- argument types --------------------------------------------------------------------

def _field_type(struct: type[msgspec.Struct], name: str) -> Any:
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    [found] = [f.type for f in info.fields if f.name == name]
    if isinstance(found, msgspec.inspect.UnionType):  # optional: the type beside None
        [found] = [t for t in found.types if not isinstance(t, msgspec.inspect.NoneType)]
    return found.type if isinstance(found, msgspec.inspect.Metadata) else found


LONG_LIMIT = 2**53
"""An upper limit past this is shown as a power of two (an id's is 2**62)."""


def _range_text(info: Any, kind: str) -> str:
    if info.ge is not None and info.le is not None:
        top = (f"2**{info.le.bit_length() - 1}" if info.le > LONG_LIMIT
               and info.le & (info.le - 1) == 0 else f"{info.le}")
        return f"{kind} from {info.ge} to {top}"
    if info.ge is not None:
        return f"{kind} of at least {info.ge}"
    return kind


def number_in(struct: type[msgspec.Struct], name: str) -> Callable[[str], Any]:
    """An argparse type: a number in the range the wire type of ``struct.name`` allows, so
    a bad value is a usage error that names the flag, not the daemon's JSON path."""
    info = _field_type(struct, name)
    integer = isinstance(info, msgspec.inspect.IntType)
    kind = "an integer" if integer else "a number"

    def convert(text: str) -> Any:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            value = None
        if value is None or (info.ge is not None and value < info.ge) or (
                info.le is not None and value > info.le):
            raise argparse.ArgumentTypeError(f"must be {_range_text(info, kind)}, got {text!r}")
        return value

    convert.__name__ = name
    return convert


def matching(kind: str, annotated: Any) -> Callable[[str], str]:
    """An argparse type: a string the wire's ``annotated`` type accepts (an id, a scope),
    the error saying which forms are allowed."""
    meta = get_args(annotated)[1]
    described = wire.PATTERN_MEANINGS.get(meta.pattern, meta.description)

    def convert(text: str) -> str:
        try:
            msgspec.convert(text, annotated)
        except msgspec.ValidationError:
            raise argparse.ArgumentTypeError(
                f"invalid {kind} {text!r}: use {described}") from None
        return text

    convert.__name__ = kind
    return convert


new_session_id = matching("session id", wire.SessionId)
SHORTENED = "…"
"""What ends an id a table shortened (`ctxclient._output.ID_SHOWN`)."""


def session_id(text: str) -> str:
    """An argparse type: a session id, or one as a table shows it shortened (its first
    characters and ``…``), which the command finds among the sessions (`cli.main`)."""
    new_session_id(text.removesuffix(SHORTENED) if text.endswith(SHORTENED) else text)
    return text


session_id.__name__ = "session id"
branch_id = matching("branch id", wire.BranchId)
scope = matching("scope", wire.Scope)
cursor = matching("cursor", wire.Cursor)
CURSOR_HELP = ("start after the page that gave this next_cursor (shown under a page "
               "that is not the last, and in --json)")


def shared_name(kind: str) -> Callable[[str], str]:
    """An argparse type: the name of a ``kind`` (team, org) as a shared scope takes it."""

    def convert(text: str) -> str:
        try:
            msgspec.convert(f"{kind}:{text}", wire.SharedScope)
        except msgspec.ValidationError:
            raise argparse.ArgumentTypeError(
                f"invalid {kind} name {text!r}: use one word of 1-128 characters") from None
        return text

    convert.__name__ = f"{kind} name"
    return convert


def tag(text: str) -> str:
    """A memory's tag, as the wire's `Tag` takes it."""
    try:
        msgspec.convert(text, wire.Tag)
    except msgspec.ValidationError:
        raise argparse.ArgumentTypeError(f"invalid tag {text!r}: use one word of at most 64 "
                                         "characters") from None
    return text


def interval(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds >= MIN_INTERVAL_S:  # also NaN
        raise argparse.ArgumentTypeError(f"must be at least {MIN_INTERVAL_S} seconds, "
                                         f"got {text!r}")
    return seconds


def seq_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a seq (0 or a positive integer), got {text!r}")
    return int(text)


def seconds_to_wait(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got {text!r}")
    return seconds


def text_of(struct: type[msgspec.Struct], name: str, what: str,
            blank_ok: bool = True) -> Callable[[str], str]:
    """An argparse type: text within the wire's length limits for ``struct.name`` (and not
    blank, unless ``blank_ok``)."""

    def convert(text: str) -> str:
        problem = length_problem(struct, name, text, blank_ok)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return text

    convert.__name__ = what
    return convert


def length_problem(struct: type[msgspec.Struct], name: str, text: str,
                   blank_ok: bool = True) -> str | None:
    """What is wrong with ``text`` as ``struct.name`` (too short, too long, blank), or
    None."""
    info = _field_type(struct, name)
    if info.min_length and len(text) < info.min_length:
        return "is empty" if info.min_length == 1 else f"is shorter than {info.min_length}"
    if not blank_ok and not text.strip():
        return "is blank"
    if info.max_length is not None and len(text) > info.max_length:
        return f"is longer than {info.max_length:,} characters"
    return None


def read_stdin() -> str | None:
    """Standard input as UTF-8 text, or None (and a message) when it is not."""
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"ctxctl: standard input is not UTF-8 text: {exc}", file=sys.stderr)
        return None
