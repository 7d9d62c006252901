"""ctxctl's daemon commands: ``status`` (with ``--watch``), ``events``, ``call``,
``cancel``, ``doctor`` and ``stop``."""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.text import Text

from ctxclient._cli_args import (
    MIN_INTERVAL_S,
    PAGE_ALL,
    group,
    interval,
    number_in,
    read_stdin,
    seconds_to_wait,
    seq_number,
    session_id,
)
from ctxclient._cli_sessions import live_branches_listing, sessions_listing, usage_listing
from ctxclient._cli_values import compact_json, duration, size
from ctxclient._errors import BadSocketPath, DaemonUnavailable, RpcError
from ctxclient._output import (
    IDS_SHORTENED,
    Column,
    Lines,
    Listing,
    Output,
    Stderr,
    cell,
    ids_shortened,
    table,
)
from ctxclient._sync import Client
from ctxd.errors import ErrorCode
from ctxd.wire import types as wire

if TYPE_CHECKING:
    from ctxclient._cli_args import Commands, Parser


# ---- status ----------------------------------------------------------------------------

def daemon_line(status: dict[str, Any], width: int | None = None) -> Text:
    """The daemon's line; on a terminal ``width`` cells wide, broken between one figure
    and the next, never between a figure's label and its value."""
    figures = [f"pid {status['pid']}", f"up {duration(status['uptime_s'])}",
               f"sessions {status['sessions_open']} open / {status['sessions_total']}",
               f"actors {status['session_actors']}", f"conns {status['connections']}",
               f"db {size(status['db_size_bytes'])}", f"rss {size(status['rss_bytes'])}",
               f"{status['requests_per_s']:.1f} req/s",
               f"p50 {status['latency_p50_ms']:.2f} ms",
               f"p99 {status['latency_p99_ms']:.2f} ms"]
    line = Text.assemble(("ctxd ", "bold"), (status["version"], "bold cyan"))
    used = len(line)
    for figure in figures:
        if width is not None and used + 2 + len(figure) > width:
            line.append("\n")
            used = 0
        else:
            line.append("  ")
            used += 2
        line.append(figure)
        used += len(figure)
    line.append("\n")
    line.append(f"socket {status['socket']}  data {status['data_dir']}", "dim")
    return line


GATEWAY_COLUMNS = (Column("session", ident=True), Column("model", keep=20),
                   Column("sent", right=True),
                   Column("removed", keep=60, right=True), Column("input", keep=50, right=True),
                   Column("cache read", keep=45, right=True),
                   Column("cache write", keep=30, right=True), Column("cost", keep=55, right=True))
"""At 80 columns a session id of 36 leaves room for the tokens sent and removed, the
provider's input and the cost; plain output and wider terminals show the rest."""


def memory_line(index: dict[str, Any]) -> str:
    """The memories and whether search sees them all yet, else what it waits for
    (daemon.status's ``memory_index``)."""
    waiting = [*(["lexical loading"] if index["lexical"] != "ready" else []),
               *([f"dense {index['state']}"] if index["state"] != "ready" else
                 [f"dense {index['vectors']:,} indexed"]
                 if index["vectors"] != index["memories"] else [])]
    state = "search ready" if index.get("whole") else ", ".join(waiting)
    return f"memories {index['memories']:,} ({index['embedder']}): {state}"


def gateway_line(status: dict[str, Any]) -> str:
    """The gateway's address and counters (daemon.status's ``gateway``), or that it is
    disabled, or off and why (``gateway_off``)."""
    gateway = status.get("gateway")
    if gateway is None:
        off = status.get("gateway_off")
        return "gateway: disabled" if off is None else f"gateway: off: {off}"
    return (f"gateway {gateway['listen']}  calls {gateway['calls']:,}  "
            f"rewrite failures {gateway['rewrite_failures']:,}")


def team_line(team: dict[str, Any] | None) -> str | None:
    """The team link (daemon.status's ``team``), or None without ``[memory.team]``."""
    if team is None:
        return None
    if not team["connected"]:
        return (f"team {team['name']}: not connected ({team['error'] or 'connecting'})  "
                f"outbox {team['outbox_depth']:,}")
    return (f"team {team['name']}: connected  lag {team['lag_changes']:,} changes  outbox "
            f"{team['outbox_depth']:,}")


def gateway_listing(gateway: dict[str, Any] | None) -> Listing:
    """The last model call of each live session through the gateway, newest first: the
    tokens sent (as ctxd counted the body), those ctxd's substitutions removed, the
    provider's input and cache counts, and the cost in input-token units."""
    listing = Listing(GATEWAY_COLUMNS, title="last model call of live sessions (cost in "
                                             "input tokens)")
    for call in (gateway or {}).get("sessions", []):
        listing.rows.append([
            cell(call["session_id"]), cell(call["model"] or "-"),
            *(cell(f"{call[key]:,}") for key in ("sent_tokens", "removed_tokens",
                                                  "input_tokens", "cache_read_tokens",
                                                  "cache_write_tokens")),
            cell(f"{call['cost']:,.0f}")])
    return listing


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


INJECTION_COLUMNS = (Column("session", ident=True), Column("pending", right=True),
                     Column("unacknowledged", right=True))


def injections_listing(sessions: list[dict[str, Any]]) -> Listing:
    """The sessions with injections waiting for their agent."""
    listing = Listing(INJECTION_COLUMNS, title="pending injections")
    for s in sessions:
        counts = s.get("injections", {})
        if counts.get("pending", 0) or counts.get("delivered", 0):
            listing.rows.append([cell(s["session_id"]), cell(str(counts["pending"])),
                                 cell(str(counts["delivered"]))])
    return listing


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


@dataclass(frozen=True)
class Status:
    """What ``status`` shows: the daemon, its open sessions, their waiting injections, the
    live branches and the usage (``snapshot`` is what ``--json`` prints)."""

    snapshot: dict[str, Any]
    budgets: dict[str, dict[str, Any]]
    """The budget of each session that holds a live branch (its bar's thresholds)."""

    @classmethod
    def read(cls, client: Client, limit: int) -> Status:
        status = client.call("daemon.status")
        sessions = client.call("session.list", {"state": "open", "limit": limit})
        branches, budgets = live_branches(client, status, sessions)
        waiting_injections(client, sessions["sessions"])
        return cls({"daemon": status, "sessions": sessions["sessions"],
                    "more_sessions": sessions["next_cursor"] is not None,
                    "live_branches": branches,
                    "usage": sessions_usage(client, sessions["sessions"])}, budgets)

    def listings(self) -> tuple[Listing, Listing, Listing, Listing, Listing]:
        """The gateway's calls, sessions, injections, live branches, usage."""
        snapshot = self.snapshot
        title = "open sessions" + (" (first page)" if snapshot["more_sessions"] else "")
        used = snapshot["usage"]
        return (gateway_listing(snapshot["daemon"].get("gateway")),
                sessions_listing(snapshot["sessions"], title),
                injections_listing(snapshot["sessions"]),
                live_branches_listing(snapshot["live_branches"], self.budgets),
                usage_listing("session", [(sid, got["totals"], got["cost"])
                                          for sid, got in used.items()],
                              "usage of open sessions",
                              any(got["cost"] is not None for got in used.values())))

    def view(self, width: int) -> Group:
        """The tables of a terminal ``width`` cells wide."""
        listings = self.listings()
        calls, sessions, injections, branches, usage = listings
        shortened = any(ids_shortened(listing) for listing in listings)
        team = team_line(self.snapshot["daemon"].get("team"))
        return Group(daemon_line(self.snapshot["daemon"], width),
                     Text(memory_line(self.snapshot["daemon"]["memory_index"])),
                     Text(gateway_line(self.snapshot["daemon"])),
                     *([Text(team)] if team else []),
                     *([table(calls, width)] if calls.rows else []), table(sessions, width),
                     *([table(injections, width)] if injections.rows else []),
                     table(branches, width) if branches.rows else Text("no live branches"),
                     *([table(usage, width)] if usage.rows else []),
                     *([Text(IDS_SHORTENED, style="dim")] if shortened else []))

    def show(self, out: Output) -> None:
        if out.format == "table":
            out.console.print(self.view(out.console.width))
            return
        team = team_line(self.snapshot["daemon"].get("team"))
        out.lines([" ".join(daemon_line(self.snapshot["daemon"]).plain.split()),
                   memory_line(self.snapshot["daemon"]["memory_index"]),
                   gateway_line(self.snapshot["daemon"]),
                   *([team] if team else [])])
        for listing in self.listings():
            if listing.rows:
                out.lines([""])
                out.listing(listing, "")


def cmd_status(client: Client, args: argparse.Namespace, out: Output) -> int:
    if not args.watch:
        status = Status.read(client, args.limit)
        out.emit(status.snapshot, status)
        return 0
    try:
        if out.format == "table":
            from rich.live import Live

            width = out.console.width
            with Live(Status.read(client, args.limit).view(width), console=out.console,
                      refresh_per_second=4, screen=False) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(Status.read(client, args.limit).view(out.console.width))
        while True:  # one JSON object a line, or one plain snapshot after another
            status = Status.read(client, args.limit)
            out.emit(status.snapshot, status, Lines([""]), one_line=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return 0


# ---- events ----------------------------------------------------------------------------

def event_fields(event: dict[str, Any]) -> list[str]:
    """An event's time (local, to the millisecond), seq, type, session and data."""
    ts = event["ts"]
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"
    return [when, str(event["seq"]), event["type"], event["session_id"] or "-",
            compact_json(event["data"])]


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
            out.row(event, event_fields(event))
    except KeyboardInterrupt:
        return 0


# ---- call, cancel ----------------------------------------------------------------------

def cmd_call(client: Client, args: argparse.Namespace, out: Output) -> int:
    text = args.params
    if text == "-":
        text = read_stdin()
        if text is None:
            return 2
    try:
        params = json.loads(text) if text else None
    except json.JSONDecodeError as exc:
        source = "standard input" if args.params == "-" else "PARAMS"
        print(f"ctxctl: {source} is not valid JSON: {exc}", file=sys.stderr)
        return 2
    out.print_json(client.call(args.method, params, request_id=args.id))
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.cancel(args.request_id, args.reason)
    lines = [f"request {args.request_id!r}: {result['cancelled']} cancelled"]
    if result["finishing"]:
        lines.append(f"{result['finishing']} past its commit point: answered as done")
    out.emit(result, Lines(lines))
    return 0


# ---- doctor, stop ----------------------------------------------------------------------

GATEWAY_FIX = ("ctxctl: the model gateway does not answer, so the agents wired to it cannot "
               "reach their model; restart ctxd (`ctxctl stop`, then `ctxd`) and read its "
               "log, or run `ctxctl uninstall claude-code` to send Claude Code straight to "
               "the provider again")


TEAM_FIX = ("ctxctl: the team database is unreachable: memories shared here wait in the "
            "outbox and teammates' do not arrive; check the URL in the variable [memory.team] "
            "url_env names (in ctxd's environment) and that the database answers "
            "(`psql \"$TEAM_MEMORY_DATABASE_URL\"`)")


UPSTREAM_NOTE = ("ctxctl: calls to an upstream out of reach fail (HTTP 502): check "
                 "{settings} under [gateway], and the network (unless no agent of yours calls "
                 "that API)")


def gateway_check(status: dict[str, Any]) -> dict[str, Any] | None:
    """The gateway end to end (``GET <base_url>/_ctxd/health``), and whether it reaches
    its upstreams (``upstreams``: None when it does not say); None when it is disabled,
    a failed check (without ``listen``) when it is off (``gateway_off``)."""
    from ctxclient import _gateway

    gateway = status.get("gateway")
    if gateway is None:
        off = status.get("gateway_off")
        return None if off is None else {"listen": None, "ok": False, "problem": off,
                                         "upstreams": None}
    problem, upstreams = _gateway.health_with_upstreams(gateway["base_url"])
    return {"listen": gateway["listen"], "ok": problem is None, "problem": problem,
            "upstreams": upstreams}


def upstream_lines(check: dict[str, Any] | None) -> list[str]:
    """One line an upstream: reached (with the status it answered), or what failed."""
    return [f"upstream {upstream['url']}: "
            + (f"reached (HTTP {upstream['status']})" if upstream["reached"]
               else upstream["problem"])
            for upstream in (check or {}).get("upstreams") or ()]


def gateway_check_line(check: dict[str, Any] | None) -> str:
    from ctxclient._gateway import HEALTH_PATH

    if check is None:
        return "gateway: disabled"
    if check["listen"] is None:
        return f"gateway: off: {check['problem']}"
    if check["ok"]:
        return f"gateway {check['listen']}: ok ({HEALTH_PATH} answered)"
    return f"gateway {check['listen']}: {check['problem']}"


def cmd_doctor(client: Client, args: argparse.Namespace, out: Output) -> int:
    client.timeout = None  # the whole database is read: seconds per GiB from disk
    result = client.call("daemon.check")
    status = client.call("daemon.status")
    gateway = gateway_check(status)
    from ctxclient import _install

    integrations, wired = _install.doctor(
        Path.cwd(), None if status.get("gateway") is None else status["gateway"]["base_url"])
    if result["ok"]:
        found = [f"{result['database']}: ok (integrity_check, {result['seconds']:.2f} s)"]
    else:
        found = [f"{result['database']}: {problem}" for problem in result["problems"]]
    gateway_ok = gateway is None or gateway["ok"]
    team = status.get("team")
    team_ok = team is None or team["connected"]
    unreached = [u for u in (gateway or {}).get("upstreams") or () if not u["reached"]]
    out.emit({**result, "gateway": gateway, "team": team, "integrations": integrations},
             Lines([*found, gateway_check_line(gateway), *upstream_lines(gateway),
                    *filter(None, [team_line(team)]), *_install.doctor_lines(integrations)]),
             *([] if result["ok"] else [Stderr(
                 f"ctxctl: the database {result['database']} is corrupt; stop ctxd and run "
                 "`ctxd --recover`")]),
             *([] if gateway_ok else [Stderr(GATEWAY_FIX)]),
             *([Stderr(UPSTREAM_NOTE.format(settings=", ".join(
                 u["setting"] for u in unreached)))] if unreached else []),
             *([] if team_ok else [Stderr(TEAM_FIX)]))
    if not wired:
        print("ctxctl: an agent's ctxd settings are incomplete; run the fix shown",
              file=sys.stderr)
    return 0 if result["ok"] and wired and gateway_ok and team_ok else 1


def doctor_without_daemon(exc: DaemonUnavailable, out: Output) -> int | None:
    """`doctor` with no daemon: say what checks the files instead, and check the agent
    tools' settings; then no daemon is reported as for any command."""
    print("ctxctl: doctor asks the running daemon; start it (`ctxd`, or `systemctl --user "
          "start ctxd.socket` with the units), or check its files with `ctxd --check`",
          file=sys.stderr)
    from ctxclient import _install

    out.text(Lines(_install.doctor_lines(_install.doctor(Path.cwd())[0])))
    return None


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
    out.emit({"stopped": True, "pid": pid}, Lines([f"ctxd (pid {pid}) stopped"]))
    return 0


def stop_without_daemon(exc: DaemonUnavailable, out: Output) -> int | None:
    """`stop` with no daemon: done already, as `systemctl stop` of a stopped unit is (not
    when the socket's path is wrong: that is reported as for any command)."""
    if isinstance(exc, BadSocketPath):
        return None
    out.emit({"stopped": False, "pid": None})
    print(f"ctxctl: ctxd is not running (nothing listens on {exc.path})", file=sys.stderr)
    return 0


# ---- the command line ------------------------------------------------------------------

def add_status(commands: Commands, common: Parser) -> None:
    """``status``."""
    status = commands.add_parser("status", parents=[common],
                                 help="the daemon, its open sessions and live branches")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=interval, default=1.0, metavar="SECONDS",
                        help=f"seconds between refreshes (default 1, at least "
                             f"{MIN_INTERVAL_S})")
    status.add_argument("--limit", type=number_in(wire.SessionListParams, "limit"), default=50,
                        metavar="N", help="sessions shown (default 50)")
    status.set_defaults(run=cmd_status)


def cmd_team_status(client: Client, args: argparse.Namespace, out: Output) -> int:
    """0 when linked, 1 when the team database is unreachable, 2 without a team."""
    team = client.call("daemon.status").get("team")
    if team is None:
        print("ctxctl: no team: name one under [memory.team] in ctxd's config "
              "($XDG_CONFIG_HOME/ctxd/config.toml, ctxd.toml(5)): name = \"…\", and the "
              "database's URL in the variable url_env names; then restart ctxd",
              file=sys.stderr)
        return 2
    line = team_line(team)
    assert line is not None
    out.emit(team, Lines([line]), *([] if team["connected"] else [Stderr(TEAM_FIX)]))
    return 0 if team["connected"] else 1


def add_team(commands: Commands, common: Parser) -> None:
    """``team status``."""
    actions = group(commands, "team", common, "see the link to your team's shared memories")
    status = actions.add_parser(
        "status", parents=[common], help="the team link: connected, lag, outbox",
        description="The link to the team database ([memory.team] in ctxd's config, "
                    "ctxd.toml(5)): whether "
                    "it is connected, how many changes the mirror lags, how many writes wait "
                    "in the outbox. Exit status 0 when connected, 1 when not, 2 without a "
                    "team.")
    status.set_defaults(run=cmd_team_status)


def add_events(commands: Commands, common: Parser) -> None:
    """``events``."""
    events = commands.add_parser("events", parents=[common],
                                 help="follow the daemon's new events until Ctrl-C (--since "
                                      "0: the kept ones first)")
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


def add_call_cancel_doctor(commands: Commands, common: Parser) -> None:
    """``call``, ``cancel`` and ``doctor``."""
    call = commands.add_parser("call", parents=[common], help="call any method")
    call.add_argument("method", metavar="METHOD", help="e.g. session.get")
    call.add_argument("params", metavar="PARAMS", nargs="?",
                      help='params as JSON, e.g. \'{"session_id": "s1"}\', or - to read '
                           "them from standard input")
    call.add_argument("--id", metavar="ID",
                      help="the request's id (default: a new UUID), for ctxctl cancel ID")
    call.set_defaults(method_hints=True, run=cmd_call)
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
    doctor.set_defaults(run=cmd_doctor, no_daemon=doctor_without_daemon)


def add_stop(commands: Commands, common: Parser) -> None:
    """``stop``."""
    stop = commands.add_parser("stop", parents=[common], help="shut the daemon down gracefully")
    stop.add_argument("--wait", type=seconds_to_wait, default=15.0, metavar="SECONDS",
                      help="seconds to wait for the exit (default 15)")
    stop.set_defaults(run=cmd_stop, no_daemon=stop_without_daemon)
