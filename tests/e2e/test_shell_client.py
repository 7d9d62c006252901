"""clients/shell/ctxd-call against a real daemon, over both transports (socat and python3)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import DaemonProcess
from tests_support import needs, placed_by_others

from ctxclient import DaemonUnavailable, RpcError
from ctxd.config import default_socket_path

SCRIPT = Path(__file__).resolve().parents[2] / "clients" / "shell" / "ctxd-call"


@pytest.fixture(params=[
    "python",
    pytest.param("socat", marks=needs("socat")),
])
def transport(request: pytest.FixtureRequest) -> str:
    """The transport that CTXD_CALL_TRANSPORT forces."""
    return str(request.param)


def base_env(**extra: str) -> dict[str, str]:
    """The test's environment without anything that would pick a socket or transport."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTXD_") and k != "XDG_RUNTIME_DIR"}
    env.update(extra)
    return env


def run(*args: str, env: dict[str, str] | None = None, stdin: bytes = b"",
        shell: list[str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*(shell or []), str(SCRIPT), *args], input=stdin,
                          capture_output=True, env=base_env() if env is None else env,
                          timeout=60, check=False)


def call(daemon: DaemonProcess, transport: str, method: str, *params: str,
         stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """ctxd-call -s SOCKET METHOD [PARAMS] with the transport forced."""
    return run("-s", str(daemon.socket), method, *params, stdin=stdin,
               env=base_env(CTXD_CALL_TRANSPORT=transport))


def ok(proc: subprocess.CompletedProcess[bytes]) -> Any:
    """The result a successful call printed (one line of JSON, nothing on stderr)."""
    assert (proc.returncode, proc.stderr) == (0, b""), proc.stderr.decode()
    assert proc.stdout.endswith(b"\n")
    assert proc.stdout.count(b"\n") == 1
    return json.loads(proc.stdout)


def rpc_error(daemon: DaemonProcess, method: str, params: Any) -> dict[str, Any]:
    """The error object the Python client gets for the same call."""
    with daemon.client() as client, pytest.raises(RpcError) as caught:
        client.call(method, params)
    error: dict[str, Any] = {"code": caught.value.code, "message": caught.value.message}
    if caught.value.data is not None:
        error["data"] = caught.value.data
    return error


def encoded(value: Any) -> bytes:
    """What ctxd puts on the wire for ``value`` (compact JSON), plus the newline we print."""
    return msgspec.json.encode(value) + b"\n"


MESSAGES = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "hello world"},
]
TRICKY = 'he said "}{" and \\"{\n}"\\ — ünïcödé {"result": 1}'


def test_ping(shared_daemon: DaemonProcess, transport: str) -> None:
    before = time.time()
    result = ok(call(shared_daemon, transport, "daemon.ping"))
    after = time.time()
    assert sorted(result) == ["pong", "ts"]
    assert result["pong"] is True
    assert before <= result["ts"] <= after


def test_session_open_prints_the_result(shared_daemon: DaemonProcess, transport: str,
                                        sid: str) -> None:
    params = {"session_id": sid, "project": "p{1}", "title": TRICKY}
    opened = ok(call(shared_daemon, transport, "session.open", json.dumps(params)))
    with shared_daemon.client() as client:
        again = client.call("session.open", params)
    assert opened["created"] is True
    assert again["created"] is False
    assert opened["session"] == again["session"]
    assert opened["context_state"] == again["context_state"]
    assert opened["session"]["title"] == TRICKY


def test_message_append_counts_like_the_python_client(shared_daemon: DaemonProcess,
                                                      transport: str, sid: str) -> None:
    other = sid + "-py"
    ok(call(shared_daemon, transport, "session.open", json.dumps({"session_id": sid})))
    appended = ok(call(shared_daemon, transport, "message.append",
                       json.dumps({"session_id": sid, "messages": MESSAGES})))
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": other})
        expected = client.call("message.append", {"session_id": other, "messages": MESSAGES})
    # 3 framing + 1 role + 4 content ("You are helpful.") and 3 + 1 + 2 ("hello world")
    assert [m["tokens"] for m in appended["appended"]] == [8, 6]
    assert appended["appended"] == expected["appended"]
    assert appended["tokens_appended"] == expected["tokens_appended"] == 14
    assert appended["context_state"] == {**expected["context_state"], "session_id": sid}


def test_output_is_the_daemons_result_unchanged(shared_daemon: DaemonProcess,
                                                transport: str, sid: str) -> None:
    messages = [{"role": "user", "content": TRICKY},
                {"role": "assistant", "content": "}}}{{{\"\"\\\\"}]
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": messages})
        expected = client.call("ctxd.render", {"session_id": sid})
    proc = call(shared_daemon, transport, "ctxd.render", json.dumps({"session_id": sid}))
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert proc.stdout == encoded(expected)
    assert [m["content"] for m in json.loads(proc.stdout)["messages"]] == [
        TRICKY, "}}}{{{\"\"\\\\"]


def test_params_from_stdin(shared_daemon: DaemonProcess, transport: str, sid: str) -> None:
    ok(call(shared_daemon, transport, "session.open", json.dumps({"session_id": sid})))
    messages = [{"role": "user", "content": TRICKY}]
    # Pretty-printed: raw newlines between tokens must not split the request line.
    stdin = json.dumps({"session_id": sid, "messages": messages}, indent=2).encode() + b"\n"
    assert stdin.count(b"\n") > 5
    appended = ok(call(shared_daemon, transport, "message.append", "-", stdin=stdin))
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid + "-py"})
        expected = client.call("message.append",
                               {"session_id": sid + "-py", "messages": messages})
        rendered = client.call("ctxd.render", {"session_id": sid})
    assert appended["appended"] == expected["appended"]
    assert rendered["messages"] == messages


def test_large_params_from_stdin(shared_daemon: DaemonProcess, transport: str,
                                 sid: str) -> None:
    content = "line {x} \"quoted\" ünï\n" * 50_000  # 1.2 MB
    budget = {"context_window": 10_000_000}
    # A user message: a tool result this large is offloaded, its stub naming a ref of its own.
    messages = [{"role": "user", "content": content}]
    ok(call(shared_daemon, transport, "session.open",
            json.dumps({"session_id": sid, "budget": budget})))
    stdin = json.dumps({"session_id": sid, "messages": messages}).encode()
    appended = ok(call(shared_daemon, transport, "message.append", "-", stdin=stdin))
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid + "-py", "budget": budget})
        expected = client.call("message.append",
                               {"session_id": sid + "-py", "messages": messages})
        stored = client.call("message.list", {"session_id": sid})
    assert appended["appended"] == expected["appended"]
    assert [m["content"] for m in stored["messages"]] == [content]


def test_large_result(shared_daemon: DaemonProcess, transport: str, sid: str) -> None:
    content = "x{\"}" * 500_000  # 2 MB
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid,
                                     "budget": {"context_window": 10_000_000}})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "tool", "content": content, "tool_call_id": "c1"}]})
        expected = client.call("message.list", {"session_id": sid})
    proc = call(shared_daemon, transport, "message.list", json.dumps({"session_id": sid}))
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert proc.stdout == encoded(expected)


def test_unknown_method(shared_daemon: DaemonProcess, transport: str) -> None:
    proc = call(shared_daemon, transport, "no.such.method")
    expected = rpc_error(shared_daemon, "no.such.method", None)
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr == encoded(expected)
    assert expected["code"] == -32601
    assert expected["data"]["method"] == "no.such.method"


@pytest.mark.parametrize(("params", "path"), [
    ({"session_id": 5}, "$.session_id"),
    ({"session_id": "ok", "budget": {"warn": 2}}, "$.budget.warn"),
    ({"sesion_id": "typo"}, "$"),
])
def test_bad_params(shared_daemon: DaemonProcess, transport: str, params: dict[str, Any],
                    path: str) -> None:
    proc = call(shared_daemon, transport, "session.open", json.dumps(params))
    expected = rpc_error(shared_daemon, "session.open", params)
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr == encoded(expected)
    assert (expected["code"], expected["data"]["path"]) == (-32602, path)


@pytest.mark.parametrize("params", [
    '{"session_id": ',
    '{"session_id": "a\nb"}',  # a raw newline inside a string is not JSON
    "",
])
def test_invalid_json_params_are_a_parse_error(shared_daemon: DaemonProcess, transport: str,
                                               params: str) -> None:
    proc = call(shared_daemon, transport, "session.open", params)
    assert (proc.returncode, proc.stdout) == (1, b"")
    error = json.loads(proc.stderr)
    assert (error["code"], error["data"]) == (-32700, {"fix": "send valid UTF-8 JSON"})
    assert error["message"].startswith("parse error: JSON is malformed: ")


def test_a_lone_surrogate_in_params_is_stored_as_u_fffd(shared_daemon: DaemonProcess,
                                                        transport: str, sid: str) -> None:
    """docs/protocol.md, "Framing": the params go as written, and the daemon reads the
    escape of half an emoji as U+FFFD."""
    ok(call(shared_daemon, transport, "session.open", json.dumps({"session_id": sid})))
    appended = call(shared_daemon, transport, "message.append", json.dumps(
        {"session_id": sid, "messages": [{"role": "user", "content": "cut \ud83d"}]}))
    assert ok(appended)["appended"][0]["seq"] == 1
    listed = ok(call(shared_daemon, transport, "message.list", json.dumps({"session_id": sid})))
    assert [m["content"] for m in listed["messages"]] == ["cut \ufffd"]


def test_raw_newlines_between_tokens_are_whitespace(shared_daemon: DaemonProcess,
                                                    transport: str, sid: str) -> None:
    proc = call(shared_daemon, transport, "session.open",
                '{\n"session_id":\n"' + sid + '"\r\n}\n')
    assert ok(proc)["session"]["session_id"] == sid


def test_error_without_an_id(daemon_root: Path, transport: str) -> None:
    # max_connections = 1 and one connection held (a subscriber: never dropped as idle):
    # ctxd answers the next with -32007 (id null, sent before anything is read) and
    # closes it.
    process = DaemonProcess(daemon_root, extra_args=["--max-connections", "1"]).start()
    try:
        deadline = time.monotonic() + 10
        while True:  # the start-up check's connection may not be gone yet
            held = process.client()
            try:
                held.call("events.subscribe", {"session_id": "nobody"})
                break
            except DaemonUnavailable:
                held.close()
                assert time.monotonic() < deadline
                time.sleep(0.02)
        with held:
            proc = call(process, transport, "daemon.ping")
    finally:
        process.stop()
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr == encoded({
        "code": -32007, "message": "overloaded: too many connections; retry later",
        "data": {"limit": "max_connections", "max": 1,
                 "fix": "retry after a moment with fewer requests"}})


@pytest.fixture
def dead_socket(daemon_root: Path) -> Path:
    """A socket file nobody listens on (what a daemon killed with SIGKILL leaves)."""
    path = daemon_root / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
    return path


def test_no_daemon(daemon_root: Path, transport: str) -> None:
    path = daemon_root / "nothing" / "ctxd.sock"
    proc = run("-s", str(path), "daemon.ping", env=base_env(CTXD_CALL_TRANSPORT=transport))
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == (f"ctxd-call: no ctxd daemon is running on {path} "
                                    f"(no such socket); start it with `ctxd --socket {path}`\n")


def test_no_daemon_on_a_path_to_quote(daemon_root: Path) -> None:
    folder = daemon_root / "it's here"
    folder.mkdir(mode=0o700)
    path = folder / "ctxd.sock"
    quoted = "'" + str(path).replace("'", "'\\''") + "'"  # as a shell reads it
    proc = run("-s", str(path), "daemon.ping")
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == (f"ctxd-call: no ctxd daemon is running on {path} "
                                    f"(no such socket); start it with "
                                    f"`ctxd --socket {quoted}`\n")


def test_stale_socket(dead_socket: Path, transport: str) -> None:
    proc = run("-s", str(dead_socket), "daemon.ping",
               env=base_env(CTXD_CALL_TRANSPORT=transport))
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == (f"ctxd-call: no ctxd daemon is running on {dead_socket} "
                                    "(cannot connect); start it with "
                                    f"`ctxd --socket {dead_socket}`\n")


def test_not_a_socket(daemon_root: Path) -> None:
    path = daemon_root / "file"
    path.write_text("")
    proc = run("-s", str(path), "daemon.ping")
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == (f"ctxd-call: no ctxd daemon is running on {path} "
                                    f"(not a socket); start it with `ctxd --socket {path}`\n")


@pytest.mark.parametrize("where", ["open-mode", "shared"])
def test_a_socket_others_could_have_placed_is_refused_naming_the_fix(
        tmp_path: Path, transport: str, where: str) -> None:
    # docs/decisions.md, "Who serves the socket": a given path is held to the rule too.
    with placed_by_others(tmp_path, where) as (path, reason):
        proc = run("-s", str(path), "daemon.ping",
                   env=base_env(CTXD_CALL_TRANSPORT=transport))
        assert (proc.returncode, proc.stdout, proc.stderr.decode()) == (
            2, b"", f"ctxd-call: {reason}\n")


def test_no_answer_within_the_timeout(daemon_root: Path, transport: str) -> None:
    path = daemon_root / "mute.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(str(path))
        mute.listen(4)  # never accepts: connecting works, nothing ever answers
        proc = run("-s", str(path), "-t", "0.2", "daemon.ping",
                   env=base_env(CTXD_CALL_TRANSPORT=transport))
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == (f"ctxd-call: ctxd on {path} did not answer "
                                    "within 0.2 s\n")


def test_socket_path_with_special_characters(transport: str) -> None:
    # socat gives , : ! quotes and brackets a meaning in addresses; all must be escaped.
    root = Path(tempfile.mkdtemp(prefix="ctxd-t s,p:e'c\"i!!a(l)[", dir="/tmp"))
    process = DaemonProcess(root).start()
    try:
        result = ok(call(process, transport, "daemon.ping"))
    finally:
        process.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert result["pong"] is True


USAGE_HINT = "Try 'ctxd-call -h' for help.\n"


@pytest.mark.parametrize(("argv", "message"), [
    ([], "METHOD is missing"),
    (["daemon.ping", "{}", "extra"], "too many arguments (quote JSON_PARAMS as one argument)"),
    (["-x", "daemon.ping"], "unknown option -x"),
    (["-s"], "option -s needs a value"),
    (['bad"method'], "METHOD must be a method name such as daemon.ping"),
    (["bad\\method"], "METHOD must be a method name such as daemon.ping"),
    (["bad\tmethod"], "METHOD must be a method name such as daemon.ping"),
    ([""], "METHOD must be a method name such as daemon.ping"),
    (["-t", "soon", "daemon.ping"], "-t needs a number of seconds, such as 5 or 0.5"),
    (["-t", "1.2.3", "daemon.ping"], "-t needs a number of seconds, such as 5 or 0.5"),
])
def test_bad_usage(argv: list[str], message: str) -> None:
    proc = run(*argv)
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == f"ctxd-call: {message}\n{USAGE_HINT}"


def test_bad_transport(shared_daemon: DaemonProcess) -> None:
    proc = run("-s", str(shared_daemon.socket), "daemon.ping",
               env=base_env(CTXD_CALL_TRANSPORT="pigeon"))
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == ("ctxd-call: CTXD_CALL_TRANSPORT must be socat or python, "
                                    f"not 'pigeon'\n{USAGE_HINT}")


def test_help() -> None:
    proc = run("-h")
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert proc.stdout.startswith(
        b"usage: ctxd-call [-s SOCKET] [-t SECONDS] METHOD [JSON_PARAMS | -]\n")


def test_is_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)


@needs("shellcheck")
def test_shellcheck_is_clean() -> None:
    proc = subprocess.run(["shellcheck", "--shell=sh", str(SCRIPT)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize("shell", [pytest.param(["dash"], marks=needs("dash")),
                                   ["bash", "--posix"],
                                   pytest.param(["busybox", "sh"], marks=needs("busybox"))],
                         ids=["dash", "bash-posix", "busybox"])
def test_runs_under_posix_shells(shared_daemon: DaemonProcess, shell: list[str],
                                 sid: str) -> None:
    proc = run("-s", str(shared_daemon.socket), "session.open",
               json.dumps({"session_id": sid, "title": TRICKY}), shell=shell)
    assert ok(proc)["session"]["title"] == TRICKY
    proc = run("-s", str(shared_daemon.socket), "no.such", shell=shell)
    assert (proc.returncode, json.loads(proc.stderr)["code"]) == (1, -32601)


# ---- which socket, which transport --------------------------------------------------

@pytest.mark.parametrize("environ", [
    {"CTXD_SOCKET": "/nonexistent/a/ctxd.sock", "XDG_RUNTIME_DIR": "/nonexistent/run"},
    {"CTXD_SOCKET": "", "XDG_RUNTIME_DIR": "/nonexistent/run"},
    {"XDG_RUNTIME_DIR": "/nonexistent/run"},
    {},
], ids=["CTXD_SOCKET", "empty-CTXD_SOCKET", "XDG_RUNTIME_DIR", "neither"])
def test_socket_is_resolved_like_the_daemon(environ: dict[str, str]) -> None:
    expected = default_socket_path(environ)
    if expected.exists():
        pytest.skip(f"{expected} exists here; this check needs the path to be free")
    proc = run("daemon.ping", env=base_env(**environ))
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == (f"ctxd-call: no ctxd daemon is running on {expected} "
                                    "(no such socket); start it with `ctxd`\n")


def test_reaches_the_daemon_through_ctxd_socket(shared_daemon: DaemonProcess) -> None:
    proc = run("daemon.ping", env=base_env(CTXD_SOCKET=str(shared_daemon.socket),
                                           XDG_RUNTIME_DIR="/nonexistent/run"))
    assert ok(proc)["pong"] is True


def test_reaches_the_daemon_through_xdg_runtime_dir(shared_daemon: DaemonProcess,
                                                    daemon_root: Path) -> None:
    (daemon_root / "ctxd").mkdir(mode=0o700)
    (daemon_root / "ctxd" / "ctxd.sock").symlink_to(shared_daemon.socket)
    proc = run("daemon.ping", env=base_env(XDG_RUNTIME_DIR=str(daemon_root)))
    assert ok(proc)["pong"] is True


def test_socket_option_wins_over_the_environment(shared_daemon: DaemonProcess) -> None:
    proc = run("-s", str(shared_daemon.socket), "daemon.ping",
               env=base_env(CTXD_SOCKET="/nonexistent/ctxd.sock"))
    assert ok(proc)["pong"] is True


def tool_dir(root: Path, tools: list[str], socat_log: Path | None = None) -> Path:
    """A PATH directory with only ``tools`` (and a logging ``socat`` when asked)."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for tool in tools:
        found = sys.executable if tool == "python3" else shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    if socat_log is not None:
        real = shutil.which("socat")
        assert real is not None
        wrapper = bin_dir / "socat"
        wrapper.write_text(f'#!/bin/sh\necho used >> "{socat_log}"\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    return bin_dir


BASIC_TOOLS = ["id", "tr", "sed", "ls", "mktemp", "mkfifo", "rm"]


@needs("socat")
@pytest.mark.parametrize(("forced", "socat_used"), [(None, True), ("socat", True),
                                                     ("python", False)])
def test_socat_is_preferred(shared_daemon: DaemonProcess, daemon_root: Path,
                            forced: str | None, socat_used: bool) -> None:
    log = daemon_root / "socat.log"
    bin_dir = tool_dir(daemon_root, [*BASIC_TOOLS, "python3"], socat_log=log)
    env = base_env(PATH=str(bin_dir))
    if forced:
        env["CTXD_CALL_TRANSPORT"] = forced
    assert ok(run("-s", str(shared_daemon.socket), "daemon.ping", env=env))["pong"] is True
    assert log.exists() is socat_used


def test_python_is_the_fallback(shared_daemon: DaemonProcess, daemon_root: Path) -> None:
    bin_dir = tool_dir(daemon_root, [*BASIC_TOOLS, "python3"])
    proc = run("-s", str(shared_daemon.socket), "daemon.ping",
               env=base_env(PATH=str(bin_dir)))
    assert ok(proc)["pong"] is True


@pytest.mark.parametrize(("forced", "message"), [
    (None, "needs socat or python3 on PATH to talk to ctxd"),
    ("python", "needs socat or python3 on PATH to talk to ctxd"),
    ("socat", "CTXD_CALL_TRANSPORT=socat but socat is not on PATH"),
])
def test_no_transport(shared_daemon: DaemonProcess, daemon_root: Path, forced: str | None,
                      message: str) -> None:
    env = base_env(PATH=str(tool_dir(daemon_root, BASIC_TOOLS)))
    if forced:
        env["CTXD_CALL_TRANSPORT"] = forced
    proc = run("-s", str(shared_daemon.socket), "daemon.ping", env=env)
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == f"ctxd-call: {message}\n"
