"""`ctxctl hook`: the one command Claude Code runs for every hook event (README, "Claude
Code"; docs/decisions.md, "Claude Code hooks").

It reads the event's JSON on stdin and writes its answer on stdout. It fails open: no
daemon, a slow one or any error ends with exit 0 and no output, so Claude Code goes on as
without ctxd (the daemon's log gets a line through `daemon.log` when it can be reached).
A socket that is not the user's own ctxd's gets nothing, not even that line; the user is
told on stderr (docs/security.md, "Who serves the socket").
It imports the standard library only (and ``ctxd.paths``): the interpreter's start-up is
most of its cost.
"""

from __future__ import annotations

import _socket  # not `socket`: its enums and selectors cost the hook milliseconds
import contextlib
import fcntl
import json
import os
import stat
import sys
import time

from ctxd.paths import UntrustedSocket, check_peer, check_socket_directory, default_socket_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

DEADLINE_S = 3.0
"""The longest a hook talks to the daemon; Claude Code's own timeout is the installed one."""
MAX_QUERY_CHARS = 8_192
"""The longest query memory.context takes."""
SOURCE = "ctxctl-hook"
NOT_FOUND = -32004
BUDGET_EXHAUSTED_CODE = -32002
INVALID_STATE_CODE = -32003
TIMEOUT_CODE = -32009
SUMMARY_PREFIX = "[Summary of "
PERSISTED_MAX_BYTES = 4 << 20
"""The largest output the hook reads back from Claude Code's persisted-output file (a
larger one is recorded as Claude Code cut it): its append must stay under the daemon's
``max_request_bytes``."""
PERSISTED_KEYS = ("persistedOutputPath", "persistedOutputSize")
"""Where Claude Code's Bash output names the file it saved a large output to (it then shows
the model a 2 KB preview, and the hook ``stdout`` cut at 30,000 characters)."""
AGENT_TOOLS = ("Agent", "Task")
"""Claude Code's tool that starts a sub-agent (``Task`` before version 2)."""
BUDGET_EXHAUSTED = "budget exhausted: return your result now"
TIME_UP = "time is up: return your result now"
LIVE = "live"
"""The meta key that marks a message recorded as it happened: transcript.import does not
append it again (docs/protocol.md, "transcript.import")."""


class HookError(Exception):
    """The daemon answered a call with an error."""

    def __init__(self, error: dict[str, Any]):
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")


class Connection:
    """One blocking connection: a request, then its answer line (no pipelining)."""

    def __init__(self, path: str, deadline: float):
        self.path = path
        self.deadline = deadline
        check_socket_directory(path)
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self.sock.settimeout(self._left())
            self.sock.connect(path)
            check_peer(self.sock, path)
        except BaseException:
            self.sock.close()
            raise
        self.buffer = b""
        self.next_id = 0

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the daemon did not answer in time")
        return left

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        request = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.sock.settimeout(self._left())
        self.sock.sendall(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        while True:
            line = self._line()
            answer = json.loads(line)
            # An error with id null (a line the daemon could not read) answers the one
            # request outstanding (docs/protocol.md, "Framing").
            if answer.get("id") != self.next_id and not (
                    answer.get("id") is None and "error" in answer):
                continue  # a notification
            if "error" in answer:
                raise HookError(answer["error"])
            return answer["result"]

    def _line(self) -> bytes:
        while b"\n" not in self.buffer:
            self.sock.settimeout(self._left())
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def close(self) -> None:
        self.sock.close()


def project_of(event: dict[str, Any]) -> str | None:
    """The session's project: Claude Code's working directory (its last 256 characters,
    the longest project session.open takes)."""
    cwd = event.get("cwd")
    return cwd[-256:] if isinstance(cwd, str) and cwd else None


def scope_of(project: str | None) -> str:
    """The memory scope of a project, as the daemon derives it for a session
    (docs/protocol.md, Memory, "Scopes")."""
    if not project or not project.split():
        return "global"
    return "project:" + "-".join(project.split())[:128]


def output_text(response: Any) -> str | None:
    """The text a tool result shows the model: a string; Bash's ``stdout`` and
    ``stderr``; Read's text file ``content``; an MCP tool's text content parts. None for
    any other shape (kept whole)."""
    if isinstance(response, str):
        return response
    if isinstance(response, dict) and isinstance(response.get("stdout"), str):
        stderr = response.get("stderr")
        return str(response["stdout"]) + (f"\n{stderr}" if isinstance(stderr, str) and stderr
                                     else "")
    if _read_file(response) is not None:
        return str(response["file"]["content"])
    if isinstance(response, list) and response and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in response):
        return "\n".join(str(p["text"]) for p in response)
    return None


def _read_file(response: Any) -> dict[str, Any] | None:
    """Read's answer for a text file (``{"type": "text", "file": {"content": ...}}``)."""
    if isinstance(response, dict) and response.get("type") == "text":
        file = response.get("file")
        if isinstance(file, dict) and isinstance(file.get("content"), str):
            return file
    return None


def stubbed(response: Any, stub: str) -> Any:
    """The tool's output in its own shape (Claude Code rejects another shape), with the
    stub in place of its text; without the persisted-output file Claude Code named, or
    it would show its preview of that file again."""
    if isinstance(response, str):
        return stub
    file = _read_file(response)
    if file is not None:
        return {**response, "file": {**file, "content": stub}}
    if isinstance(response, dict):
        return {**{k: v for k, v in response.items() if k not in PERSISTED_KEYS},
                "stdout": stub, "stderr": ""}
    return [{"type": "text", "text": stub}]


def claude_dirs(event: dict[str, Any]) -> list[str]:
    """Claude Code's own directories, whose files the hook may read: its configuration
    directory (``CLAUDE_CONFIG_DIR``, else ``~/.claude``) and the folder of the session's
    transcript."""
    dirs = [os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"),
                                                                ".claude")]
    transcript = event.get("transcript_path")
    if isinstance(transcript, str) and os.path.isabs(transcript):
        dirs.append(os.path.dirname(transcript))
    return [os.path.realpath(d) for d in dirs if os.path.isabs(d)]


def persisted_output(response: Any, event: dict[str, Any]) -> str | None:
    """The whole output Claude Code saved to its persisted-output file, when the file is a
    regular file inside one of its own directories (`claude_dirs`; never another path a
    tool's output could name) of at most `PERSISTED_MAX_BYTES`, in UTF-8; None otherwise."""
    if not isinstance(response, dict):
        return None
    path = response.get("persistedOutputPath")
    if not isinstance(path, str) or not os.path.isabs(path):
        return None
    dirs = claude_dirs(event)
    real = os.path.realpath(path)
    if not any(os.path.commonpath([real, d]) == d for d in dirs):
        return None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > PERSISTED_MAX_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(PERSISTED_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > PERSISTED_MAX_BYTES:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


@contextlib.contextmanager
def sub_agents(socket_path: str, session_id: str) -> Iterator[dict[str, Any]]:
    """A session's sub-agents and their branches, ``{"pending": [[tool_use_id, branch_id,
    subagent_type], ...], "agents": {agent_id: branch_id}}``, read and written back under
    a lock (Claude Code runs hooks side by side). Each hook is a process of its own: the
    map lives in a file beside the socket, in ctxd's private runtime folder (gone with a
    reboot, as the sub-agents are)."""
    folder = os.path.join(os.path.dirname(socket_path), "claude-code")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in session_id)[:128]
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(folder, f"{safe}.json"), os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        text = file.read()
        state: dict[str, Any] = json.loads(text) if text else {}
        state.setdefault("pending", [])
        state.setdefault("agents", {})
        before = json.dumps(state)
        yield state
        if json.dumps(state) != before:
            file.seek(0)
            file.truncate()
            file.write(json.dumps(state))


class Hook:
    """One event's handling: the calls it makes and the answer it gives."""

    def __init__(self, conn: Connection, event: dict[str, Any]):
        self.conn = conn
        self.event = event
        self.session_id: str = event["session_id"]
        self.project = project_of(event)
        self._through_gateway: bool | None = None
        self._agent_branch: tuple[str | None] | None = None

    def sub_agents(self) -> contextlib.AbstractContextManager[dict[str, Any]]:
        return sub_agents(self.conn.path, self.session_id)

    def agent_branch(self) -> str | None:
        """The branch of the sub-agent the event comes from (None: the main agent, or a
        sub-agent started before the hooks were installed). Read once an event."""
        if self._agent_branch is None:
            agent_id = self.event.get("agent_id")
            branch_id = None
            if isinstance(agent_id, str) and agent_id:
                with self.sub_agents() as state:
                    branch_id = state["agents"].get(agent_id)
            self._agent_branch = (branch_id if isinstance(branch_id, str) else None,)
        return self._agent_branch[0]

    def through_gateway(self) -> bool:
        """Whether Claude Code sends its model calls through this ctxd's gateway (its
        ``ANTHROPIC_BASE_URL``, from the environment or its settings, is the gateway's base
        URL). Then the gateway records the conversation, offloads its results, delivers
        injections and memories and records the usage, from what the model is sent: the
        hooks only open the session and compact ctxd's copy (docs/decisions.md, Gateway)."""
        if self._through_gateway is None:
            url = os.environ.get("ANTHROPIC_BASE_URL", "").rstrip("/")
            gateway = self.conn.call("daemon.status", {}).get("gateway") if url else None
            self._through_gateway = (isinstance(gateway, dict)
                                     and url == str(gateway["base_url"]).rstrip("/"))
        return self._through_gateway

    def gateway_records(self) -> bool:
        """Whether the gateway records the event's tool call (from what the model is sent):
        the main agent's, through the gateway. A sub-agent's model calls go as sent (their
        ``x-claude-code-agent-id`` header names the agent), so its hooks record its calls,
        in its branch (docs/decisions.md, Agents end to end)."""
        return self.agent_branch() is None and self.through_gateway()

    def open(self) -> dict[str, Any]:
        params: dict[str, Any] = {"session_id": self.session_id}
        if self.project:
            params["project"] = self.project
        result: dict[str, Any] = self.conn.call("session.open", params)
        return result

    def in_session(self, method: str, params: dict[str, Any]) -> Any:
        """A session call; a session ctxd does not know yet (hooks installed mid-session,
        a daemon with a fresh data directory) is opened first."""
        try:
            return self.conn.call(method, params)
        except HookError as exc:
            if exc.code != NOT_FOUND:
                raise
        self.open()
        return self.conn.call(method, params)

    def memories(self, query: str, compacted: bool = False,
                 main_context: bool = True) -> str | None:
        """The memories that match. For the main context (``main_context``), those already
        given to the session are left out (the daemon remembers them with it;
        ``compacted``: Claude Code compacted its context, which held them, so they may
        come again); a sub-agent's context starts empty, and is given them all."""
        query = query.strip()[:MAX_QUERY_CHARS]
        if not query:
            return None
        params: dict[str, Any] = {"query": query, "scope": scope_of(self.project)}
        if main_context:
            params["session_id"] = self.session_id
        if compacted:
            params["compacted"] = True
        result = self.conn.call("memory.context", params)
        text: str | None = result["text"]
        return text

    def answer(self, name: str, **fields: Any) -> dict[str, Any]:
        return {"hookSpecificOutput": {"hookEventName": name, **fields}}

    def context(self, name: str, parts: list[str | None]) -> dict[str, Any] | None:
        text = "\n\n".join(p for p in parts if p)
        return self.answer(name, additionalContext=text) if text else None

    def session_start(self) -> dict[str, Any] | None:
        self.open()
        source = self.event.get("source")
        if source not in ("startup", "resume", "compact"):
            return None
        parts: list[str | None] = []
        summary = self.summary() if source == "compact" else None
        parts.append(summary)
        name = os.path.basename((self.project or "").rstrip("/"))
        query = name or summary or ""
        if query and not self.through_gateway():
            parts.append(self.memories(query, compacted=source == "compact"))
        return self.context("SessionStart", parts)

    def summary(self) -> str | None:
        """The summary of ctxd's latest compaction of the session (taken at PreCompact):
        none when the session was never compacted."""
        resumed = self.conn.call("session.resume", {"session_id": self.session_id})
        if resumed["source"] != "snapshot":
            return None
        # A summary message starts as docs/protocol.md, "Compaction", writes it.
        summaries = [m["content"] for m in resumed["messages"]
                     if m["role"] == "user" and isinstance(m["content"], str)
                     and m["content"].startswith(SUMMARY_PREFIX)]
        return "\n\n".join(summaries) or None

    def user_prompt_submit(self) -> dict[str, Any] | None:
        prompt = self.event.get("prompt")
        if not isinstance(prompt, str) or not prompt or self.through_gateway():
            return None
        self.in_session("message.append", {"session_id": self.session_id, "messages": [
            {"role": "user", "content": prompt, "meta": {LIVE: "UserPromptSubmit"}}]})
        pulled = self.conn.call("inject.pull", {"session_id": self.session_id})
        injected: list[str | None] = []
        for injection in pulled["injections"]:
            self.conn.call("inject.ack", {"injection_id": injection["injection_id"],
                                          "accepted": True})
            injected.append(injection["content"])
        return self.context("UserPromptSubmit", [*injected, self.memories(prompt)])

    def pre_tool_use(self) -> dict[str, Any] | None:
        """A sub-agent's tool call is denied once its branch is spent (ctxd returned it:
        budget or deadline), so that it returns its result; a sub-agent's start (the
        Agent tool) opens its branch, under the branch of the agent that starts it."""
        parent = self.agent_branch()
        if parent is not None:
            branch = self.conn.call("branch.status", {"branch_id": parent})["branch"]
            reason = (BUDGET_EXHAUSTED if branch["status"] == "budget_exhausted"
                      or branch["budget_remaining"] <= 0 else
                      TIME_UP if branch["status"] == "timeout"
                      or (branch.get("time_left_s") is not None and branch["time_left_s"] <= 0)
                      else None)
            if reason is not None:
                return self.answer("PreToolUse", permissionDecision="deny",
                                   permissionDecisionReason=reason)
        tool_input = self.event.get("tool_input")
        tool_use_id = self.event.get("tool_use_id")
        if (self.event.get("tool_name") not in AGENT_TOOLS or not isinstance(tool_input, dict)
                or not isinstance(tool_use_id, str)):
            return None
        prompt = tool_input.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return None
        description = tool_input.get("description")
        description = (description if isinstance(description, str) and description.strip()
                       else prompt)[:500]
        created = self.in_session("branch.create", {
            "session_id": self.session_id, "description": description,
            "prompt": prompt[:1_048_576], "parent_branch_id": parent,
            "inject_memories": False})
        kind = tool_input.get("subagent_type")
        with self.sub_agents() as state:
            state["pending"].append([tool_use_id, created["branch_id"],
                                     kind if isinstance(kind, str) else None])
        return None

    def subagent_start(self) -> dict[str, Any] | None:
        """The sub-agent takes the branch its Agent call opened (the oldest waiting one
        of its type: the event does not name the call), and the memories of its task
        join its first prompt; the branch records them, as the sub-agent was sent them."""
        agent_id = self.event.get("agent_id")
        if not isinstance(agent_id, str) or not agent_id:
            return None
        kind = self.event.get("agent_type")
        with self.sub_agents() as state:
            pending = state["pending"]
            found = next((entry for entry in pending if entry[2] == kind),
                         pending[0] if pending else None)
            if found is None:
                return None
            pending.remove(found)
            state["agents"][agent_id] = found[1]
        branch = self.conn.call("branch.status", {"branch_id": found[1]})["branch"]
        text = self.memories(branch["description"], main_context=False)
        if not text:
            return None
        self.conn.call("message.append", {
            "session_id": self.session_id, "branch_id": found[1], "messages": [
                {"role": "user", "content": text, "meta": {LIVE: "SubagentStart"}}]})
        return self.context("SubagentStart", [text])

    def post_tool_use(self) -> dict[str, Any] | None:
        tool_name = self.event.get("tool_name")
        tool_use_id = self.event.get("tool_use_id")
        response = self.event.get("tool_response")
        if (not isinstance(tool_name, str) or not isinstance(tool_use_id, str)
                or self.gateway_records()):
            return None
        text = output_text(response)
        whole = persisted_output(response, self.event) if text else None
        if whole is not None and isinstance(response, dict):
            stderr = response.get("stderr")
            text = whole + (f"\n{stderr}" if isinstance(stderr, str) and stderr else "")
        interrupted = isinstance(response, dict) and response.get("interrupted") is True
        stub = self.record(tool_name, tool_use_id,
                           text if text is not None else json.dumps(response), interrupted)
        if stub is None or text is None:
            return None
        return self.answer("PostToolUse", updatedToolOutput=stubbed(response, stub))

    def post_tool_use_failure(self) -> None:
        """A tool that failed (a command's non-zero exit, an interrupt): its error is
        recorded as an error result. Claude Code takes no other output for it from a hook:
        the model sees Claude Code's text; ctxd's copy is offloaded only beyond the larger
        bound of an error (docs/protocol.md, "Offloaded tool results")."""
        tool_name = self.event.get("tool_name")
        tool_use_id = self.event.get("tool_use_id")
        error = self.event.get("error")
        if (not isinstance(tool_name, str) or not isinstance(tool_use_id, str)
                or not isinstance(error, str) or self.gateway_records()):
            return
        self.record(tool_name, tool_use_id, error, True, "PostToolUseFailure")

    def record(self, tool_name: str, tool_use_id: str, text: str, is_error: bool,
               live: str = "PostToolUse") -> str | None:
        """The tool call and its result appended to the session (a sub-agent's: to its
        branch); the stub the result is stored as (None: it stays inline, or the branch was
        returned)."""
        call = {"role": "assistant", "content": [{
            "type": "tool_use", "id": tool_use_id, "name": tool_name,
            "input": self.event.get("tool_input") or {}}], "meta": {LIVE: live}}
        result: dict[str, Any] = {
            "role": "tool", "name": tool_name[:256], "tool_call_id": tool_use_id[:256],
            "content": text, "meta": {LIVE: live}}
        if is_error:
            result["meta"]["is_error"] = True
        branch_id = self.agent_branch()
        params: dict[str, Any] = {"session_id": self.session_id, "messages": [call, result]}
        if branch_id is not None:
            params["branch_id"] = branch_id
        try:
            appended = self.in_session("message.append", params)
        except HookError as exc:
            if branch_id is None or exc.code not in (BUDGET_EXHAUSTED_CODE, TIMEOUT_CODE,
                                                    INVALID_STATE_CODE):
                raise
            return None  # ctxd returned the branch: the next call is denied
        stub: str | None = appended["appended"][-1].get("stub")
        return stub

    def ingest(self, path_field: str = "transcript_path") -> None:
        """Stop, SubagentStop, SessionEnd: the transcript from the last byte read (a
        sub-agent's own file becomes a branch); what the hooks recorded live is not
        appended again, and each response's usage is recorded once. The sub-agents' files
        are not: each is recorded live in its branch (`pre_tool_use`), or imported at its
        SubagentStop."""
        path = self.event.get(path_field)
        if not isinstance(path, str) or not os.path.isabs(path) or self.through_gateway():
            return
        params: dict[str, Any] = {"format": "claude-code", "path": path,
                                  "session_id": self.session_id, "subagents": False}
        if self.project:
            params["project"] = self.project
        self.conn.call("transcript.import", params)

    def subagent_stop(self) -> None:
        """A sub-agent with a branch returns it with its last message (a branch ctxd
        returned already keeps its fold); one without (started before the hooks) is
        imported from its transcript."""
        agent_id = self.event.get("agent_id")
        branch_id = self.agent_branch()
        if branch_id is None:
            self.ingest("agent_transcript_path")
            return
        with self.sub_agents() as state:
            state["agents"].pop(agent_id, None)
        message = self.event.get("last_assistant_message")
        if not isinstance(message, str) or not message.strip():
            message = "(the sub-agent ended without a message)"
        try:
            self.conn.call("branch.return", {"branch_id": branch_id,
                                             "message": message[:1_048_576]})
        except HookError as exc:
            if exc.code != INVALID_STATE_CODE:
                raise

    def pre_compact(self) -> None:
        # ctxd compacts its copy too: the compacted thread becomes the session's snapshot,
        # whose summary SessionStart (source "compact") hands back to the model.
        self.in_session("context.compact", {"session_id": self.session_id})


HANDLERS = {
    "SessionStart": Hook.session_start,
    "UserPromptSubmit": Hook.user_prompt_submit,
    "PreToolUse": Hook.pre_tool_use,
    "SubagentStart": Hook.subagent_start,
    "PostToolUse": Hook.post_tool_use,
    "PostToolUseFailure": Hook.post_tool_use_failure,
    "PreCompact": Hook.pre_compact,
    "Stop": Hook.ingest,
    "SubagentStop": Hook.subagent_stop,
    "SessionEnd": Hook.ingest,
}


def _socket_path(socket_arg: str | None) -> str:
    return socket_arg or str(default_socket_path())


def run(socket_arg: str | None, stdin: str, deadline_s: float = DEADLINE_S) -> str:
    """Handle one event; the text to print (empty: nothing). Never raises."""
    conn = None
    try:
        event = json.loads(stdin)
        handler = HANDLERS.get(event.get("hook_event_name"))
        if handler is None:
            return ""
        conn = Connection(_socket_path(socket_arg), time.monotonic() + deadline_s)
        answer = handler(Hook(conn, event))
        return json.dumps(answer) if answer else ""
    except UntrustedSocket as exc:  # not ctxd's: nothing is said to it, the user is told
        sys.stderr.write(f"ctxctl hook: {exc}\n")
        return ""
    except Exception as exc:  # fail open: Claude Code must go on whatever happened here
        _log(conn, socket_arg, f"{type(exc).__name__}: {exc}")
        return ""
    finally:
        if conn is not None:
            conn.close()


def _log(conn: Connection | None, socket_arg: str | None, message: str) -> None:
    """Tell the daemon's log why the hook answered nothing, when it can be reached."""
    try:
        if conn is None:
            conn = Connection(_socket_path(socket_arg), time.monotonic() + 0.5)
        conn.deadline = time.monotonic() + 0.5
        conn.call("daemon.log", {"source": SOURCE, "message": message[:2_000]})
    except Exception:
        return


def parse(argv: list[str]) -> str | None:
    """``hook [--socket PATH]``: the socket, or None for the default; other arguments
    are ignored (a hook fails open)."""
    socket_arg = None
    rest = argv[1:]
    while rest:
        arg = rest.pop(0)
        if arg == "--socket" and rest:
            socket_arg = rest.pop(0)
        elif arg.startswith("--socket="):
            socket_arg = arg.partition("=")[2]
    return socket_arg or os.environ.get("CTXD_SOCKET") or None


def takes(argv: list[str]) -> bool:
    """Whether the hook answers ``argv``, not the CLI: anything but a request for help
    (``hook --help`` reads no event; it prints what the command does)."""
    return not {"-h", "--help"} & set(argv[1:])


def main(argv: list[str]) -> int:
    """The hook's entry: ``argv`` starts with ``hook`` (`takes`). Always exits 0."""
    out = run(parse(argv), sys.stdin.read())
    if out:
        sys.stdout.write(out + "\n")
    return 0
