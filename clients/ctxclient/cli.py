"""ctxctl: look at and drive a running ctxd (status, sessions, branches, events, memory, raw
calls, stop).

Exit codes: 0 success, 1 the daemon answered with an error, 2 no daemon (or bad usage).
Listings print as a table on a terminal and as plain rows otherwise (``--format``);
every command takes ``--json`` for machine-readable output; ``NO_COLOR`` is honoured.

The commands live by group (docs/decisions.md, "ctxctl's commands by group"):
`_cli_sessions` (sessions, session …, branches, usage, tools, inject), `_cli_memory`,
`_cli_hygiene` (result, compact, fork), `_cli_integrations` (hook, install, mcp, import,
replay, completion) and `_cli_daemon` (status, events, call, cancel, doctor, stop); each
prints through `Output.emit` (`ctxclient._output`). This module assembles the parser and
runs a command.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn

from rich.console import Console

from ctxclient import _cli_daemon, _cli_hygiene, _cli_integrations, _cli_memory, _cli_sessions
from ctxclient._cli_args import SHORTENED, ParagraphsFormatter, Parser, common_options
from ctxclient._errors import DaemonUnavailable, RpcError
from ctxclient._output import Output
from ctxclient._sync import Client
from ctxd import __version__
from ctxd.errors import ErrorCode

EXIT_STATUS = """exit status:
  0  success
  1  the daemon answered with an error (or `stop` found it still running)
  2  no daemon answers on the socket, or bad usage
  3  install/uninstall refused a settings file (nothing written)
run exits with its command's status, or 125 (it could not run it: no daemon, the
gateway disabled or off), 126 (not executable) or 127 (not found)"""


def parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common_options(common, defaults=False)
    cli = Parser(prog="ctxctl", description="Look at and drive ctxd.", epilog=EXIT_STATUS,
                 formatter_class=ParagraphsFormatter)
    cli.add_argument("--version", action="version", version=f"ctxctl {__version__}")
    common_options(cli, defaults=True)
    cli.set_defaults(run=None, group=cli, offline=False, no_daemon=None, method_hints=False)
    commands = cli.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    # In the order `ctxctl --help` lists them.
    _cli_daemon.add_status(commands, common)
    _cli_sessions.add_sessions(commands, common)
    _cli_sessions.add_usage(commands, common)
    _cli_hygiene.add_result_compact(commands, common)
    _cli_sessions.add_inject(commands, common)
    _cli_daemon.add_events(commands, common)
    _cli_memory.add_memory(commands, common)
    _cli_daemon.add_team(commands, common)
    _cli_daemon.add_call_cancel_doctor(commands, common)
    _cli_integrations.add_hook_install(commands, common)
    _cli_integrations.add_run(commands, common)
    _cli_daemon.add_stop(commands, common)
    _cli_integrations.add_mcp_import(commands, common)
    _cli_hygiene.add_fork(commands, common)
    _cli_integrations.add_replay(commands)
    _cli_integrations.add_completion(commands, common)
    return cli


def _missing_command(group: argparse.ArgumentParser) -> NoReturn:
    [commands] = [a for a in group._actions if isinstance(a, argparse._SubParsersAction)]
    group.error(f"missing command (choose from {', '.join(commands.choices)})")


COMMAND_OF_METHOD = {
    "daemon.status": "ctxctl status", "daemon.shutdown": "ctxctl stop",
    "daemon.check": "ctxctl doctor", "session.list": "ctxctl sessions",
    "session.open": "ctxctl session open {session}",
    "session.get": "ctxctl session show {session}",
    "session.close": "ctxctl session close {session}",
    "session.delete": "ctxctl session delete {session}",
    "session.resume": "ctxctl session resume {session}",
    "message.list": "ctxctl session messages {session}",
    "ctxd.render": "ctxctl session render {session}",
    "branch.list": "ctxctl branches {session}", "tool.list": "ctxctl tools {session}",
    "usage.get": "ctxctl usage {session}", "inject.push": "ctxctl inject {session} TEXT",
    "context.compact": "ctxctl compact {session}", "context.fork": "ctxctl fork {session}",
    "result.read": "ctxctl result REF", "events.subscribe": "ctxctl events",
    "request.cancel": "ctxctl cancel REQUEST_ID", "transcript.import": "ctxctl import",
    "memory.list": "ctxctl memory list", "memory.search": "ctxctl memory search QUERY",
    "memory.record": "ctxctl memory add TITLE CONTENT", "memory.get": "ctxctl memory show ID",
    "memory.delete": "ctxctl memory rm ID", "memory.reindex": "ctxctl memory reindex",
    "memory.share": "ctxctl memory share ID --team NAME",
    "memory.feedback": "ctxctl memory rate ID --helpful",
    "memory.outcome": "ctxctl memory rate ID --succeeded",
}
"""The ctxctl command that does what a method does, for the hints of the daemon's errors;
``{session}`` is the session the error names. A method without one is ``ctxctl call``.
The daemon's route table names the same commands (tests/unit/test_ctxctl_refusals.py)."""
METHOD_NAME = re.compile(r"\b(?:daemon|session|message|ctxd|budget|transcript|context|result|"
                         r"tools|prompt|branch|inject|usage|tool|memory|events|request|turn|"
                         r"mcp)\.[a-z_]+\b")
"""A method's name in a hint (the namespaces of the daemon's methods)."""


def ctxctl_hint(fix: str, data: dict[str, Any]) -> str:
    """A daemon's hint as a ctxctl user reads it: each method it names becomes the ctxctl
    command to type (``open it with `ctxctl session open s1```)."""
    session = data.get("session_id") if isinstance(data.get("session_id"), str) else None

    def command(match: re.Match[str]) -> str:
        template = COMMAND_OF_METHOD.get(match.group(0))
        if template is None:
            return f"`ctxctl call {match.group(0)}`"
        return "`" + template.format(session=session or "SESSION") + "`"

    return METHOD_NAME.sub(command, fix)


def _report_rpc_error(exc: RpcError, out: Output, method_hints: bool = False) -> int:
    """Print the daemon's error; its hint names ctxctl commands (`ctxctl_hint`) unless
    ``method_hints`` (``ctxctl call``, whose user types methods)."""
    out.emit({"error": {"code": exc.code, "message": exc.message, "data": exc.data}})
    print(f"ctxctl: error {exc.code}: {exc.message}", file=sys.stderr)
    data = exc.data if isinstance(exc.data, dict) else {}
    if (exc.code == ErrorCode.METHOD_NOT_FOUND and not data.get("suggestion")
            and data.get("available")):
        print(f"ctxctl: the daemon's methods: {', '.join(data['available'])}", file=sys.stderr)
    elif isinstance(data.get("fix"), str) and data["fix"]:
        fix = data["fix"] if method_hints else ctxctl_hint(data["fix"], data)
        print(f"ctxctl: fix: {fix}", file=sys.stderr)
    return 1


class ShortIdNotFound(Exception):
    """No session's id, or more than one, starts as a shortened id does."""


def whole_session_id(client: Client, shown: str) -> str:
    """The one session whose id starts as ``shown`` (an id a table shortened: its first
    characters and ``…``) does, found in ``session.list``.

    Raises:
        ShortIdNotFound: no session's id starts so, or more than one does (what to type).
    """
    prefix = shown.removesuffix(SHORTENED)
    found: list[str] = []
    params: dict[str, Any] = {"limit": 1000}
    while True:
        page = client.call("session.list", params)
        found += [s["session_id"] for s in page["sessions"]
                  if s["session_id"].startswith(prefix)]
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ShortIdNotFound(f"no session's id starts with {prefix!r}")
    listed = ", ".join(found[:5]) + (", …" if len(found) > 5 else "")
    raise ShortIdNotFound(f"{len(found)} sessions' ids start with {prefix!r} ({listed}); give "
                          "more of the id")


def _report_no_answer(message: str, socket_path: str, out: Output) -> int:
    out.emit({"error": {"code": None, "message": message, "data": {"socket": socket_path}}})
    print(f"ctxctl: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The ``ctxctl`` console script."""
    args, extra = parser().parse_known_args(argv)
    if extra:  # told by the command they were given to, with its usage (not ctxctl's)
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.run is None:
        _missing_command(args.group)
    out = Output(Console(), args.format, args.headers)
    if args.offline:
        code: int = args.run(args, out)
        return code
    try:
        client = Client(args.socket)
    except DaemonUnavailable as exc:
        handled = None if args.no_daemon is None else args.no_daemon(exc, out)
        if handled is not None:
            return int(handled)
        return _report_no_answer(str(exc), exc.path, out)
    try:
        with client:
            if isinstance(getattr(args, "session", None), str) and \
                    args.session.endswith(SHORTENED):
                args.session = whole_session_id(client, args.session)
            code = args.run(client, args, out)
            return code
    except ShortIdNotFound as exc:
        print(f"ctxctl: {exc}", file=sys.stderr)
        return 1
    except DaemonUnavailable as exc:
        return _report_no_answer(str(exc), exc.path, out)
    except RpcError as exc:
        return _report_rpc_error(exc, out, args.method_hints)
    except TimeoutError:
        return _report_no_answer(f"ctxd on {client.path} did not answer in time (the request "
                                 "may still complete)", client.path, out)


if __name__ == "__main__":
    sys.exit(main())
