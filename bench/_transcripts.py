"""Recorded agent transcripts as ctxd messages, for the replay benchmark (bench/hygiene.py).

Small on purpose: enough of each format to replay a session's main thread as appends.
Claude Code (JSONL, or the same records as one JSON array): user text is a ``user``
message; the records of one API response (sharing ``message.id``) are one ``assistant``
message whose content keeps its ``text`` and ``tool_use`` parts (thinking blocks are
left out, as a harness does not send them back); each ``tool_result`` block is a ``tool``
message (``tool_call_id``, ``name`` of its call, ``meta.is_error``). Sidechain (sub-agent)
records, hook ``system`` records, summaries and file snapshots are skipped: a sub-agent
has its own context, and only its final answer (the ``Task`` tool's result) reaches the
main thread. SWE-agent (``.traj``): the ``history``, the demonstration left out; each
observation after an action is a ``tool`` message named after the action's command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Message = dict[str, Any]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or []
                     if isinstance(part, dict) and part.get("type") == "text")


def claude_code(records: list[dict[str, Any]]) -> list[Message]:
    messages: list[Message] = []
    names: dict[str, str] = {}
    last_response = None
    for record in records:
        if record.get("type") not in ("user", "assistant") or record.get("isSidechain"):
            continue
        message = record["message"]
        content = message["content"]
        if record["type"] == "assistant":
            parts = [part for part in content
                     if part.get("type") == "tool_use"
                     or (part.get("type") == "text" and part.get("text"))]
            for part in parts:
                if part["type"] == "tool_use":
                    names[part["id"]] = part["name"]
            if not parts:
                continue
            if (messages and messages[-1]["role"] == "assistant"
                    and message.get("id") is not None and message.get("id") == last_response):
                messages[-1]["content"].extend(parts)
            else:
                messages.append({"role": "assistant", "content": parts})
                last_response = message.get("id")
            continue
        last_response = None
        if isinstance(content, str):
            if content:
                messages.append({"role": "user", "content": content})
            continue
        texts = []
        for part in content:
            if part.get("type") == "tool_result":
                result: Message = {"role": "tool", "tool_call_id": part["tool_use_id"],
                                   "name": names.get(part["tool_use_id"], "tool"),
                                   "content": _text(part.get("content")) or "(no output)"}
                if part.get("is_error"):
                    result["meta"] = {"is_error": True}
                messages.append(result)
            elif part.get("type") == "text" and part.get("text"):
                texts.append(part["text"])
        if texts:
            messages.append({"role": "user", "content": "\n".join(texts)})
    return messages


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
        return claude_code([json.loads(line) for line in path.read_text().splitlines()
                            if line.strip()])
    return claude_code(json.loads(path.read_text()))
