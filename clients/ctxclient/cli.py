"""ctxctl: look at and drive a running ctxd (status, sessions, branches, events, memory, raw
calls, stop).

Exit codes: 0 success, 1 the daemon answered with an error, 2 no daemon (or bad usage).
Listings print as a table on a terminal and as plain rows otherwise (``--format``);
every command takes ``--json`` for machine-readable output; ``NO_COLOR`` is honoured.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import json
import os
import queue
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, get_args

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ctxclient import _fork, _import, _mcp
from ctxclient._errors import BadSocketPath, DaemonUnavailable, RpcError
from ctxclient._output import (
    FORMATS,
    Cell,
    Column,
    Listing,
    Output,
    cell,
    plain_lines,
    table,
    tsv_lines,
)
from ctxclient._sync import Client
from ctxd import __version__
from ctxd.errors import ErrorCode
from ctxd.wire import types as wire

HEALTH_STYLE = {"ok": "green", "warn": "yellow", "caution": "dark_orange",
                "compact": "red", "blocked": "bold red"}
BRANCH_STATUS_STYLE = {"active": "green", "completed": "", "budget_exhausted": "dark_orange",
                       "timeout": "dark_orange", "failed": "red", "discarded": "dim"}
DESCRIPTION_SHOWN = 40
"""Characters of a branch description that fit in a table cell."""
CONTENT_SHOWN = 60
"""Characters of a memory's or message's content that fit in a table cell."""
MEMORY_PAGE = 50
"""Memories `memory list` shows by default."""
PAGE_ALL = 1000
"""Items per call for `--all` (the largest page memory.list and message.list give)."""
MIN_INTERVAL_S = 0.1
"""The shortest `status --watch --interval`: faster only loads the daemon."""
EXIT_STATUS = """exit status:
  0  success
  1  the daemon answered with an error (or `stop` found it still running)
  2  no daemon answers on the socket, or bad usage
  3  install/uninstall refused a settings file (nothing written)"""


# ---- values shown --------------------------------------------------------------------

def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def _timestamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _shorten(text: str, width: int = DESCRIPTION_SHOWN) -> Cell:
    """One line of at most ``width`` characters in a table; the whole text in plain
    output."""
    line = " ".join(text.split())
    return cell(line if len(line) <= width else line[:width - 1] + "…", plain=text)


def _percent(usage: float) -> str:
    return f"{usage * 100:.1f}%"


def usage_bar(usage: float, health: str, width: int = 12) -> Cell:
    """A bar of ``width`` cells filled to ``usage`` (0..1), coloured by health; the
    percentage alone in plain output."""
    filled = min(width, round(usage * width))
    bar = Text("█" * filled, style=HEALTH_STYLE.get(health, ""))
    bar.append("░" * (width - filled), style="dim")
    bar.append(f" {usage * 100:5.1f}%")
    return cell(bar, plain=_percent(usage))


def health_cell(health: str) -> Cell:
    return cell(Text(health, style=HEALTH_STYLE.get(health, "")))


def _confidence(confidence: float) -> str:
    return f"{confidence:.3f}"


def _compact_json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _content_text(content: Any) -> str:
    return content if isinstance(content, str) else _compact_json(content)


# ---- listings ------------------------------------------------------------------------

SESSION_COLUMNS = (
    Column("session"), Column("project", keep=50, wrap=True, min_width=8),
    Column("title", keep=40, wrap=True), Column("state"), Column("msgs", keep=20, right=True),
    Column("tokens", keep=30, right=True), Column("usage", keep=10),
    Column("health", keep=60))


def sessions_listing(sessions: list[dict[str, Any]], title: str) -> Listing:
    listing = Listing(SESSION_COLUMNS, title=title)
    for s in sessions:
        listing.rows.append([
            cell(s["session_id"]), cell(s["project"] or ""), cell(s["title"] or ""),
            cell(s["state"]), cell(str(s["message_count"])),
            cell(f"{s['main_thread_tokens']:,}/{s['effective_window']:,}"),
            usage_bar(s["usage"], s["health"]), health_cell(s["health"])])
    return listing


def _branch_budget(branch: dict[str, Any]) -> str:
    return f"{branch['budget_used']:,}/{branch['budget']:,}"


def branch_budget_bar(branch: dict[str, Any], budget: dict[str, Any]) -> Cell:
    """The usage bar of a branch's budget, coloured by the health its session's thresholds
    give that share (`wire.Budget.health`, the daemon's own levels)."""
    usage = branch["budget_used"] / branch["budget"]
    thresholds = wire.Budget(**{name: budget[name] for name in wire.Budget.__struct_fields__})
    return usage_bar(usage, thresholds.health(usage))


LIVE_BRANCH_COLUMNS = (
    Column("session"), Column("branch"), Column("depth", keep=20, right=True),
    Column("description", keep=50, wrap=True), Column("budget", keep=40, right=True),
    Column("usage", keep=10), Column("time left", keep=30, right=True))


def live_branches_listing(branches: list[dict[str, Any]],
                          budgets: dict[str, dict[str, Any]]) -> Listing:
    listing = Listing(LIVE_BRANCH_COLUMNS, title="live branches")
    for b in branches:
        listing.rows.append([
            cell(b["session_id"]), cell(b["branch_id"]), cell(str(b["depth"])),
            _shorten(b["description"]), cell(_branch_budget(b)),
            branch_budget_bar(b, budgets[b["session_id"]]),
            cell(_duration(b["time_left_s"] or 0))])
    return listing


BRANCH_COLUMNS = (
    Column("branch"), Column("parent", keep=60), Column("depth", keep=30, right=True),
    Column("status"), Column("budget", keep=40, right=True),
    Column("left/returned", keep=20), Column("folded/saved", keep=10, right=True),
    Column("description", keep=70, wrap=True))


def branches_listing(branches: list[dict[str, Any]], title: str) -> Listing:
    listing = Listing(BRANCH_COLUMNS, title=title)
    for b in branches:
        if b["status"] == "active":
            when = f"{_duration(b['time_left_s'] or 0)} left"
        else:
            when = _timestamp(b["returned_at"]) if b["returned_at"] is not None else ""
        folded = ("" if b["tokens_folded"] is None
                  else f"{b['tokens_folded']:,}/{b['tokens_saved']:,}")
        listing.rows.append([
            cell(b["branch_id"]), cell(b["parent_branch_id"] or "main"), cell(str(b["depth"])),
            cell(Text(b["status"], style=BRANCH_STATUS_STYLE.get(b["status"], ""))),
            cell(_branch_budget(b)), cell(when), cell(folded), _shorten(b["description"])])
    return listing


HIT_COLUMNS = (
    Column("id", right=True), Column("score", keep=30, right=True),
    Column("confidence", keep=40, right=True), Column("legs", keep=20),
    Column("scope", keep=50, wrap=True, min_width=8), Column("title", keep=70, wrap=True),
    Column("content", keep=60, wrap=True, min_width=20))


def memory_hits_listing(result: dict[str, Any]) -> Listing:
    """The results of memory.search, best first."""
    legs = ", ".join(result["legs_used"]) or "none"
    listing = Listing(HIT_COLUMNS, title=f"{len(result['results'])} found by {result['mode']} "
                                         f"search (legs: {legs})")
    for hit in result["results"]:
        listing.rows.append([
            cell(str(hit["id"])), cell(f"{hit['score']:.4f}"), cell(_confidence(hit["confidence"])),
            cell("+".join(hit["legs"])), cell(hit["scope"]), _shorten(hit["title"]),
            _shorten(hit["content"], CONTENT_SHOWN)])
    return listing


MEMORY_COLUMNS = (
    Column("id", right=True), Column("scope", keep=50, wrap=True, min_width=8),
    Column("confidence", keep=40, right=True), Column("outcome", keep=30),
    Column("uses", keep=20, right=True), Column("tags", keep=10, wrap=True, min_width=8),
    Column("title", keep=70, wrap=True), Column("content", keep=60, wrap=True, min_width=20))


def memories_listing(memories: list[dict[str, Any]], title: str) -> Listing:
    listing = Listing(MEMORY_COLUMNS, title=title)
    for m in memories:
        listing.rows.append([
            cell(str(m["id"])), cell(m["scope"]), cell(_confidence(m["confidence"])),
            cell(m["outcome"]), cell(str(m["usage_count"])), cell(" ".join(m["tags"])),
            _shorten(m["title"]), _shorten(m["content"], CONTENT_SHOWN)])
    return listing


MESSAGE_COLUMNS = (
    Column("seq", right=True), Column("role"), Column("component", keep=20),
    Column("tokens", keep=40, right=True), Column("branch", keep=30),
    Column("content", keep=60, wrap=True, min_width=20))


def messages_listing(messages: list[dict[str, Any]], title: str) -> Listing:
    listing = Listing(MESSAGE_COLUMNS, title=title)
    for m in messages:
        listing.rows.append([
            cell(str(m["seq"])), cell(m["role"]), cell(m["component"]), cell(f"{m['tokens']:,}"),
            cell(m.get("branch_id") or "main"), _shorten(_content_text(m["content"]),
                                                         CONTENT_SHOWN)])
    return listing


FIELD_COLUMNS = (Column("field"), Column("value", wrap=True, min_width=20))


def show_fields(out: Output, fields: Sequence[tuple[str, str]]) -> None:
    """Name/value pairs of one thing, shown whole: aligned lines without a frame on a
    terminal; without a header line in plain and TSV output."""
    if out.format == "table":
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for name, value in fields:
            grid.add_row(name, Text(value))
        out.console.print(grid)
        return
    listing = Listing(FIELD_COLUMNS, [[cell(name), cell(value)] for name, value in fields])
    out.lines(plain_lines(listing, headers=False) if out.format == "plain"
              else tsv_lines(listing, headers=False))


# ---- status --------------------------------------------------------------------------

def daemon_line(status: dict[str, Any]) -> Text:
    return Text.assemble(
        ("ctxd ", "bold"), (status["version"], "bold cyan"),
        f"  pid {status['pid']}  up {_duration(status['uptime_s'])}  ",
        f"sessions {status['sessions_open']} open / {status['sessions_total']}  ",
        f"actors {status['session_actors']}  conns {status['connections']}  ",
        f"db {_bytes(status['db_size_bytes'])}  rss {_bytes(status['rss_bytes'])}  ",
        f"{status['requests_per_s']:.1f} req/s  p50 {status['latency_p50_ms']:.2f} ms  "
        f"p99 {status['latency_p99_ms']:.2f} ms\n",
        (f"socket {status['socket']}  data {status['data_dir']}", "dim"))


def _open_sessions(client: Client, first_page: dict[str, Any]) -> list[dict[str, Any]]:
    """Every open session: ``first_page`` of session.list and the pages after it."""
    sessions = list(first_page["sessions"])
    cursor = first_page["next_cursor"]
    while cursor is not None:
        page = client.call("session.list", {"state": "open", "limit": PAGE_ALL,
                                            "cursor": cursor})
        sessions += page["sessions"]
        cursor = page["next_cursor"]
    return sessions


def live_branches(client: Client, status: dict[str, Any], first_page: dict[str, Any]
                  ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The active branches of every open session, session by session, oldest first, and
    the budget of each session that holds one.

    One pipelined branch.list per session that session.list counts live branches in. The
    daemon's count, session.list and branch.list are read at different moments, so a
    branch created or returned in between may show in one and not in another: the view
    is a snapshot of those moments, and the next refresh catches up.

    Raises:
        RpcError: the daemon answered a branch.list with an error other than -32004 (a
            session deleted since it was listed is skipped).
    """
    if status["live_branches"] == 0:
        return [], {}
    holding = [s for s in _open_sessions(client, first_page) if s["live_branches"] > 0]
    pending = [client.submit("branch.list", {"session_id": s["session_id"],
                                             "status": "active"}) for s in holding]
    branches: list[dict[str, Any]] = []
    for future in pending:
        try:
            branches += future.result(client.timeout)["branches"]
        except RpcError as exc:
            if exc.code != ErrorCode.NOT_FOUND:
                raise
    return branches, {s["session_id"]: s["budget"] for s in holding}


def waiting_injections(client: Client, sessions: list[dict[str, Any]]) -> None:
    """Add each session's injections by state (``injections``: inject.list's counts) to its
    entry; one pipelined inject.list per session, a session deleted meanwhile counts none.

    Raises:
        RpcError: the daemon answered an inject.list with an error other than -32004.
    """
    pending = [client.submit("inject.list", {"session_id": s["session_id"], "limit": 1})
               for s in sessions]
    for session, future in zip(sessions, pending, strict=True):
        try:
            session["injections"] = future.result(client.timeout)["counts"]
        except RpcError as exc:
            if exc.code != ErrorCode.NOT_FOUND:
                raise
            session["injections"] = {}


INJECTION_COLUMNS = (Column("session"), Column("pending", right=True),
                     Column("delivered, not acknowledged", right=True))


def injections_listing(sessions: list[dict[str, Any]]) -> Listing:
    """The sessions with injections waiting for their agent."""
    listing = Listing(INJECTION_COLUMNS, title="pending injections")
    for s in sessions:
        counts = s.get("injections", {})
        if counts.get("pending", 0) or counts.get("delivered", 0):
            listing.rows.append([cell(s["session_id"]), cell(str(counts["pending"])),
                                 cell(str(counts["delivered"]))])
    return listing


def _status_snapshot(client: Client, limit: int) -> tuple[dict[str, Any],
                                                          dict[str, dict[str, Any]]]:
    status = client.call("daemon.status")
    sessions = client.call("session.list", {"state": "open", "limit": limit})
    branches, budgets = live_branches(client, status, sessions)
    waiting_injections(client, sessions["sessions"])
    return {"daemon": status, "sessions": sessions["sessions"],
            "more_sessions": sessions["next_cursor"] is not None,
            "live_branches": branches,
            "usage": sessions_usage(client, sessions["sessions"])}, budgets


def sessions_usage(client: Client, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The usage totals (and cost) of each session that reported any, by session id."""
    found = {}
    for session in sessions:
        try:
            got = client.call("usage.get", {"session_id": session["session_id"]})
        except RpcError as exc:
            if exc.code != ErrorCode.NOT_FOUND:  # deleted meanwhile
                raise
            continue
        if got["totals"]["calls"]:
            found[session["session_id"]] = {"totals": got["totals"], "cost": got["cost"]}
    return found


def _status_usage(snapshot: dict[str, Any]) -> Listing:
    used = snapshot["usage"]
    return usage_listing("session", [(sid, got["totals"], got["cost"])
                                     for sid, got in used.items()],
                         "usage of open sessions",
                         any(got["cost"] is not None for got in used.values()))


def _status_listings(snapshot: dict[str, Any], budgets: dict[str, dict[str, Any]]
                     ) -> tuple[Listing, Listing]:
    title = "open sessions" + (" (first page)" if snapshot["more_sessions"] else "")
    return (sessions_listing(snapshot["sessions"], title),
            live_branches_listing(snapshot["live_branches"], budgets))


def _status_view(snapshot: dict[str, Any], budgets: dict[str, dict[str, Any]],
                 width: int) -> Group:
    sessions, branches = _status_listings(snapshot, budgets)
    usage = _status_usage(snapshot)
    injections = injections_listing(snapshot["sessions"])
    return Group(daemon_line(snapshot["daemon"]), table(sessions, width),
                 *([table(injections, width)] if injections.rows else []),
                 table(branches, width) if branches.rows else Text("no live branches"),
                 *([table(usage, width)] if usage.rows else []))


def _print_status(out: Output, snapshot: dict[str, Any],
                  budgets: dict[str, dict[str, Any]]) -> None:
    if out.json:
        out.lines([_compact_json(snapshot)])
        return
    if out.format == "table":
        out.console.print(_status_view(snapshot, budgets, out.console.width))
        return
    sessions, branches = _status_listings(snapshot, budgets)
    out.lines([" ".join(daemon_line(snapshot["daemon"]).plain.split())])
    if sessions.rows:
        out.lines([""])
        out.listing(sessions, "")
    injections = injections_listing(snapshot["sessions"])
    if injections.rows:
        out.lines([""])
        out.listing(injections, "")
    if branches.rows:
        out.lines([""])
        out.listing(branches, "")
    usage = _status_usage(snapshot)
    if usage.rows:
        out.lines([""])
        out.listing(usage, "")


def cmd_status(client: Client, args: argparse.Namespace, out: Output) -> int:
    if not args.watch:
        snapshot, budgets = _status_snapshot(client, args.limit)
        if out.json:
            _print_json(snapshot)
        else:
            _print_status(out, snapshot, budgets)
        return 0
    try:
        if out.format == "table":
            width = out.console.width
            with Live(_status_view(*_status_snapshot(client, args.limit), width),
                      console=out.console, refresh_per_second=4, screen=False) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(_status_view(*_status_snapshot(client, args.limit),
                                             out.console.width))
        while True:  # one JSON object a line, or one plain snapshot after another
            _print_status(out, *_status_snapshot(client, args.limit))
            if not out.json:
                out.lines([""])
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return 0


# ---- sessions, branches --------------------------------------------------------------

def cmd_sessions(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.project:
        params["project"] = args.project
    if args.state:
        params["state"] = args.state
    result = client.call("session.list", params)
    if out.json:
        _print_json(result)
        return 0
    out.listing(sessions_listing(result["sessions"], "sessions"), "no sessions")
    if result["next_cursor"]:
        out.note(f"(more: --limit larger than {args.limit})")
    return 0


def cmd_session_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("session.get", {"session_id": args.session})
    if out.json:
        _print_json(result)
        return 0
    s, state = result["session"], result["context_state"]
    budget = s["budget"]
    show_fields(out, [
        ("session", s["session_id"]), ("project", s["project"] or ""),
        ("title", s["title"] or ""), ("state", s["state"]),
        ("messages", f"{s['message_count']:,}"),
        ("tokens", f"{state['main_thread_tokens']:,} main thread, "
                   f"{state['total_tokens']:,} in all, {state['folded_tokens']:,} folded"),
        ("window", f"{state['effective_window']:,} ({budget['context_window']:,} less "
                   f"{budget['max_output_tokens']:,} for the reply)"),
        ("usage", f"{_percent(state['usage'])} ({state['health']})"),
        ("thresholds", f"warn {_percent(budget['warn'])}, caution "
                       f"{_percent(budget['caution'])}, compact "
                       f"{_percent(budget['compact_trigger'])}, hard block "
                       f"{_percent(budget['hard_block'])}"),
        ("branch", " > ".join(state["branch_path"]) or "main"),
        ("live branches", str(s["live_branches"])),
        ("created", _timestamp(s["created_at"])), ("updated", _timestamp(s["updated_at"])),
        ("closed", _timestamp(s["closed_at"]) if s["closed_at"] is not None else "")])
    return 0


def cmd_session_close(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("session.close", {"session_id": args.session})
    if out.json:
        _print_json(result)
    else:
        out.lines([f"session {args.session} closed"])
    return 0


def cmd_session_delete(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("session.delete", {"session_id": args.session})
    if out.json:
        _print_json(result)
    else:
        count = result["messages_deleted"]
        out.lines([f"session {args.session} deleted "
                   f"({count} message{'' if count == 1 else 's'})"])
    return 0


def _conversation(messages: list[dict[str, Any]]) -> list[str]:
    """Messages as a reader sees them: ``[role (name)]`` over each content, blank lines
    between (nothing for none)."""
    blocks = []
    for message in messages:
        who = message["role"] + (f" ({message['name']})" if message.get("name") else "")
        blocks.append(f"[{who}]\n{_content_text(message['content'])}")
    return ["\n\n".join(blocks)] if blocks else []


def cmd_session_render(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"session_id": args.session}
    if args.branch is not None:
        params["branch_id"] = args.branch
    result = client.call("ctxd.render", params)
    if out.json:
        _print_json(result)
        return 0
    out.lines(_conversation(result["messages"]))
    state = result["context_state"]
    out.note(f"({len(result['messages'])} messages, {result['tokens']:,} tokens of "
             f"{state['effective_window']:,}: {_percent(state['usage'])}, {state['health']})")
    return 0


def cmd_session_messages(client: Client, args: argparse.Namespace, out: Output) -> int:
    limit = args.limit if args.limit is not None else PAGE_ALL if args.all else 100
    params: dict[str, Any] = {"session_id": args.session, "limit": limit}
    if args.branch is not None:
        params["branch_id"] = args.branch
    result = client.call("message.list", params)
    messages = list(result["messages"])
    while args.all and result["next_cursor"] is not None:
        result = client.call("message.list", {**params, "cursor": result["next_cursor"]})
        messages += result["messages"]
    if out.json:
        _print_json({"messages": messages, "next_cursor": result["next_cursor"],
                     "context_state": result["context_state"]})
        return 0
    out.listing(messages_listing(messages, f"messages of session {args.session}"),
                "no messages")
    if result["next_cursor"] is not None:
        out.note(f"(more: --all, or --limit larger than {limit})")
    return 0


def cmd_result(client: Client, args: argparse.Namespace, out: Output) -> int:
    """An offloaded tool result (result.read): a page of it, or its lines that match."""
    params: dict[str, Any] = {"session_id": args.session, "ref_id": args.ref}
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
    result = client.call("result.read", params)
    if out.json:
        _print_json(result)
        return 0
    if args.grep is None:
        sys.stdout.write(result["content"])
        sys.stdout.flush()
        if result["next_offset"] is not None:
            out.note(f"(characters {result['offset']:,} to {result['next_offset']:,} of "
                     f"{result['total_chars']:,}: --offset {result['next_offset']} for more)")
        return 0
    out.lines([f"{m['line']}:{m['text']}" for m in result["matches"]])
    if result["more_matches"]:
        out.note(f"({result['more_matches']:,} more matching lines: --max-matches)")
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
    if out.json:
        _print_json(result)
        return 0
    window = result["context_state"]["effective_window"]
    before, after = result["before_tokens"], result["after_tokens"]
    listing = Listing(COMPACT_COLUMNS, title=f"session {args.session}" + (
        f", branch {args.branch}" if args.branch else ""))
    listing.rows += [
        [cell("tokens"), cell(f"{before:,}"), cell(f"{after:,}"),
         cell(f"{after - before:+,}")],
        [cell("usage"), cell(_percent(before / window)), cell(_percent(after / window)),
         cell(f"{(after - before) / window * 100:+.1f} pts")],
        [cell("messages"), cell(f"{result['before_msgs']:,}"), cell(f"{result['after_msgs']:,}"),
         cell(f"{result['after_msgs'] - result['before_msgs']:+,}")]]
    out.listing(listing, "")
    done = [f"{result[what]} {what}" for what in ("cleared", "summarized", "truncated")
            if result[what]]
    if not result["strategies_run"]:
        out.note(f"(already under the target of {result['target_tokens']:,} tokens: nothing "
                 "to do)")
    else:
        out.note(f"(ran {', '.join(result['strategies_run'])}: "
                 f"{', '.join(done) or 'nothing could go'}; target "
                 f"{result['target_tokens']:,} tokens)")
    if result["summarizer_error"]:
        out.note(f"the {result['summarizer']} summarizer failed: {result['summarizer_error']}",
                 style="yellow")
    return 0


def cmd_session_resume(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("session.resume", {"session_id": args.session})
    if out.json:
        _print_json(result)
        return 0
    out.lines(_conversation(result["messages"]))
    source = (f"from the snapshot of {_timestamp(result['compacted_at'])}"
              if result["source"] == "snapshot" else "the thread: never compacted")
    out.note(f"({len(result['messages'])} messages, {result['tokens']:,} tokens, {source})")
    return 0


def cmd_branches(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"session_id": args.session}
    if args.status:
        params["status"] = args.status
    result = client.call("branch.list", params)
    if out.json:
        _print_json(result)
        return 0
    what = f"{args.status} branches" if args.status else "branches"
    out.listing(branches_listing(
        result["branches"], f"{what} of session {args.session}  ({result['total']} in all: "
                            f"{result['active']} active, {result['folded']} folded)"),
        f"no {what} in session {args.session}")
    return 0


# ---- usage, tool calls ---------------------------------------------------------------

USAGE_COUNTER_HEADERS = (("input_tokens", "input"), ("output_tokens", "output"),
                         ("cache_read_tokens", "cache read"),
                         ("cache_write_tokens", "cache write"), ("thinking_tokens", "thinking"))
USAGE_SESSIONS = 100
"""Sessions `usage` without a session looks at: the first page of `session.list`, in the
order the sessions were created."""


def _cost(cost: dict[str, Any] | None) -> str:
    return "-" if cost is None else f"{cost['total']:.4f}"


def usage_listing(key: str, rows: list[tuple[str, dict[str, Any], dict[str, Any] | None]],
                  title: str, priced: bool) -> Listing:
    """One row per (key, totals, cost): its calls and counters, and its cost when any call
    was priced."""
    columns = [Column(key), Column("calls", right=True),
               *(Column(header, keep=40, right=True) for _, header in USAGE_COUNTER_HEADERS)]
    if priced:
        columns.append(Column("cost", right=True))
    listing = Listing(columns, title=title)
    for name, totals, cost in rows:
        listing.rows.append([cell(name), cell(f"{totals['calls']:,}"),
                             *(cell(f"{totals[counter]:,}")
                               for counter, _ in USAGE_COUNTER_HEADERS),
                             *([cell(_cost(cost))] if priced else [])])
    return listing


def _calibration_note(calibration: dict[str, Any] | None) -> str | None:
    if calibration is None or not calibration["input_tokens"]:
        return None
    ratio = calibration["ratio"]
    return (f"latest call: {calibration['input_tokens']:,} input tokens reported, ctxd "
            f"counted {calibration['local_input_tokens']:,}"
            + (f" (ratio {ratio:.4f})" if ratio is not None else ""))


def cmd_usage(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.session is None:
        return _usage_of_sessions(client, out)
    params: dict[str, Any] = {"session_id": args.session}
    if args.by:
        params["group_by"] = args.by
    result = client.call("usage.get", params)
    if out.json:
        _print_json(result)
        return 0
    rows = [(g["key"] or ("main thread" if args.by == "branch" else "-"), g["totals"],
             g["cost"]) for g in result["groups"] or ()]
    rows.append(("total", result["totals"], result["cost"]))
    out.listing(usage_listing(args.by or "scope", rows, f"usage of session {args.session}"
                              + (f" by {args.by}" if args.by else ""),
                              result["cost"] is not None), "")
    note = _calibration_note(result["calibration"])
    if result["cost"] is not None and result["cost"]["unpriced_calls"]:
        unpriced = result["cost"]["unpriced_calls"]
        out.note(f"{unpriced} {'call has' if unpriced == 1 else 'calls have'} no price "
                 "(not in [usage] prices)")
    if note:
        out.note(note)
    return 0


def _usage_of_sessions(client: Client, out: Output) -> int:
    sessions = client.call("session.list", {"limit": USAGE_SESSIONS})["sessions"]
    found = {}
    for session in sessions:
        try:
            found[session["session_id"]] = client.call(
                "usage.get", {"session_id": session["session_id"]})
        except RpcError as exc:
            if exc.code != ErrorCode.NOT_FOUND:  # deleted meanwhile
                raise
    used = {sid: got for sid, got in found.items() if got["totals"]["calls"]}
    if out.json:
        _print_json({"sessions": [used[sid] for sid in used]})
        return 0
    out.listing(usage_listing("session", [(sid, got["totals"], got["cost"])
                                          for sid, got in used.items()],
                              "usage by session",
                              any(got["cost"] is not None for got in used.values())),
                "no session has reported usage")
    return 0


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 60 else _duration(value)


def tool_calls_listing(calls: list[dict[str, Any]], title: str) -> Listing:
    listing = Listing((Column("tool call"), Column("tool", keep=50), Column("state"),
                       Column("in state", keep=40, right=True),
                       Column("history", keep=30, wrap=True)), title=title)
    for call in calls:
        current = ("-" if call["terminal"]
                   else _seconds(call["seconds_in_state"].get(call["state"], 0.0)))
        history = " > ".join(
            entry["state"] + (f" {_seconds(entry['seconds'])}" if entry["seconds"] is not None
                              else "")
            for entry in call["history"])
        listing.rows.append([cell(call["tool_call_id"]), cell(call["tool_name"] or ""),
                             cell(call["state"]), cell(current), cell(history)])
    return listing


def cmd_tools(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"session_id": args.session}
    if args.state:
        params["state"] = args.state
    result = client.call("tool.list", params)
    if out.json:
        _print_json(result)
        return 0
    what = f"{args.state} tool calls" if args.state else "tool calls"
    out.listing(tool_calls_listing(result["tool_calls"], f"{what} of session {args.session}"),
                f"no {what} in session {args.session}")
    return 0


# ---- events --------------------------------------------------------------------------

def event_fields(event: dict[str, Any]) -> list[str]:
    """An event's time (local, to the millisecond), seq, type, session and data."""
    ts = event["ts"]
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"
    return [when, str(event["seq"]), event["type"], event["session_id"] or "-",
            _compact_json(event["data"])]


def cmd_events(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {}
    if args.session is not None:
        params["session_id"] = args.session
    if args.type:
        params["types"] = args.type
    if args.since is not None:
        params["since_seq"] = args.since
    client.call("events.subscribe", params)
    try:
        while True:
            try:
                message = client.notifications.get(timeout=0.5)
            except queue.Empty:
                if not client.connected:
                    raise DaemonUnavailable(client.path, "the daemon closed the connection"
                                            ) from None
                continue
            if message.get("method") != "event":
                continue
            event = message["params"]
            if out.json:
                out.lines([_compact_json(event)])
            elif out.format == "tsv":
                out.lines(["\t".join(event_fields(event))])
            else:
                out.lines(["  ".join(event_fields(event))])
    except KeyboardInterrupt:
        return 0


# ---- memory --------------------------------------------------------------------------

def cmd_memory_search(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"query": args.query}
    for name in ("scope", "k", "min_confidence", "mode"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    result = client.call("memory.search", params)
    if out.json:
        _print_json(result)
        return 0
    out.listing(memory_hits_listing(result), f"no memories found by {result['mode']} search")
    if result["note"]:
        out.note(f"note: {result['note']}", style="yellow")
    return 0


def _read_stdin() -> str | None:
    """Standard input as UTF-8 text, or None (and a message) when it is not."""
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"ctxctl: standard input is not UTF-8 text: {exc}", file=sys.stderr)
        return None


def cmd_inject(client: Client, args: argparse.Namespace, out: Output) -> int:
    content = _read_stdin() if args.text == "-" else args.text
    if content is None:
        return 2
    problem = _length_problem(wire.InjectPushParams, "content", content)
    if problem:
        print(f"ctxctl: {'standard input' if args.text == '-' else 'TEXT'} {problem}",
              file=sys.stderr)
        return 2
    params: dict[str, Any] = {"session_id": args.session, "content": content,
                              "priority": args.priority, "source": "ctxctl"}
    if args.key is not None:
        params["idempotency_key"] = args.key
    result = client.call("inject.push", params)
    if out.json:
        _print_json(result)
        return 0
    scrubbed = result["secrets_scrubbed"]
    out.lines([f"injection {result['injection_id']} "
               + ("was already queued" if result["duplicate"] else "queued")
               + f" for {args.session} ({result['priority']}, {result['tokens']:,} tokens)"
               + (f"; {scrubbed} secret{'s' if scrubbed > 1 else ''} scrubbed"
                  if scrubbed else "")])
    return 0


def cmd_memory_add(client: Client, args: argparse.Namespace, out: Output) -> int:
    content = _read_stdin() if args.content == "-" else args.content
    if content is None:
        return 2
    problem = _length_problem(wire.MemoryRecordParams, "content", content)
    if problem:
        print(f"ctxctl: {'standard input' if args.content == '-' else 'CONTENT'} {problem}",
              file=sys.stderr)
        return 2
    params: dict[str, Any] = {"title": args.title, "content": content}
    for name in ("description", "scope", "outcome"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    if args.tag:
        params["tags"] = args.tag
    result = client.call("memory.record", params)
    if out.json:
        _print_json(result)
        return 0
    memory = result["memory"]
    scrubbed = result["secrets_scrubbed"]
    out.lines([f"memory {memory['id']} recorded in {memory['scope']}"
               + (f"; {scrubbed} secret{'s' if scrubbed > 1 else ''} scrubbed"
                  if scrubbed else "")])
    if not result["indexed"]:
        out.note("not in the dense index yet (it is not ready); lexical search finds it")
    return 0


def cmd_memory_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    limit = args.limit if args.limit is not None else PAGE_ALL if args.all else MEMORY_PAGE
    params: dict[str, Any] = {"limit": limit}
    if args.scope is not None:
        params["scope"] = args.scope
    result = client.call("memory.list", params)
    memories = list(result["memories"])
    while args.all and result["next_cursor"] is not None:
        result = client.call("memory.list", {**params, "cursor": result["next_cursor"]})
        memories += result["memories"]
    if out.json:
        _print_json({"memories": memories, "next_cursor": result["next_cursor"]})
        return 0
    out.listing(memories_listing(memories, "memories"), "no memories")
    if result["next_cursor"] is not None:
        out.note(f"(more: --all, or --limit larger than {limit})")
    return 0


def cmd_memory_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("memory.get", {"id": args.id})
    if out.json:
        _print_json(result)
        return 0
    m = result["memory"]
    show_fields(out, [
        ("id", str(m["id"])), ("scope", m["scope"]), ("title", m["title"]),
        ("description", m["description"]), ("outcome", m["outcome"]),
        ("tags", " ".join(m["tags"])), ("confidence", _confidence(m["confidence"])),
        ("uses", str(m["usage_count"])), ("source", m["source"] or ""),
        ("created", _timestamp(m["created_at"])), ("updated", _timestamp(m["updated_at"])),
        ("content", m["content"])])
    return 0


def _index_line(index: dict[str, Any]) -> str:
    return (f"{index['state']}: {index['vectors']:,} vectors, {index['memories']:,} memories "
            f"({index['embedder']})")


def cmd_memory_reindex(client: Client, args: argparse.Namespace, out: Output) -> int:
    started = time.monotonic()
    rebuilt = client.submit("memory.reindex")
    if out.format == "table" and out.console.is_terminal:
        # memory.reindex answers when the index is rebuilt; meanwhile daemon.status (on the
        # same connection: requests are pipelined) says how far it is.
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=out.console, transient=True) as progress:
            task = progress.add_task("rebuilding the memory index", total=None)
            while not concurrent.futures.wait([rebuilt], timeout=0.25).done:
                index = client.call("daemon.status")["memory_index"]
                progress.update(task, description=f"rebuilding the memory index: "
                                                  f"{_index_line(index)}")
    index = rebuilt.result()
    if out.json:
        _print_json(index)
    else:
        out.lines([f"memory index {_index_line(index)}; rebuilt in "
                   f"{time.monotonic() - started:.1f} s"])
    return 0


RATINGS = {"helpful": ("memory.feedback", "helpful", True),
           "unhelpful": ("memory.feedback", "helpful", False),
           "succeeded": ("memory.outcome", "succeeded", True),
           "failed": ("memory.outcome", "succeeded", False)}
"""A rating flag's method and params."""


def cmd_memory_rate(client: Client, args: argparse.Namespace, out: Output) -> int:
    method, name, value = RATINGS[args.rating]
    result = client.call(method, {"id": args.id, name: value})
    if out.json:
        _print_json(result)
    else:
        out.lines([f"memory {args.id}: confidence {_confidence(result['memory']['confidence'])}"])
    return 0


def cmd_memory_rm(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("memory.delete", {"id": args.id})
    if out.json:
        _print_json(result)
    else:
        out.lines([f"memory {args.id} deleted"])
    return 0


# ---- call, stop, completion ----------------------------------------------------------

def cmd_call(client: Client, args: argparse.Namespace, out: Output) -> int:
    text = args.params
    if text == "-":
        text = _read_stdin()
        if text is None:
            return 2
    try:
        params = json.loads(text) if text else None
    except json.JSONDecodeError as exc:
        source = "standard input" if args.params == "-" else "PARAMS"
        print(f"ctxctl: {source} is not valid JSON: {exc}", file=sys.stderr)
        return 2
    _print_json(client.call(args.method, params, request_id=args.id))
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.cancel(args.request_id, args.reason)
    if out.json:
        _print_json(result)
        return 0
    lines = [f"request {args.request_id!r}: {result['cancelled']} cancelled"]
    if result["finishing"]:
        lines.append(f"{result['finishing']} past its commit point: answered as done")
    out.lines(lines)
    return 0


def _running(pid: int) -> bool:
    """Whether the process lives (an exited one not yet reaped by its parent does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def cmd_doctor(client: Client, args: argparse.Namespace, out: Output) -> int:
    client.timeout = None  # the whole database is read: seconds per GiB from disk
    result = client.call("daemon.check")
    from ctxclient import _install

    integrations, wired = _install.doctor(Path.cwd())
    if out.json:
        _print_json({**result, "integrations": integrations})
    elif result["ok"]:
        out.lines([f"{result['database']}: ok (integrity_check, {result['seconds']:.2f} s)",
                   *_install.doctor_lines(integrations)])
    else:
        out.lines([*(f"{result['database']}: {problem}" for problem in result["problems"]),
                   *_install.doctor_lines(integrations)])
        print(f"ctxctl: the database {result['database']} is corrupt; stop ctxd and run "
              "`ctxd --recover`", file=sys.stderr)
    if not wired:
        print("ctxctl: an agent's ctxd settings are incomplete; run the fix shown",
              file=sys.stderr)
    return 0 if result["ok"] and wired else 1


def cmd_install(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _install

    return _install.run("install", args.target, args.scope, Path(args.dir).absolute(),
                        args.socket, out.json)


def cmd_uninstall(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _install

    return _install.run("uninstall", args.target, args.scope, Path(args.dir).absolute(),
                        None, out.json)


def cmd_hook(args: argparse.Namespace, out: Output) -> int:
    # The console script answers `ctxctl hook` before the CLI loads (clients/ctxclient/
    # _entry.py); this is `python -m ctxclient.cli hook` and the help.
    from ctxclient import _hook

    return _hook.main(["hook", *(["--socket", args.socket] if args.socket else [])])


def cmd_stop(client: Client, args: argparse.Namespace, out: Output) -> int:
    pid = client.call("daemon.status")["pid"]
    client.call("daemon.shutdown")
    # Gone means the process exited: the socket refuses connections as soon as shutdown
    # starts, while in-flight requests still drain and the data directory stays locked.
    deadline = time.monotonic() + args.wait
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running(pid):
        print(f"ctxctl: ctxd (pid {pid}) is still running after {args.wait}s", file=sys.stderr)
        return 1
    if out.json:
        _print_json({"stopped": True, "pid": pid})
    else:
        out.lines([f"ctxd (pid {pid}) stopped"])
    return 0


def _stop_when_not_running(out: Output, path: str) -> int:
    """`stop` with no daemon: done already, as `systemctl stop` of a stopped unit is."""
    if out.json:
        _print_json({"stopped": False, "pid": None})
    print(f"ctxctl: ctxd is not running (nothing listens on {path})", file=sys.stderr)
    return 0


def cmd_mcp(args: argparse.Namespace, out: Output) -> int:
    return _mcp.run(getattr(args, "socket", None), args.session)


def _replay_window(text: str) -> int:
    from ctxclient import _replay

    return _replay.window(text)


def cmd_replay(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _replay

    return _replay.run(args, out)


def cmd_completion(args: argparse.Namespace, out: Output) -> int:
    import shtab

    out.lines([shtab.complete(parser(), shell=args.shell).rstrip("\n")])
    return 0


def _print_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")


# ---- what the command line accepts ---------------------------------------------------

def _field_type(struct: type[msgspec.Struct], name: str) -> Any:
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    [found] = [f.type for f in info.fields if f.name == name]
    if isinstance(found, msgspec.inspect.UnionType):  # optional: the type beside None
        [found] = [t for t in found.types if not isinstance(t, msgspec.inspect.NoneType)]
    return found.type if isinstance(found, msgspec.inspect.Metadata) else found


def _range_text(info: Any, kind: str) -> str:
    if info.ge is not None and info.le is not None:
        return f"{kind} from {info.ge} to {info.le}"
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


def _matching(kind: str, annotated: Any) -> Callable[[str], str]:
    """An argparse type: a string the wire's ``annotated`` type accepts (an id, a scope),
    the error saying which forms are allowed."""
    described = get_args(annotated)[1].description

    def convert(text: str) -> str:
        try:
            msgspec.convert(text, annotated)
        except msgspec.ValidationError:
            raise argparse.ArgumentTypeError(
                f"invalid {kind} {text!r}: use {described}") from None
        return text

    convert.__name__ = kind
    return convert


session_id = _matching("session id", wire.SessionId)
branch_id = _matching("branch id", wire.BranchId)
scope = _matching("scope", wire.Scope)


def tag(text: str) -> str:
    if not text or len(text) > 64 or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"invalid tag {text!r}: use one word of at most 64 "
                                         "characters")
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


def _text_of(struct: type[msgspec.Struct], name: str, what: str) -> Callable[[str], str]:
    """An argparse type: text within the wire's length limits for ``struct.name``."""

    def convert(text: str) -> str:
        problem = _length_problem(struct, name, text)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return text

    convert.__name__ = what
    return convert


def _length_problem(struct: type[msgspec.Struct], name: str, text: str) -> str | None:
    info = _field_type(struct, name)
    if info.min_length and len(text) < info.min_length:
        return "is empty" if info.min_length == 1 else f"is shorter than {info.min_length}"
    if info.max_length is not None and len(text) > info.max_length:
        return f"is longer than {info.max_length:,} characters"
    return None


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


class _Parser(argparse.ArgumentParser):
    """argparse, with an unknown command or choice answered by the closest one."""

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


def _common_options(parser: argparse.ArgumentParser, defaults: bool,
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


def _group(commands: argparse._SubParsersAction[_Parser], name: str, common: _Parser,
           help_text: str) -> argparse._SubParsersAction[_Parser]:
    """A command with commands of its own (``memory``, ``session``)."""
    group = commands.add_parser(name, parents=[common], help=help_text,
                                description=help_text[0].upper() + help_text[1:] + ".")
    group.set_defaults(run=None, group=group)
    return group.add_subparsers(dest="action", metavar="COMMAND", parser_class=_Parser)


def parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    _common_options(common, defaults=False)
    cli = _Parser(prog="ctxctl", description="Look at and drive ctxd.", epilog=EXIT_STATUS,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--version", action="version", version=f"ctxctl {__version__}")
    _common_options(cli, defaults=True)
    cli.set_defaults(run=None, group=cli, offline=False)
    commands = cli.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    status = commands.add_parser("status", parents=[common],
                                 help="the daemon, its open sessions and live branches")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=interval, default=1.0, metavar="SECONDS",
                        help=f"seconds between refreshes (default 1, at least "
                             f"{MIN_INTERVAL_S})")
    status.add_argument("--limit", type=number_in(wire.SessionListParams, "limit"), default=50,
                        metavar="N", help="sessions shown (default 50)")
    status.set_defaults(run=cmd_status)
    sessions = commands.add_parser("sessions", parents=[common], help="list sessions")
    sessions.add_argument("--project", metavar="NAME", help="only this project's sessions")
    sessions.add_argument("--state", choices=get_args(wire.SessionStateName))
    sessions.add_argument("--limit", type=number_in(wire.SessionListParams, "limit"),
                          default=100, metavar="N", help="sessions shown (default 100)")
    sessions.set_defaults(run=cmd_sessions)
    _session_commands(commands, common)
    branches = commands.add_parser("branches", parents=[common],
                                   help="the branches of a session (context folding)")
    branches.add_argument("session", metavar="SESSION", type=session_id, help="the session's id")
    branches.add_argument("--status", choices=get_args(wire.BranchStatus),
                          help="only the branches with this status")
    branches.set_defaults(run=cmd_branches)
    _usage_commands(commands, common)
    result = commands.add_parser("result", parents=[common],
                                 help="read an offloaded tool result (result.read)")
    result.add_argument("ref", metavar="REF", type=_matching("ref id", wire.RefId),
                        help='the ref_id its stub names, e.g. res_5f0c1d9e2a7b3c48')
    result.add_argument("--session", type=session_id, metavar="ID", required=True,
                        help="the session the result belongs to")
    result.add_argument("--grep", type=_text_of(wire.ResultReadParams, "pattern", "PATTERN"),
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
    inject = commands.add_parser(
        "inject", parents=[common],
        help="push a text into a session for its agent to pick up (inject.push)")
    inject.add_argument("session", metavar="SESSION", type=session_id, help="the session's id")
    inject.add_argument("text", metavar="TEXT", help="the text, or - to read standard input")
    inject.add_argument("--priority", choices=get_args(wire.InjectPriority), default="normal",
                        help="how soon the agent should take it (default normal)")
    inject.add_argument("--key", metavar="KEY",
                        type=_text_of(wire.InjectPushParams, "idempotency_key", "KEY"),
                        help="an idempotency key: a retried push with it queues nothing new")
    inject.set_defaults(run=cmd_inject)
    events = commands.add_parser("events", parents=[common],
                                 help="follow the daemon's events until Ctrl-C")
    events.add_argument("-f", "--follow", action="store_true",
                        help="follow the stream (what events always does, as tail -f)")
    events.add_argument("--session", type=session_id, metavar="ID",
                        help="only the events of this session")
    events.add_argument("--type", action="append", metavar="TYPE",
                        help="only events of this type, e.g. branch.created (repeat for more)")
    events.add_argument("--since", type=seq_number, metavar="SEQ",
                        help="first the kept events after this seq (0: all of them), from "
                             "the daemon's events table, then the new ones")
    events.set_defaults(run=cmd_events)
    _memory_commands(commands, common)
    call = commands.add_parser("call", parents=[common], help="call any method")
    call.add_argument("method", metavar="METHOD", help="e.g. session.get")
    call.add_argument("params", metavar="PARAMS", nargs="?",
                      help='params as JSON, e.g. \'{"session_id": "s1"}\', or - to read '
                           "them from standard input")
    call.add_argument("--id", metavar="ID",
                      help="the request's id (default: a new UUID), for ctxctl cancel ID")
    call.set_defaults(run=cmd_call)
    cancel = commands.add_parser(
        "cancel", parents=[common],
        help="cancel the requests in flight with this JSON-RPC id (request.cancel)")
    cancel.add_argument("request_id", metavar="REQUEST_ID",
                        help="the id the request was sent with")
    cancel.add_argument("--reason", metavar="R", help="why, as its caller will be told")
    cancel.set_defaults(run=cmd_cancel)
    doctor = commands.add_parser(
        "doctor", parents=[common],
        help="ask the daemon to check its whole database (integrity_check) and check the "
             "agent tools ctxd is installed for; exit 1 on a problem (with no daemon "
             "running: ctxd --check)")
    doctor.set_defaults(run=cmd_doctor)
    hook = commands.add_parser(
        "hook", parents=[common],
        help="answer one Claude Code hook event (JSON on stdin); always exits 0")
    hook.set_defaults(run=cmd_hook, offline=True)
    for action, verb in (("install", "wire"), ("uninstall", "unwire")):
        wire_cmd = commands.add_parser(
            action, parents=[common],
            help=f"{verb} an agent tool to ctxd (its hooks and MCP server, in its settings)")
        wire_cmd.add_argument("target", metavar="TARGET", choices=("claude-code", "opencode"),
                              help="claude-code or opencode")
        wire_cmd.add_argument("--scope", choices=("project", "user"), default="user",
                              help="the project's settings or the user's (default user)")
        wire_cmd.add_argument("--dir", default=".", metavar="DIR",
                              help="the project's root for --scope project (default: the "
                                   "current directory)")
        wire_cmd.set_defaults(run=cmd_install if action == "install" else cmd_uninstall,
                              offline=True)
    stop = commands.add_parser("stop", parents=[common], help="shut the daemon down gracefully")
    stop.add_argument("--wait", type=seconds_to_wait, default=15.0, metavar="SECONDS",
                      help="seconds to wait for the exit (default 15)")
    stop.set_defaults(run=cmd_stop)
    mcp = commands.add_parser(
        "mcp", parents=[common],
        help="speak MCP on stdin/stdout for an MCP client, through the daemon (started "
             "when none runs)")
    mcp.add_argument("--session", metavar="ID",
                     help="the session its tools work on (default: $CLAUDE_CODE_SESSION_ID, "
                          "else a new one)")
    mcp.set_defaults(run=cmd_mcp, offline=True)
    _import.register(commands, common, session_id, _Parser)
    _fork.register(commands, common, session_id, branch_id)
    private = _Parser(add_help=False)
    _common_options(private, defaults=False, socket=False)
    replay = commands.add_parser(
        "replay", parents=[private],
        help="replay a transcript into a private ctxd and report how much context it saves",
        description="Replay a Claude Code or OpenCode transcript turn by turn into a private "
                    "ctxd (its own temporary data) and report its peak context against the "
                    "raw thread's, the key facts kept, and whether every removed byte reads "
                    "back.",
        epilog="examples:\n"
               "  ctxctl replay ~/.claude/projects/-home-me-app/SESSION.jsonl\n"
               "  ctxctl replay EXPORT.json --window 32000 --json\n"
               "  ctxctl replay SESSION.jsonl --plot context.png",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    replay.add_argument("file", metavar="FILE", help="a Claude Code transcript (JSONL, or a "
                                                     "JSON array of its records) or an "
                                                     "OpenCode export")
    replay.add_argument("--window", type=_replay_window, metavar="N",
                        help="the context window in tokens (default: ctxd's, 200,000)")
    replay.add_argument("--from", dest="transcript_format",
                        choices=("claude-code", "opencode"),
                        help="the transcript's format (default: guessed from the file)")
    replay.add_argument("--plot", metavar="PNG",
                        help="write a PNG of the context's tokens per turn, raw against "
                             "ctxd (needs matplotlib: pip install 'ctxd[plot]')")
    replay.set_defaults(run=cmd_replay, offline=True)
    completion = commands.add_parser("completion", parents=[common],
                                     help="print a shell completion script")
    completion.add_argument("shell", metavar="SHELL", choices=("bash", "zsh", "fish"),
                            help="bash, zsh or fish")
    completion.set_defaults(run=cmd_completion, offline=True)
    return cli


def _usage_commands(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    usage = commands.add_parser(
        "usage", parents=[common],
        help="the LLM usage agents reported (usage.record): totals, with cost when "
             "[usage] prices are set")
    usage.add_argument("session", metavar="SESSION", type=session_id, nargs="?",
                       help="the session's id (default: every session that reported usage)")
    usage.add_argument("--by", choices=get_args(wire.UsageGroupBy),
                       help="one row per model, branch or day (UTC)")
    usage.set_defaults(run=cmd_usage)
    tools = commands.add_parser("tools", parents=[common],
                                help="a session's tool calls, their states and the time in "
                                     "each")
    tools.add_argument("session", metavar="SESSION", type=session_id, help="the session's id")
    tools.add_argument("--state", choices=wire.TOOL_CALL_STATES,
                       help="only the tool calls in this state")
    tools.set_defaults(run=cmd_tools)


def _session_commands(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    actions = _group(commands, "session", common,
                     "show, close, delete, render, resume a session or list its messages")
    for name, run, help_text in (
            ("show", cmd_session_show, "a session's state, tokens and budget"),
            ("close", cmd_session_close, "close a session (it can no longer grow)"),
            ("delete", cmd_session_delete, "delete a session and its messages")):
        action = actions.add_parser(name, parents=[common], help=help_text)
        action.add_argument("session", metavar="ID", type=session_id, help="the session's id")
        action.set_defaults(run=run)
    render = actions.add_parser("render", parents=[common],
                                help="the messages to send to the model now (ctxd.render)")
    render.add_argument("session", metavar="ID", type=session_id, help="the session's id")
    render.add_argument("--branch", type=branch_id, metavar="BRANCH",
                        help="render this branch's context (default: the active one)")
    render.set_defaults(run=cmd_session_render)
    resume = actions.add_parser("resume", parents=[common],
                                help="the context to resume a session from (session.resume): "
                                     "its latest snapshot and what came after")
    resume.add_argument("session", metavar="ID", type=session_id, help="the session's id")
    resume.set_defaults(run=cmd_session_resume)
    messages = actions.add_parser("messages", parents=[common],
                                  help="the stored messages of a session, oldest first")
    messages.add_argument("session", metavar="ID", type=session_id, help="the session's id")
    messages.add_argument("--branch", type=branch_id, metavar="BRANCH",
                          help="only this branch's messages")
    messages.add_argument("--limit", type=number_in(wire.MessageListParams, "limit"),
                          metavar="N", help=f"messages per page (default 100, or {PAGE_ALL} "
                                            "with --all)")
    messages.add_argument("--all", action="store_true", help="every page, not just the first")
    messages.set_defaults(run=cmd_session_messages)


def _memory_commands(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    actions = _group(commands, "memory", common,
                     "search, add, list, show, rate, remove and reindex memories")
    scope_help = 'global or project:NAME'
    memory_id = number_in(wire.MemoryIdParams, "id")
    search = actions.add_parser("search", parents=[common], help="find memories")
    search.add_argument("query", metavar="QUERY",
                        type=_text_of(wire.MemorySearchParams, "query", "QUERY"),
                        help="what to look for, in words")
    search.add_argument("--scope", type=scope, metavar="SCOPE",
                        help=f"{scope_help} (a project also sees global ones)")
    search.add_argument("-k", type=number_in(wire.MemorySearchParams, "k"), metavar="N",
                        help="results wanted (default 5, at most 100)")
    search.add_argument("--min-confidence", metavar="X",
                        type=number_in(wire.MemorySearchParams, "min_confidence"),
                        help="hide memories below this confidence (0 to 1, default 0)")
    search.add_argument("--mode", choices=get_args(wire.SearchMode),
                        help="which retrievers to use (default hybrid)")
    search.set_defaults(run=cmd_memory_search)
    add = actions.add_parser("add", parents=[common], help="record a memory")
    add.add_argument("title", metavar="TITLE",
                     type=_text_of(wire.MemoryRecordParams, "title", "TITLE"))
    add.add_argument("content", metavar="CONTENT", help="the text, or - to read standard input")
    add.add_argument("--description", metavar="TEXT", help="when the memory applies",
                     type=_text_of(wire.MemoryRecordParams, "description", "TEXT"))
    add.add_argument("--scope", type=scope, metavar="SCOPE", help=f"{scope_help} "
                                                                  "(default global)")
    add.add_argument("--outcome", choices=get_args(wire.Outcome),
                     help="whether what it records worked (default success)")
    add.add_argument("--tag", action="append", type=tag, help="a tag (repeat for more)")
    add.set_defaults(run=cmd_memory_add)
    listing = actions.add_parser("list", parents=[common], help="list memories, oldest first")
    listing.add_argument("--scope", type=scope, metavar="SCOPE",
                         help=f"{scope_help} (a project also lists global ones)")
    listing.add_argument("--limit", type=number_in(wire.MemoryListParams, "limit"), metavar="N",
                         help=f"memories per page (default {MEMORY_PAGE}, or {PAGE_ALL} with "
                              "--all)")
    listing.add_argument("--all", action="store_true", help="every page, not just the first")
    listing.set_defaults(run=cmd_memory_list)
    show = actions.add_parser("show", parents=[common], help="one memory, whole")
    show.add_argument("id", metavar="ID", type=memory_id)
    show.set_defaults(run=cmd_memory_show)
    rate = actions.add_parser("rate", parents=[common], help="move a memory's confidence")
    rate.add_argument("id", metavar="ID", type=memory_id)
    ratings = rate.add_mutually_exclusive_group(required=True)
    for flag, help_text in (("helpful", "it helped"), ("unhelpful", "it did not help"),
                            ("succeeded", "acting on it succeeded"),
                            ("failed", "acting on it failed")):
        ratings.add_argument(f"--{flag}", dest="rating", action="store_const", const=flag,
                             help=help_text)
    rate.set_defaults(run=cmd_memory_rate)
    remove = actions.add_parser("rm", parents=[common], help="delete a memory")
    remove.add_argument("id", metavar="ID", type=memory_id)
    remove.set_defaults(run=cmd_memory_rm)
    reindex = actions.add_parser("reindex", parents=[common],
                                 help="rebuild the dense index from the stored memories")
    reindex.set_defaults(run=cmd_memory_reindex)


# ---- main ----------------------------------------------------------------------------

def _missing_command(group: argparse.ArgumentParser) -> NoReturn:
    [commands] = [a for a in group._actions if isinstance(a, argparse._SubParsersAction)]
    group.error(f"missing command (choose from {', '.join(commands.choices)})")


def _report_rpc_error(exc: RpcError, out: Output) -> int:
    if out.json:
        _print_json({"error": {"code": exc.code, "message": exc.message, "data": exc.data}})
    print(f"ctxctl: error {exc.code}: {exc.message}", file=sys.stderr)
    data = exc.data if isinstance(exc.data, dict) else {}
    if (exc.code == ErrorCode.METHOD_NOT_FOUND and not data.get("suggestion")
            and data.get("available")):
        print(f"ctxctl: the daemon's methods: {', '.join(data['available'])}", file=sys.stderr)
    elif data.get("fix"):
        print(f"ctxctl: fix: {data['fix']}", file=sys.stderr)
    return 1


def _report_unavailable(exc: DaemonUnavailable, out: Output) -> int:
    return _report_no_answer(str(exc), exc.path, out)


def _report_no_answer(message: str, socket_path: str, out: Output) -> int:
    if out.json:
        _print_json({"error": {"code": None, "message": message, "data": {
            "socket": socket_path}}})
    print(f"ctxctl: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The ``ctxctl`` console script."""
    args = parser().parse_args(argv)
    if args.run is None:
        _missing_command(args.group)
    out = Output(Console(), args.format, args.headers)
    if args.offline:
        code: int = args.run(args, out)
        return code
    try:
        client = Client(args.socket)
    except DaemonUnavailable as exc:
        if args.run is cmd_stop and not isinstance(exc, BadSocketPath):
            return _stop_when_not_running(out, exc.path)
        if args.run is cmd_doctor:
            print("ctxctl: doctor asks the running daemon; with none running, check its "
                  "files with `ctxd --check`", file=sys.stderr)
            if not out.json:
                from ctxclient import _install

                out.lines(_install.doctor_lines(_install.doctor(Path.cwd())[0]))
        return _report_unavailable(exc, out)
    try:
        with client:
            code = args.run(client, args, out)
            return code
    except DaemonUnavailable as exc:
        return _report_unavailable(exc, out)
    except RpcError as exc:
        return _report_rpc_error(exc, out)
    except TimeoutError:
        return _report_no_answer(f"ctxd on {client.path} did not answer in time (the request "
                                 "may still complete)", client.path, out)


if __name__ == "__main__":
    sys.exit(main())

