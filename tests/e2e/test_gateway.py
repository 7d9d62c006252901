"""The model gateway against a real daemon, with the official anthropic and openai SDKs as
its clients and a scripted provider (tests/gateway_upstream.py) as its upstream: what the
provider received, what the SDK got back, the usage recorded once per response, the
refusals (token, Origin, Host, size), upstream errors and a stream cut off passed on, and
the socket answering while 50 streams are in flight."""

from __future__ import annotations

import concurrent.futures
import http.client
import itertools
import json
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import DaemonProcess, kill_leftovers, short_root
from gateway_upstream import (
    OPENAI_USAGE,
    REPLY_TEXT,
    USAGE,
    Failure,
    ModelUpstream,
)
from tests_support import next_event

if TYPE_CHECKING:
    # Imported where used: the SDKs take over 2 s of CPU to import, which every
    # pytest-xdist worker would spend collecting this module, not only the one running it.
    import anthropic
    import openai

MAX_BODY_BYTES = 64 * 1024
HOP_BY_HOP = ("connection", "keep-alive", "te", "trailer", "proxy-authorization", "upgrade")
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ModelUpstream]:
    with ModelUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway_daemon(upstream: ModelUpstream) -> Iterator[DaemonProcess]:
    root = short_root()
    process = DaemonProcess(root, env={
        "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": upstream.origin,
        "CTXD_GATEWAY_OPENAI_UPSTREAM": upstream.origin,
        "CTXD_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        # A turn cancel the agent does not answer ends after half a second
        # (test_an_unanswered_turn_cancel_terminates_the_turn_and_its_model_call).
        "CTXD_CANCEL_TIMEOUT_S": "0.5"}).start()
    yield process
    process.stop()
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def script(upstream: ModelUpstream, sid: str) -> ModelUpstream:
    """The upstream, its record emptied and its response id fresh for the test."""
    upstream.script.received.clear()
    upstream.script.failures.clear()
    upstream.script.response_id = "msg_" + sid
    return upstream


def gateway_status(daemon: DaemonProcess) -> dict[str, Any]:
    with daemon.client() as client:
        return client.call("daemon.status")["gateway"]  # type: ignore[no-any-return]


def base_url(daemon: DaemonProcess) -> str:
    return gateway_status(daemon)["base_url"]  # type: ignore[no-any-return]


class Clients:
    """The SDK clients a test makes, closed after it."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.base_url = base_url(daemon)
        self.made: list[anthropic.Anthropic | openai.OpenAI] = []

    def claude(self, sid: str) -> anthropic.Anthropic:
        import anthropic
        client = anthropic.Anthropic(
            base_url=self.base_url, api_key="sk-ant-secret", max_retries=0,
            default_headers={"x-api-key": "sk-ant-key", "anthropic-beta": "beta-1",
                             "x-ctxd-session": sid})
        self.made.append(client)
        return client

    def gpt(self, sid: str) -> openai.OpenAI:
        import openai
        client = openai.OpenAI(base_url=self.base_url + "/v1", api_key="sk-openai-secret",
                               max_retries=0, default_headers={"x-ctxd-session": sid})
        self.made.append(client)
        return client


@pytest.fixture
def sdk(gateway_daemon: DaemonProcess) -> Iterator[Clients]:
    clients = Clients(gateway_daemon)
    yield clients
    for client in clients.made:
        client.close()


def usage_totals(daemon: DaemonProcess, sid: str) -> dict[str, int]:
    with daemon.client() as client:
        return client.call("usage.get", {"session_id": sid})["totals"]  # type: ignore[no-any-return]


class Calls:
    """The ``gateway.call`` events of one session (or of all), as they come: each is
    published once its call's usage is recorded, so waiting for them is waiting for the
    ledger (the agent has its answer a moment before)."""

    def __init__(self, daemon: DaemonProcess, sid: str | None) -> None:
        self.daemon, self.sid = daemon, sid
        self.watcher = daemon.client()
        self.watcher.call("events.subscribe", {"types": ["gateway.call"],
                                               **({"session_id": sid} if sid else {})})

    def wait(self, calls: int) -> list[dict[str, Any]]:
        return [next_event(self.watcher, timeout=60)["data"] for _ in range(calls)]

    def totals_after(self, calls: int) -> dict[str, int]:
        """The session's usage totals once ``calls`` calls were accounted."""
        self.wait(calls)
        assert self.sid is not None
        return usage_totals(self.daemon, self.sid)


@pytest.fixture
def calls(gateway_daemon: DaemonProcess, sid: str) -> Iterator[Calls]:
    watched = Calls(gateway_daemon, sid)
    yield watched
    watched.watcher.close()


def raw_request(daemon: DaemonProcess, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host, port = gateway_status(daemon)["listen"].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def token_path(daemon: DaemonProcess) -> str:
    return "/" + base_url(daemon).rsplit("/", 1)[1]


# ---- Anthropic ----------------------------------------------------------------------


def test_anthropic_message_goes_through_with_its_headers(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str,
        calls: Calls) -> None:
    message = sdk.claude(sid).messages.create(
        model="claude-test", max_tokens=10, messages=USER,
        extra_headers={"Keep-Alive": "timeout=5", "TE": "trailers"})
    assert (message.id, message.content[0].text) == ("msg_" + sid, REPLY_TEXT)  # type: ignore[union-attr]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (21, 7)
    [received] = script.received
    assert (received.method, received.path) == ("POST", "/v1/messages")
    assert received.json() == {"model": "claude-test", "max_tokens": 10, "messages": USER}
    headers = received.headers
    assert (headers["x-api-key"], headers["authorization"], headers["anthropic-beta"]) == (
        "sk-ant-key", "Bearer sk-ant-secret", "beta-1")
    assert headers["anthropic-version"].startswith("20")
    assert headers["host"] == f"127.0.0.1:{script.port}"
    assert headers["content-length"] == str(len(received.body))
    assert [name for name in (*HOP_BY_HOP, "x-ctxd-session") if name in headers] == []
    assert calls.totals_after(1) == {
        "input_tokens": 21, "output_tokens": 7, "cache_read_tokens": 5,
        "cache_write_tokens": 3, "thinking_tokens": 0, "calls": 1}


def test_a_repeated_response_id_is_counted_once(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str,
        calls: Calls) -> None:
    client = sdk.claude(sid)
    for _ in range(3):
        client.messages.create(model="claude-test", max_tokens=10, messages=USER)
    assert len(script.received) == 3
    assert calls.totals_after(3)["calls"] == 1
    with gateway_daemon.client() as socket_client:
        usage = socket_client.call("usage.get", {"session_id": sid})
    sent = usage["calibration"]["local_input_tokens"]
    [last] = [call for call in gateway_status(gateway_daemon)["sessions"]
              if call["session_id"] == sid]
    assert last == {
        "session_id": sid, "model": "claude-test", "last_call_at": last["last_call_at"],
        "sent_tokens": sent, "removed_tokens": 0, "input_tokens": 21, "output_tokens": 7,
        "cache_read_tokens": 5, "cache_write_tokens": 3,
        "cost": round(21 + 7 * 5 + 5 * 0.1 + 3 * 1.25, 2)}
    assert sent > 0


def test_anthropic_stream_arrives_and_its_usage_is_recorded(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str,
        calls: Calls) -> None:
    with sdk.claude(sid).messages.stream(
            model="claude-test", max_tokens=10, messages=USER) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == ["hello ", "from the model"]
    assert (final.id, final.usage.input_tokens, final.usage.output_tokens) == (
        "msg_" + sid, 21, 7)
    assert script.received[0].json()["stream"] is True
    assert calls.totals_after(1) == {
        "input_tokens": 21, "output_tokens": USAGE["output_tokens"], "cache_read_tokens": 5,
        "cache_write_tokens": 3, "thinking_tokens": 0, "calls": 1}


def test_keys_reach_no_log_event_or_file(
        gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str) -> None:
    import anthropic
    canary = "sk-ant-canary-" + sid
    with gateway_daemon.client() as watcher:
        watcher.call("events.subscribe", {"session_id": sid})
        with anthropic.Anthropic(base_url=base_url(gateway_daemon), api_key=canary,
                                 max_retries=0, default_headers={
                                     "x-api-key": canary, "x-ctxd-session": sid}) as client:
            client.messages.create(model="claude-test", max_tokens=10, messages=USER)
            client.messages.count_tokens(model="claude-test", messages=USER)
        events = []
        while not events or events[-1]["type"] != "gateway.call":
            events.append(next_event(watcher, timeout=60))
    assert script.received[0].headers["x-api-key"] == canary  # it did pass through
    assert {"gateway.call_started", "usage.recorded", "gateway.call"} <= {
        event["type"] for event in events}
    assert canary not in json.dumps(events)
    assert canary not in gateway_daemon.log()
    stored = [path.name for path in gateway_daemon.data_dir.iterdir()
              if path.is_file() and canary.encode() in path.read_bytes()]
    assert stored == []


def test_count_tokens_goes_through_and_records_nothing(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str) -> None:
    counted = sdk.claude(sid).messages.count_tokens(model="claude-test",
                                                                messages=USER)
    assert counted.input_tokens == 42
    assert [(r.path, r.json()) for r in script.received] == [
        ("/v1/messages/count_tokens", {"model": "claude-test", "messages": USER})]
    assert usage_totals(gateway_daemon, sid)["calls"] == 0


# ---- OpenAI -------------------------------------------------------------------------


def test_openai_completion_goes_through(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str,
        calls: Calls) -> None:
    completion = sdk.gpt(sid).chat.completions.create(model="gpt-test",
                                                                  messages=USER)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == REPLY_TEXT
    [received] = script.received
    assert (received.path, received.json()) == ("/v1/chat/completions",
                                                 {"model": "gpt-test", "messages": USER})
    assert received.headers["authorization"] == "Bearer sk-openai-secret"
    assert "anthropic-version" not in received.headers
    cached = OPENAI_USAGE["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
    assert calls.totals_after(1) == {
        "input_tokens": 30 - cached, "output_tokens": 9, "cache_read_tokens": cached,
        "cache_write_tokens": 0, "thinking_tokens": 0, "calls": 1}


def test_openai_stream_with_usage(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str,
        calls: Calls) -> None:
    chunks = list(sdk.gpt(sid).chat.completions.create(
        model="gpt-test", messages=USER, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == REPLY_TEXT
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 30
    assert calls.totals_after(1)["calls"] == 1


def test_other_paths_pass_through_unchanged(
        gateway_daemon: DaemonProcess, script: ModelUpstream) -> None:
    status, body = raw_request(gateway_daemon, "GET",
                               token_path(gateway_daemon) + "/v1/models?limit=2",
                               headers={"anthropic-version": "2023-06-01"})
    assert (status, json.loads(body)) == (200, {"data": [], "path": "/v1/models?limit=2"})
    assert [(r.method, r.path) for r in script.received] == [("GET", "/v1/models?limit=2")]


def test_health_is_answered_by_the_gateway(
        gateway_daemon: DaemonProcess, script: ModelUpstream) -> None:
    status, body = raw_request(gateway_daemon, "GET",
                               token_path(gateway_daemon) + "/_ctxd/health")
    with gateway_daemon.client() as client:
        version = client.call("daemon.status")["version"]
    assert (status, json.loads(body)) == (200, {"ok": True, "version": version,
                                                "session_id": None})
    assert script.received == []


# ---- refusals -----------------------------------------------------------------------


def test_a_wrong_or_missing_token_is_not_found(
        gateway_daemon: DaemonProcess, script: ModelUpstream) -> None:
    token = token_path(gateway_daemon)
    answers = {raw_request(gateway_daemon, "POST", path, b"{}")
               for path in ("/v1/messages", token[:-1] + "/v1/messages",
                            token + "x/v1/messages", "/", "/_ctxd/health")}
    assert answers == {(404, b'{"type":"error","error":{"type":"not_found_error",'
                              b'"message":"Not found"}}')}
    assert script.received == []


@pytest.mark.parametrize("headers", [{"Origin": "http://127.0.0.1"},
                                     {"Origin": "null"},
                                     {"Host": "evil.example:8788"},
                                     {"Host": "10.0.0.1"}])
def test_a_browser_or_another_host_is_refused(
        gateway_daemon: DaemonProcess, script: ModelUpstream, headers: dict[str, str]) -> None:
    status, body = raw_request(gateway_daemon, "POST",
                               token_path(gateway_daemon) + "/v1/messages", b"{}", headers)
    assert status == 403
    assert json.loads(body)["error"]["type"] == "permission_error"
    assert script.received == []


def test_a_body_too_large_is_refused(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str) -> None:
    import anthropic
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk.claude(sid).messages.create(
            model="claude-test", max_tokens=10,
            messages=[{"role": "user", "content": "x" * MAX_BODY_BYTES}])
    assert caught.value.status_code == 413
    assert script.received == []


# ---- failures -----------------------------------------------------------------------


@pytest.mark.parametrize(("status", "kind"), [(529, "overloaded_error"), (500, "api_error"),
                                              (400, "invalid_request_error")])
def test_upstream_errors_reach_the_client_unchanged(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str, status: int,
        kind: str, calls: Calls) -> None:
    import anthropic
    import openai
    body = json.dumps({"type": "error", "error": {"type": kind, "message": f"m{status}"}})
    script.script.failures.append(Failure(status=status, body=body.encode()))
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk.claude(sid).messages.create(model="claude-test", max_tokens=10,
                                                    messages=USER)
    assert (caught.value.status_code, caught.value.response.text) == (status, body)
    script.script.failures.append(Failure(status=status, body=body.encode()))
    with pytest.raises(openai.APIStatusError) as caught_openai:
        sdk.gpt(sid).chat.completions.create(model="gpt-test", messages=USER)  # type: ignore[arg-type]
    assert (caught_openai.value.status_code, caught_openai.value.response.text) == (
        status, body)
    assert calls.totals_after(2)["calls"] == 0


def test_a_stream_cut_off_upstream_ends_with_an_error(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str) -> None:
    import anthropic
    import openai
    script.script.failures.append(Failure(cut_after=3))
    texts: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk.claude(sid).messages.stream(
                model="claude-test", max_tokens=10, messages=USER) as stream:
            texts.extend(stream.text_stream)
    assert texts == ["hello "]
    assert "upstream connection was lost" in str(caught.value)
    script.script.failures.append(Failure(cut_after=1))
    with pytest.raises(openai.APIError) as caught_openai:
        for _ in sdk.gpt(sid).chat.completions.create(
                model="gpt-test", messages=USER, stream=True):  # type: ignore[arg-type]
            pass
    assert "upstream connection was lost" in str(caught_openai.value)
    # The connection still serves.
    message = sdk.claude(sid).messages.create(model="claude-test", max_tokens=10,
                                                          messages=USER)
    assert message.content[0].text == REPLY_TEXT  # type: ignore[union-attr]


def test_the_socket_answers_while_50_streams_are_in_flight(
        gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str) -> None:
    import anthropic
    hold = script.script.hold = threading.Event()
    streams = 50
    base = base_url(gateway_daemon)
    every_call = Calls(gateway_daemon, None)

    def one_stream(index: int) -> str:
        with anthropic.Anthropic(base_url=base, api_key="k", max_retries=0,
                                 default_headers={"x-ctxd-session": f"{sid}_{index}"}
                                 ) as client, client.messages.stream(
                model="claude-test", max_tokens=10, messages=USER) as stream:
            return "".join(stream.text_stream)

    try:
        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            futures = [pool.submit(one_stream, index) for index in range(streams)]
            for _ in range(streams):  # every stream has sent its first event and waits
                assert script.script.holding.acquire(timeout=60)
            with gateway_daemon.client() as client:
                pong = client.call("daemon.ping")
                inflight = client.call("daemon.status")["gateway"]
            assert pong["pong"] is True
            assert not any(future.done() for future in futures)
            hold.set()
            assert [future.result(timeout=60) for future in futures] == [REPLY_TEXT] * streams
    finally:
        hold.set()
        script.script.hold = None
    done: list[dict[str, Any]] = []
    try:
        # The subscription is to every session's calls: a call of an earlier test of this
        # module's daemon may still be accounted while these streams run.
        while len(done) < streams:
            done += [call for call in every_call.wait(1)
                     if call["session_id"].startswith(f"{sid}_")]
    finally:
        every_call.watcher.close()
    assert sorted(call["session_id"] for call in done) == sorted(
        f"{sid}_{index}" for index in range(streams))
    assert (len(inflight["inflight"]), gateway_status(gateway_daemon)["calls"]) == (
        streams, inflight["calls"] + streams)


def test_a_call_cancelled_before_its_answer_gets_499(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str,
        calls: Calls) -> None:
    import openai
    hold = script.script.hold_answer = threading.Event()
    outcome: list[BaseException] = []
    client = sdk.gpt(sid)

    def one_call() -> None:
        try:
            client.chat.completions.create(model="gpt-test", messages=USER)  # type: ignore[arg-type]
        except openai.APIError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=one_call)
    try:
        worker.start()
        assert script.script.holding.acquire(timeout=60)
        [inflight] = gateway_status(gateway_daemon)["inflight"]
        with gateway_daemon.client() as socket_client:
            socket_client.call("request.cancel", {"request_id": inflight["call_id"]})
        worker.join(60)
    finally:
        hold.set()
        script.script.hold_answer = None
        worker.join(60)
    [error] = outcome
    assert isinstance(error, openai.APIStatusError)
    assert (error.status_code, error.response.json()) == (499, {"type": "error", "error": {
        "type": "cancelled",
        "message": f"ctxd gateway: request {inflight['call_id']!r} was cancelled"}})
    assert len(script.received) == 1  # the SDK did not send it again
    assert calls.totals_after(1)["calls"] == 0


# ---- start-up ------------------------------------------------------------------------


def test_a_disabled_gateway_is_null_in_the_status(daemon_root: Path) -> None:
    with DaemonProcess(daemon_root, env={"CTXD_GATEWAY_ENABLED": "false"}).running() as daemon:
        assert gateway_status(daemon) is None
        assert not (daemon.data_dir / "gateway.token").exists()


def test_a_taken_port_leaves_the_gateway_off_and_the_daemon_serving(daemon_root: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        process = DaemonProcess(daemon_root, env={"CTXD_GATEWAY_LISTEN": f"127.0.0.1:{port}"})
        with process.running() as daemon:
            with daemon.client() as client:
                status = client.call("daemon.status")
            ctxctl = [sys.executable, "-m", "ctxclient.cli", "--socket", str(daemon.socket)]
            shown, doctor, run = (subprocess.run([*ctxctl, *args], capture_output=True,
                                                 text=True, timeout=60, check=False)
                                  for args in (["status"], ["doctor"], ["run", "--", "true"]))
            log = daemon.log()
    off = (f"it cannot listen on 127.0.0.1:{port} (Address already in use); set [gateway] "
           "listen to a free port (0: any) and restart ctxd")
    assert (status["gateway"], status["gateway_off"]) == (None, off)
    assert f"ERROR ctxd: the gateway is off: {off}" in log
    # Every command says why, not that the gateway is disabled; doctor fails.
    assert f"gateway: off: {off}" in shown.stdout
    assert (doctor.returncode, f"gateway: off: {off}" in doctor.stdout) == (1, True)
    assert (run.returncode, run.stderr) == (
        125, f"ctxctl run: the daemon's model gateway is off: {off}\n")


def test_the_token_is_private_and_outlives_a_restart(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root)
    with process.running() as daemon:
        first = base_url(daemon)
    token_file = process.data_dir / "gateway.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    with process.running() as daemon:
        second = base_url(daemon)
    assert first.rsplit("/", 1)[1] == second.rsplit("/", 1)[1] == token_file.read_text().strip()


def test_request_cancel_stops_a_model_call_in_flight(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str,
        calls: Calls) -> None:
    import anthropic
    hold = script.script.hold = threading.Event()
    outcome: list[BaseException | list[str]] = []
    client = sdk.claude(sid)

    def one_stream() -> None:
        texts: list[str] = []
        try:
            with client.messages.stream(model="claude-test", max_tokens=10,
                                        messages=USER) as stream:
                texts.extend(stream.text_stream)
            outcome.append(texts)
        except anthropic.APIError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=one_stream)
    try:
        worker.start()
        assert script.script.holding.acquire(timeout=60)
        [inflight] = gateway_status(gateway_daemon)["inflight"]
        assert inflight == {"call_id": inflight["call_id"], "session_id": sid,
                            "model": "claude-test", "started_at": inflight["started_at"]}
        with gateway_daemon.client() as socket_client:
            answer = socket_client.call("request.cancel", {"request_id": inflight["call_id"],
                                                           "reason": "user stop"})
        assert answer == {"request_id": inflight["call_id"], "cancelled": 1, "finishing": 0}
        worker.join(60)
    finally:
        hold.set()
        script.script.hold = None
        worker.join(60)
    [error] = outcome
    assert isinstance(error, anthropic.APIStatusError)
    assert error.body == {"type": "error", "error": {"type": "cancelled", "message": (
        f"ctxd gateway: request {inflight['call_id']!r} was cancelled: user stop")}}
    # What the upstream said before the cancel is recorded (its input, the output so far).
    assert calls.totals_after(1)["input_tokens"] == USAGE["input_tokens"]
    assert gateway_status(gateway_daemon)["inflight"] == []


def wait_for_log(process: DaemonProcess, line: str) -> None:
    """Wait until the daemon has logged ``line`` (a guard of 60 s against a hang)."""
    deadline = time.monotonic() + 60
    while line not in process.log():
        assert time.monotonic() < deadline, process.log()
        time.sleep(0.01)


def test_a_stream_in_flight_finishes_before_the_daemon_stops(
        daemon_root: Path, script: ModelUpstream, sid: str) -> None:
    import anthropic
    process = DaemonProcess(daemon_root, env={
        "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": script.origin}).start()
    hold = script.script.hold = threading.Event()
    try:
        with anthropic.Anthropic(base_url=base_url(process), api_key="k", max_retries=0,
                                 default_headers={"x-ctxd-session": sid}) as client, \
                concurrent.futures.ThreadPoolExecutor(1) as pool:

            def one_stream() -> str:
                with client.messages.stream(model="claude-test", max_tokens=10,
                                            messages=USER) as stream:
                    return "".join(stream.text_stream)

            text = pool.submit(one_stream)
            assert script.script.holding.acquire(timeout=60)
            assert process.proc is not None
            process.proc.send_signal(signal.SIGTERM)
            wait_for_log(process, "ctxd stopping")  # it is shutting down, the call held
            hold.set()
            assert text.result(timeout=60) == REPLY_TEXT
            assert process.proc.wait(60) == 0
    finally:
        hold.set()
        script.script.hold = None
        process.stop()
    assert "ctxd stopping" in process.log()


def test_a_stream_still_in_flight_at_the_deadline_ends_with_an_error(
        daemon_root: Path, script: ModelUpstream, sid: str) -> None:
    import anthropic
    process = DaemonProcess(daemon_root, env={
        "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": script.origin,
        "CTXD_SHUTDOWN_TIMEOUT_S": "0"}).start()
    hold = script.script.hold = threading.Event()
    try:
        with anthropic.Anthropic(base_url=base_url(process), api_key="k", max_retries=0,
                                 default_headers={"x-ctxd-session": sid}) as client, \
                client.messages.stream(model="claude-test", max_tokens=10,
                                       messages=USER) as stream:
            events = iter(stream)
            assert next(events).type == "message_start"
            assert process.proc is not None
            process.proc.send_signal(signal.SIGTERM)
            with pytest.raises(anthropic.APIStatusError) as caught:
                list(events)
            assert process.proc.wait(60) == 0
    finally:
        hold.set()
        script.script.hold = None
        process.stop()
    assert caught.value.body == {"type": "error", "error": {
        "type": "cancelled",
        "message": "ctxd gateway: request 'gw_1' was cancelled: ctxd is stopping"}}


# ---- socket activation ----------------------------------------------------------------

# What systemd does between fork and exec for ctxd.socket's two ListenStream= lines: the
# Unix socket becomes fd 3, the gateway's TCP socket fd 4, and LISTEN_PID/LISTEN_FDS name
# this very process, which then becomes ctxd.
ACTIVATE_BOTH = """
import os, sys
unix, tcp = os.dup(int(sys.argv[1])), os.dup(int(sys.argv[2]))
os.dup2(unix, 3)
os.dup2(tcp, 4)
os.set_inheritable(3, True)
os.set_inheritable(4, True)
for fd in {unix, tcp, int(sys.argv[1]), int(sys.argv[2])} - {3, 4}:
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "2"
os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
"""


def test_the_gateway_port_is_taken_from_systemd(daemon_root: Path) -> None:
    (daemon_root / "run").mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as unix, \
            socket.create_server(("127.0.0.1", 0)) as tcp:
        unix.bind(str(daemon_root / "run" / "ctxd.sock"))
        unix.listen(16)
        port = tcp.getsockname()[1]
        process = DaemonProcess(daemon_root, entry=[
            "-c", ACTIVATE_BOTH, str(unix.fileno()), str(tcp.fileno()), "-P", "-m", "ctxd"])
        token = "k" * 43  # the one a previous run made, which the agent's URL holds
        process.data_dir.mkdir(mode=0o700)
        (process.data_dir / "gateway.token").write_text(token + "\n")
        (process.data_dir / "gateway.token").chmod(0o600)
        # The agent's request arrives while no ctxd runs: the port (systemd's) holds it,
        # and the ctxd it starts answers it.
        with socket.create_connection(("127.0.0.1", port), timeout=60) as early:
            early.sendall(f"GET /{token}/_ctxd/health HTTP/1.1\r\nHost: 127.0.0.1:{port}"
                          "\r\nConnection: close\r\n\r\n".encode())
            process.start(wait=False, pass_fds=(unix.fileno(), tcp.fileno()))
            try:
                process.wait_ready()
                answer = b""
                while chunk := early.recv(65536):
                    answer += chunk
                status = gateway_status(process)
            finally:
                assert process.stop() == 0
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["ok"] is True
    assert status["listen"] == f"127.0.0.1:{port}"
    assert "systemd-activated" in process.log()


def test_an_unanswered_turn_cancel_terminates_the_turn_and_its_model_call(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str) -> None:
    """An agent asked to stop a turn that never says it did (no turn.end): after
    ``cancel_timeout_s`` ctxd ends the turn itself, stops the session's model call in
    flight and logs it (docs/protocol.md, "Cancellation")."""
    import anthropic
    hold = script.script.hold = threading.Event()
    outcome: list[BaseException | list[str]] = []
    client = sdk.claude(sid)

    def one_stream() -> None:
        try:
            with client.messages.stream(model="claude-test", max_tokens=10,
                                        messages=USER) as stream:
                outcome.append(list(stream.text_stream))
        except anthropic.APIError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=one_stream)
    try:
        with gateway_daemon.client() as agent, gateway_daemon.client() as ui:
            agent.call("session.open", {"session_id": sid})
            agent.call("events.subscribe", {"session_id": sid, "types": ["turn.ended"]})
            agent.call("turn.start", {"session_id": sid, "turn_id": "t1"})
            worker.start()
            # The semaphore may hold releases of earlier tests' streams: wait for this one.
            deadline = time.monotonic() + 60
            while not (mine := [call for call in gateway_status(gateway_daemon)["inflight"]
                                if call["session_id"] == sid]):
                assert time.monotonic() < deadline, "the model call never started"
                script.script.holding.acquire(timeout=1)
            [inflight] = mine
            ui.call("turn.cancel", {"session_id": sid, "turn_id": "t1", "reason": "stop"})
            ended = next_event(agent, timeout=60)  # the agent never answers
            turn = ui.call("turn.get", {"session_id": sid, "turn_id": "t1"})
            late = agent.call("turn.list", {"session_id": sid})
        worker.join(60)
    finally:
        hold.set()
        script.script.hold = None
        worker.join(60)
    assert (ended["type"], ended["data"]) == ("turn.ended", {
        "turn_id": "t1", "cancelled": None, "cancel_requested": True, "terminated": True,
        "calls_stopped": 1})
    assert (turn["state"], turn["terminated"], turn["cancelled"]) == ("ended", True, None)
    assert late == {"turns": [turn]}
    [error] = outcome
    assert isinstance(error, anthropic.APIStatusError)
    assert error.body == {"type": "error", "error": {"type": "cancelled", "message": (
        f"ctxd gateway: request {inflight['call_id']!r} was cancelled: turn 't1' was "
        "terminated: its cancel had no answer")}}
    assert (f"turn 't1' of session '{sid}': no turn.end within 0.5 s of its cancel; "
            "terminated (1 model call(s) in flight stopped)") in gateway_daemon.log()


def test_a_tool_found_by_tool_search_is_offered_on_the_next_model_call(
        sdk: Clients, gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str) -> None:
    """An agent that offers ctxd's tool_search has its MCP tools deferred past the
    session's threshold (left out of what the model is sent); tool_search over MCP finds
    one, with its input schema, and the next model call offers it."""
    from e2e.test_mcp import initialize, raw
    from tests_support import hello_text

    def tool(name: str, words: str) -> dict[str, Any]:
        return {"name": name, "description": f"{words}. {hello_text(400)}",
                "input_schema": {"type": "object", "properties": {"text": {"type": "string"}},
                                 "required": ["text"]}}

    tools = [{"name": "Bash", "description": "Run a shell command.",
              "input_schema": {"type": "object", "properties": {
                  "command": {"type": "string"}}}},
             {"name": "mcp__ctxd__tool_search", "description": "Find deferred tools.",
              "input_schema": {"type": "object", "properties": {"query": {"type": "string"}},
                               "required": ["query"]}},
             {**tool("mcp__alpha__send", "Send an alpha signal"),
              "cache_control": {"type": "ephemeral"}},
             tool("mcp__beta__post", "Post a beta note"),
             tool("mcp__gamma__file", "File a gamma report")]
    searched = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{
                    "type": "tool_use", "id": "toolu_search", "name": "mcp__ctxd__tool_search",
                    "input": {"query": "alpha signal"}}]},
                {"role": "user", "content": [{"type": "tool_result",
                                              "tool_use_id": "toolu_search",
                                              "content": "found mcp__alpha__send"}]}]
    client = sdk.claude(sid)
    with gateway_daemon.client() as native:
        # An effective window of 10,000 tokens: the tools may take 1,000 of it.
        native.call("session.open", {"session_id": sid, "budget": {
            "context_window": 12_000, "max_output_tokens": 2_000}})
        client.messages.create(model="claude-test", max_tokens=10, tools=tools,  # type: ignore[arg-type]
                               messages=USER)
        with raw(gateway_daemon) as line:
            line.ask("mcp.bind", {"session_id": sid, "tools": ["tool_search"]})
            line.ask("initialize", initialize("2025-06-18"))
            found = line.ask("tools/call", {"name": "tool_search", "arguments": {
                "query": "alpha signal"}}, 2)["result"]["structuredContent"]
        client.messages.create(model="claude-test", max_tokens=10, tools=tools,  # type: ignore[arg-type]
                               messages=searched)
        registered = {tool["name"]: tool for tool in native.call(
            "ctxd.render", {"session_id": sid})["tools"]}
    first, second = (received.json()["tools"] for received in script.received)
    # 29 + 39 + 3 x 439 tokens of definitions, 1,000 allowed: alpha (the least recently
    # used MCP tool; never used: by name) is left out, and its cache mark moves to the
    # last tool kept, so the agent's tools stay one cached prefix.
    assert first == [tools[0], tools[1], tools[3], {**tools[4], "cache_control": {
        "type": "ephemeral"}}]
    assert [match["name"] for match in found["matches"]] == ["mcp__alpha__send"]
    assert found["matches"][0]["input_schema"] == tools[2]["input_schema"]
    # Promoted, alpha is offered (with its own mark); beta makes room for it.
    assert second == [tools[0], tools[1], tools[2], tools[4]]
    assert sorted(registered) == ["Bash", "mcp__alpha__send", "mcp__ctxd__tool_search",
                                  "mcp__gamma__file"]


def test_a_conversation_starts_with_only_the_memories_its_prompt_is_about(
        daemon_root: Path, script: ModelUpstream, sid: str) -> None:
    process = DaemonProcess(daemon_root, env={
        "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": script.origin}).start()
    clients = Clients(process)
    unrelated = "Is this a good test of the weather?"
    related = "Why is the tmp_path fixture flaky?"
    try:
        with process.client() as native:
            native.call("memory.record", {
                "title": "pytest flaky fixture", "content": "Run the tests with -p "
                "no:randomly when the tmp_path fixture is flaky; it is a test order issue."})
        for conversation, prompt in (("weather", unrelated), ("fixture", related)):
            clients.claude(f"{sid}-{conversation}").messages.create(
                model="claude-test", max_tokens=10,
                messages=[{"role": "user", "content": prompt}])
    finally:
        for client in clients.made:
            client.close()
        process.stop()
    weather, fixture = (received.json()["messages"] for received in script.received)
    # The model receives the first prompt as the agent sent it; the second with the memory.
    assert weather == [{"role": "user", "content": unrelated}]
    assert fixture == [{"role": "user", "content": [
        {"type": "text", "text": related},
        {"type": "text", "text": "Memories from earlier work that may help with this task:\n"
                                 "- pytest flaky fixture (confidence 0.80): Run the tests "
                                 "with -p no:randomly when the tmp_path fixture is flaky; it "
                                 "is a test order issue.\n"}]}]


def conversation(letter: str, turns: int) -> list[list[dict[str, Any]]]:
    """The histories an agent sends for one conversation, one per request: the shared
    first prompt, then per turn a Bash call whose large output ctxd offloads, and the
    model's words."""
    big = "\n".join(f"{letter}-line {n:05d} of the build log" for n in range(400))
    history: list[dict[str, Any]] = [{"role": "user", "content": "Read the build log."}]
    requests = [list(history)]
    for turn in range(1, turns):
        call_id = f"toolu_{letter}{turn}"
        history += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": call_id,
                                               "name": "Bash", "input": {"command": "cat"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                          "content": big}]},
            {"role": "assistant", "content": f"{letter} turn {turn} read."},
            {"role": "user", "content": f"Go on with {letter}, turn {turn}."}]
        requests.append(list(history))
    return requests


def test_parallel_conversations_with_one_start_keep_each_others_bytes(
        gateway_daemon: DaemonProcess, script: ModelUpstream, sid: str) -> None:
    import anthropic

    # No x-ctxd-session and no Claude Code id: both are one keyless session (the same
    # system prompt and first message), as two runs of one scripted task are.
    client = anthropic.Anthropic(base_url=base_url(gateway_daemon), api_key="sk-ant-dummy",
                                 max_retries=0)
    system = f"You are the build agent of {sid}."
    first, second = conversation("a", 4), conversation("b", 4)
    try:
        for a_history, b_history in zip(first, second, strict=True):
            for history in (a_history, b_history):
                client.messages.create(model="claude-test", max_tokens=10, system=system,
                                       messages=history)
    finally:
        client.close()
    received = [r.json()["messages"] for r in script.received]
    assert len(received) == 8
    for sent in (received[0::2], received[1::2]):  # each conversation's requests in turn
        # Every message the model was sent before is sent again as it was: the stubs
        # name the same refs, so the provider's cached prefix holds.
        for before, after in itertools.pairwise(sent):
            assert after[:len(before)] == before
        assert "line 00200 of" not in json.dumps(sent[-1])  # offloaded, as stubs
    assert received[3][:1] == received[2][:1]
    assert received[3][1:] != received[2][1:]


def test_doctor_says_which_upstream_the_gateway_cannot_reach(
        daemon_root: Path, script: ModelUpstream) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"
    process = DaemonProcess(daemon_root, env={"CTXD_GATEWAY_ANTHROPIC_UPSTREAM": script.origin,
                                              "CTXD_GATEWAY_OPENAI_UPSTREAM": nobody})
    with process.running() as daemon:
        doctor = subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket",
                                 str(daemon.socket), "doctor"], capture_output=True,
                                text=True, timeout=60, check=False)
        status, health = raw_request(daemon, "GET", token_path(daemon)
                                     + "/_ctxd/health?upstreams=1")
    # The scripted provider answers HEAD / with 501 (an answer all the same); the closed
    # port refuses the connection. Neither fails doctor: an API no agent uses may be
    # unreachable.
    assert (status, json.loads(health)["upstreams"]) == (200, [
        {"setting": "anthropic_upstream", "url": script.origin, "reached": True,
         "status": 501, "problem": None},
        {"setting": "openai_upstream", "url": nobody, "reached": False, "status": None,
         "problem": "could not be reached (ConnectError)"}])
    assert doctor.returncode == 0
    assert doctor.stdout.splitlines()[2:4] == [
        f"upstream {script.origin}: reached (HTTP 501)",
        f"upstream {nobody}: could not be reached (ConnectError)"]
    assert doctor.stderr == (
        "ctxctl: calls to an upstream out of reach fail (HTTP 502): check openai_upstream "
        "under [gateway], and the network (unless no agent of yours calls that API)\n")


def test_an_upstream_whose_every_connection_is_busy_is_still_reached(
        daemon_root: Path, script: ModelUpstream, sid: str) -> None:
    """The check has a client of its own: a stream holding the calls' only connection does
    not make the upstream look out of reach."""
    import anthropic
    hold = script.script.hold = threading.Event()
    process = DaemonProcess(daemon_root, env={"CTXD_GATEWAY_ANTHROPIC_UPSTREAM": script.origin,
                                              "CTXD_GATEWAY_MAX_UPSTREAM_CALLS": "1"})
    try:
        with process.running() as daemon, concurrent.futures.ThreadPoolExecutor(1) as pool:
            client = anthropic.Anthropic(base_url=base_url(daemon), api_key="k", max_retries=0,
                                         default_headers={"x-ctxd-session": sid})

            def one_stream() -> str:
                with client.messages.stream(model="claude-test", max_tokens=10,
                                            messages=USER) as stream:
                    return "".join(stream.text_stream)

            streaming = pool.submit(one_stream)
            assert script.script.holding.acquire(timeout=60)  # the stream holds its call
            status, health = raw_request(daemon, "GET", token_path(daemon)
                                         + "/_ctxd/health?upstreams=1")
            hold.set()
            assert streaming.result(timeout=60) == REPLY_TEXT
            client.close()
    finally:
        hold.set()
        script.script.hold = None
    assert (status, json.loads(health)["upstreams"][0]) == (200, {
        "setting": "anthropic_upstream", "url": script.origin, "reached": True, "status": 501,
        "problem": None})
