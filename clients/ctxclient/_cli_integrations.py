"""ctxctl's commands that wire ctxd to other tools, or run one beside it: ``hook``,
``install``, ``uninstall``, ``mcp``, ``import``, ``replay`` and ``completion``. None of them
needs a running daemon first (``import`` aside); their work is in `ctxclient._hook`,
`_install`, `_mcp`, `_import` and `_replay`, loaded when the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ctxclient import _import
from ctxclient._cli_args import Parser, common_options, session_id
from ctxclient._output import Output

if TYPE_CHECKING:
    from ctxclient._cli_args import Commands


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


def cmd_mcp(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _mcp

    return _mcp.run(getattr(args, "socket", None), args.session)


def _replay_window(text: str) -> int:
    from ctxclient import _replay

    return _replay.window(text)


def cmd_replay(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _replay

    return _replay.run(args, out)


def cmd_completion(args: argparse.Namespace, out: Output) -> int:
    import shtab

    from ctxclient.cli import parser

    out.lines([shtab.complete(parser(), shell=args.shell).rstrip("\n")])  # in any format
    return 0


def add_hook_install(commands: Commands, common: Parser) -> None:
    """``hook``, ``install`` and ``uninstall``."""
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


def add_mcp_import(commands: Commands, common: Parser) -> None:
    """``mcp`` and ``import``."""
    mcp = commands.add_parser(
        "mcp", parents=[common],
        help="speak MCP on stdin/stdout for an MCP client, through the daemon (started "
             "when none runs)")
    mcp.add_argument("--session", metavar="ID",
                     help="the session its tools work on (default: $CLAUDE_CODE_SESSION_ID, "
                          "else a new one)")
    mcp.set_defaults(run=cmd_mcp, offline=True)
    _import.register(commands, common, session_id, Parser)


def add_replay(commands: Commands) -> None:
    """``replay``, which takes no ``--socket``: it starts a daemon of its own."""
    private = Parser(add_help=False)
    common_options(private, defaults=False, socket=False)
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


def add_completion(commands: Commands, common: Parser) -> None:
    """``completion``."""
    completion = commands.add_parser("completion", parents=[common],
                                     help="print a shell completion script")
    completion.add_argument("shell", metavar="SHELL", choices=("bash", "zsh", "fish"),
                            help="bash, zsh or fish")
    completion.set_defaults(run=cmd_completion, offline=True)
