"""`ctxctl fork SESSION | --from FORMAT FILE`: a session's forked context (context.fork,
docs/protocol.md), or a transcript's, imported into a temporary session that is deleted
afterwards."""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path
from typing import Any

from ctxclient._cli_args import ParagraphsFormatter
from ctxclient._errors import RpcError
from ctxclient._output import Column, Lines, Listing, Output, cell
from ctxclient._sync import Client

FORMATS = {"claude-code": "a Claude Code JSONL transcript",
           "opencode": "an OpenCode session export (`opencode export ID > FILE.json`)"}
STATS_COLUMNS = (Column("stat"), Column("value", right=True))
STATS_ROWS = ("original_count", "final_count", "total_chars", "removed_messages",
              "compaction_detected", "compaction_slice_index", "truncated_results",
              "tier1", "tier2", "tier3", "head_tail_applied", "cleared_results",
              "truncated_params", "tokens")


def stats_listing(result: dict[str, Any], title: str) -> Listing:
    """The fork's figures, one row each (the tiers flattened)."""
    figures = {**result["stats"], **result["stats"]["tier_distribution"],
               "tokens": result["tokens"]}
    listing = Listing(STATS_COLUMNS, title=title)

    def shown(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return f"{value:,}"

    listing.rows = [[cell(name), cell(shown(figures[name]))] for name in STATS_ROWS]
    return listing


def _print(result: dict[str, Any], args: argparse.Namespace, out: Output, title: str) -> None:
    if args.stats:
        out.emit({"stats": result["stats"], "tokens": result["tokens"]},
                 stats_listing(result, title))
    else:
        out.emit(result, Lines([result["preamble"] + (
            "\n\n" + result["context"] if result["context"] else "")]))


def _read(imported: dict[str, Any]) -> str:
    """What an import that added nothing read: its records, malformed and of other types."""
    unknown = sum(imported["unknown_kept"].values())
    parts = [f"{imported['lines_read']:,} records read"]
    if imported["malformed"]:
        parts.append(f"{len(imported['malformed']):,} malformed")
    if unknown:
        parts.append(f"{unknown:,} of another type: "
                     + ", ".join(sorted(imported["unknown_kept"])))
    return "; ".join(parts)


def _from_file(client: Client, args: argparse.Namespace, out: Output) -> int:
    fmt, file = args.source
    if fmt not in FORMATS:
        print(f"ctxctl: --from takes {' or '.join(FORMATS)}, not {fmt!r}", file=sys.stderr)
        return 2
    path = Path(file).expanduser().absolute()
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        print(f"ctxctl: {path} {what}\nctxctl: next: give the path of {FORMATS[fmt]}",
              file=sys.stderr)
        return 2
    other = next(name for name in FORMATS if name != fmt)
    pick = f"ctxctl: next: give the path of {FORMATS[fmt]}, or, if it is {FORMATS[other]}: " \
           f"ctxctl fork --from {other} {path}"
    session = "fork-" + secrets.token_hex(8)
    try:
        imported = client.call("transcript.import", {"format": fmt, "path": str(path),
                                                     "session_id": session}, timeout=None)
        if not imported["messages_added"] and not imported["usage_records"] \
                and imported["size"]:
            # Read, but nothing in it is a conversation: not the format asked for.
            print(f"ctxctl: {path}: nothing to fork: no message in it as {FORMATS[fmt]} "
                  f"({_read(imported)})\n{pick}", file=sys.stderr)
            return 1
        result = client.call("context.fork", {"session_id": session})
    except RpcError as exc:
        if out.json or exc.code != -32602:  # as JSON, the error itself (ctxctl's main)
            raise
        data = exc.data if isinstance(exc.data, dict) else {}
        print(f"ctxctl: {data.get('reason', exc.message)}\n{pick}", file=sys.stderr)
        return 1
    finally:
        # The transcript was read only to be forked: nothing of it stays in ctxd.
        try:
            client.call("session.delete", {"session_id": session})
        except RpcError:
            pass
    _print(result, args, out, f"{fmt} {path.name}")
    return 0


def cmd_fork(client: Client, args: argparse.Namespace, out: Output) -> int:
    """context.fork of SESSION, or of FILE through a temporary session; exit 0 when printed,
    1 when the daemon refused, 2 for a wrong command line or a missing file."""
    if (args.session is None) == (args.source is None):
        print("ctxctl: fork takes a SESSION or --from FORMAT FILE (one of them)",
              file=sys.stderr)
        return 2
    if args.source is not None:
        if args.branch is not None:
            print("ctxctl: --branch forks a branch of a SESSION, not of --from's file",
                  file=sys.stderr)
            return 2
        return _from_file(client, args, out)
    params: dict[str, Any] = {"session_id": args.session}
    if args.branch is not None:
        params["branch_id"] = args.branch
    result = client.call("context.fork", params)
    _print(result, args, out, f"session {args.session}"
           + (f", branch {args.branch}" if args.branch else ""))
    return 0


def register(commands: Any, common: argparse.ArgumentParser, session_type: Any,
             branch_type: Any) -> None:
    """``fork`` under ``commands``."""
    fork = commands.add_parser(
        "fork", parents=[common],
        help="a session's (or a transcript's) context forked for a sub-agent: old tool "
             "results cut, from the latest compaction, within 200,000 characters",
        description="Print the forked context of a session (context.fork): a preamble "
                    "that says what was cut, then the context; or of a transcript file "
                    "(--from), imported into a temporary session deleted afterwards.",
        epilog="examples:\n"
               "  ctxctl fork SESSION | less\n"
               "  ctxctl fork SESSION --branch BRANCH --stats\n"
               "  ctxctl fork --from claude-code ~/.claude/projects/-home-me-app/ID.jsonl\n"
               "  ctxctl fork --from opencode EXPORT.json --stats --json",
        formatter_class=ParagraphsFormatter)
    fork.add_argument("session", metavar="SESSION", nargs="?", type=session_type,
                      help="the session's id")
    fork.add_argument("--branch", type=branch_type, metavar="BRANCH",
                      help="fork this branch's own messages (default: the main thread)")
    fork.add_argument("--stats", action="store_true",
                      help="print the fork's figures instead of its text")
    fork.add_argument("--from", dest="source", nargs=2, metavar=("FORMAT", "FILE"),
                      help="fork a transcript instead: claude-code FILE.jsonl or opencode "
                           "EXPORT.json")
    fork.set_defaults(run=cmd_fork)
