"""Replay a Claude Code or OpenCode transcript model call by model call (a turn is one
assistant response) into a private ctxd and report
how much context ctxd's default hygiene saves, and what it keeps (``ctxctl replay``,
``bench/replay.py``; docs/decisions.md, "Replay: context saved").

Two private daemons (temporary data directories and sockets: a user's own data is never
touched) receive the same transcript, grown one turn (model call) at a time in a temporary file and
read by ``transcript.import``, the importer's own parsing: one with ctxd's default
configuration and the window under test, one with hygiene off (no offload, no automatic
compaction) whose main thread is the raw thread. After each turn both main threads are
measured (exact tokens); at the end the key facts are looked for in the rendered context
and the results its stubs name, and every removed message is read back and compared
with the raw session's.

Then the cost (docs/decisions.md, "Replay: cost"): the raw daemon's thread, rendered in
Anthropic's shape just before each assistant response, is what the agent would send for
that model call. The policies of ``_policies`` turn those requests into theirs; ctxd's
are what its gateway sends: each call goes to the ctxd daemon's gateway (a session of its
own), which forwards it to a scripted model (`Upstream`) that answers with the
transcript's response and keeps the bodies it received. Every policy's requests are
priced with Anthropic's prompt cache on the transcript's clock (``ctxd.cost``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import importlib.util
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ctxclient._errors import DaemonUnavailable
from ctxclient._output import Column, Listing, Output, cell
from ctxclient._policies import (
    POLICIES,
    RUN,
    Applied,
    Call,
    PolicyReport,
    Sent,
    blocks_of,
    marked,
    price,
    result_text,
    size_of,
)
from ctxclient._spawn import private_environment, spawn_daemon
from ctxclient._sync import Client
from ctxd.cost import DEFAULT_MODEL, PRICES_AS_OF, PromptCache

FORMATS = ("claude-code", "opencode")
START_WAIT_S = 30.0
STOP_WAIT_S = 20.0
"""A private daemon asked to stop is killed after this long."""
INTERRUPTED = 130
"""``ctxctl replay``'s exit code when interrupted (SIGINT, SIGTERM, SIGHUP)."""
LAST_TURNS = 20
"""Files, commands and errors count as key facts in this many last turns (model calls)."""
HEAD_PAD = 4096
"""Leading blanks of each document written whole (an OpenCode export, a JSON array of
Claude Code records): the importer tells a grown file from a replaced one by the hash of its
first 4,096 bytes, which then never change."""
RULE = re.compile(r"\b(always|never|must|don't|do not|please use|make sure)\b", re.I)
ERROR_LINE = re.compile(r"\b(error|exception|traceback|failed)\b", re.I)
REF = re.compile(r"res_[0-9a-f]{16}")
CLEARED_INPUT = re.compile(r'\[Old tool input cleared — [\d,]+ chars; read it with read_result '
                           r'ref_id="(res_[0-9a-f]{16})" offset=(\d+) limit=(\d+) or ctxctl '
                           r"result res_[0-9a-f]{16} --offset \d+ --limit \d+\]")
LOCAL_COMMAND = ("<command-", "<local-command-")
"""How Claude Code records a slash command the user ran and its output, as user messages:
not a request."""
SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
PATH_CHARS = r"\w/\\.\-"
"""Word and path characters: a key fact is kept only where none continues it
(`kept_in`)."""
FACT_KEYS = ("file_path", "path", "notebook_path", "command")
RAW_CONFIG = ("[hygiene]\nauto_compact = false\noffload_threshold_bytes = 1073741824\n"
              "[gateway]\nenabled = false\n")
CTXD_CONFIG = '[gateway]\nlisten = "127.0.0.1:0"\nanthropic_upstream = "{upstream}"\n'
"""ctxd's defaults, its gateway on a free port and forwarding to the replay's scripted
model server."""
GATEWAY_SESSION = "replay-gateway"
"""The session the replay's model calls go to through ctxd's gateway (the transcript's
import goes to ``replay``)."""
GATEWAY_WAIT_S = 120.0
RAW_WINDOW = 10_000_000
READ_PAGE = 1_048_576


class ReplayError(Exception):
    """What ``ctxctl replay`` says before exiting 1 (a file it cannot replay, a daemon
    that did not start)."""


FORMATS_READ = ("ctxctl replay reads (--from):\n"
                "  claude-code  a Claude Code transcript, ~/.claude/projects/PROJECT/"
                "SESSION.jsonl (JSONL, or a JSON array of its records)\n"
                "  opencode     an OpenCode export, `opencode export SESSION > FILE` (a JSON "
                "object with info and messages)")
"""The formats replay reads, listed under an error about a file it cannot read."""


def unsupported(path: Path, why: str) -> ReplayError:
    """The error for a file replay cannot read as a transcript: ``why``, then the formats
    it reads (`FORMATS_READ`)."""
    return ReplayError(f"{path} {why}\n{FORMATS_READ}")


@dataclass
class Transcript:
    """A transcript split into turns: the records of each turn, as written to the file the
    importer reads (Claude Code: one JSONL line each; OpenCode: one export message each)."""

    format: str
    turns: list[list[Any]]
    info: dict[str, Any] = field(default_factory=dict)
    """OpenCode: the export's session info."""
    array: bool = False
    """Claude Code records saved as one JSON array (a turn holds records, not lines)."""


def guess_format(path: Path) -> str:
    """claude-code for ``.jsonl`` and a JSON array of records, opencode for a JSON object
    with ``info`` and ``messages``.

    Raises:
        ReplayError: none of these.
    """
    if path.suffix == ".jsonl":
        return "claude-code"
    with path.open("rb") as file:
        head = file.read(4096).lstrip()
    if head.startswith(b"["):
        return "claude-code"
    if head.startswith(b"{"):
        try:
            document = json.loads(path.read_bytes())
        except ValueError:
            return "claude-code"  # JSONL whose name does not say so
        if isinstance(document, dict) and "messages" in document and "info" in document:
            return "opencode"
        return "claude-code"
    raise unsupported(path, "is neither a Claude Code transcript nor an OpenCode export")


def _is_prompt(record: Any) -> bool:
    """A real user prompt (a turn starts there): a main-thread user record with text of the
    user's own, not a tool result, a meta record or a compaction summary."""
    if not isinstance(record, dict) or record.get("type") != "user":
        return False
    if record.get("isSidechain") or record.get("isMeta") or record.get("isCompactSummary"):
        return False
    message = record.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return bool(content.strip()) and not content.lstrip().startswith(LOCAL_COMMAND)
    if not isinstance(content, list):
        return False
    types = {block.get("type") for block in content if isinstance(block, dict)}
    texts = [str(block["text"]) for block in content if isinstance(block, dict)
             and isinstance(block.get("text"), str)]
    return "text" in types and "tool_result" not in types and not all(
        text.lstrip().startswith(LOCAL_COMMAND) for text in texts)


def _opencode_prompt(message: Any) -> bool:
    if not isinstance(message, dict) or not isinstance(message.get("info"), dict):
        return False
    parts: list[Any] = message["parts"] if isinstance(message.get("parts"), list) else []
    types = {part.get("type") for part in parts if isinstance(part, dict)}
    return (message["info"].get("role") == "user" and "text" in types
            and "compaction" not in types)


def _is_message(record: Any) -> bool:
    """A Claude Code record that holds a message: a user or assistant record with one."""
    return (isinstance(record, dict) and record.get("type") in ("user", "assistant")
            and isinstance(record.get("message"), dict))


def _response_id(record: Any) -> str | None:
    """The API response a main-thread Claude Code assistant record belongs to (Claude Code
    writes one record per content block, each with the response's ``message.id``); None for
    any other record."""
    if not isinstance(record, dict) or record.get("type") != "assistant" \
            or record.get("isSidechain"):
        return None
    message = record.get("message")
    response = message.get("id") if isinstance(message, dict) else None
    return response if isinstance(response, str) else f"uuid:{record.get('uuid')}"


def _opencode_response(message: Any) -> str | None:
    if not isinstance(message, dict) or not isinstance(message.get("info"), dict) \
            or message["info"].get("role") != "assistant":
        return None
    return str(message["info"].get("id"))


def _split(records: list[Any], is_prompt: Any, response_of: Any) -> list[list[Any]]:
    """Records in turns, one per model call: an assistant response (its records), the tool
    results that answer it and whatever came before it since the previous response (a user
    prompt among them). A new turn starts at a prompt or at another response once the turn
    has its response; records after the last response join the last turn."""
    turns: list[list[Any]] = []
    answered: str | None = None
    for record in records:
        response = response_of(record)
        if not turns or (answered is not None and (
                is_prompt(record) or (response is not None and response != answered))):
            turns.append([])
            answered = None
        turns[-1].append(record)
        if response is not None:
            answered = response
    return turns


def load(path: Path, fmt: str | None = None) -> Transcript:
    """The transcript at ``path`` in turns (``fmt``: None guesses it).

    Raises:
        ReplayError: it cannot be read as that format, or holds no record.
    """
    try:
        fmt = fmt or guess_format(path)
        data = path.read_bytes()
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    if fmt == "opencode":
        try:
            document = json.loads(data)
        except ValueError as exc:
            raise unsupported(path, f"is not an OpenCode export: not JSON ({exc})") from None
        if not isinstance(document, dict) or not isinstance(document.get("messages"), list):
            raise unsupported(path, "is not an OpenCode export: it is not an object "
                                    "{info, messages: [...]}")
        info: dict[str, Any] = document["info"] if isinstance(document.get("info"), dict) \
            else {}
        if not any(isinstance(message, dict) and isinstance(message.get("info"), dict)
                   and message["info"].get("role") in ("user", "assistant")
                   for message in document["messages"]):
            raise unsupported(path, "holds no message to replay as an OpenCode export")
        turns = _split(document["messages"], _opencode_prompt, _opencode_response)
        transcript = Transcript("opencode", turns, info)
    else:
        # A JSON array of records is imported as it is (transcript.import reads it whole):
        # each turn is then its records, else its lines.
        records: list[tuple[Any, Any]] = []
        array = data.lstrip()[:1] == b"["
        if array:
            try:
                elements = json.loads(data)
            except ValueError as exc:
                raise unsupported(path, "is not a Claude Code transcript: a JSON array "
                                        f"that does not parse ({exc})") from None
            records = [(record, record) for record in elements] \
                if isinstance(elements, list) else []
        else:
            for line in data.splitlines():
                if not line.strip():
                    continue
                try:
                    records.append((line, json.loads(line)))
                except ValueError:
                    records.append((line, None))
        if not any(isinstance(record, dict) for _, record in records):
            raise unsupported(path, "is not a Claude Code transcript: no "
                                    f"{'element' if array else 'line'} is a JSON record")
        if not any(_is_message(record) for _, record in records):
            raise unsupported(path, "is not a Claude Code transcript: no record is a user "
                                    "or assistant message")
        split = _split(records, lambda pair: _is_prompt(pair[1]),
                       lambda pair: _response_id(pair[1]))
        transcript = Transcript("claude-code", [[raw for raw, _ in turn] for turn in split],
                                array=array)
    if not transcript.turns:
        raise unsupported(path, "holds no message to replay")
    return transcript


# ---- the private daemons -------------------------------------------------------------

class PrivateDaemon:
    """A ctxd of its own: socket, data directory and configuration under ``root``."""

    def __init__(self, root: Path, name: str, config: str) -> None:
        self.root = root
        self.socket = root / f"{name}.sock"
        self.log = root / f"{name}.log"
        config_path = root / f"{name}.toml"
        config_path.write_text(config)
        env = private_environment({"XDG_CONFIG_HOME": str(root / "config"),
                                   "XDG_STATE_HOME": str(root / "state")})
        # Its own session keeps it from the terminal's signals: the replay stops it
        # (`stop_all`), or its death does.
        self.proc = spawn_daemon(
            ["--socket", str(self.socket), "--data-dir", str(root / f"{name}-data"),
             "--config", str(config_path)],
            log=self.log, env=env, detach=True, die_with_parent=True)

    def connect(self) -> Client:
        """A client once the daemon answers.

        Raises:
            ReplayError: it exited, or did not answer within `START_WAIT_S`.
        """
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                client = Client(self.socket, timeout=None)
            except (DaemonUnavailable, OSError):
                time.sleep(0.02)
                continue
            client.call("daemon.ping")
            return client
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-5:])
        raise ReplayError(f"the replay's private ctxd did not start; its log ends with:\n"
                          f"{tail}")

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM) if it still runs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


def stop_all(daemons: list[PrivateDaemon], root: Path) -> None:
    """Stop every daemon and remove ``root``, whatever interrupts it: all are asked to stop
    first, then each is waited for on its own (killed after `STOP_WAIT_S`, or at once when
    an interrupt lands in its wait, which is raised again at the end); ``root`` goes last,
    in any case."""
    interrupted: BaseException | None = None
    try:
        for daemon in daemons:
            try:
                daemon.terminate()
            except (OSError, KeyboardInterrupt) as exc:
                interrupted = interrupted or (exc if isinstance(exc, KeyboardInterrupt)
                                              else None)
        for daemon in daemons:
            try:
                daemon.proc.wait(STOP_WAIT_S)
            except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
                if isinstance(exc, KeyboardInterrupt):
                    interrupted = interrupted or exc
                daemon.proc.kill()
                daemon.proc.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if interrupted is not None:
        raise interrupted


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as SIGINT does, while in the block (the
    main thread only), so that a replay killed or whose terminal closes stops its private
    daemons and removes their files; the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, interrupt)
                for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# ---- the replay ------------------------------------------------------------------------

@dataclass
class Point:
    turn: int
    raw_tokens: int
    tokens: int


@dataclass
class Fact:
    kind: str
    """first_request, latest_request, rule, file, command or error."""
    text: str


@dataclass
class Report:
    file: str
    format: str
    window: int
    turns: int
    messages: int
    raw_peak_tokens: int
    peak_tokens: int
    reduction: float
    trigger_tokens: int
    """Where automatic compaction triggers (``compact_trigger`` of the effective window):
    once the raw thread passes it, ctxd's peak cannot be much under it."""
    floor_share: float
    """The lowest peak share reachable: min(raw peak, trigger) / raw peak."""
    key_facts: int
    key_facts_kept: float
    facts_missed: list[Fact]
    removed_messages: int
    removed_bytes: int
    retrievable_fraction: float
    not_retrievable: list[int]
    """Seqs of removed messages whose original could not be read back exactly."""
    compacted: int
    """Main-thread messages compaction took out (cleared, summarized, truncated)."""
    offloaded: int
    branches: int
    final_tokens: int
    series: list[Point]
    price_model: str = DEFAULT_MODEL
    """The model whose list prices ``dollars`` are at."""
    prices_as_of: str = PRICES_AS_OF
    policies: dict[str, PolicyReport] = field(default_factory=dict)
    """Each policy's cost and figures on the same model calls (docs/decisions.md,
    "Replay: cost")."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- the model calls, through ctxd's gateway -------------------------------------------

class Upstream:
    """The model the replay's gateway forwards to: a scripted Anthropic Messages API on
    127.0.0.1 that answers each call with the transcript's response (`answers`) and keeps
    every body it received. Its answers report no input usage, so the gateway's
    calibration against the provider's counts stays at 1."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.answers: list[list[dict[str, Any]]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                upstream.received.append(body)
                content: list[dict[str, Any]] = upstream.answers.pop(0) \
                    if upstream.answers else [
                    {"type": "text", "text": "(the replay ends here)"}]
                payload = json.dumps({
                    "id": f"msg_replay_{len(upstream.received)}", "type": "message",
                    "role": "assistant", "model": body.get("model"), "content": content,
                    "stop_reason": "tool_use" if any(
                        block.get("type") == "tool_use" for block in content) else "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 0, "output_tokens": 1}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


def _through_gateway(ctxd: Client, upstream: Upstream, calls: list[Call],
                     final: list[dict[str, Any]], window: int | None) -> list[dict[str, Any]]:
    """Each call's raw request sent to ctxd's gateway as Claude Code would send it (one
    breakpoint, on its last block), the transcript's response coming back; then the final
    thread, unpriced, for what ctxd keeps. The bodies the model received, in order."""
    params: dict[str, Any] = {"session_id": GATEWAY_SESSION}
    if window is not None:
        params["budget"] = {"context_window": window}
    ctxd.call("session.open", params)
    base_url = urllib.parse.urlsplit(ctxd.call("daemon.status")["gateway"]["base_url"])
    connection = http.client.HTTPConnection(base_url.hostname or "127.0.0.1", base_url.port,
                                            timeout=GATEWAY_WAIT_S)
    path = f"{base_url.path.rstrip('/')}/v1/messages"
    try:
        asked: list[tuple[list[dict[str, Any]], Any]] = [
            (call.messages, call.response.get("content") or []) for call in calls]
        for messages, answer in [*asked, (final, None)]:
            upstream.answers = [] if answer is None else [answer]
            body = json.dumps({"model": DEFAULT_MODEL, "max_tokens": 8192, "stream": False,
                               "messages": marked(messages)}).encode()
            connection.request("POST", path, body=body, headers={
                "content-type": "application/json",
                "anthropic-version": "2023-06-01", "x-ctxd-session": GATEWAY_SESSION})
            answered = connection.getresponse()
            text = answered.read()
            if answered.status != 200:
                raise ReplayError(f"ctxd's gateway answered the replay's model call "
                                  f"{answered.status}: {text[:300].decode(errors='replace')}")
    finally:
        connection.close()
    if len(upstream.received) != len(calls) + 1:
        raise ReplayError(f"the model received {len(upstream.received)} of the replay's "
                          f"{len(calls) + 1} calls through ctxd's gateway")
    return upstream.received


def _unmarked(block: Any) -> Any:
    return {k: v for k, v in block.items() if k != "cache_control"} \
        if isinstance(block, dict) else block


def _ctxd_applied(ctxd: Client, received: list[dict[str, Any]], calls: list[Call],
                  final: list[dict[str, Any]], counter: PromptCache) -> Applied:
    """ctxd's policy: the bodies its gateway sent the model, the last (the final thread)
    what it keeps. A block it replaced is removed; it is retrievable when its stub's or
    marker's ref reads back the original exactly (``result.read``)."""
    sent = [Sent(body["messages"], call.at, counter.tokens({"messages": [call.response]}), n)
            for n, (body, call) in enumerate(zip(received, calls, strict=False))]
    kept = received[-1]["messages"]
    applied = Applied(sent, kept)
    dropped = len(final) - len(kept) + 1 if len(kept) < len(final) else 0
    if dropped and not _text(kept[0].get("content", "")).startswith("[Summary of "):
        raise ReplayError(f"ctxd's gateway sent {len(kept)} messages for the final thread's "
                          f"{len(final)}, the first not a summary: a rewrite the replay "
                          "cannot align")
    if dropped:
        _dropped(ctxd, final[:dropped], applied)
    for original, shown in zip(final[dropped:], kept[bool(dropped):], strict=True):
        for block, shown_block in zip(blocks_of(original), blocks_of(shown), strict=False):
            if _unmarked(block) == _unmarked(shown_block):
                continue
            if block.get("type") == "tool_result":
                size = len(result_text(block).encode())
                refs = REF.findall(result_text(shown_block))
                back = _read(ctxd, GATEWAY_SESSION, refs[0]) if refs else None
                exact = back == result_text(block)
            elif block.get("type") == "tool_use":
                size = size_of(block.get("input"))
                back = json.dumps(_restore_inputs(ctxd, GATEWAY_SESSION,
                                                  shown_block.get("input")))
                exact = back == json.dumps(block.get("input"))
            else:
                size, back, exact = size_of(block), None, False
            applied.removed_bytes += size
            if exact:
                applied.retrievable_bytes += size
                if back is not None:
                    applied.readable.append(back)
    return applied


def _dropped(ctxd: Client, dropped: list[dict[str, Any]], applied: Applied) -> None:
    """The messages a compaction point of ctxd's gateway left out: removed, and
    retrievable where the gateway's session holds each of their blocks whole (a text or
    a tool result's, verbatim in a stored message, a stub's read back through its ref; a
    call's arguments, read back through their markers)."""
    texts: set[str] = set()
    inputs: set[str] = set()
    for message in _list(ctxd, GATEWAY_SESSION):
        content = message["content"]
        if message["role"] == "tool":
            texts.add(_read(ctxd, GATEWAY_SESSION, message["ref_id"])
                      if message.get("ref_id") else _text(content))
            continue
        for part in [{"type": "text", "text": content}] if isinstance(content, str) \
                else content:
            if part.get("type") == "text":
                texts.add(part.get("text", ""))
            elif isinstance(part.get("input"), dict):
                inputs.add(json.dumps(_restore_inputs(ctxd, GATEWAY_SESSION, part["input"]),
                                      sort_keys=True))
    # A stored text may join several of the dropped message's blocks (a provider's shape
    # joins a turn's records): a block is found as whole lines of a stored text.
    stored = "\n" + "\n\x00\n".join(texts) + "\n"
    for message in dropped:
        for block in blocks_of(message):
            kind = block.get("type")
            text = result_text(block) if kind == "tool_result" else block.get("text")
            size = size_of(block.get("input")) if kind == "tool_use" else size_of(
                text if isinstance(text, str) else block)
            applied.removed_bytes += size
            if (json.dumps(block.get("input"), sort_keys=True) in inputs
                    if kind == "tool_use" else isinstance(text, str)
                    and f"\n{text}\n" in stored):
                applied.retrievable_bytes += size


def _facts_kept(facts: list[Fact], applied: Applied) -> float:
    """The share of ``facts`` in the context a policy keeps at the end, or one read away."""
    if not facts:
        return 1.0
    text = "\n".join(t for message in applied.final for t in _texts(message.get("content")))
    kept = sum(1 for fact in facts if kept_in(fact.text, text)
               or any(kept_in(fact.text, readable) for readable in applied.readable))
    return round(kept / len(facts), 4)


def _texts(content: Any) -> Iterator[str]:
    """The strings a content holds: text parts, and every string of a tool call's input."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for item in content:
            yield from _texts(item)
    elif isinstance(content, dict):
        if content.get("type") == "text" and isinstance(content.get("text"), str):
            yield content["text"]
        else:
            for value in content.values():
                yield from _texts(value)


def _text(content: Any) -> str:
    """A message's text as offload and result.read see it: a string, or its text parts
    joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if isinstance(part, dict)
                     and part.get("type") == "text" and isinstance(part.get("text"), str))


def _list(client: Client, session_id: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"session_id": session_id, "limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = client.call("message.list", params)
        messages.extend(page["messages"])
        cursor = page["next_cursor"]
        if not cursor:
            return messages


def _read(client: Client, session_id: str, ref_id: str) -> str:
    pages = []
    offset: int | None = 0
    while offset is not None:
        page = client.call("result.read", {"session_id": session_id, "ref_id": ref_id,
                                           "offset": offset, "limit": READ_PAGE})
        pages.append(page["content"] or "")
        offset = page.get("next_offset")
    return "".join(pages)


def _restore_inputs(client: Client, session_id: str, content: Any) -> Any:
    """A content whose cleared tool-call arguments are read back from their blob."""
    if isinstance(content, str):
        match = CLEARED_INPUT.fullmatch(content)
        if match is None:
            return content
        ref, offset, limit = match.group(1), int(match.group(2)), int(match.group(3))
        pages = []
        for start in range(offset, offset + limit, READ_PAGE):
            page = client.call("result.read", {
                "session_id": session_id, "ref_id": ref, "offset": start,
                "limit": min(READ_PAGE, offset + limit - start)})
            pages.append(page["content"] or "")
        return "".join(pages)
    if isinstance(content, list):
        return [_restore_inputs(client, session_id, item) for item in content]
    if isinstance(content, dict):
        return {key: _restore_inputs(client, session_id, value)
                for key, value in content.items()}
    return content


def _main_thread(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The main thread's messages as imported: no branch's, none compaction wrote."""
    return [m for m in messages if m.get("branch_id") is None and not m.get("discarded")
            and m.get("at_seq") is None]


def _position(message: dict[str, Any]) -> int:
    source = (message.get("meta") or {}).get("source") or {}
    value = source.get("line", source.get("index", 0))
    return value if isinstance(value, int) else 0


def _prompt(message: dict[str, Any]) -> str | None:
    meta = message.get("meta") or {}
    if message["role"] != "user" or meta.get("is_meta") or meta.get("compact_summary"):
        return None
    text = _text(message["content"]).strip()
    return text if text and not text.startswith(LOCAL_COMMAND) else None


def kept_in(fact: str, text: str) -> bool:
    """Whether ``fact`` appears in ``text`` delimited: an edge of the fact that is a word or
    path character (letters, digits, ``_``, ``/``, ``\\``, ``.``, ``-``) is not continued by
    one in ``text`` (a ``.`` then a blank or the end is punctuation, not a path), so that
    ``ls`` is not kept by ``tools`` nor ``README.md`` by ``docs/README.md``."""
    if not fact:
        return False
    before = rf"(?<![{PATH_CHARS}])" if re.match(rf"[{PATH_CHARS}]", fact[0]) else ""
    after = rf"(?![{PATH_CHARS}]*[\w/\\-])" if re.match(rf"[{PATH_CHARS}]", fact[-1]) \
        else ""
    return re.search(before + re.escape(fact) + after, text) is not None


def key_facts(raw: list[dict[str, Any]], turn_of: dict[int, int], turns: int) -> list[Fact]:
    """The key facts of a raw main thread (docs/decisions.md, "Replay: context saved"):
    ``turn_of`` maps a message's position in the transcript to its turn."""
    facts: list[Fact] = []
    prompts = [(m, text) for m in raw if (text := _prompt(m)) is not None]
    if prompts:
        facts.append(Fact("first_request", prompts[0][1]))
        if len(prompts) > 1:
            facts.append(Fact("latest_request", prompts[-1][1]))
    rules: list[str] = []
    for _, text in prompts:
        for sentence in SENTENCE.split(text):
            sentence = sentence.strip()
            if sentence and RULE.search(sentence) and sentence not in rules:
                rules.append(sentence)
    facts.extend(Fact("rule", rule) for rule in rules)
    first_recent = turns - LAST_TURNS
    seen: set[tuple[str, str]] = set()
    for message in raw:
        if turn_of.get(_position(message), 0) < first_recent:
            continue
        if message["role"] == "assistant" and isinstance(message["content"], list):
            for part in message["content"]:
                inputs = part.get("input") if isinstance(part, dict) \
                    and part.get("type") == "tool_use" else None
                if not isinstance(inputs, dict):
                    continue
                for key in FACT_KEYS:
                    value = inputs.get(key)
                    kind = "command" if key == "command" else "file"
                    if isinstance(value, str) and value.strip() and (kind, value) not in seen:
                        seen.add((kind, value))
                        facts.append(Fact(kind, value))
        elif message["role"] == "tool":
            lines = [line.strip() for line in _text(message["content"]).splitlines()
                     if line.strip()]
            flagged = bool((message.get("meta") or {}).get("is_error"))
            if lines and (flagged or ERROR_LINE.search(lines[0])) \
                    and ("error", lines[0]) not in seen:
                seen.add(("error", lines[0]))
                facts.append(Fact("error", lines[0]))
    return facts


def _open(client: Client, session_id: str, window: int | None) -> tuple[int, int]:
    """The session's context window, and the tokens at which automatic compaction
    triggers (``compact_trigger`` of the effective window)."""
    params: dict[str, Any] = {"session_id": session_id}
    if window is not None:
        params["budget"] = {"context_window": window}
    budget = client.call("session.open", params)["session"]["budget"]
    effective = int(budget["context_window"]) - int(budget["max_output_tokens"])
    return int(budget["context_window"]), math.floor(effective * budget["compact_trigger"])


def replay(path: Path, window: int | None = None, fmt: str | None = None,
           policies: Sequence[str] = POLICIES, model: str = DEFAULT_MODEL) -> Report:
    """Replay ``path`` at ``window`` tokens (None: ctxd's default) and report, with the
    cost of each of ``policies`` at ``model``'s prices.

    Raises:
        ReplayError: the file cannot be replayed, or a private daemon did not start.
    """
    transcript = load(path, fmt)
    root = Path(tempfile.mkdtemp(prefix="ctxd-replay-"))
    daemons: list[PrivateDaemon] = []
    clients: list[Client] = []
    upstream = Upstream()
    try:
        daemons.append(PrivateDaemon(root, "ctxd", CTXD_CONFIG.format(upstream=upstream.url)))
        daemons.append(PrivateDaemon(root, "raw", RAW_CONFIG))
        for daemon in daemons:
            clients.append(daemon.connect())
        return _run(transcript, path, root, window, clients[0], clients[1],
                    Policies(list(dict.fromkeys(policies)), model, upstream))
    finally:
        try:
            for client in clients:
                client.close()
        finally:
            try:
                stop_all(daemons, root)
            finally:
                upstream.close()


@dataclass
class Policies:
    """What the replay prices: the policies, the model whose prices it names, the scripted
    model ctxd's gateway forwards to."""

    names: list[str]
    model: str
    upstream: Upstream


def _write(transcript: Transcript, feed: Path, written: list[Any], new: list[Any]) -> None:
    """``new`` records added to the ``written`` ones in ``feed``, as the importer reads it."""
    written.extend(new)
    if transcript.format == "claude-code" and not transcript.array:
        with feed.open("ab") as file:
            file.write(b"".join(line + b"\n" for line in new))
        return
    document = json.dumps(written if transcript.array else {
        "info": transcript.info, "messages": written}, ensure_ascii=False)
    feed.write_bytes(b" " * HEAD_PAD + document.encode())


def _response_at(transcript: Transcript, records: list[Any]) -> tuple[int, float] | None:
    """Where a turn's model response starts among its records, and when it came (the
    transcript's timestamp, in seconds); None for a turn without one."""
    for index, record in enumerate(records):
        if transcript.format == "opencode":
            if _opencode_response(record) is None:
                continue
            created = ((record.get("info") or {}).get("time") or {}).get("created")
            return index, created / 1000 if isinstance(created, (int, float)) else 0.0
        parsed = record
        if isinstance(record, bytes):
            try:
                parsed = json.loads(record)
            except ValueError:
                continue
        if _response_id(parsed) is None:
            continue
        stamp = parsed.get("timestamp")
        try:
            at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except (AttributeError, ValueError):
            at = 0.0
        return index, at
    return None


def _anthropic_thread(client: Client) -> list[dict[str, Any]]:
    return client.call("ctxd.render", {"session_id": "replay", "branch_id": None,  # type: ignore[no-any-return]
                                       "format": "anthropic"})["messages"]


def _run(transcript: Transcript, path: Path, root: Path, window: int | None,
         ctxd: Client, raw: Client, policies: Policies) -> Report:
    window_used, trigger = _open(ctxd, "replay", window)
    _open(raw, "replay", RAW_WINDOW)
    feed = root / ("feed.jsonl" if transcript.format == "claude-code" and not transcript.array
                   else "feed.json")
    feed.touch()
    series: list[Point] = []
    turn_of: dict[int, int] = {}
    position = 0
    branches = 0
    written: list[Any] = []
    asked: list[tuple[list[dict[str, Any]], float]] = []
    """Each model call's raw request and when it was made."""
    for turn, records in enumerate(transcript.turns):
        for _ in records:
            position += 1
            turn_of[position] = turn
        response = _response_at(transcript, records) if policies.names else None
        rest = records
        if response is not None:
            start, at = response
            if start:
                _write(transcript, feed, written, records[:start])
                raw.call("transcript.import", {"format": transcript.format,
                                               "path": str(feed), "session_id": "replay"})
            asked.append((_anthropic_thread(raw), at))
            rest = records[start:]
        _write(transcript, feed, written, rest)
        for client in (ctxd, raw):
            result = client.call("transcript.import", {
                "format": transcript.format, "path": str(feed), "session_id": "replay"})
            if client is ctxd:
                branches += result["branches"]
        rendered = ctxd.call("session.get", {"session_id": "replay"})["context_state"]
        thread = raw.call("session.get", {"session_id": "replay"})["context_state"]
        series.append(Point(turn + 1, thread["main_thread_tokens"],
                            rendered["main_thread_tokens"]))
    raw_messages = _main_thread(_list(raw, "replay"))
    all_messages = _list(ctxd, "replay")
    kept = _main_thread(all_messages)
    render = ctxd.call("ctxd.render", {"session_id": "replay", "branch_id": None})
    facts = key_facts(raw_messages, turn_of, len(transcript.turns))
    rendered_text = "\n".join(text for m in render["messages"] for text in _texts(m["content"]))
    reads: dict[str, str] = {}
    for ref in dict.fromkeys(REF.findall(rendered_text)):
        reads[ref] = _read(ctxd, "replay", ref)
    missed = [fact for fact in facts if not kept_in(fact.text, rendered_text)
              and not any(kept_in(fact.text, text) for text in reads.values())]
    removed = removed_bytes = retrievable_bytes = 0
    not_retrievable: list[int] = []
    offloaded = 0
    if len(kept) != len(raw_messages):
        raise ReplayError(f"the replay imported {len(kept)} main-thread messages and the raw "
                          f"thread {len(raw_messages)}: the two imports differ")
    replacement = {m["at_seq"]: m for m in all_messages if m.get("at_seq") is not None}
    for message, original in zip(kept, raw_messages, strict=True):
        offloaded += bool(message.get("ref_id"))
        if not message.get("ref_id") and not message.get("compaction"):
            continue
        removed += 1
        size = size_of(original["content"])
        removed_bytes += size
        exact = message["content"] == original["content"] and message["role"] == original[
            "role"]
        if exact and message.get("compaction") == "cleared" and message["role"] == "assistant":
            stub = replacement.get(message["seq"], {})
            exact = _restore_inputs(ctxd, "replay", stub.get("content")) == original["content"]
        elif exact and message.get("compaction") == "cleared":
            stub = replacement.get(message["seq"], {})
            refs = REF.findall(_text(stub.get("content", "")))
            exact = bool(refs) and _read(ctxd, "replay", refs[0]) == _text(original["content"])
        elif exact and message.get("ref_id") and not message.get("compaction"):
            exact = _read(ctxd, "replay", message["ref_id"]) == _text(original["content"])
        if exact:
            retrievable_bytes += size
        else:
            not_retrievable.append(message["seq"])
    raw_peak = max(point.raw_tokens for point in series)
    peak = max(point.tokens for point in series)
    return Report(
        file=str(path), format=transcript.format, window=window_used,
        turns=len(transcript.turns), messages=len(raw_messages), raw_peak_tokens=raw_peak,
        peak_tokens=peak, reduction=round(1 - peak / raw_peak, 4) if raw_peak else 0.0,
        trigger_tokens=trigger,
        floor_share=round(min(raw_peak, trigger) / raw_peak, 4) if raw_peak else 1.0,
        key_facts=len(facts),
        key_facts_kept=round(1 - len(missed) / len(facts), 4) if facts else 1.0,
        facts_missed=missed, removed_messages=removed, removed_bytes=removed_bytes,
        retrievable_fraction=round(retrievable_bytes / removed_bytes, 4)
        if removed_bytes else 1.0,
        not_retrievable=not_retrievable,
        compacted=sum(bool(m.get("compaction")) for m in kept), offloaded=offloaded,
        branches=branches, final_tokens=render["tokens"], series=series,
        price_model=policies.model,
        policies=_price_policies(ctxd, raw, policies, asked, facts, window_used))


def _price_policies(ctxd: Client, raw: Client, policies: Policies,
                    asked: list[tuple[list[dict[str, Any]], float]], facts: list[Fact],
                    window: int) -> dict[str, PolicyReport]:
    """Each policy's requests for the replay's model calls, priced. A call's response is
    the assistant message the next call's request (or the final thread) holds after the
    call's own messages."""
    if not policies.names:
        return {}
    final = _anthropic_thread(raw)
    calls: list[Call] = []
    for k, (messages, at) in enumerate(asked):
        after = asked[k + 1][0] if k + 1 < len(asked) else final
        response = after[len(messages)] if len(after) > len(messages) else None
        if response is None or response.get("role") != "assistant" \
                or after[:len(messages)] != messages:
            raise ReplayError(f"model call {k + 1} of the replay: the thread after it does "
                              "not continue its request with the assistant's response")
        calls.append(Call(messages, at, response))
    counter = PromptCache()
    reports: dict[str, PolicyReport] = {}
    for name in policies.names:
        if name == "ctxd":
            received = _through_gateway(ctxd, policies.upstream, calls, final, window)
            applied = _ctxd_applied(ctxd, received, calls, final, counter)
        else:
            applied = RUN[name](calls, final, window, counter)
        reports[name] = price(applied, policies.model, _facts_kept(facts, applied), counter)
    return reports


# ---- ctxctl replay ---------------------------------------------------------------------

SUMMARY_COLUMNS = (Column("figure"), Column("value", right=True),
                   Column("detail", wrap=True, keep=10))
PLOT_INSTALL = "pip install 'ctxd[plot]' (matplotlib)"


def summary(report: Report) -> Listing:
    """The report as one row per figure."""
    listing = Listing(SUMMARY_COLUMNS, title=f"replay of {Path(report.file).name} at a "
                                             f"{report.window:,}-token window")
    missed = ", ".join(f"{fact.kind} {fact.text.splitlines()[0][:60]!r}"
                       for fact in report.facts_missed[:5])
    more = len(report.facts_missed) - 5
    rows = [
        ("turns", f"{report.turns:,}", f"{report.messages:,} main-thread messages, "
                                       f"{report.branches:,} sub-agent branches"),
        ("raw peak tokens", f"{report.raw_peak_tokens:,}", "the thread without hygiene"),
        ("ctxd peak tokens", f"{report.peak_tokens:,}",
         f"{report.final_tokens:,} at the end"),
        ("reduction", f"{report.reduction:.1%}", "1 - peak / raw peak"),
        ("floor", f"{report.floor_share:.1%}",
         f"lowest share reachable: compaction triggers at {report.trigger_tokens:,} tokens"),
        ("key facts kept", f"{report.key_facts_kept:.1%}",
         f"{report.key_facts - len(report.facts_missed)} of {report.key_facts}"
         + (f"; missed: {missed}" if missed else "") + (f" and {more} more" if more > 0
                                                        else "")),
        ("retrievable", f"{report.retrievable_fraction:.1%}",
         f"{report.removed_messages:,} messages removed ({report.removed_bytes:,} bytes): "
         f"{report.offloaded:,} offloaded, {report.compacted:,} compacted"),
    ]
    listing.rows = [[cell(a), cell(b), cell(c)] for a, b, c in rows]
    return listing


POLICY_COLUMNS = (Column("policy"), Column("cost", right=True), Column("$", right=True),
                  Column("vs best", right=True), Column("peak", right=True, keep=3),
                  Column("read", right=True, keep=2), Column("written", right=True, keep=2),
                  Column("facts", right=True, keep=4), Column("retrievable", right=True,
                                                              keep=4))


def policy_table(report: Report) -> Listing:
    """The policies side by side: cost (input-token units, and dollars at the price
    model's list prices), its ratio to the cheapest other policy's, peak, cache reads and
    writes, key facts kept, retrievable share."""
    listing = Listing(POLICY_COLUMNS, title=f"cost of each policy at {report.price_model}'s "
                                            f"prices (as of {report.prices_as_of})")
    for name, policy in report.policies.items():
        others = [other.cost for key, other in report.policies.items() if key != name]
        best = min(others) if others else None
        listing.rows.append([
            cell(name), cell(f"{policy.cost:,.0f}"), cell(f"{policy.dollars:.2f}"),
            cell(f"{policy.cost / best:.2f}x" if best else "-"),
            cell(f"{policy.peak_tokens:,}"), cell(f"{policy.cache_read_tokens:,}"),
            cell(f"{policy.cache_write_tokens:,}"), cell(f"{policy.key_facts_kept:.0%}"),
            cell(f"{policy.retrievable_fraction:.0%}")])
    return listing


def plot(report: Report, target: Path) -> None:
    """A PNG of each call's context tokens (above) and the cost so far (below), every
    policy on the same two charts (raw against ctxd when none was priced)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (tokens, cost) = pyplot.subplots(2, 1, figsize=(8, 7), dpi=100, sharex=True)
    if report.policies:
        for name, policy in report.policies.items():
            calls = [point["call"] for point in policy.series]
            tokens.plot(calls, [point["tokens"] for point in policy.series], label=name)
            cost.plot(calls, [point["cumulative_cost"] for point in policy.series],
                      label=name)
    else:
        turns = [point.turn for point in report.series]
        tokens.plot(turns, [point.raw_tokens for point in report.series], label="raw thread")
        tokens.plot(turns, [point.tokens for point in report.series], label="ctxd (rendered)")
    tokens.axhline(report.window, linestyle=":", color="grey", label="context window")
    tokens.set_ylabel("tokens sent")
    tokens.set_title(f"{Path(report.file).name} at a {report.window:,}-token window")
    tokens.legend(fontsize="small")
    cost.set_xlabel("model call")
    cost.set_ylabel("cost so far (input-token units)")
    if report.policies:
        cost.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(target, format="png")
    pyplot.close(figure)


def run(args: argparse.Namespace, out: Output) -> int:
    """``ctxctl replay``: 0 when replayed, 1 when the file cannot be replayed, 2 when it is
    not there or --plot has no matplotlib."""
    path = Path(args.file).expanduser().absolute()
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        print(f"ctxctl: {path} {what}\nctxctl: next: give the path of a Claude Code "
              "transcript (JSONL) or an OpenCode export (JSON)", file=sys.stderr)
        return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(f"ctxctl: --plot needs matplotlib, which is not installed\nctxctl: next: "
              f"{PLOT_INSTALL}", file=sys.stderr)
        return 2
    try:
        with interruptible():
            report = replay(path, args.window, args.transcript_format,
                            args.policies or POLICIES, args.price_model)
    except ReplayError as exc:
        print(f"ctxctl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ctxctl: interrupted", file=sys.stderr)
        return INTERRUPTED
    if args.plot:
        plot(report, Path(args.plot))
    if out.json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2, ensure_ascii=False) + "\n")
        return 0
    out.listing(summary(report), "")
    if report.policies:
        out.listing(policy_table(report), "")
    if args.plot:
        out.note(f"(plot written to {args.plot})")
    return 0


def window(text: str) -> int:
    """``--window``: a context window ctxd accepts."""
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of tokens") from None
    if not 1024 <= value <= RAW_WINDOW:
        raise argparse.ArgumentTypeError(f"a window is 1,024 to {RAW_WINDOW:,} tokens")
    return value


__all__ = [
    "FORMATS",
    "Fact",
    "Point",
    "ReplayError",
    "Report",
    "Transcript",
    "guess_format",
    "interruptible",
    "kept_in",
    "key_facts",
    "load",
    "replay",
    "stop_all",
]
