"""Recorded agent transcripts as ctxd messages, for the replay benchmark (bench/hygiene.py).

Claude Code (JSONL, or the same records as one JSON array): the messages the importer's
parser (``ctxd.transcripts``, docs/protocol.md "transcript.import") makes of the main
thread, as ``transcript.import`` appends them: one message per record (an API response
written as several records is several ``assistant`` messages), thinking blocks left out,
each ``tool_result`` block a ``tool`` message named after its call. Sidechain
(sub-agent) records are left out: a sub-agent has its own context (an import makes it a
branch), and only its final answer (the ``Task`` tool's result) reaches the main thread.
SWE-agent (``.traj``): the ``history``, the demonstration left out; each observation
after an action is a ``tool`` message named after the action's command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from ctxd.transcripts import ClaudeCodeParser

Message = dict[str, Any]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or []
                     if isinstance(part, dict) and part.get("type") == "text")


def claude_code(data: bytes) -> list[Message]:
    """The main thread as ``transcript.import`` appends it: its parser's messages, those of
    sidechain records left out."""
    entries, _ = ClaudeCodeParser().feed(data, 0, 1)
    return [{k: v for k, v in msgspec.to_builtins(message).items() if v is not None}
            for entry in entries if entry.thread is None for message in entry.messages]


def swe_agent(trajectory: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    step = 0
    for entry in trajectory["history"]:
        if entry.get("is_demo"):
            continue
        role, content = entry["role"], _text(entry["content"]) or "(no output)"
        if role == "assistant":
            step += 1
            name = (entry.get("action") or "action").split(maxsplit=1)[0] if (
                entry.get("action") or "").strip() else "action"
            messages.append({"role": "assistant", "content": content,
                             "meta": {"tool_calls": [{"id": f"step_{step}", "name": name}]}})
        elif role == "user" and messages and messages[-1]["role"] == "assistant":
            call = messages[-1]["meta"]["tool_calls"][0]
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"],
                             "content": content})
        else:
            messages.append({"role": role, "content": content})
    return messages


def load(path: Path) -> list[Message]:
    """The main thread of the transcript at ``path``, as messages to append."""
    if path.suffix == ".traj":
        return swe_agent(json.loads(path.read_text()))
    if path.suffix == ".jsonl":
        return claude_code(path.read_bytes())
    # The same records as one JSON array: as the lines of a JSONL file.
    return claude_code(b"".join(json.dumps(record).encode() + b"\n"
                                for record in json.loads(path.read_text())))


def as_claude_code(path: Path, folder: Path) -> Path:
    """A SWE-agent trajectory written as the Claude Code transcript of the same calls (in
    ``folder``, named after it): the task as the user's prompt, each step an assistant
    record (its thought, and its action as a ``Bash`` call) answered by its observation as
    the call's result; the system prompt and the demonstration left out. Without
    timestamps: the replay prices every call as made at once."""
    history = json.loads(path.read_text())["history"]
    records: list[dict[str, Any]] = []
    step = 0
    waiting: str | None = None

    def add(kind: str, content: Any) -> None:
        records.append({"type": kind, "uuid": f"{kind[0]}{len(records)}",
                        "parentUuid": records[-1]["uuid"] if records else None,
                        "sessionId": path.stem, "message": {"role": kind, "content": content}})

    for entry in history:
        if entry.get("is_demo") or entry["role"] == "system":
            continue
        text = _text(entry["content"]) or "(no output)"
        if entry["role"] == "assistant":
            step += 1
            waiting = f"toolu_{step:04d}"
            add("assistant", [{"type": "text", "text": text},
                              {"type": "tool_use", "id": waiting, "name": "Bash",
                               "input": {"command": (entry.get("action") or "").strip()}}])
        elif waiting is not None:
            add("user", [{"type": "tool_result", "tool_use_id": waiting, "content": text}])
            waiting = None
        else:
            add("user", text)
    target = folder / f"{path.stem}.jsonl"
    target.write_text("".join(json.dumps(record) + "\n" for record in records))
    return target
