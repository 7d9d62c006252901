"""The gateway's rewrite keeps the prompt cache: a 30-turn session in Claude Code's shape
(marked system prompt, tools, thinking with signatures, large and small tool results, a
branch opened and returned), each request priced by the prompt cache's emulation
(ctxd/cost.py) as sent directly and as the rewrite sends it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from tests_support import running_supervisor

from ctxd.config import Config
from ctxd.cost import CacheUsage, PromptCache
from ctxd.gateway import GatewayRequest, prepare

MARK = {"type": "ephemeral"}
TURNS = 30
BRANCH_AT, RETURN_AT = 8, 14


def tool_output(turn: int) -> str:
    size = 12_000 if turn % 3 == 0 else 900
    return (f"output of step {turn}: src/module_{turn}.py:12: def handler(request):\n"
            * (size // 50))[:size]


def session() -> list[dict[str, Any]]:
    """The whole conversation: a user's task, then per turn the model's thinking, text
    and tool call and the tool's result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "Fix the failing tests in the handler module."}]}]
    for turn in range(TURNS):
        name, arguments = "Bash", {"command": f"pytest tests/test_{turn}.py"}
        if turn == BRANCH_AT:
            name, arguments = "mcp__ctxd__context_branch", {"description": "explore"}
        elif turn == RETURN_AT:
            name, arguments = "mcp__ctxd__context_return", {"message": "handler() drops "
                                                            "the request id"}
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"Step {turn}: look at the output. " * 8,
             "signature": f"EqQBCkYIBxgCKkD{turn:04d}" * 8},
            {"type": "text", "text": f"Running step {turn}."},
            {"type": "tool_use", "id": f"toolu_{turn:03d}", "name": name, "input": arguments}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{turn:03d}",
             "content": tool_output(turn)}]})
    return messages


def marked_request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A request as Claude Code sends it: its system prompt and its last message's last
    block marked."""
    last = messages[-1]
    messages = [*messages[:-1], {**last, "content": [
        *last["content"][:-1], {**last["content"][-1], "cache_control": MARK}]}]
    return {"model": "claude-x", "max_tokens": 1000,
            "system": [{"type": "text", "text": "You are a coding agent. " * 400,
                        "cache_control": MARK}],
            "tools": [{"name": f"tool_{n}", "description": "Does one thing well. " * 30,
                       "input_schema": {"type": "object"}} for n in range(12)],
            "messages": messages}


def read_share(charged: list[CacheUsage]) -> float:
    return sum(c.cache_read_tokens for c in charged) / sum(c.total for c in charged)


async def test_the_cache_is_read_as_much_through_the_rewrite_as_directly(
        tmp_path: Path) -> None:
    now = [0.0]
    direct, rewritten = PromptCache(lambda: now[0]), PromptCache(lambda: now[0])
    charged_direct: list[CacheUsage] = []
    charged_rewritten: list[CacheUsage] = []
    conversation = session()
    async with running_supervisor(tmp_path / "ctxd.db", Config()) as supervisor:
        for end in range(1, len(conversation) + 1, 2):
            body = marked_request(conversation[:end])
            prepared = await prepare(supervisor, GatewayRequest(
                api="anthropic", endpoint="messages", session_header="s1", body=body))
            charged_direct.append(direct.charge(body))
            charged_rewritten.append(rewritten.charge(msgspec.json.decode(prepared.body)))
            now[0] += 20.0
    assert len(charged_direct) == TURNS + 1
    total_direct = sum(c.total for c in charged_direct)
    total_rewritten = sum(c.total for c in charged_rewritten)
    cost_direct = sum(c.cost() for c in charged_direct)
    cost_rewritten = sum(c.cost() for c in charged_rewritten)
    # Within 5 points of the share read from cache directly, for fewer tokens and less cost.
    assert read_share(charged_rewritten) >= read_share(charged_direct) - 0.05, (
        read_share(charged_rewritten), read_share(charged_direct))
    assert total_rewritten < 0.5 * total_direct, (total_rewritten, total_direct)
    assert cost_rewritten < 0.6 * cost_direct, (cost_rewritten, cost_direct)
    # Every request but the first two and the fold's reads what the one before wrote.
    misses = [turn for turn, c in enumerate(charged_rewritten) if c.cache_read_tokens == 0]
    assert misses == [0]
