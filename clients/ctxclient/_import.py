"""`ctxctl import claude-code|opencode FILE`: a transcript into a ctxd session through
transcript.import (docs/protocol.md, "transcript.import"), with a short summary of what it
added."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ctxclient._errors import RpcError
from ctxclient._output import Column, Listing, Note, Output, cell
from ctxclient._sync import Client
from ctxd.errors import ErrorCode

FORMATS = {"claude-code": "a Claude Code JSONL transcript (~/.claude/projects/*/ID.jsonl)",
           "opencode": "an OpenCode session export (`opencode export ID > FILE.json`)"}
MALFORMED_SHOWN = 10
"""Line numbers of malformed lines listed in the summary; the rest are counted."""
SUMMARY_COLUMNS = (Column("what"), Column("count", right=True),
                   Column("detail", wrap=True, keep=10))


def _count(n: int) -> str:
    return f"{n:,}"


def whole_document(result: dict[str, Any], path: Path) -> bool:
    """Whether the import's position in ``path`` counts records, not bytes (an OpenCode
    export, Claude Code records as one JSON array)."""
    if result["format"] != "claude-code":
        return True
    try:
        with path.open("rb") as file:
            while chunk := file.read(4096):
                if chunk.strip():
                    return chunk.lstrip()[:1] == b"["
    except OSError:
        pass
    return False


def summary(result: dict[str, Any], whole: bool = False) -> Listing:
    """What an import added, one row per kind of thing (fits a narrow terminal: the detail
    column wraps, and is the first left out)."""
    listing = Listing(SUMMARY_COLUMNS, title=f"{result['format']} → session "
                                             f"{result['session_id']}")
    rows: list[tuple[str, int, str]] = [
        ("messages", result["messages_added"], ""),
        ("tool results", result["tool_results"], ""),
        ("usage records", result["usage_records"],
         f"{_count(result['usage_duplicates'])} already recorded"
         if result["usage_duplicates"] else ""),
        ("branches", result["branches"], "sub-agents, folded"),
        ("compactions", result["compactions"], ""),
        ("bytes read", result["bytes_read"],
         f"at {_count(result['offset'])} of {_count(result['size'])}" if not whole else
         f"{_count(result['offset'])} records in the array"
         if result["format"] == "claude-code" else
         f"{_count(result['offset'])} messages in the export"),
    ]
    if result.get("subagent_files"):
        rows.append(("sub-agent files", result["subagent_files"], "subagents/agent-*.jsonl"))
    malformed = result["malformed"]
    if malformed:
        shown = [f"{m['line']}" + (f" ({Path(m['path']).name})" if m.get("path") else "")
                 for m in malformed[:MALFORMED_SHOWN]]
        more = len(malformed) - len(shown)
        rows.append(("malformed lines", len(malformed),
                     "line " + ", ".join(shown) + (f" and {more} more" if more else "")))
    unknown = result["unknown_kept"]
    if unknown:
        rows.append(("kept as metadata", sum(unknown.values()),
                     ", ".join(f"{name} {n}" for name, n in unknown.items())))
    listing.rows = [[cell(what), cell(_count(n)), cell(detail)] for what, n, detail in rows]
    return listing


def _nothing_new(result: dict[str, Any]) -> bool:
    return not (result["messages_added"] or result["usage_records"] or result["malformed"]
                or result["lines_read"] or result["created"])


def _explain(exc: RpcError, args: argparse.Namespace, path: Path) -> None:
    """What to do next, for the errors an import can meet."""
    data = exc.data if isinstance(exc.data, dict) else {}
    if exc.code == ErrorCode.INVALID_STATE:
        session = f" --session {args.session}" if args.session else ""
        print(f"ctxctl: {exc.message}\nctxctl: next: to import it again from its start "
              f"(what was imported stays): ctxctl import {args.transcript_format} {path}"
              f"{session} --restart", file=sys.stderr)
    elif exc.code == ErrorCode.INVALID_PARAMS and data.get("path") == "$.session_id":
        print(f"ctxctl: {data.get('reason', exc.message)}\nctxctl: next: name the session: "
              f"ctxctl import {args.transcript_format} {path} --session ID", file=sys.stderr)
    elif exc.code == ErrorCode.INVALID_PARAMS and data.get("path") == "$.path":
        print(f"ctxctl: {data.get('reason', exc.message)}\nctxctl: next: give the path of "
              f"{FORMATS[args.transcript_format]}", file=sys.stderr)
    else:
        raise exc


def cmd_import(client: Client, args: argparse.Namespace, out: Output) -> int:
    """transcript.import of FILE; exit 0 when imported (even nothing new), 1 when the daemon
    refused it, 2 when FILE is not there."""
    path = Path(args.file).expanduser().absolute()
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        print(f"ctxctl: {path} {what}\nctxctl: next: give the path of "
              f"{FORMATS[args.transcript_format]}", file=sys.stderr)
        return 2
    params: dict[str, Any] = {"format": args.transcript_format, "path": str(path)}
    if args.session:
        params["session_id"] = args.session
    if args.project:
        params["project"] = args.project
    if args.restart:
        params["restart"] = True
    try:
        # A large transcript takes as long as it takes (Ctrl-C stops waiting; what was
        # committed stays, and the next import resumes there).
        result = client.call("transcript.import", params, timeout=None)
    except RpcError as exc:
        if out.json:  # the error itself, as JSON (ctxctl's main)
            raise
        _explain(exc, args, path)
        return 1
    whole = whole_document(result, path)
    if _nothing_new(result):
        out.emit(result, Note(
            f"nothing new: {path} is imported into session {result['session_id']} "
            + (f"up to {result['offset']:,} of {result['size']:,} bytes" if not whole
               else f"up to its {result['offset']:,} "
               + ("records" if result["format"] == "claude-code" else "messages")),
            style=""))
        return 0
    verb = "created" if result["created"] else "added to"
    out.emit(result, summary(result, whole), Note(
        f"({verb} session {result['session_id']}"
        + (", imported again from the start" if result["restarted"] else "") + ")"))
    return 0


def register(commands: Any, common: argparse.ArgumentParser,
             session_type: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """``import claude-code`` and ``import opencode`` under ``commands``."""
    group = commands.add_parser("import", parents=[common],
                                help="import a Claude Code or OpenCode transcript into a "
                                     "session",
                                description="Import a Claude Code or OpenCode transcript "
                                            "into a session (again: only what is new).")
    group.set_defaults(run=None, group=group)
    formats = group.add_subparsers(dest="transcript_format", metavar="FORMAT",
                                   parser_class=parser_class)
    for name, what in FORMATS.items():
        command = formats.add_parser(name, parents=[common], help=f"import {what}")
        command.add_argument("file", metavar="FILE", help=what)
        command.add_argument("--session", type=session_type, metavar="ID",
                             help="the session to import into (default: the transcript's "
                                  "own id)")
        command.add_argument("--project", metavar="NAME",
                             help="the project of a session the import creates")
        command.add_argument("--restart", action="store_true",
                             help="import a replaced or truncated file from its start")
        command.set_defaults(run=cmd_import)
