"""What ctxctl answers without a daemon: bad usage (exit 2, before any connection), no daemon
on the socket, --version and --help. Run in this process (``ctxclient.cli.main``, what
``python -m ctxclient.cli`` runs): a real daemon adds nothing to these."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from jsonrpc import NOT_FOUND_FIX

from ctxclient.cli import main


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


Ctxctl = Callable[..., Done]


@pytest.fixture
def ctxctl(monkeypatch: pytest.MonkeyPatch) -> Ctxctl:
    """ctxctl with ``--socket SOCKET ARGS``: its exit status, standard output and error."""
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.delenv("CTXD_SOCKET", raising=False)

    def run(socket: Path, *args: str) -> Done:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["--socket", str(socket), *args])
            except SystemExit as exit:  # as the interpreter turns it into a status
                code = (0 if exit.code is None else exit.code if isinstance(exit.code, int)
                        else 1)
        return Done(code, out.getvalue(), err.getvalue())

    return run


def test_an_impossible_socket_path_is_exit_two_with_json(ctxctl: Ctxctl,
                                                         tmp_path: Path) -> None:
    too_long = tmp_path / ("x" * 120) / "ctxd.sock"
    result = ctxctl(too_long, "--json", "status")
    assert result.returncode == 2
    # The real problem, not "no daemon is running": none ever could, there.
    assert result.stderr == (f"ctxctl: {too_long} cannot be ctxd's socket: the path is longer "
                             "than 107 bytes; choose a shorter --socket or CTXD_SOCKET\n")
    assert json.loads(result.stdout)["error"]["data"] == {"socket": str(too_long)}


def test_no_daemon_is_exit_two(ctxctl: Ctxctl, tmp_path: Path) -> None:
    for command in (["status"], ["sessions"], ["call", "daemon.ping"], ["events", "-f"],
                    ["session", "show", "s1"], ["memory", "show", "1"], ["memory", "reindex"],
                    ["memory", "search", "x"], ["memory", "add", "t", "c"],
                    ["memory", "list"], ["memory", "rate", "1", "--helpful"],
                    ["memory", "rm", "1"]):
        result = ctxctl(tmp_path / "none.sock", *command)
        assert result.returncode == 2
        assert result.stderr.startswith(f"ctxctl: no ctxd daemon is running on "
                                        f"{tmp_path / 'none.sock'}")


def test_memory_usage_errors_exit_two_before_any_connection(ctxctl: Ctxctl,
                                                            tmp_path: Path) -> None:
    """What the command line can say is checked in its own terms: exit 2, and no daemon
    is needed (none listens on the socket: its refusal would be another message)."""
    scope_forms = ('use "global" or "<project|team|org>:<name>" (a name of 1-128 characters, '
                   "no whitespace)")
    for command, message in (
            (["rate", "1"], "one of the arguments --helpful --unhelpful --succeeded --failed "
                            "is required"),
            (["rate", "1", "--helpful", "--failed"],
             "argument --failed: not allowed with argument --helpful"),
            (["rate", "one", "--helpful"],
             "argument ID: must be an integer from 1 to 2**62, got 'one'"),
            (["rm", "1.5"], "argument ID: must be an integer from 1 to 2**62, "
                            "got '1.5'"),
            (["show", "0"], "argument ID: must be an integer from 1 to 2**62, "
                            "got '0'"),
            (["search", "q", "--mode", "fuzzy"],
             "argument --mode: invalid choice: 'fuzzy' (choose from hybrid, lexical, dense)"),
            (["add", "t", "c", "--outcome", "partial"],
             "argument --outcome: invalid choice: 'partial' (choose from success, failure)"),
            (["add", "t"], "the following arguments are required: CONTENT"),
            (["add", "t", "c", "--scope", "project:two words"],
             f"argument --scope: invalid scope 'project:two words': {scope_forms}"),
            (["search", "q", "--scope", "crew:x"],
             f"argument --scope: invalid scope 'crew:x': {scope_forms}"),
            (["list", "--scope", "bogus"], f"argument --scope: invalid scope 'bogus': "
                                           f"{scope_forms}"),
            (["add", "t", "c", "--tag", "two words"],
             "argument --tag: invalid tag 'two words': use one word of at most 64 characters"),
            (["add", "", "c"], "argument TITLE: is empty"),
            (["add", " \t", "c"], "argument TITLE: is blank"),
            (["share", "3", "--team", "two words"],
             "argument --team: invalid team name 'two words': use one word of 1-128 "
             "characters"),
            (["share", "3", "--org", ""],
             "argument --org: invalid org name '': use one word of 1-128 characters"),
            (["search", "q", "-k", "0"], "argument -k: must be an integer from 1 to 100, got '0'"),
            (["search", "q", "--min-confidence", "1.5"],
             "argument --min-confidence: must be a number from 0.0 to 1.0, got '1.5'"),
            (["list", "--limit", "0"],
             "argument --limit: must be an integer from 1 to 1000, got '0'"),
            (["remove", "1"], "unknown command 'remove'; did you mean 'rm'? (choose from "
                              "search, add, list, show, rate, share, rm, reindex)"),
            ([], "missing command (choose from search, add, list, show, rate, share, rm, "
                 "reindex)")):
        result = ctxctl(tmp_path / "none.sock", "memory", *command)
        assert (result.returncode, result.stdout) == (2, ""), command
        assert result.stderr.endswith(f": error: {message}\n"), (command, result.stderr)


def test_an_unknown_argument_shows_its_commands_usage(ctxctl: Ctxctl, tmp_path: Path) -> None:
    """Told by the command it was given to, with that command's usage: exit 2, before any
    connection; without a command, ctxctl's."""
    for args, prog in ((["memory", "list", "--foo"], "ctxctl memory list"),
                       (["status", "extra"], "ctxctl status"),
                       (["session", "render", "s1", "--provider", "openai"],
                        "ctxctl session render"),
                       (["--foo", "status"], "ctxctl status"),
                       (["--foo"], "ctxctl")):
        result = ctxctl(tmp_path / "none.sock", *args)
        extra = " ".join(arg for arg in args if arg in ("--foo", "extra", "--provider",
                                                         "openai"))
        assert (result.returncode, result.stdout) == (2, ""), args
        assert result.stderr.startswith(f"usage: {prog} "), (args, result.stderr)
        assert result.stderr.endswith(f"\n{prog}: error: unrecognized arguments: {extra}\n"
                                      ), (args, result.stderr)


def test_status_watch_interval_is_checked(ctxctl: Ctxctl, tmp_path: Path) -> None:
    for value in ("-1", "0", "0.05", "nan", "soon"):
        result = ctxctl(tmp_path / "none.sock", "status", "--watch", "--interval", value)
        assert (result.returncode, result.stdout) == (2, ""), value
        assert result.stderr.endswith(f"ctxctl status: error: argument --interval: must be at "
                                      f"least 0.1 seconds, got '{value}'\n")


def test_stop_without_a_daemon_is_done_already(ctxctl: Ctxctl, tmp_path: Path) -> None:
    result = ctxctl(tmp_path / "none.sock", "stop")
    assert (result.returncode, result.stdout, result.stderr) == (
        0, "", f"ctxctl: ctxd is not running (nothing listens on {tmp_path / 'none.sock'})\n")
    as_json = ctxctl(tmp_path / "none.sock", "stop", "--json")
    assert (as_json.returncode, json.loads(as_json.stdout)) == (
        0, {"stopped": False, "pid": None})
    # A path where no daemon could ever listen is a real problem, not "not running".
    not_a_socket = tmp_path / "file"
    not_a_socket.write_text("")
    bad = ctxctl(not_a_socket, "stop")
    assert (bad.returncode, bad.stderr) == (
        2, f"ctxctl: {not_a_socket} cannot be ctxd's socket: it exists and is not a socket\n")


def test_version_and_exit_codes_in_help(ctxctl: Ctxctl, tmp_path: Path) -> None:
    version = ctxctl(tmp_path / "none.sock", "--version")
    assert (version.returncode, version.stdout) == (0, "ctxctl 0.1.0\n")
    shown = ctxctl(tmp_path / "none.sock", "--help")
    assert shown.stdout.endswith(
        "exit status:\n  0  success\n  1  the daemon answered with an error (or `stop` found "
        "it still running)\n  2  no daemon answers on the socket, or bad usage\n"
        "  3  install/uninstall refused a settings file (nothing written)\n"
        "run exits with its command's status, or 125 (it could not run it: no daemon, the\n"
        "gateway disabled or off), 126 (not executable) or 127 (not found)\n")


def test_every_hint_method_is_a_daemon_method_and_every_command_parses() -> None:
    """The daemon's hints name methods; ctxctl prints the command that does the same
    (`ctxclient.cli.COMMAND_OF_METHOD`): each method is one of the daemon's, each command
    one ctxctl takes, and every namespace of the daemon's methods is recognised."""
    from ctxclient.cli import COMMAND_OF_METHOD, METHOD_NAME, parser
    from ctxd.daemon._routes import ROUTES

    methods = {route.method for route in ROUTES if "." in route.method}
    assert set(COMMAND_OF_METHOD) <= methods
    typed = {route.method: route.ctxctl for route in ROUTES
             if set(route.ctxctl) - {"hook", "mcp"}}  # commands a user types for it
    assert set(COMMAND_OF_METHOD) == set(typed)
    for method, template in COMMAND_OF_METHOD.items():
        words = " ".join(word for word in template.split()[1:]
                         if word.islower() and not word.startswith(("{", "-")))
        assert words in typed[method], (method, template)
    assert all(METHOD_NAME.fullmatch(method) for method in methods)
    placeholders = {"SESSION": "s1", "TEXT": "hi", "REF": "res_0123456789abcdef",
                    "REQUEST_ID": "7", "QUERY": "q", "TITLE": "t", "CONTENT": "c", "ID": "3"}
    for template in COMMAND_OF_METHOD.values():
        words = template.format(session="SESSION").split()[1:]
        args = parser().parse_args([placeholders.get(word, word) for word in words]
                                   + (["claude-code", "f.jsonl"] if words == ["import"]
                                      else []))
        assert args.run is not None, template


def test_every_commands_help_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal of 80 columns every ``--help`` fits: its paragraphs refilled, its
    lists and examples written to fit."""
    import argparse

    from ctxclient.cli import parser

    monkeypatch.setenv("COLUMNS", "80")
    seen, wide = 0, []
    waiting = [parser()]
    while waiting:
        command = waiting.pop()
        seen += 1
        wide += [(command.prog, line) for line in command.format_help().splitlines()
                 if len(line) > 80]
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                waiting += list(dict.fromkeys(action.choices.values()))  # aliases once
    assert seen > 40
    assert wide == []


def test_a_hint_names_the_ctxctl_command() -> None:
    from ctxclient.cli import ctxctl_hint

    assert ctxctl_hint(NOT_FOUND_FIX, {"session_id": "s1"}) == (
        "check its id (`ctxctl sessions` lists them), or open it with "
        "`ctxctl session open s1`")
    assert ctxctl_hint("return them first (branch.return), or compact one of them with its "
                       "branch_id", {}) == (
        "return them first (`ctxctl call branch.return`), or compact one of them with its "
        "branch_id")
    assert ctxctl_hint("list a session's branches with branch.list; see config.toml", {}) == (
        "list a session's branches with `ctxctl branches SESSION`; see config.toml")
