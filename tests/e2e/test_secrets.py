"""Secrets against a real daemon (docs/security.md): what leaves a session is scrubbed, a
session's own messages are stored as given unless ``scrub_at_rest``, and deleted text is
gone from the database file."""

from __future__ import annotations

import json
import stat
import string
import sys
from pathlib import Path
from typing import Any

from conftest import DaemonProcess
from e2e.test_hooks import event, hook
from tests_support import next_event

from ctxclient import Client

ALNUM = string.ascii_letters + string.digits


def fake(prefix: str, length: int, alphabet: str = ALNUM) -> str:
    return prefix + "".join(alphabet[i * 7 % len(alphabet)] for i in range(length))


VAULT = fake("hvs.", 90)
DD_KEY = fake("", 40, "0123456789abcdef")
# Formats the scrubber missed or cut short before (docs/security.md), and the parts of
# them that must not be seen anywhere.
RETURN_MESSAGE = ("Deployed.\ncredentials:\n  password: PrTOzSJgJMHxPIVh\n"
                  "dsn postgresql://admin:Pa@ss!w0rd9@db.internal/app\n"
                  f"vault {VAULT}; ran mysql -u root -pS3cr3t!x app")
FOLDED = ('Branch "deploy with DD_APP_KEY=[REDACTED:secret_assignment]" returned: Deployed.\n'
          "credentials:\n  password: [REDACTED:secret_assignment]\n"
          "dsn postgresql://admin:[REDACTED:url_password]@db.internal/app\n"
          "vault [REDACTED:vault_token]; ran mysql -u root -p[REDACTED:cli_password] app")
SECRETS = ["PrTOzSJgJMHxPIVh", "Pa@ss", "ss!w0rd9", VAULT[4:], "S3cr3t!x", DD_KEY]


def no_secret(value: Any) -> list[str]:
    """The secrets that a reply (any JSON value) still shows."""
    text = json.dumps(value)
    return [secret for secret in SECRETS if secret in text]


def wait_for(client: Client, event_type: str) -> dict[str, Any]:
    seen = []
    while True:
        event = next_event(client, timeout=30)
        seen.append(event)
        if event["type"] == event_type:
            return seen[-1] | {"all": seen}


def test_what_leaves_a_session_is_scrubbed(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as watcher, shared_daemon.client() as client:
        watcher.call("events.subscribe", {"session_id": sid})
        client.call("session.open", {"session_id": sid,
                                     "title": f"deploy with DD_APP_KEY={DD_KEY}"})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "deploy the app"}]})
        branch_id = client.call("branch.create", {
            "session_id": sid, "description": f"deploy with DD_APP_KEY={DD_KEY}",
            "prompt": "deploy"})["branch_id"]
        returned = client.call("branch.return", {"branch_id": branch_id,
                                                 "message": RETURN_MESSAGE,
                                                 "extract_memory": True})
        assert returned["summary"]["secrets_scrubbed"] == 4
        recorded = wait_for(watcher, "memory.recorded")
        replies = {
            "branch.return": returned,
            "ctxd.render": client.call("ctxd.render", {"session_id": sid}),
            "message.list": client.call("message.list", {"session_id": sid}),
            "branch.status": client.call("branch.status", {"branch_id": branch_id}),
            "branch.list": client.call("branch.list", {"session_id": sid}),
            "events": recorded["all"],
            "memory.get": client.call("memory.get", {"id": recorded["data"]["id"]}),
            "memory.list": client.call("memory.list", {}),
            "memory.search": client.call("memory.search", {"query": "deployed credentials"}),
        }
        assert {name: no_secret(reply) for name, reply in replies.items()} == {
            name: [] for name in replies}
        assert recorded["all"][0]["data"]["title"] == (
            "deploy with DD_APP_KEY=[REDACTED:secret_assignment]")
        assert replies["ctxd.render"]["messages"][-1]["content"] == FOLDED
        assert replies["message.list"]["messages"][-1]["content"] == FOLDED
        branch = replies["branch.status"]["branch"]
        assert branch["result"] == FOLDED.split(" returned: ", 1)[1]
        assert branch["description"] == "deploy with DD_APP_KEY=[REDACTED:secret_assignment]"
        memory = replies["memory.get"]["memory"]
        assert (memory["title"], memory["content"]) == (branch["description"], branch["result"])
        # Recorded directly, a memory is scrubbed the same way.
        made = client.call("memory.record", {"title": "the staging database",
                                             "content": RETURN_MESSAGE, "scope": "global"})
        assert made["secrets_scrubbed"] == 4
        assert no_secret(client.call("memory.get", {"id": made["memory"]["id"]})) == []


def test_a_sessions_own_messages_are_stored_as_given(shared_daemon: DaemonProcess,
                                                     sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": RETURN_MESSAGE}]})
        listed = client.call("message.list", {"session_id": sid})["messages"]
    assert [m["content"] for m in listed] == [RETURN_MESSAGE]
    assert stat.S_IMODE((shared_daemon.data_dir / "ctxd.db").stat().st_mode) == 0o600


def raw_bytes(data_dir: Path) -> bytes:
    """The database file and its WAL (if any) as they are on disk."""
    return b"".join(path.read_bytes() for path in (data_dir / "ctxd.db",
                                                   data_dir / "ctxd.db-wal") if path.exists())


def test_scrub_at_rest_scrubs_a_sessions_own_messages(daemon_root: Path, sid: str) -> None:
    process = DaemonProcess(daemon_root, ["--scrub-at-rest", "true"]).start()
    try:
        with process.client() as client:
            client.call("session.open", {"session_id": sid})
            client.call("message.append", {"session_id": sid, "messages": [
                {"role": "user", "content": RETURN_MESSAGE},
                {"role": "user", "content": [{"type": "text", "text": f"key {VAULT}"},
                                             {"type": "image_url", "image_url": {"url": "x"}}]}]})
            branch_id = client.call("branch.create", {"session_id": sid, "description": "d",
                                                      "prompt": f"use {VAULT}"})["branch_id"]
            main = client.call("message.list", {"session_id": sid})["messages"]
            opening = client.call("message.list", {"session_id": sid,
                                                   "branch_id": branch_id})["messages"]
    finally:
        process.stop()
    assert main[0]["content"] == FOLDED.split(" returned: ", 1)[1]
    assert main[1]["content"] == [{"type": "text", "text": "key [REDACTED:vault_token]"},
                                  {"type": "image_url", "image_url": {"url": "x"}}]
    assert opening[-1]["content"] == "use [REDACTED:vault_token]"
    assert [secret for secret in SECRETS if secret.encode() in raw_bytes(process.data_dir)] == []


def test_deleted_text_is_gone_from_disk(daemon_root: Path) -> None:
    """session.delete and memory.delete overwrite what they delete: messages (one long
    enough for overflow pages), folds, branch results and descriptions, memories and their
    words in the full-text index. Kept markers show that the search would find them."""
    process = DaemonProcess(daemon_root).start()
    deleted: list[str] = []
    kept: list[str] = []
    try:
        with process.client() as client:
            for n in range(20):
                markers = [f"zqdel{n:03d}m{i}" for i in range(4)]
                target = kept if n % 5 == 0 else deleted
                target += markers
                session = f"s_{n}"
                client.call("session.open", {"session_id": session})
                client.call("message.append", {"session_id": session, "messages": [
                    {"role": "user", "content": f"look for {markers[0]}"},
                    {"role": "assistant", "content": "lorem " * 3000 + markers[1]}]})
                branch_id = client.call("branch.create", {
                    "session_id": session, "description": f"find {markers[2]}",
                    "prompt": "find it"})["branch_id"]
                client.call("branch.return", {"branch_id": branch_id,
                                              "message": f"found {markers[3]}"})
            memory_ids = {}
            for n in range(40):
                marker = f"zqmem{n:03d}"
                (kept if n % 5 == 0 else deleted).append(marker)
                memory_ids[marker] = client.call("memory.record", {
                    "title": f"lesson {marker}", "content": f"the {marker} lesson body",
                    "tags": [marker], "scope": "global"})["memory"]["id"]
            for n in range(20):
                if n % 5:
                    client.call("session.delete", {"session_id": f"s_{n}"})
            for marker, memory_id in memory_ids.items():
                if marker in deleted:
                    client.call("memory.delete", {"id": memory_id})
    finally:
        process.stop()
    on_disk = raw_bytes(process.data_dir)
    assert (len(deleted), len(kept)) == (96, 24)
    assert [marker for marker in deleted if marker.encode() in on_disk] == []
    assert [marker for marker in kept if marker.encode() not in on_disk] == []


# ---- every channel out of a session ------------------------------------------------------

DSN = "postgresql://admin:Pa@ss!w0rd9@db.internal/app"
CURL_PW = "S3cr3tPass!"
OKTA = fake("00", 40, ALNUM + "-_")
KUBE_KEY = fake("LS0tLS1CRUdJTiBSU0Eg", 120)
NETRC_PW = "n3trc-Pa55word"
PG_PW = "Sup3r$ecret!"
DJANGO = "django-insecure-7x)k2#v@9m$!8^w%n(q&5e-r_3tb0c*y=j4o6p+l1a"
AWS_ID = fake("AKIA", 16, string.ascii_uppercase)
API_TOKEN = "tok-9f8e7d6c5b4a"
GITHUB = fake("ghp_", 36)
ACK_PW = "ack-Pa55word"
# The thread that is forked: a secret in a message, a tool call's input, a tool result.
SOURCE = [
    {"role": "user", "content": f"Deploy it. The DSN is {DSN}"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "Bash", "input": {
        "command": f"curl -u deploy:{CURL_PW} https://api.example.com/deploy",
        "password": "hunter2hunter2"}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "Bash",
     "content": f"Authorization: SSWS {OKTA}\ndeployed"},
]
SOURCE_SCRUBBED = [
    "Deploy it. The DSN is postgresql://admin:[REDACTED:url_password]@db.internal/app",
    [{"type": "tool_use", "id": "c1", "name": "Bash", "input": {
        "command": "curl -u deploy:[REDACTED:cli_password] https://api.example.com/deploy",
        "password": "[REDACTED:secret_assignment]"}}],
    "Authorization: SSWS [REDACTED:okta_token]\ndeployed",
]
FORKED_CONTEXT = (
    f"[user]\n{SOURCE_SCRUBBED[0]}\n\n"
    '[assistant]\n[tool_use Bash id=c1] {"command": "curl -u deploy:[REDACTED:cli_password] '
    'https://api.example.com/deploy", "password": "[REDACTED:secret_assignment]"}\n\n'
    f"[tool: Bash]\n{SOURCE_SCRUBBED[2]}")
MEMORY_LINE = ("- staging pgpass (confidence 0.80): Our ~/.pgpass line:\n"
               "db.internal:5432:app:appuser:[REDACTED:pgpass_password]\n")
MEMORY_BLOCK = "Memories from earlier work that may help with this sub-task:\n" + MEMORY_LINE
"""The memory as a new branch's opening shows it."""
PROMPT_MEMORY_BLOCK = "Memories from earlier work that may help with this task:\n" + MEMORY_LINE
"""The memory as the hooks' memory.context gives it, beside a user's prompt."""
RAW = [DSN.split(":")[2], CURL_PW, OKTA, "hunter2hunter2", KUBE_KEY, NETRC_PW, PG_PW, DJANGO,
       DJANGO[20:], AWS_ID, API_TOKEN, GITHUB, ACK_PW]


def seeded(client: Client, session_id: str) -> list[Any]:
    """A forked session's messages after its preamble."""
    return [m["content"] for m in client.call("message.list",
                                              {"session_id": session_id})["messages"][1:]]


def test_every_channel_out_of_a_session_is_scrubbed(daemon_root: Path, sid: str) -> None:
    """docs/security.md, "What leaves a session": one secret per channel, and the exact text
    each channel hands out. A session's own messages are the only place the raw ones stay."""
    seen = daemon_root / "span.json"
    script = daemon_root / "summarize.py"
    script.write_text(f"import sys\nopen({str(seen)!r}, 'w').write(sys.stdin.read())\n"
                      "print('Pushed the fix.')\n")
    process = DaemonProcess(daemon_root, ["--hygiene-auto-compact", "false",
                                          "--hygiene-summarizer", "command",
                                          "--hygiene-summarizer-command",
                                          f"{sys.executable} {script}"])
    got: dict[str, Any] = {}
    with process.running(), process.client() as watcher, process.client() as client, \
            process.client() as mcp:
        watcher.call("events.subscribe", {"session_id": sid})
        client.call("session.open", {"session_id": sid, "title": f"ops with {AWS_ID}"})
        got["event session.opened (title)"] = wait_for(watcher, "session.opened")["data"]["title"]
        client.call("message.append", {"session_id": sid, "messages": SOURCE})
        # Forks: context.fork, session.open fork_from, MCP context_fork.
        got["context.fork"] = client.call("context.fork", {"session_id": sid})["context"]
        client.call("session.open", {"session_id": sid + "-fork",
                                     "fork_from": {"session_id": sid}})
        got["session.open fork_from"] = seeded(client, sid + "-fork")
        # MCP over the socket, as `ctxctl mcp` relays it.
        mcp.call("mcp.bind", {"session_id": sid})
        tool = mcp.call("tools/call", {"name": "context_fork",
                                       "arguments": {"session_id": sid + "-mcp",
                                                     "include_context": True}})
        got["MCP context_fork"] = tool["structuredContent"]["context"]
        got["MCP context_fork (its session)"] = seeded(client, sid + "-mcp")
        # Folds: branch.return (and the memory it extracts), a forced return's partial
        # result; a branch's description in its event.
        outer = client.call("branch.create", {
            "session_id": sid, "description": f"deploy with API_TOKEN={API_TOKEN}",
            "prompt": "deploy"})["branch_id"]
        got["event branch.created (description)"] = wait_for(
            watcher, "branch.created")["data"]["description"]
        inner = client.call("branch.create", {"session_id": sid, "description": "netrc",
                                              "prompt": "look", "parent_branch_id": outer})
        client.call("message.append", {"session_id": sid, "branch_id": inner["branch_id"],
                                       "messages": [{"role": "assistant", "content": (
                                           "Found ~/.netrc: machine github.com login ci "
                                           f"password {NETRC_PW}")}]})
        client.call("branch.return", {"branch_id": outer, "extract_memory": True,
                                      "message": f"Done. client-key-data: {KUBE_KEY}"})
        got["fold (branch.return)"] = client.call("message.list", {
            "session_id": sid})["messages"][-1]["content"]
        got["forced return (partial result)"] = client.call(
            "branch.status", {"branch_id": inner["branch_id"]})["branch"]["result"]
        extracted = wait_for(watcher, "memory.recorded")["data"]["id"]
        got["memory extracted"] = client.call("memory.get", {"id": extracted})["memory"]["content"]
        # Memories, and what is built of them: memory.context's block (the hooks' memories),
        # the injection into a new branch.
        made = client.call("memory.record", {
            "title": "staging pgpass", "scope": "global",
            "content": f"Our ~/.pgpass line:\ndb.internal:5432:app:appuser:{PG_PW}"})
        got["memory.record"] = client.call("memory.get", {"id": made["memory"]["id"]})[
            "memory"]["content"]
        got["memory.context"] = client.call("memory.context", {
            "query": "staging pgpass", "scope": "global"})["text"]
        injected = client.call("branch.create", {"session_id": sid, "parent_branch_id": None,
                                                 "description": "staging pgpass",
                                                 "prompt": "check the staging pgpass"})
        got["branch.create injection"] = client.call("message.list", {
            "session_id": sid, "branch_id": injected["branch_id"]})["messages"][-2]["content"]
        # Injections, as inject.pull and a hook's answer hand them out; an answer's reason.
        client.call("inject.push", {"session_id": sid,
                                    "content": f"Set SECRET_KEY={DJANGO} in prod"})
        [pulled] = client.call("inject.pull", {"session_id": sid})["injections"]
        got["inject.pull"] = pulled["content"]
        client.call("inject.ack", {"injection_id": pulled["injection_id"], "accepted": False,
                                   "reason": f"use DB_PASSWORD={ACK_PW} instead"})
        [acked] = client.call("inject.list", {"session_id": sid, "state": "rejected"})[
            "injections"]
        got["inject.ack (reason)"] = acked["reason"]
        client.call("inject.push", {"session_id": sid,
                                    "content": f"Set SECRET_KEY={DJANGO} in staging"})
        _, answer, _ = hook(process.socket, event("UserPromptSubmit", sid, "/",
                                                  prompt="continue"))
        got["hook answer"] = json.loads(answer)["hookSpecificOutput"]["additionalContext"]
        # The span a compaction sends to a command summarizer.
        client.call("session.open", {"session_id": sid + "-span", "budget": {
            "context_window": 6000, "max_output_tokens": 0}})
        client.call("message.append", {"session_id": sid + "-span", "messages": [
            {"role": "user", "content": "Fix the tests."},
            {"role": "assistant", "content": f"Pushed with {GITHUB}."},
            *({"role": "assistant", "content": f"step {i}: " + "ran the tests. " * 40}
              for i in range(28))]})
        compacted = client.call("context.compact", {"session_id": sid + "-span",
                                                    "strategies": ["summarize"]})
        assert (compacted["summarizer"], compacted["summarizer_error"]) == ("command", None)
        span = json.loads(seen.read_text())
        got["summarizer span"] = next(m["content"] for m in span["messages"]
                                      if "Pushed with" in str(m["content"]))
        own = [m["content"] for m in client.call("message.list", {"session_id": sid,
                                                                  "limit": 3})["messages"]]
    assert got == {
        "event session.opened (title)": "ops with [REDACTED:aws_access_key_id]",
        "context.fork": FORKED_CONTEXT,
        "session.open fork_from": SOURCE_SCRUBBED,
        "MCP context_fork": FORKED_CONTEXT,
        "MCP context_fork (its session)": SOURCE_SCRUBBED,
        "event branch.created (description)": "deploy with API_TOKEN=[REDACTED:secret_assignment]",
        "fold (branch.return)": 'Branch "deploy with API_TOKEN=[REDACTED:secret_assignment]" '
                                "returned: Done. client-key-data: [REDACTED:kubeconfig_client_key]",
        "forced return (partial result)": "Found ~/.netrc: machine github.com login ci password "
                                          "[REDACTED:netrc_password]",
        "memory extracted": "Done. client-key-data: [REDACTED:kubeconfig_client_key]",
        "memory.record": "Our ~/.pgpass line:\ndb.internal:5432:app:appuser:"
                         "[REDACTED:pgpass_password]",
        "memory.context": PROMPT_MEMORY_BLOCK,
        "branch.create injection": MEMORY_BLOCK,
        "inject.pull": "Set SECRET_KEY=[REDACTED:secret_assignment] in prod",
        "inject.ack (reason)": "use DB_PASSWORD=[REDACTED:secret_assignment] instead",
        "hook answer": "Set SECRET_KEY=[REDACTED:secret_assignment] in staging",
        "summarizer span": "Pushed with [REDACTED:github_token].",
    }
    assert [secret for secret in RAW if secret in json.dumps(got)] == []
    # The session's own messages are stored as given (docs/security.md, promise 3).
    assert own[0] == SOURCE[0]["content"]
