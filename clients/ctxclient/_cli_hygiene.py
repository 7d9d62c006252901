"""ctxctl's context hygiene commands: ``result`` (an offloaded tool result), ``compact``, and
``fork`` (its own module, `ctxclient._fork`)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, get_args

from ctxclient import _fork
from ctxclient._cli_args import (
    ParagraphsFormatter,
    branch_id,
    matching,
    number_in,
    session_id,
    text_of,
)
from ctxclient._cli_values import percent
from ctxclient._errors import InvalidParams
from ctxclient._output import Column, Lines, Listing, Note, Output, Part, Raw, cell
from ctxclient._sync import Client
from ctxd.wire import types as wire

if TYPE_CHECKING:
    from ctxclient._cli_args import Commands, Parser


def cmd_result(client: Client, args: argparse.Namespace, out: Output) -> int:
    """An offloaded tool result (result.read): a page of it, or its lines that match; the
    daemon finds its session from the ref unless ``--session`` names one."""
    params: dict[str, Any] = {"ref_id": args.ref}
    if args.session is not None:
        params["session_id"] = args.session
    if args.grep is not None:
        if args.offset is not None or args.limit is not None:
            print("ctxctl: --grep searches the whole result: leave out --offset and --limit",
                  file=sys.stderr)
            return 2
        params |= {"pattern": args.grep, "literal": args.fixed_strings}
        if args.max_matches is not None:
            params["max_matches"] = args.max_matches
    else:
        params |= {key: value for key, value in (("offset", args.offset),
                                                 ("limit", args.limit)) if value is not None}
    try:
        result = client.call("result.read", params)
    except InvalidParams as exc:
        if args.grep is None or not isinstance(exc.data, dict) or \
                exc.data.get("path") != "$.pattern":
            raise
        # The daemon names its parameter; ctxctl's user types the flag.
        raise InvalidParams(exc.code, exc.message.replace("pass literal=true", "add -F"),
                            exc.data) from None
    if args.grep is None:
        out.emit(result, Raw(result["content"]), *([Note(
            f"(characters {result['offset']:,} to {result['next_offset']:,} of "
            f"{result['total_chars']:,}: --offset {result['next_offset']} for more)")]
            if result["next_offset"] is not None else []))
        return 0
    out.emit(result, Lines([f"{m['line']}:{m['text']}" for m in result["matches"]]),
             *([Note(f"({result['more_matches']:,} more matching lines: --max-matches)")]
               if result["more_matches"] else []))
    return 0 if result["matched_lines"] else 1


COMPACT_COLUMNS = (Column(""), Column("before", right=True), Column("after", right=True),
                   Column("change", right=True))


def cmd_compact(client: Client, args: argparse.Namespace, out: Output) -> int:
    """context.compact: the thread before and after, and what the chain did."""
    params: dict[str, Any] = {"session_id": args.session}
    if args.branch is not None:
        params["branch_id"] = args.branch
    if args.strategy:
        params["strategies"] = [s for s in get_args(wire.Strategy) if s in args.strategy]
    # A summarizer may take up to 600 s (hygiene.summarizer_timeout_s at its maximum).
    result = client.call("context.compact", params, timeout=660.0)
    window = result["context_state"]["effective_window"]
    before, after = result["before_tokens"], result["after_tokens"]
    listing = Listing(COMPACT_COLUMNS, title=f"session {args.session}" + (
        f", branch {args.branch}" if args.branch else ""))
    listing.rows += [
        [cell("tokens"), cell(f"{before:,}"), cell(f"{after:,}"),
         cell(f"{after - before:+,}")],
        [cell("usage"), cell(percent(before / window)), cell(percent(after / window)),
         cell(f"{(after - before) / window * 100:+.1f} pts")],
        [cell("messages"), cell(f"{result['before_msgs']:,}"), cell(f"{result['after_msgs']:,}"),
         cell(f"{result['after_msgs'] - result['before_msgs']:+,}")]]
    done = [f"{result[what]} {what}" for what in ("cleared", "summarized", "truncated")
            if result[what]]
    notes: list[Part] = []
    if not result["strategies_run"]:
        notes.append(Note(f"(already under the target of {result['target_tokens']:,} tokens: "
                          "nothing to do)"))
    else:
        notes.append(Note(f"(ran {', '.join(result['strategies_run'])}: "
                          f"{', '.join(done) or 'nothing could go'}; target "
                          f"{result['target_tokens']:,} tokens)"))
    if result["summarizer_error"]:
        notes.append(Note(f"the {result['summarizer']} summarizer failed: "
                          f"{result['summarizer_error']}", style="yellow"))
    out.emit(result, listing, *notes)
    return 0


def add_result_compact(commands: Commands, common: Parser) -> None:
    """``result`` and ``compact``."""
    result = commands.add_parser(
        "result", parents=[common],
        help="read an offloaded tool result by the ref its stub names (result.read)",
        description="Print a tool result ctxd stored whole and replaced in the context by a "
                    "stub (`[Tool result stored — … ref_id=\"res_…\"…]`): a page of it, or "
                    "its lines that match. Any agent can run it from its shell; the ref "
                    "alone finds the session.",
        epilog="examples:\n"
               "  ctxctl result res_5f0c1d9e2a7b3c48\n"
               "  ctxctl result res_5f0c1d9e2a7b3c48 --grep 'FAILED|Error'\n"
               "  ctxctl result res_5f0c1d9e2a7b3c48 --offset 8000 --limit 8000",
        formatter_class=ParagraphsFormatter)
    result.add_argument("ref", metavar="REF", type=matching("ref id", wire.RefId),
                        help='the ref_id its stub names, e.g. res_5f0c1d9e2a7b3c48')
    result.add_argument("--session", type=session_id, metavar="ID",
                        help="the session the result belongs to (default: the one that "
                             "holds REF)")
    result.add_argument("--grep", type=text_of(wire.ResultReadParams, "pattern", "PATTERN"),
                        metavar="PATTERN",
                        help="only the lines that match this regular expression, numbered")
    result.add_argument("-F", "--fixed-strings", action="store_true",
                        help="--grep's pattern is plain text")
    result.add_argument("--max-matches", type=number_in(wire.ResultReadParams, "max_matches"),
                        metavar="N", help="matching lines shown at most (default 100)")
    result.add_argument("--offset", type=number_in(wire.ResultReadParams, "offset"),
                        metavar="N", help="the first character to show (default 0)")
    result.add_argument("--limit", type=number_in(wire.ResultReadParams, "limit"),
                        metavar="N", help="characters to show (default 8000)")
    result.set_defaults(run=cmd_result)
    compact = commands.add_parser(
        "compact", parents=[common],
        help="compact a session's context now (context.compact): clear old tool results, "
             "summarise the oldest span, truncate, until it is under the target")
    compact.add_argument("session", metavar="SESSION", type=session_id, help="the session's id")
    compact.add_argument("--branch", type=branch_id, metavar="BRANCH",
                         help="compact this live branch's own messages (default: the main "
                              "thread)")
    compact.add_argument("--strategy", action="append", choices=get_args(wire.Strategy),
                         help="only this strategy (repeat for more; they run in the chain's "
                              "order: clear, summarize, truncate)")
    compact.set_defaults(run=cmd_compact)


def add_fork(commands: Commands, common: Parser) -> None:
    """``fork``."""
    _fork.register(commands, common, session_id, branch_id)
