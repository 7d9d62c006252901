"""ctxctl: look at and drive a running ctxd (status, sessions, raw calls, stop).

Exit codes: 0 success, 1 the daemon answered with an error, 2 no daemon (or bad usage).
Every command takes ``--json`` for machine-readable output; ``NO_COLOR`` is honoured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ctxclient._errors import DaemonUnavailable, RpcError
from ctxclient._sync import Client

HEALTH_STYLE = {"ok": "green", "warn": "yellow", "caution": "dark_orange",
                "compact": "red", "blocked": "bold red"}


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
            s["session_id"], s["project"] or "", (s["title"] or "")[:40], s["state"],
            str(s["message_count"]), f"{s['main_thread_tokens']:,}/{window:,}",
            usage_bar(s["usage"], s["health"]),
            Text(s["health"], style=HEALTH_STYLE.get(s["health"], "")))
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


def _status_snapshot(client: Client, limit: int) -> dict[str, Any]:
    status = client.call("daemon.status")
    sessions = client.call("session.list", {"state": "open", "limit": limit})
    return {"daemon": status, "sessions": sessions["sessions"],
            "more_sessions": sessions["next_cursor"] is not None}


def _status_view(snapshot: dict[str, Any]) -> Group:
    title = "open sessions" + (" (first page)" if snapshot["more_sessions"] else "")
    return Group(daemon_line(snapshot["daemon"]), sessions_table(snapshot["sessions"], title))


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
    status = commands.add_parser("status", parents=[common], help="the daemon and its sessions")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    status.add_argument("--limit", type=int, default=50, help="sessions shown")
    status.set_defaults(run=cmd_status)
    sessions = commands.add_parser("sessions", parents=[common], help="list sessions")
    sessions.add_argument("--project")
    sessions.add_argument("--state", choices=["open", "closed"])
    sessions.add_argument("--limit", type=int, default=100)
    sessions.set_defaults(run=cmd_sessions)
    call = commands.add_parser("call", parents=[common], help="call any method")
    call.add_argument("method", help="e.g. session.get")
    call.add_argument("params", nargs="?", help='params as JSON, e.g. \'{"session_id": "s1"}\'')
    call.set_defaults(run=cmd_call)
    stop = commands.add_parser("stop", parents=[common], help="shut the daemon down gracefully")
    stop.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the exit")
    stop.set_defaults(run=cmd_stop)
    return cli


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
