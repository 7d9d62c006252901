"""The gateway killed at each commit of its model requests (tests/kill_at_commit.py): a
real daemon SIGKILLed before and after every write its rewrite makes, for a script of
two conversations that share a session's start (so one request starts a line of its own
and the next goes back to the other line), then started again and sent the rest of the
script, as an agent retries. The scripted provider must receive, call for call, the
bodies an unkilled daemon sends, and the session hold the same messages."""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import DaemonProcess, kill_leftovers, short_root
from gateway_upstream import ModelUpstream
from kill_at_commit import KILL_AT_COMMIT

SESSION = "killed-conversations"
BIG = "\n".join(f"line {n:04d} of the test log" for n in range(300))


def history(letter: str, turns: int) -> list[dict[str, Any]]:
    """A conversation's messages after ``turns`` turns: a Bash call with a large result
    (offloaded) and a word each."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Run the tests."}]
    for turn in range(turns):
        call_id = f"toolu_{letter}{turn}"
        messages += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": call_id,
                                               "name": "Bash", "input": {"command": "make"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                          "content": f"{letter}{turn}\n{BIG}"}]}]
    return messages


# One conversation's turn, then another with the same start (a new line), then the first
# again (found in SQLite after a restart), then the second.
SCRIPT = [history("a", 1), history("b", 1), history("a", 2), history("b", 2)]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ModelUpstream]:
    with ModelUpstream() as server:
        yield server


def send(daemon: DaemonProcess, messages: list[dict[str, Any]]) -> None:
    """One model request through the gateway (raises OSError when the daemon dies)."""
    with daemon.client() as client:
        gateway = client.call("daemon.status")["gateway"]
    host, port = gateway["listen"].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", urlsplit(gateway["base_url"]).path + "/v1/messages",
                           body=json.dumps({"model": "claude-test", "max_tokens": 10,
                                            "system": "You run tests.",
                                            "messages": messages}),
                           headers={"content-type": "application/json",
                                    "anthropic-version": "2023-06-01",
                                    "x-api-key": "sk-ant-dummy", "x-ctxd-session": SESSION})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        response.read()
    finally:
        connection.close()


def sent_until_killed(daemon: DaemonProcess) -> int:
    """How many of the script's requests were answered before the daemon died."""
    for done, messages in enumerate(SCRIPT):
        try:
            send(daemon, messages)
        except ConnectionError:  # the daemon killed itself mid-request
            return done
    raise AssertionError("the daemon was not killed")


def messages_of(daemon: DaemonProcess) -> list[tuple[str, Any]]:
    with daemon.client() as client:
        listed = client.call("message.list", {"session_id": SESSION, "limit": 1000})
    return [(m["role"], m["content"]) for m in listed["messages"]]


def test_a_kill_at_any_commit_of_the_gateway_changes_nothing_the_model_receives(
        upstream: ModelUpstream) -> None:
    roots: list[Path] = []

    def daemon(**env: str) -> DaemonProcess:
        root = short_root()
        roots.append(root)
        return DaemonProcess(root, entry=[KILL_AT_COMMIT], env={
            "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": upstream.origin,
            "TEST_KILL_SESSION": SESSION, **env})

    try:
        log = Path(short_root()) / "commits"
        log.parent.mkdir(exist_ok=True)
        roots.append(log.parent)
        upstream.script.received.clear()
        with daemon(TEST_COMMIT_LOG=str(log)).running() as whole:
            for messages in SCRIPT:
                send(whole, messages)
            reference = messages_of(whole)
        expected = [received.body for received in upstream.script.received]
        commits = len(log.read_text().splitlines())
        # The session opened, then each request's one transaction.
        assert commits == 1 + len(SCRIPT)
        for when, number in [("before", n) for n in range(1, commits + 1)] + [
                ("after", n) for n in range(1, commits + 1)]:
            upstream.script.received.clear()
            killed = daemon(TEST_KILL_AT_COMMIT=f"{when}:{number}").start()
            done = sent_until_killed(killed)
            assert killed.proc is not None
            assert killed.proc.wait(20) == -9
            again = DaemonProcess(killed.root, env={
                "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": upstream.origin})
            with again.running():
                for messages in SCRIPT[done:]:  # the agent sends its failed call again
                    send(again, messages)
                assert messages_of(again) == reference, (when, number)
            assert [r.body for r in upstream.script.received] == expected, (when, number)
    finally:
        for root in roots:
            kill_leftovers(root)
            shutil.rmtree(root, ignore_errors=True)
