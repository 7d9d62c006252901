"""ctxctl's session commands: ``sessions``, ``session open|show|close|delete|render|resume|
messages``, ``branches``, ``usage``, ``tools`` and ``inject``, and the listings of
sessions, branches, messages, usage and tool calls (``status`` shows some of them too)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, get_args

from rich.text import Text

from ctxclient._cli_args import (
    CURSOR_HELP,
    PAGE_ALL,
    branch_id,
    cursor,
    group,
    length_problem,
    new_session_id,
    number_in,
    read_stdin,
    session_id,
    text_of,
)
from ctxclient._cli_values import (
    BRANCH_STATUS_STYLE,
    CONTENT_SHOWN,
    branch_budget_bar,
    content_text,
    duration,
    health_cell,
    percent,
    seconds,
    shorten,
    timestamp,
    usage_bar,
)
from ctxclient._errors import RpcError
from ctxclient._output import Column, Fields, Lines, Listing, Note, Output, cell
from ctxclient._sync import Client
from ctxd.errors import ErrorCode
from ctxd.wire import types as wire

if TYPE_CHECKING:
    from ctxclient._cli_args import Commands, Parser


# ---- listings --------------------------------------------------------------------------

SESSION_COLUMNS = (  # at 80 columns: the id, its state, tokens, usage and health
    Column("session", ident=True), Column("project", keep=50, wrap=True, min_width=8),
    Column("title", keep=40, wrap=True), Column("state"), Column("msgs", keep=20, right=True),
    Column("tokens", keep=70, right=True), Column("usage", keep=65),
    Column("health", keep=60))


def sessions_listing(sessions: list[dict[str, Any]], title: str, empty: str = "") -> Listing:
    listing = Listing(SESSION_COLUMNS, title=title, empty=empty)
    for s in sessions:
        listing.rows.append([
            cell(s["session_id"]), cell(s["project"] or ""), cell(s["title"] or ""),
            cell(s["state"]), cell(str(s["message_count"])),
            cell(f"{s['main_thread_tokens']:,}/{s['effective_window']:,}"),
            usage_bar(s["usage"], s["health"]), health_cell(s["health"])])
    return listing


def _branch_budget(branch: dict[str, Any]) -> str:
    return f"{branch['budget_used']:,}/{branch['budget']:,}"


LIVE_BRANCH_COLUMNS = (
    Column("session", ident=True), Column("branch", ident=True),
    Column("depth", keep=20, right=True),
    Column("description", keep=50, wrap=True), Column("budget", keep=40, right=True),
    Column("usage", keep=10), Column("time left", keep=30, right=True))


def live_branches_listing(branches: list[dict[str, Any]],
                          budgets: dict[str, dict[str, Any]]) -> Listing:
    listing = Listing(LIVE_BRANCH_COLUMNS, title="live branches")
    for b in branches:
        listing.rows.append([
            cell(b["session_id"]), cell(b["branch_id"]), cell(str(b["depth"])),
            shorten(b["description"]), cell(_branch_budget(b)),
            branch_budget_bar(b, budgets[b["session_id"]]),
            cell(duration(b["time_left_s"] or 0))])
    return listing


BRANCH_COLUMNS = (
    Column("branch", ident=True), Column("parent", keep=60, ident=True),
    Column("depth", keep=30, right=True),
    Column("status"), Column("budget", keep=40, right=True),
    Column("left/returned", keep=20), Column("folded/saved", keep=10, right=True),
    Column("description", keep=70, wrap=True))


def branches_listing(branches: list[dict[str, Any]], title: str, empty: str) -> Listing:
    listing = Listing(BRANCH_COLUMNS, title=title, empty=empty)
    for b in branches:
        if b["status"] == "active":
            when = f"{duration(b['time_left_s'] or 0)} left"
        else:
            when = timestamp(b["returned_at"]) if b["returned_at"] is not None else ""
        folded = ("" if b["tokens_folded"] is None
                  else f"{b['tokens_folded']:,}/{b['tokens_saved']:,}")
        listing.rows.append([
            cell(b["branch_id"]), cell(b["parent_branch_id"] or "main"), cell(str(b["depth"])),
            cell(Text(b["status"], style=BRANCH_STATUS_STYLE.get(b["status"], ""))),
            cell(_branch_budget(b)), cell(when), cell(folded), shorten(b["description"])])
    return listing


MESSAGE_COLUMNS = (
    Column("seq", right=True), Column("role"), Column("component", keep=20),
    Column("tokens", keep=40, right=True), Column("branch", keep=30),
    Column("content", keep=60, wrap=True, min_width=20))


def messages_listing(messages: list[dict[str, Any]], title: str,
                     empty: str = "no messages") -> Listing:
    listing = Listing(MESSAGE_COLUMNS, title=title, empty=empty)
    for m in messages:
        listing.rows.append([
            cell(str(m["seq"])), cell(m["role"]), cell(m["component"]), cell(f"{m['tokens']:,}"),
            cell(m.get("branch_id") or "main"), shorten(content_text(m["content"]),
                                                        CONTENT_SHOWN)])
    return listing


USAGE_COUNTER_HEADERS = (("input_tokens", "input"), ("output_tokens", "output"),
                         ("cache_read_tokens", "cache read"),
                         ("cache_write_tokens", "cache write"), ("thinking_tokens", "thinking"))
USAGE_SESSIONS = 100
"""Sessions `usage` without a session looks at: the first page of `session.list`, in the
order the sessions were created."""


def _cost(cost: dict[str, Any] | None) -> str:
    return "-" if cost is None else f"{cost['total']:.4f}"


def usage_listing(key: str, rows: list[tuple[str, dict[str, Any], dict[str, Any] | None]],
                  title: str, priced: bool, empty: str = "") -> Listing:
    """One row per (key, totals, cost): its calls and counters, and its cost when any call
    was priced."""
    columns = [Column(key, ident=key == "session"), Column("calls", right=True),
               *(Column(header, keep=40, right=True) for _, header in USAGE_COUNTER_HEADERS)]
    if priced:
        columns.append(Column("cost", right=True))
    listing = Listing(columns, title=title, empty=empty)
    for name, totals, cost in rows:
        listing.rows.append([cell(name), cell(f"{totals['calls']:,}"),
                             *(cell(f"{totals[counter]:,}")
                               for counter, _ in USAGE_COUNTER_HEADERS),
                             *([cell(_cost(cost))] if priced else [])])
    return listing


def tool_calls_listing(calls: list[dict[str, Any]], title: str, empty: str) -> Listing:
    listing = Listing((Column("tool call", ident=True), Column("tool", keep=50),
                       Column("state"),
                       Column("in state", keep=40, right=True),
                       Column("history", keep=30, wrap=True)), title=title, empty=empty)
    for call in calls:
        current = ("-" if call["terminal"]
                   else seconds(call["seconds_in_state"].get(call["state"], 0.0)))
        history = " > ".join(
            entry["state"] + (f" {seconds(entry['seconds'])}" if entry["seconds"] is not None
                              else "")
            for entry in call["history"])
        listing.rows.append([cell(call["tool_call_id"]), cell(call["tool_name"] or ""),
                             cell(call["state"]), cell(current), cell(history)])
    return listing


def conversation(messages: list[dict[str, Any]]) -> Lines:
    """Messages as a reader sees them: ``[role (name)]`` over each content, blank lines
    between (nothing for none)."""
    blocks = []
    for message in messages:
        who = message["role"] + (f" ({message['name']})" if message.get("name") else "")
        blocks.append(f"[{who}]\n{content_text(message['content'])}")
    return Lines(["\n\n".join(blocks)] if blocks else [])


# ---- sessions, session …, branches -----------------------------------------------------

def cmd_sessions(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"limit": args.limit, "cursor": args.cursor}
    if args.project:
        params["project"] = args.project
    if args.state:
        params["state"] = args.state
    result = client.call("session.list", params)
    out.emit(result, sessions_listing(result["sessions"], "sessions",
                                      "no more sessions" if args.cursor else "no sessions"),
             *([Note(f"(more: --limit larger than {args.limit}, or --cursor "
                     f"{result['next_cursor']})")] if result["next_cursor"] else []))
    return 0


def _live_branch_tokens(client: Client, session: dict[str, Any]) -> int:
    """The tokens of a session's live branches' own messages (what ``total_tokens`` adds
    to the main thread's messages); no call when it has none."""
    if not session["live_branches"]:
        return 0
    listed = client.call("branch.list", {"session_id": session["session_id"],
                                         "status": "active"})
    return sum(branch["budget_used"] for branch in listed["branches"])


def cmd_session_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("session.get", {"session_id": args.session})
    s, state = result["session"], result["context_state"]
    budget = s["budget"]
    out.emit(result, Fields([
        ("session", s["session_id"]), ("project", s["project"] or ""),
        ("title", s["title"] or ""), ("state", s["state"]),
        ("messages", f"{s['message_count']:,}"),
        ("tokens", f"{state['main_thread_tokens']:,} in the main thread as sent, "
                   f"{_live_branch_tokens(client, s):,} in live branches, "
                   f"{state['folded_tokens']:,} folded away"),
        ("window", f"{state['effective_window']:,} ({budget['context_window']:,} less "
                   f"{budget['max_output_tokens']:,} for the reply)"),
        ("usage", f"{percent(state['usage'])} ({state['health']})"),
        ("thresholds", f"warn {percent(budget['warn'])}, caution "
                       f"{percent(budget['caution'])}, compact "
                       f"{percent(budget['compact_trigger'])}, hard block "
                       f"{percent(budget['hard_block'])}"),
        ("branch", " > ".join(state["branch_path"]) or "main"),
        ("live branches", str(s["live_branches"])),
        ("created", timestamp(s["created_at"])), ("updated", timestamp(s["updated_at"])),
        ("closed", timestamp(s["closed_at"]) if s["closed_at"] is not None else "")]))
    return 0


def cmd_session_open(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"session_id": args.session}
    if args.project is not None:
        params["project"] = args.project
    if args.title is not None:
        params["title"] = args.title
    result = client.call("session.open", params)
    count = result["session"]["message_count"]
    out.emit(result, Lines([f"session {args.session} opened" if result["created"] else
                            f"session {args.session} is open ({count} message"
                            f"{'' if count == 1 else 's'})"]))
    return 0


def cmd_session_close(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("session.close", {"session_id": args.session})
    out.emit(result, Lines([f"session {args.session} closed"]))
    return 0


def cmd_session_delete(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("session.delete", {"session_id": args.session})
    count = result["messages_deleted"]
    out.emit(result, Lines([f"session {args.session} deleted "
                            f"({count} message{'' if count == 1 else 's'})"]))
    return 0


def cmd_session_render(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"session_id": args.session}
    if args.branch is not None:
        params["branch_id"] = args.branch
    result = client.call("ctxd.render", params)
    state = result["context_state"]
    out.emit(result, conversation(result["messages"]), Note(
        f"({len(result['messages'])} messages, {result['tokens']:,} tokens of "
        f"{state['effective_window']:,}: {percent(state['usage'])}, {state['health']})"))
    return 0


def cmd_session_messages(client: Client, args: argparse.Namespace, out: Output) -> int:
    limit = args.limit if args.limit is not None else PAGE_ALL if args.all else 100
    params: dict[str, Any] = {"session_id": args.session, "limit": limit}
    if args.branch is not None:
        params["branch_id"] = args.branch
    result = client.call("message.list", {**params, "cursor": args.cursor})
    messages = list(result["messages"])
    while args.all and result["next_cursor"] is not None:
        result = client.call("message.list", {**params, "cursor": result["next_cursor"]})
        messages += result["messages"]
    out.emit({"messages": messages, "next_cursor": result["next_cursor"],
              "context_state": result["context_state"]},
             messages_listing(messages, f"messages of session {args.session}",
                              "no more messages" if args.cursor else "no messages"),
             *([Note(f"(more: --all, --limit larger than {limit}, or --cursor "
                     f"{result['next_cursor']})")] if result["next_cursor"] is not None else []))
    return 0


def cmd_session_resume(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("session.resume", {"session_id": args.session})
    source = (f"from the snapshot of {timestamp(result['compacted_at'])}"
              if result["source"] == "snapshot" else "the thread: never compacted")
    out.emit(result, conversation(result["messages"]), Note(
        f"({len(result['messages'])} messages, {result['tokens']:,} tokens, {source})"))
    return 0


def cmd_branches(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"session_id": args.session}
    if args.status:
        params["status"] = args.status
    result = client.call("branch.list", params)
    what = f"{args.status} branches" if args.status else "branches"
    out.emit(result, branches_listing(
        result["branches"], f"{what} of session {args.session}  ({result['total']} in all: "
                            f"{result['active']} active, {result['folded']} folded)",
        f"no {what} in session {args.session}"))
    return 0


# ---- usage, tool calls -----------------------------------------------------------------

def _calibration_note(calibration: dict[str, Any] | None) -> str | None:
    """The latest call's reported input beside ctxd's count of its thread; nothing when
    either is 0 (a call recorded before ctxd held any of the thread: an import's, or a
    harness's before its first message)."""
    if (calibration is None or not calibration["input_tokens"]
            or not calibration["local_input_tokens"]):
        return None
    return (f"latest call: {calibration['input_tokens']:,} input tokens reported, ctxd "
            f"counted {calibration['local_input_tokens']:,} (ratio "
            f"{calibration['ratio']:.4f})")


def cmd_usage(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.session is None:
        if args.by == "branch":
            print("ctxctl usage: --by branch groups one session's calls (a branch is a "
                  "session's): name it (`ctxctl usage SESSION --by branch`; `ctxctl "
                  "sessions` lists them)", file=sys.stderr)
            return 2
        return _usage_of_sessions(client, out, args.by)
    params: dict[str, Any] = {"session_id": args.session}
    if args.by:
        params["group_by"] = args.by
    result = client.call("usage.get", params)
    rows = [(g["key"] or ("main thread" if args.by == "branch" else "-"), g["totals"],
             g["cost"]) for g in result["groups"] or ()]
    rows.append(("total", result["totals"], result["cost"]))
    notes = []
    if result["cost"] is not None and result["cost"]["unpriced_calls"]:
        unpriced = result["cost"]["unpriced_calls"]
        notes.append(Note(f"{unpriced} {'call has' if unpriced == 1 else 'calls have'} no "
                          "price (not in [usage] prices)"))
    calibration = _calibration_note(result["calibration"])
    if calibration:
        notes.append(Note(calibration))
    out.emit(result, usage_listing(args.by or "scope", rows, f"usage of session {args.session}"
                                   + (f" by {args.by}" if args.by else ""),
                                   result["cost"] is not None), *notes)
    return 0


def _usage_of_sessions(client: Client, out: Output, by: str | None) -> int:
    """One row per session that reported usage; with ``by`` (model, day), one row per
    model or day, the sessions' groups added up (of the first `USAGE_SESSIONS` sessions:
    a note says when there are more)."""
    listed = client.call("session.list", {"limit": USAGE_SESSIONS})
    sessions = listed["sessions"]
    notes = [Note(f"(the first {USAGE_SESSIONS} sessions only: `ctxctl usage SESSION` for "
                  "another)")] if listed["next_cursor"] is not None else []
    found = {}
    for session in sessions:
        try:
            found[session["session_id"]] = client.call(
                "usage.get", {"session_id": session["session_id"],
                              **({"group_by": by} if by else {})})
        except RpcError as exc:
            if exc.code != ErrorCode.NOT_FOUND:  # deleted meanwhile
                raise
    used = {sid: got for sid, got in found.items() if got["totals"]["calls"]}
    priced = any(got["cost"] is not None for got in used.values())
    if by is None:
        out.emit({"sessions": [used[sid] for sid in used]},
                 usage_listing("session", [(sid, got["totals"], got["cost"])
                                           for sid, got in used.items()],
                               "usage by session", priced, "no session has reported usage"),
                 *notes)
        return 0
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for got in used.values():
        for grouped in got["groups"] or ():
            groups.setdefault(grouped["key"], []).append(grouped)
    added: list[dict[str, Any]] = [
        {"key": key, "totals": _added([g["totals"] for g in listed]),
         "cost": _added([g["cost"] for g in listed if g["cost"] is not None]) or None}
        for key, listed in sorted(groups.items(), key=lambda item: (
            item[0] is None, item[0] or ""))]
    totals = _added([got["totals"] for got in used.values()]) or dict.fromkeys(
        ["calls", *(counter for counter, _ in USAGE_COUNTER_HEADERS)], 0)
    cost = _added([got["cost"] for got in used.values() if got["cost"]]) or None
    if cost is not None and cost["unpriced_calls"]:
        unpriced = cost["unpriced_calls"]
        notes.append(Note(f"{unpriced} {'call has' if unpriced == 1 else 'calls have'} no "
                          "price (not in [usage] prices)"))
    rows: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
        (group["key"] or "-", group["totals"], group["cost"]) for group in added]
    out.emit({"groups": added, "totals": totals, "cost": cost},
             usage_listing(by, [*rows, *([("total", totals, cost)] if rows else [])],
                           f"usage by {by}", priced, "no session has reported usage"),
             *notes)
    return 0


def _added(counts: list[dict[str, Any]]) -> dict[str, Any]:
    """The sum of each field of ``counts`` (usage totals, or costs), key by key (none:
    an empty dict)."""
    return {key: sum(count[key] for count in counts) for key in counts[0]} if counts else {}


def cmd_tools(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"session_id": args.session}
    if args.state:
        params["state"] = args.state
    result = client.call("tool.list", params)
    what = f"{args.state} tool calls" if args.state else "tool calls"
    out.emit(result, tool_calls_listing(result["tool_calls"], f"{what} of session "
                                                              f"{args.session}",
                                        f"no {what} in session {args.session}"))
    return 0


# ---- inject ----------------------------------------------------------------------------

def cmd_inject(client: Client, args: argparse.Namespace, out: Output) -> int:
    content = read_stdin() if args.text == "-" else args.text
    if content is None:
        return 2
    problem = length_problem(wire.InjectPushParams, "content", content)
    if problem:
        print(f"ctxctl: {'standard input' if args.text == '-' else 'TEXT'} {problem}",
              file=sys.stderr)
        return 2
    params: dict[str, Any] = {"session_id": args.session, "content": content,
                              "priority": args.priority, "source": "ctxctl"}
    if args.key is not None:
        params["idempotency_key"] = args.key
    result = client.call("inject.push", params)
    scrubbed = result["secrets_scrubbed"]
    out.emit(result, Lines([
        f"injection {result['injection_id']} "
        + ("was already queued" if result["duplicate"] else "queued")
        + f" for {args.session} ({result['priority']}, {result['tokens']:,} tokens)"
        + (f"; {scrubbed} secret{'s' if scrubbed > 1 else ''} scrubbed" if scrubbed else "")]))
    return 0


# ---- the command line ------------------------------------------------------------------

def add_sessions(commands: Commands, common: Parser) -> None:
    """``sessions``, ``session …`` and ``branches``."""
    sessions = commands.add_parser("sessions", parents=[common], help="list sessions")
    sessions.add_argument("--project", metavar="NAME", help="only this project's sessions")
    sessions.add_argument("--state", choices=get_args(wire.SessionStateName))
    sessions.add_argument("--cursor", type=cursor, metavar="CURSOR", help=CURSOR_HELP)
    sessions.add_argument("--limit", type=number_in(wire.SessionListParams, "limit"),
                          default=100, metavar="N", help="sessions shown (default 100)")
    sessions.set_defaults(run=cmd_sessions)
    actions = group(commands, "session", common,
                    "open, show, close, delete, render, resume a session or list its "
                    "messages")
    opening = actions.add_parser(
        "open", parents=[common],
        help="open a session: a new one, or an existing one again (session.open)")
    opening.add_argument("session", metavar="ID", type=new_session_id,
                         help="the session's id")
    opening.add_argument("--project", metavar="NAME",
                         type=text_of(wire.SessionOpenParams, "project", "NAME"),
                         help="the project it belongs to (its memories are found by it)")
    opening.add_argument("--title", metavar="TEXT",
                         type=text_of(wire.SessionOpenParams, "title", "TEXT"),
                         help="a title to show in listings")
    opening.set_defaults(run=cmd_session_open)
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
    messages.add_argument("--cursor", type=cursor, metavar="CURSOR", help=CURSOR_HELP)
    messages.set_defaults(run=cmd_session_messages)
    branches = commands.add_parser("branches", parents=[common],
                                   help="the branches of a session (context folding)")
    branches.add_argument("session", metavar="SESSION", type=session_id, help="the session's id")
    branches.add_argument("--status", choices=get_args(wire.BranchStatus), metavar="STATUS",
                          help="only the branches with this status: "
                               f"{', '.join(get_args(wire.BranchStatus))}")
    branches.set_defaults(run=cmd_branches)


def add_usage(commands: Commands, common: Parser) -> None:
    """``usage`` and ``tools``."""
    usage = commands.add_parser(
        "usage", parents=[common],
        help="the model calls' usage (the gateway's, and what agents reported with "
             "usage.record): totals, with cost when [usage] prices are set")
    usage.add_argument("session", metavar="SESSION", type=session_id, nargs="?",
                       help="the session's id (default: every session that reported usage)")
    usage.add_argument("--by", choices=get_args(wire.UsageGroupBy),
                       help="one row per model, branch or day (UTC); by branch needs a "
                            "SESSION")
    usage.set_defaults(run=cmd_usage)
    tools = commands.add_parser("tools", parents=[common],
                                help="a session's tool calls, their states and the time in "
                                     "each")
    tools.add_argument("session", metavar="SESSION", type=session_id, help="the session's id")
    tools.add_argument("--state", choices=wire.TOOL_CALL_STATES, metavar="STATE",
                       help="only the tool calls in this state: "
                            f"{', '.join(wire.TOOL_CALL_STATES)}")
    tools.set_defaults(run=cmd_tools)


def add_inject(commands: Commands, common: Parser) -> None:
    """``inject``."""
    inject = commands.add_parser(
        "inject", parents=[common],
        help="push a text into a session for its agent to pick up (inject.push)")
    inject.add_argument("session", metavar="SESSION", type=session_id, help="the session's id")
    inject.add_argument("text", metavar="TEXT", help="the text, or - to read standard input")
    inject.add_argument("--priority", choices=get_args(wire.InjectPriority), default="normal",
                        help="how soon the agent should take it (default normal)")
    inject.add_argument("--key", metavar="KEY",
                        type=text_of(wire.InjectPushParams, "idempotency_key", "KEY"),
                        help="an idempotency key: a retried push with it queues nothing new")
    inject.set_defaults(run=cmd_inject)
