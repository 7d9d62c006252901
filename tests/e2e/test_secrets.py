"""Secrets against a real daemon (docs/security.md): what leaves a session is scrubbed, a
session's own messages are stored as given unless ``scrub_at_rest``, and deleted text is
gone from the database file."""

from __future__ import annotations

import json
import stat
import string
from pathlib import Path
from typing import Any

from conftest import DaemonProcess
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
