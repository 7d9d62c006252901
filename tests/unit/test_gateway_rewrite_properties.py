"""The gateway's rewrite as properties over generated histories, both APIs, against a real
Store file, the real Supervisor and the real token counter: the request sent is valid,
its substitutions are sticky, every byte taken out can be read back, a repeated request
records nothing, and a rewound history is a boundary."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests_support import ledger_line, running_supervisor

from ctxd.config import Config
from ctxd.gateway import GatewayRequest, Prepared, _anthropic, _openai, prepare
from ctxd.gateway._blocks import bare, content_text
from ctxd.gateway._ledger import LedgerRow
from ctxd.gateway._rewrite import _ledgers, rewrite_points, shown
from ctxd.sessions import Supervisor, get_session, read_result
from ctxd.wire.types import ResultReadParams

THRESHOLD = 1_024
# 25 generated histories a property and run (each on a Supervisor and store of its own, about
# 0.1 s); every run of the suite draws new ones.
PROPERTIES = settings(max_examples=25, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPECIAL = {"open": "mcp__ctxd__context_branch", "close": "mcp__ctxd__context_return",
           "compact": "mcp__ctxd__compact_context", "plain": None}
REF = re.compile(r'ref_id="(res_[0-9a-f]{16})"')

words = st.text(alphabet="abcdefghij klmnop\n", min_size=1, max_size=40)
big = st.integers(THRESHOLD + 1, 3 * THRESHOLD).map(lambda n: ("0123456789abcdef\n" * n)[:n])
marks = st.booleans()


@st.composite
def tool_names(draw: st.DrawFn) -> list[str]:
    """One turn's tool calls: ordinary ones, and in some turns one of ctxd's (a branch
    opened or returned, the context compacted) among them."""
    names = draw(st.lists(st.sampled_from(["Bash", "Read"]), max_size=2))
    special = SPECIAL[draw(st.sampled_from(["plain", "plain", "open", "close", "compact"]))]
    if special is not None:
        names.insert(draw(st.integers(0, len(names))), special)
    return names


def config() -> Config:
    return msgspec.convert({"hygiene": {"offload_threshold_bytes": THRESHOLD}}, Config)


def run(example: Callable[[Supervisor], Awaitable[None]]) -> None:
    """Run ``example`` on a Supervisor of its own, over a store file of its own."""
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with running_supervisor(Path(tmp) / "ctxd.db", config()) as supervisor:
                await example(supervisor)

    trio.run(main)


# ---- Anthropic histories ------------------------------------------------------------------

@st.composite
def anthropic_result(draw: st.DrawFn, call_id: str) -> dict[str, Any]:
    kind = draw(st.sampled_from(["small", "big", "blocks", "image", "error", "empty"]))
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    if kind == "small":
        block["content"] = draw(words)
    elif kind == "big":
        block["content"] = draw(big)
    elif kind == "blocks":
        block["content"] = [{"type": "text", "text": draw(big)},
                            {"type": "text", "text": draw(words)}]
    elif kind == "image":
        block["content"] = [{"type": "image", "source": {"type": "base64",
                                                         "media_type": "image/png",
                                                         "data": "iVBORw0KGgo=" * 200}}]
    elif kind == "error":
        block["content"], block["is_error"] = draw(big), True
    return block


@st.composite
def anthropic_history(draw: st.DrawFn) -> list[dict[str, Any]]:
    """user, then turns of an assistant (thinking with a signature, text, unknown blocks,
    tool calls) and the user's answer (the calls' results, text), ending with a user."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(words)}]
    for turn in range(draw(st.integers(1, 10))):
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(words),
                           "signature": "EqQBCkYIBxgCKkD" + str(turn)})
        if draw(st.booleans()):
            blocks.append({"type": "server_tool_use", "id": f"srv_{turn}",
                           "name": "web_search", "input": {"query": "q"}})
            blocks.append({"type": "web_search_tool_result", "tool_use_id": f"srv_{turn}",
                           "content": [{"type": "web_search_result", "url": "u"}]})
        if draw(st.booleans()):
            blocks.append({"type": "mystery_block", "payload": [1, 2.5, None, "x"]})
        blocks.append({"type": "text", "text": draw(words)})
        names = draw(tool_names())
        calls = [{"type": "tool_use", "id": f"toolu_{turn}_{i}", "name": name,
                  "input": {"message": "summary"} if name.endswith("return") else {}}
                 for i, name in enumerate(names)]
        messages.append({"role": "assistant", "content": blocks + calls})
        answer = [draw(anthropic_result(call["id"])) for call in calls]
        if not answer or draw(st.booleans()):
            answer.append({"type": "text", "text": draw(words)})
        if draw(marks):
            answer[-1] = {**answer[-1], "cache_control": {"type": "ephemeral"}}
        messages.append({"role": "user", "content": answer})
        if draw(st.integers(0, 5)) == 0:
            messages.append({"role": "system", "content": draw(words)})
    return messages


# ---- OpenAI histories ---------------------------------------------------------------------

@st.composite
def openai_history(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": draw(words)}]
    for turn in range(draw(st.integers(1, 10))):
        names = draw(tool_names())
        assistant: dict[str, Any] = {"role": "assistant", "content": draw(words)}
        if names:
            assistant["tool_calls"] = [
                {"id": f"call_{turn}_{i}", "type": "function",
                 "function": {"name": name, "arguments": '{"message": "summary"}'}}
                for i, name in enumerate(names)]
        messages.append(assistant)
        for i, _ in enumerate(names):
            content = draw(st.one_of(words, big, big.map(
                lambda text: [{"type": "text", "text": text}])))
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}_{i}",
                             "content": content})
        if not names or draw(st.booleans()):
            messages.append({"role": "user", "content": draw(words)})
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "go on"})
    return messages


histories = st.one_of(anthropic_history().map(lambda h: ("anthropic", h)),
                      openai_history().map(lambda h: ("openai", h)))


def marked_last(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as Claude Code sends them: the last one's last block marked, a text
    content as a marked text block (and as a string again once it is not last)."""
    if not messages:
        return messages
    last = messages[-1]
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return [*messages[:-1], {**last, "content": [
        *blocks[:-1], {**blocks[-1], "cache_control": {"type": "ephemeral"}}]}]


def request(api: str, messages: list[dict[str, Any]], endpoint: str = "messages",
            session: str = "s1") -> GatewayRequest:
    if api == "anthropic":
        messages = marked_last(messages)
    body = {"model": "m", "max_tokens": 10, "messages": messages}
    return GatewayRequest(api=api, endpoint=endpoint  # type: ignore[arg-type]
                          if api == "anthropic" else "chat_completions",
                          session_header=session, body=body)


def shape_of(api: str) -> Any:
    return _anthropic if api == "anthropic" else _openai


async def ledger(supervisor: Supervisor, api: str,
                 messages: list[dict[str, Any]]) -> list[LedgerRow]:
    """The ledger's line a request with these messages is matched against."""
    _, rows = await ledger_line(supervisor.store, "s1", shape_of(api),
                                request(api, messages).body)
    return rows


def sent_messages(prepared: Prepared) -> list[dict[str, Any]]:
    return msgspec.json.decode(prepared.body)["messages"]  # type: ignore[no-any-return]


def originals(api: str, messages: list[dict[str, Any]]) -> dict[str, str | None]:
    shape = shape_of(api)
    return {result.call_id: result.text for message in messages
            for result in shape.results(message)}


async def read_whole(supervisor: Supervisor, ref_id: str) -> str:
    text, offset = "", 0
    while True:
        params = ResultReadParams(session_id="s1", ref_id=ref_id, offset=offset, limit=1_000)
        page = await supervisor.call("s1", lambda a, p=params: read_result(a, p))
        text += page.content
        if page.next_offset is None:
            return text
        offset = page.next_offset


def cuts(api: str, messages: list[dict[str, Any]]) -> list[int]:
    """Where a request may end: after a user message (Anthropic), or any message a
    request could end with (OpenAI: a user or tool message followed by an assistant)."""
    ends = [i + 1 for i, m in enumerate(messages) if m["role"] == "user"] if api == "anthropic" \
        else [i + 1 for i, m in enumerate(messages[:-1])
              if m["role"] in ("user", "tool") and messages[i + 1]["role"] == "assistant"]
    return ends or [len(messages)]


# ---- the properties -----------------------------------------------------------------------

@PROPERTIES
@given(history=histories)
def test_the_request_sent_is_valid_and_every_removed_byte_reads_back(
        history: tuple[str, list[dict[str, Any]]]) -> None:
    api, messages = history
    shape = shape_of(api)
    assert shape.problems(messages) == []

    async def example(supervisor: Supervisor) -> None:
        prepared = await prepare(supervisor, request(api, messages))
        sent = sent_messages(prepared)
        assert shape.problems(sent) == []
        given_results = originals(api, messages)
        for message in sent:
            for result in shape.results(message):
                if result.text == given_results[result.call_id]:
                    continue
                [ref_id] = REF.findall(result.text or "")
                assert await read_whole(supervisor, ref_id) == given_results[result.call_id]
        # Blocks ctxd does not change pass through as given.
        given_blocks = [msgspec.json.encode(block) for m in messages
                        if isinstance(m.get("content"), list) for block in m["content"]
                        if block["type"] not in ("text", "tool_result", "tool_use")]
        sent_blocks = {msgspec.json.encode(block) for m in sent
                       if isinstance(m.get("content"), list) for block in m["content"]}
        folded = any(kind != "compaction" for kind, *_ in rewrite_points(shape, messages))
        if not rewrite_points(shape, messages):
            assert all(block in sent_blocks for block in given_blocks)
            assert prepared.removed_tokens == 0 or any(
                REF.search(result.text or "") for m in sent for result in shape.results(m))
        assert folded or len(sent) == len(messages)

    run(example)


@PROPERTIES
@given(history=histories)
def test_a_growing_history_keeps_every_earlier_message_sent_as_it_was(
        history: tuple[str, list[dict[str, Any]]]) -> None:
    """Request after request, as an agent sends them: what was sent for a message stays
    the same bytes, but where a fold or compaction the new messages bring starts."""
    api, messages = history
    shape = shape_of(api)

    async def example(supervisor: Supervisor) -> None:
        before: list[LedgerRow] = []
        sent_before: list[dict[str, Any] | None] = []
        previous = 0
        for cut in [*cuts(api, messages), len(messages)]:
            prepared = await prepare(supervisor, request(api, messages[:cut]))
            after = await ledger(supervisor, api, messages)
            sent_now = shown(shape, messages[:cut], dict(enumerate(after))).messages
            new_points = [first for _, first, end in rewrite_points(shape, messages[:cut])
                          if end >= previous]
            stable = min([*new_points, previous])
            assert sent_now[:stable] == sent_before[:stable]
            assert [row.node for row in after[:previous]] == [row.node for row in before]
            # The body is the ledger's view, the agent's marks put back.
            assert [shape.bare(m) for m in sent_messages(prepared)] == [
                shape.bare(m) for m in sent_now if m is not None]
            before, sent_before, previous = after, sent_now, cut

    run(example)


@PROPERTIES
@given(history=histories)
def test_the_same_request_twice_records_nothing_the_second_time(
        history: tuple[str, list[dict[str, Any]]]) -> None:
    api, messages = history

    async def example(supervisor: Supervisor) -> None:
        first = await prepare(supervisor, request(api, messages))
        recorded = (await supervisor.call("s1", get_session)).session.message_count
        rows = await ledger(supervisor, api, messages)
        again = await prepare(supervisor, request(api, messages))
        assert again == first
        assert (await supervisor.call("s1", get_session)).session.message_count == recorded
        assert await ledger(supervisor, api, messages) == rows
        counted = await prepare(supervisor, request(api, messages, "count_tokens"))
        assert (counted.body, counted.tokens) == (first.body, first.tokens)

    run(example)


@PROPERTIES
@given(history=histories, data=st.data())
def test_a_rewound_history_is_a_boundary_and_only_its_new_messages_are_recorded(
        history: tuple[str, list[dict[str, Any]]], data: st.DataObject) -> None:
    api, messages = history
    cut = data.draw(st.sampled_from(cuts(api, messages)))
    edited = [*messages[:cut - 1], {"role": "user", "content": "something else entirely"}]

    async def example(supervisor: Supervisor) -> None:
        await prepare(supervisor, request(api, messages))
        recorded = (await supervisor.call("s1", get_session)).session.message_count
        before = await ledger(supervisor, api, messages)
        prepared = await prepare(supervisor, request(api, edited))
        after = await ledger(supervisor, api, edited)
        assert len(after) == cut
        assert after[:cut - 1] == before[:cut - 1]
        assert after[cut - 1].sent == bare(edited[-1])
        assert await ledger(supervisor, api, messages) == before  # the old line stays
        assert (await supervisor.call("s1", get_session)).session.message_count == recorded + 1
        assert sent_messages(prepared)[-1] == request(api, edited).body["messages"][-1]

    run(example)


def test_content_text_joins_text_blocks_and_refuses_others() -> None:
    assert content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\nb"
    assert content_text(None) == ""
    assert content_text([{"type": "image"}]) is None


# ---- conversations that share a session ---------------------------------------------------

@st.composite
def plain_conversation(draw: st.DrawFn, number: int) -> list[dict[str, Any]]:
    """A conversation of tool calls (results small and large, some offloaded) and words,
    starting with the message every conversation of the test starts with."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "the same start"}]
    for turn in range(draw(st.integers(1, 5))):
        call_id = f"toolu_{number}_{turn}"
        messages += [
            {"role": "assistant", "content": [
                {"type": "text", "text": draw(words)},
                {"type": "tool_use", "id": call_id, "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                          "content": draw(st.one_of(words, big))}]}]
    return messages


@st.composite
def shared_session(draw: st.DrawFn) -> tuple[list[list[dict[str, Any]]], list[tuple[int, int]]]:
    """Two to four conversations with one start and the order their requests come in: each
    step a conversation and how much of it it sends (its next turn, the same again, or an
    earlier turn, as an agent retries or a user goes back)."""
    conversations = [draw(plain_conversation(number)) for number in range(draw(st.integers(2, 4)))]
    at = [0] * len(conversations)
    steps = []
    for _ in range(draw(st.integers(4, 16))):
        number = draw(st.integers(0, len(conversations) - 1))
        ends = cuts("anthropic", conversations[number])
        move = draw(st.sampled_from(["next", "next", "same", "back"]))
        if move == "next":
            at[number] = min(at[number] + 1, len(ends) - 1)
        elif move == "back":
            at[number] = draw(st.integers(0, at[number]))
        steps.append((number, ends[at[number]]))
    return conversations, steps


@PROPERTIES
@given(shared=shared_session())
def test_conversations_of_one_start_keep_their_bytes_and_need_nothing_kept(
        shared: tuple[list[list[dict[str, Any]]], list[tuple[int, int]]]) -> None:
    """Whatever the order of their requests, each conversation is sent, message for
    message, what it was sent before (marks aside), and the same bytes whether the lines
    are kept in memory or read again from SQLite before every request."""
    conversations, steps = shared

    async def bodies(forget: bool) -> list[bytes]:
        sent_bodies = []
        with tempfile.TemporaryDirectory() as tmp:
            async with running_supervisor(Path(tmp) / "ctxd.db", config()) as supervisor:
                for number, end in steps:
                    if forget:
                        _ledgers.clear()
                    prepared = await prepare(supervisor, request(
                        "anthropic", conversations[number][:end]))
                    sent_bodies.append(prepared.body)
        return sent_bodies

    async def main() -> None:
        _ledgers.clear()
        kept = await bodies(forget=False)
        assert kept == await bodies(forget=True)
        last: dict[int, list[dict[str, Any]]] = {}
        for (number, _), body in zip(steps, kept, strict=True):
            now = [bare(m) for m in msgspec.json.decode(body)["messages"]]
            before = last.get(number, [])
            shared_part = min(len(before), len(now))
            assert now[:shared_part] == before[:shared_part], (number, steps)
            last[number] = now
        _ledgers.clear()

    trio.run(main)
