"""ctxctl's commands that wire ctxd to other tools, or run one beside it: ``hook``,
``install``, ``uninstall``, ``mcp``, ``import``, ``replay`` and ``completion``. None of them
needs a running daemon first (``import`` aside); their work is in `ctxclient._hook`,
`_install`, `_mcp`, `_import` and `_replay`, loaded when the command runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ctxclient import _import
from ctxclient._cli_args import ParagraphsFormatter, Parser, common_options, session_id
from ctxclient._output import Output
from ctxclient._policies import POLICIES
from ctxd.cost import DEFAULT_MODEL, PRICES, PRICES_AS_OF

if TYPE_CHECKING:
    from ctxclient._cli_args import Commands


def cmd_install(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _gateway, _install, _mcp

    gateway = problem = None
    if args.scope == "user" and args.gateway:
        try:
            gateway = _gateway.base_url_of(_gateway.daemon_status(
                args.socket, start=True, who="ctxctl install"))
        except _gateway.GatewayUnavailable as exc:
            problem = str(exc)
    return _install.run("install", args.target, args.scope, Path(args.dir).absolute(),
                        args.socket, out.json, gateway, problem,
                        _mcp.user_socket_unit(os.environ), args.tools)


def cmd_uninstall(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _install

    return _install.run("uninstall", args.target, args.scope, Path(args.dir).absolute(),
                        None, out.json)


def cmd_run(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _gateway

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        args.group.error("missing CMD: ctxctl run -- CMD [ARGS ...]")
    try:
        status = _gateway.daemon_status(args.socket, start=True, who="ctxctl run")
        base_url = _gateway.base_url_of(status)
    except _gateway.GatewayUnavailable as exc:
        print(f"ctxctl run: {exc}", file=sys.stderr)
        return _gateway.RUN_FAILED
    env = _gateway.agent_environment(base_url, os.environ, args.socket)
    for line in _gateway.overridden(os.environ, env):
        print(f"ctxctl run: {line}", file=sys.stderr)
    return _gateway.exec_agent(command, env)


def cmd_hook(args: argparse.Namespace, out: Output) -> int:
    # The console script answers `ctxctl hook` before the CLI loads (clients/ctxclient/
    # _entry.py); this is `python -m ctxclient.cli hook` and the help.
    from ctxclient import _hook

    return _hook.main(["hook", *(["--socket", args.socket] if args.socket else [])])


def cmd_mcp(args: argparse.Namespace, out: Output) -> int:
    from ctxclient import _mcp

    return _mcp.run(getattr(args, "socket", None), args.session, tools=args.tools)


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


INSTALL_HELP = {
    "install": "wire an agent tool to ctxd (its hooks and MCP server, in its settings; at "
               "user scope its model calls through ctxd's gateway too)",
    "uninstall": "unwire an agent tool from ctxd: take out what install wrote, put back "
                 "what it replaced"}
INSTALL_DESCRIPTION = {
    "install": """\
Wire an agent tool to ctxd, merging ctxd's entries into the tool's own settings:
  claude-code  hooks (settings.json), the MCP server (~/.claude.json, .mcp.json)
  opencode     the plugin (plugin/ctxd.js), the MCP server (opencode.json)

At user scope (the default) the tool's model calls also go through ctxd's gateway, so
that what ctxd manages is what the model receives: Claude Code's env.ANTHROPIC_BASE_URL,
OpenCode's provider.anthropic.options.baseURL. The gateway's URL holds your token, so a
project's settings (which may be shared) never get it. The daemon is asked for the URL,
and started when none runs. The tool then depends on the daemon: with ctxd's systemd
socket unit a stopped daemon is started by the next call; without it, keep `ctxd` running.
Running it again changes nothing; `ctxctl uninstall` takes out exactly what it added and
puts back a value it replaced.""",
    "uninstall": """\
Take ctxd's entries out of an agent tool's settings: exactly what install added (hooks,
plugin, MCP server), and at user scope the gateway's base URL, with the value it replaced
put back (or none, as before). Anything else in the files is left as it is."""}


MCP_TOOLS_HELP = ("the MCP tools offered: default (read_result, context_branch, "
                  "context_return, compact_context, memory_search), all, or names separated "
                  "by commas; each tool offered is in every model request")


HOOK_DESCRIPTION = """\
Answer one Claude Code hook event: read its JSON on standard input, record it in the
session of the conversation, and write Claude Code's answer (memories to add, a tool
call denied) on standard output. Claude Code runs it; `ctxctl install claude-code`
wires it into its settings. It fails open: with no daemon, a slow one or any error it
prints nothing and exits 0, and Claude Code goes on as without ctxd.

example:
  echo '{"hook_event_name":"SessionStart","session_id":"s1"}' | ctxctl hook"""


def add_hook_install(commands: Commands, common: Parser) -> None:
    """``hook``, ``install`` and ``uninstall``."""
    hook = commands.add_parser(
        "hook", parents=[common],
        help="answer one Claude Code hook event (JSON on stdin); always exits 0",
        description=HOOK_DESCRIPTION, formatter_class=ParagraphsFormatter)
    hook.set_defaults(run=cmd_hook, offline=True)
    for action, summary in INSTALL_HELP.items():
        wire_cmd = commands.add_parser(
            action, parents=[common], help=summary,
            description=INSTALL_DESCRIPTION[action],
            formatter_class=ParagraphsFormatter)
        wire_cmd.add_argument("target", metavar="TARGET", choices=("claude-code", "opencode"),
                              help="claude-code or opencode")
        wire_cmd.add_argument("--scope", choices=("project", "user"), default="user",
                              help="the project's settings or the user's (default user)")
        wire_cmd.add_argument("--dir", default=".", metavar="DIR",
                              help="the project's root for --scope project (default: the "
                                   "current directory)")
        if action == "install":
            wire_cmd.add_argument("--no-gateway", dest="gateway", action="store_false",
                                  help="leave the tool's model calls alone: hooks, plugin "
                                       "and MCP server only")
            wire_cmd.add_argument("--tools", metavar="SET",
                                  help="the MCP server's tools (ctxctl mcp --tools): "
                                       + MCP_TOOLS_HELP.partition(": ")[2])
        wire_cmd.set_defaults(run=cmd_install if action == "install" else cmd_uninstall,
                              offline=True)


RUN_EPILOG = """\
what CMD gets:
  ANTHROPIC_BASE_URL  the gateway's base URL (http://127.0.0.1:PORT/TOKEN),
                      where Claude Code, the anthropic SDKs and most agents
                      send Anthropic's calls
  OPENAI_BASE_URL     the same with /v1, where the openai SDKs, Codex and
                      litellm (aider) send OpenAI's calls
  CTXD_SOCKET         with --socket: the daemon its ctxd hooks and MCP server
                      talk to

The API keys stay the agent's own: the gateway passes them to the provider and never
keeps them. The daemon is started when none runs (log: ~/.local/state/ctxd/ctxd.log).

Each conversation is a ctxd session. An agent that sends no session of its own (Claude
Code and OpenCode's plugin do) is known by its system prompt and first message: two runs
of the same task, one after the other or side by side, share one session (each keeps its
own prompt cache, but their messages, usage and budget are counted together). Have the
agent send the header x-ctxd-session: ID, one ID per conversation.

exit status: CMD's; 125 when ctxctl run could not run it (no daemon, the gateway
disabled or off), 126 when CMD cannot be executed, 127 when it is not found.

examples:
  ctxctl run -- aider --model sonnet
  ctxctl run -- codex
  ctxctl run -- python my_agent.py
  ctxctl run -- printenv ANTHROPIC_BASE_URL   # the URL, for an agent's settings"""


def add_run(commands: Commands, common: Parser) -> None:
    """``run``."""
    run = commands.add_parser(
        "run", parents=[common],
        help="run an agent with its model calls going through ctxd's gateway",
        description="Run CMD with ANTHROPIC_BASE_URL and OPENAI_BASE_URL pointing at ctxd's "
                    "model gateway, so that ctxd manages what the model receives (offloaded "
                    "results, folded branches, compaction) and counts every call. CMD "
                    "replaces ctxctl: it keeps the terminal, its signals and its exit status.",
        epilog=RUN_EPILOG, formatter_class=ParagraphsFormatter)
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS ...]",
                     help="the program to run and its arguments")
    run.set_defaults(run=cmd_run, offline=True, group=run)


def add_mcp_import(commands: Commands, common: Parser) -> None:
    """``mcp`` and ``import``."""
    mcp = commands.add_parser(
        "mcp", parents=[common],
        help="speak MCP on stdin/stdout for an MCP client, through the daemon (started "
             "when none runs)")
    mcp.add_argument("--session", metavar="ID",
                     help="the session its tools work on (default: $CLAUDE_CODE_SESSION_ID, "
                          "else a new one)")
    mcp.add_argument("--tools", metavar="SET", help=MCP_TOOLS_HELP)
    mcp.set_defaults(run=cmd_mcp, offline=True)
    _import.register(commands, common, session_id, Parser)


def add_replay(commands: Commands) -> None:
    """``replay``, which takes no ``--socket``: it starts a daemon of its own."""
    private = Parser(add_help=False)
    common_options(private, defaults=False, socket=False)
    replay = commands.add_parser(
        "replay", parents=[private],
        help="replay a transcript into a private ctxd and report the context and the cost "
             "it saves",
        description="Replay a Claude Code or OpenCode transcript turn by turn into a private "
                    "ctxd (its own temporary data) and report its peak context against the "
                    "raw thread's, the key facts kept, and whether every removed byte reads "
                    "back; then what each model call would cost, with Anthropic's prompt "
                    "cache, under each policy: raw (no management), claude-code (its "
                    "previews and compaction), context-editing (Anthropic's "
                    "clear_tool_uses), observation-masking (the latest 10 tool results "
                    "kept) and ctxd (the requests its gateway sends).",
        epilog="examples:\n"
               "  ctxctl replay ~/.claude/projects/-home-me-app/SESSION.jsonl\n"
               "  ctxctl replay EXPORT.json --window 32000 --json\n"
               "  ctxctl replay SESSION.jsonl --policy raw --policy ctxd\n"
               "  ctxctl replay SESSION.jsonl --plot context.png",
        formatter_class=ParagraphsFormatter)
    replay.add_argument("file", metavar="FILE", help="a Claude Code transcript (JSONL, or a "
                                                     "JSON array of its records) or an "
                                                     "OpenCode export")
    replay.add_argument("--window", type=_replay_window, metavar="N",
                        help="the context window in tokens (default: ctxd's, 200,000)")
    replay.add_argument("--from", dest="transcript_format",
                        choices=("claude-code", "opencode"),
                        help="the transcript's format (default: guessed from the file)")
    replay.add_argument("--policy", dest="policies", action="append", choices=POLICIES,
                        metavar="POLICY",
                        help=f"price this policy (repeatable; default: all of "
                             f"{', '.join(POLICIES)})")
    replay.add_argument("--price-model", choices=sorted(PRICES), default=DEFAULT_MODEL,
                        metavar="MODEL",
                        help=f"the model whose list prices the dollars are at (default: "
                             f"{DEFAULT_MODEL}; {', '.join(sorted(PRICES))}; as of "
                             f"{PRICES_AS_OF})")
    replay.add_argument("--plot", metavar="PNG",
                        help="write a PNG of each call's context tokens and the cost so "
                             "far, every policy on one chart (needs matplotlib: pip install "
                             "'ctxd[plot]')")
    replay.set_defaults(run=cmd_replay, offline=True)


def add_completion(commands: Commands, common: Parser) -> None:
    """``completion``."""
    completion = commands.add_parser("completion", parents=[common],
                                     help="print a shell completion script")
    completion.add_argument("shell", metavar="SHELL", choices=("bash", "zsh", "fish"),
                            help="bash, zsh or fish")
    completion.set_defaults(run=cmd_completion, offline=True)
