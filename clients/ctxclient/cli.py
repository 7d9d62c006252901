"""ctxctl: look at and drive a running ctxd (status, sessions, branches, memory, raw calls,
stop).

Exit codes: 0 success, 1 the daemon answered with an error, 2 no daemon (or bad usage).
Every command takes ``--json`` for machine-readable output; ``NO_COLOR`` is honoured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, get_args

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ctxclient._errors import DaemonUnavailable, RpcError
from ctxclient._sync import Client
from ctxd.errors import ErrorCode
from ctxd.wire.types import BranchStatus, Outcome, SearchMode

HEALTH_STYLE = {"ok": "green", "warn": "yellow", "caution": "dark_orange",
                "compact": "red", "blocked": "bold red"}
BRANCH_STATUS_STYLE = {"active": "green", "completed": "", "budget_exhausted": "dark_orange",
                       "timeout": "dark_orange", "failed": "red", "discarded": "dim"}
BRANCH_BUDGET_WARNING = 0.8
"""Share of its budget at which the daemon warns about a branch (DESIGN §7)."""
DESCRIPTION_SHOWN = 40
"""Characters of a branch description that fit in a table cell."""
CONTENT_SHOWN = 60
"""Characters of a memory's content that fit in a table cell."""
MEMORY_PAGE = 50
"""Memories `memory list` shows by default."""
MEMORY_PAGE_ALL = 1000
"""Memories per memory.list call for `memory list --all` (the largest page it gives)."""


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


def usage_bar(usage: float, health: str, width: int = 12) -> Text:
    """A bar of ``width`` cells filled to ``usage`` (0..1), coloured by health."""
    filled = min(width, round(usage * width))
    bar = Text("█" * filled, style=HEALTH_STYLE.get(health, ""))
    bar.append("░" * (width - filled), style="dim")
    bar.append(f" {usage * 100:5.1f}%")
    return bar


def sessions_table(sessions: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for column in ("session", "project", "title", "state", "msgs", "tokens"):
        table.add_column(column, justify="right" if column in ("msgs", "tokens") else "left",
                         no_wrap=column in ("session", "tokens"))
    table.add_column("usage", no_wrap=True)
    table.add_column("health", no_wrap=True)
    for s in sessions:
        window = s["budget"]["context_window"] - s["budget"]["max_output_tokens"]
        table.add_row(
            s["session_id"], Text(s["project"] or ""), Text((s["title"] or "")[:40]), s["state"],
            str(s["message_count"]), f"{s['main_thread_tokens']:,}/{window:,}",
            usage_bar(s["usage"], s["health"]),
            Text(s["health"], style=HEALTH_STYLE.get(s["health"], "")))
    return table


def _shorten(text: str, width: int = DESCRIPTION_SHOWN) -> Text:
    """One line of at most ``width`` characters, as plain text (brackets are not markup)."""
    text = " ".join(text.split())
    return Text(text if len(text) <= width else text[:width - 1] + "…")


def _timestamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _branch_budget(branch: dict[str, Any]) -> str:
    return f"{branch['budget_used']:,}/{branch['budget']:,}"


def branch_budget_bar(branch: dict[str, Any]) -> Text:
    """The usage bar of a branch's budget: caution from the budget warning on, blocked once
    it is spent."""
    usage = branch["budget_used"] / branch["budget"]
    health = ("blocked" if usage >= 1.0 else "caution" if usage >= BRANCH_BUDGET_WARNING
              else "ok")
    return usage_bar(usage, health)


def live_branches_table(branches: list[dict[str, Any]]) -> Table:
    table = Table(title="live branches", title_justify="left", expand=False)
    for column in ("session", "branch", "depth", "description", "budget"):
        table.add_column(column, justify="right" if column in ("depth", "budget") else "left",
                         no_wrap=column != "description")
    table.add_column("usage", no_wrap=True)
    table.add_column("time left", justify="right", no_wrap=True)
    for b in branches:
        table.add_row(
            b["session_id"], b["branch_id"], str(b["depth"]), _shorten(b["description"]),
            _branch_budget(b), branch_budget_bar(b), _duration(b["time_left_s"] or 0))
    return table


def branches_table(branches: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for column in ("branch", "parent", "depth", "status", "budget", "left / returned",
                   "folded/saved", "description"):
        table.add_column(column, justify="right" if column in (
            "depth", "budget", "folded/saved") else "left", no_wrap=column != "description")
    for b in branches:
        if b["status"] == "active":
            when = f"{_duration(b['time_left_s'] or 0)} left"
        else:
            when = _timestamp(b["returned_at"]) if b["returned_at"] is not None else ""
        folded = ("" if b["tokens_folded"] is None
                  else f"{b['tokens_folded']:,}/{b['tokens_saved']:,}")
        table.add_row(
            b["branch_id"], b["parent_branch_id"] or "main", str(b["depth"]),
            Text(b["status"], style=BRANCH_STATUS_STYLE.get(b["status"], "")),
            _branch_budget(b), when, folded, _shorten(b["description"]))
    return table


def _confidence(confidence: float) -> str:
    return f"{confidence:.3f}"


def memory_hits_table(result: dict[str, Any]) -> Table:
    """The results of memory.search, best first."""
    table = Table(title=f"{len(result['results'])} found by {result['mode']} search (legs: "
                        f"{', '.join(result['legs_used']) or 'none'})",
                  title_justify="left", expand=False)
    for column in ("id", "score", "confidence", "legs", "scope", "title", "content"):
        table.add_column(column, justify="right" if column in (
            "id", "score", "confidence") else "left",
            no_wrap=column not in ("scope", "title", "content"))
    for hit in result["results"]:
        table.add_row(str(hit["id"]), f"{hit['score']:.4f}", _confidence(hit["confidence"]),
                      "+".join(hit["legs"]), Text(hit["scope"]), _shorten(hit["title"]),
                      _shorten(hit["content"], CONTENT_SHOWN))
    return table


def memories_table(memories: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for column in ("id", "scope", "confidence", "outcome", "uses", "tags", "title", "content"):
        table.add_column(column, justify="right" if column in (
            "id", "confidence", "uses") else "left",
            no_wrap=column not in ("scope", "tags", "title", "content"))
    for m in memories:
        table.add_row(str(m["id"]), Text(m["scope"]), _confidence(m["confidence"]),
                      m["outcome"], str(m["usage_count"]), Text(" ".join(m["tags"])),
                      _shorten(m["title"]), _shorten(m["content"], CONTENT_SHOWN))
    return table


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
        page = client.call("session.list", {"state": "open", "limit": 1000, "cursor": cursor})
        sessions += page["sessions"]
        cursor = page["next_cursor"]
    return sessions


def live_branches(client: Client, status: dict[str, Any],
                  first_page: dict[str, Any]) -> list[dict[str, Any]]:
    """The active branches of every open session, session by session, oldest first.

    One pipelined branch.list per session that session.list counts live branches in. The
    daemon's count, session.list and branch.list are read at different moments, so a
    branch created or returned in between may show in one and not in another: the view
    is a snapshot of those moments, and the next refresh catches up.

    Raises:
        RpcError: the daemon answered a branch.list with an error other than -32004 (a
            session deleted since it was listed is skipped).
    """
    if status["live_branches"] == 0:
        return []
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
    return branches


def _status_snapshot(client: Client, limit: int) -> dict[str, Any]:
    status = client.call("daemon.status")
    sessions = client.call("session.list", {"state": "open", "limit": limit})
    return {"daemon": status, "sessions": sessions["sessions"],
            "more_sessions": sessions["next_cursor"] is not None,
            "live_branches": live_branches(client, status, sessions)}


def _status_view(snapshot: dict[str, Any]) -> Group:
    title = "open sessions" + (" (first page)" if snapshot["more_sessions"] else "")
    branches = snapshot["live_branches"]
    return Group(daemon_line(snapshot["daemon"]), sessions_table(snapshot["sessions"], title),
                 live_branches_table(branches) if branches else Text("no live branches"))


def cmd_status(client: Client, args: argparse.Namespace, console: Console) -> int:
    if args.json:
        _print_json(_status_snapshot(client, args.limit))
        return 0
    if not args.watch:
        console.print(_status_view(_status_snapshot(client, args.limit)))
        return 0
    with Live(_status_view(_status_snapshot(client, args.limit)), console=console,
              refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(args.interval)
                live.update(_status_view(_status_snapshot(client, args.limit)))
        except KeyboardInterrupt:
            pass
    return 0


def cmd_sessions(client: Client, args: argparse.Namespace, console: Console) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.project:
        params["project"] = args.project
    if args.state:
        params["state"] = args.state
    result = client.call("session.list", params)
    if args.json:
        _print_json(result)
    else:
        console.print(sessions_table(result["sessions"], "sessions"))
        if result["next_cursor"]:
            console.print(f"(more: --limit larger than {args.limit})", style="dim")
    return 0


def cmd_branches(client: Client, args: argparse.Namespace, console: Console) -> int:
    params: dict[str, Any] = {"session_id": args.session}
    if args.status:
        params["status"] = args.status
    result = client.call("branch.list", params)
    if args.json:
        _print_json(result)
        return 0
    what = f"{args.status} branches" if args.status else "branches"
    if not result["branches"]:
        console.print(f"no {what} in session {args.session}")
        return 0
    console.print(branches_table(
        result["branches"], f"{what} of session {args.session}  ({result['total']} in all: "
                            f"{result['active']} active, {result['folded']} folded)"))
    return 0


def cmd_memory_search(client: Client, args: argparse.Namespace, console: Console) -> int:
    params: dict[str, Any] = {"query": args.query}
    for name in ("scope", "k", "min_confidence", "mode"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    result = client.call("memory.search", params)
    if args.json:
        _print_json(result)
        return 0
    if result["results"]:
        console.print(memory_hits_table(result))
    else:
        console.print(f"no memories found by {result['mode']} search")
    if result["note"]:
        console.print(Text(f"note: {result['note']}", style="yellow"))
    return 0


def _read_stdin() -> str | None:
    """Standard input as UTF-8 text, or None (and a message) when it is not."""
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"ctxctl: standard input is not UTF-8 text: {exc}", file=sys.stderr)
        return None


def cmd_memory_add(client: Client, args: argparse.Namespace, console: Console) -> int:
    content = _read_stdin() if args.content == "-" else args.content
    if content is None:
        return 2
    params: dict[str, Any] = {"title": args.title, "content": content}
    for name in ("description", "scope", "outcome"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    if args.tag:
        params["tags"] = args.tag
    result = client.call("memory.record", params)
    if args.json:
        _print_json(result)
        return 0
    memory = result["memory"]
    line = Text(f"memory {memory['id']} recorded in ")
    line.append(memory["scope"])
    scrubbed = result["secrets_scrubbed"]
    if scrubbed:
        line.append(f"; {scrubbed} secret{'s' if scrubbed > 1 else ''} scrubbed")
    console.print(line)
    if not result["indexed"]:
        console.print("not in the dense index yet (it is not ready); lexical search finds it",
                      style="dim")
    return 0


def cmd_memory_list(client: Client, args: argparse.Namespace, console: Console) -> int:
    limit = args.limit if args.limit is not None else (
        MEMORY_PAGE_ALL if args.all else MEMORY_PAGE)
    params: dict[str, Any] = {"limit": limit}
    if args.scope is not None:
        params["scope"] = args.scope
    result = client.call("memory.list", params)
    memories = list(result["memories"])
    while args.all and result["next_cursor"] is not None:
        result = client.call("memory.list", {**params, "cursor": result["next_cursor"]})
        memories += result["memories"]
    if args.json:
        _print_json({"memories": memories, "next_cursor": result["next_cursor"]})
        return 0
    if not memories:
        console.print("no memories")
        return 0
    console.print(memories_table(memories, "memories"))
    if result["next_cursor"] is not None:
        console.print(f"(more: --all, or --limit larger than {limit})", style="dim")
    return 0


RATINGS = {"helpful": ("memory.feedback", "helpful", True),
           "unhelpful": ("memory.feedback", "helpful", False),
           "succeeded": ("memory.outcome", "succeeded", True),
           "failed": ("memory.outcome", "succeeded", False)}
"""A rating flag's method and params."""


def cmd_memory_rate(client: Client, args: argparse.Namespace, console: Console) -> int:
    method, field, value = RATINGS[args.rating]
    result = client.call(method, {"id": args.id, field: value})
    if args.json:
        _print_json(result)
    else:
        console.print(f"memory {args.id}: confidence "
                      f"{_confidence(result['memory']['confidence'])}")
    return 0


def cmd_memory_rm(client: Client, args: argparse.Namespace, console: Console) -> int:
    result = client.call("memory.delete", {"id": args.id})
    if args.json:
        _print_json(result)
    else:
        console.print(f"memory {args.id} deleted")
    return 0


def cmd_call(client: Client, args: argparse.Namespace, console: Console) -> int:
    try:
        params = json.loads(args.params) if args.params else None
    except json.JSONDecodeError as exc:
        print(f"ctxctl: PARAMS is not valid JSON: {exc}", file=sys.stderr)
        return 2
    _print_json(client.call(args.method, params))
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


def cmd_stop(client: Client, args: argparse.Namespace, console: Console) -> int:
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
    if args.json:
        _print_json({"stopped": True, "pid": pid})
    else:
        console.print(f"ctxd (pid {pid}) stopped")
    return 0


def _print_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")


def _common_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    # Accepted before and after the command; a subcommand's default must not clobber a
    # value given before it, hence SUPPRESS there.
    suppress = {} if defaults else {"default": argparse.SUPPRESS}
    parser.add_argument("--socket", help="the daemon's socket (default: $CTXD_SOCKET or ctxd's)",
                        **suppress)  # type: ignore[arg-type]
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables",
                        **suppress)  # type: ignore[arg-type]


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _common_options(common, defaults=False)
    cli = argparse.ArgumentParser(prog="ctxctl", description="Look at and drive ctxd.")
    _common_options(cli, defaults=True)
    commands = cli.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", parents=[common],
                                 help="the daemon, its open sessions and live branches")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    status.add_argument("--limit", type=int, default=50, help="sessions shown")
    status.set_defaults(run=cmd_status)
    sessions = commands.add_parser("sessions", parents=[common], help="list sessions")
    sessions.add_argument("--project")
    sessions.add_argument("--state", choices=["open", "closed"])
    sessions.add_argument("--limit", type=int, default=100)
    sessions.set_defaults(run=cmd_sessions)
    branches = commands.add_parser("branches", parents=[common],
                                   help="the branches of a session (context folding)")
    branches.add_argument("session", metavar="SESSION", help="the session's id")
    branches.add_argument("--status", choices=get_args(BranchStatus),
                          help="only the branches with this status")
    branches.set_defaults(run=cmd_branches)
    _memory_commands(commands, common)
    call = commands.add_parser("call", parents=[common], help="call any method")
    call.add_argument("method", help="e.g. session.get")
    call.add_argument("params", nargs="?", help='params as JSON, e.g. \'{"session_id": "s1"}\'')
    call.set_defaults(run=cmd_call)
    stop = commands.add_parser("stop", parents=[common], help="shut the daemon down gracefully")
    stop.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the exit")
    stop.set_defaults(run=cmd_stop)
    return cli


def _memory_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                     common: argparse.ArgumentParser) -> None:
    memory = commands.add_parser("memory", parents=[common],
                                 help="search, add, list, rate and remove memories")
    actions = memory.add_subparsers(dest="action", required=True)
    search = actions.add_parser("search", parents=[common], help="find memories")
    search.add_argument("query", metavar="QUERY", help="what to look for, in words")
    search.add_argument("--scope", help='"global" or "project:NAME" (also sees global ones)')
    search.add_argument("-k", type=int, help="results wanted (default 5)")
    search.add_argument("--min-confidence", type=float,
                        help="hide memories below this confidence (0..1, default 0)")
    search.add_argument("--mode", choices=get_args(SearchMode),
                        help="which retrievers to use (default hybrid)")
    search.set_defaults(run=cmd_memory_search)
    add = actions.add_parser("add", parents=[common], help="record a memory")
    add.add_argument("title", metavar="TITLE")
    add.add_argument("content", metavar="CONTENT", help="the text, or - to read standard input")
    add.add_argument("--description", help="when the memory applies")
    add.add_argument("--scope", help='"global" (default) or "project:NAME"')
    add.add_argument("--outcome", choices=get_args(Outcome),
                     help="whether what it records worked (default success)")
    add.add_argument("--tag", action="append", help="a tag (repeat for more)")
    add.set_defaults(run=cmd_memory_add)
    listing = actions.add_parser("list", parents=[common], help="list memories, oldest first")
    listing.add_argument("--scope", help='"global" or "project:NAME" (also lists global ones)')
    listing.add_argument("--limit", type=int, help=f"memories per page (default "
                         f"{MEMORY_PAGE}, or {MEMORY_PAGE_ALL} with --all)")
    listing.add_argument("--all", action="store_true", help="every page, not just the first")
    listing.set_defaults(run=cmd_memory_list)
    rate = actions.add_parser("rate", parents=[common], help="move a memory's confidence")
    rate.add_argument("id", metavar="ID", type=int)
    ratings = rate.add_mutually_exclusive_group(required=True)
    for flag, help_text in (("helpful", "it helped"), ("unhelpful", "it did not help"),
                            ("succeeded", "acting on it succeeded"),
                            ("failed", "acting on it failed")):
        ratings.add_argument(f"--{flag}", dest="rating", action="store_const", const=flag,
                             help=help_text)
    rate.set_defaults(run=cmd_memory_rate)
    remove = actions.add_parser("rm", parents=[common], help="delete a memory")
    remove.add_argument("id", metavar="ID", type=int)
    remove.set_defaults(run=cmd_memory_rm)


def main(argv: list[str] | None = None) -> int:
    """The ``ctxctl`` console script."""
    args = parser().parse_args(argv)
    console = Console()
    try:
        with Client(args.socket) as client:
            code: int = args.run(client, args, console)
            return code
    except DaemonUnavailable as exc:
        if args.json:
            _print_json({"error": {"code": None, "message": str(exc), "data": {
                "socket": exc.path}}})
        print(f"ctxctl: {exc}", file=sys.stderr)
        return 2
    except RpcError as exc:
        if args.json:
            _print_json({"error": {"code": exc.code, "message": exc.message, "data": exc.data}})
        print(f"ctxctl: error {exc.code}: {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
