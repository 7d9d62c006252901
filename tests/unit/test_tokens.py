"""Exact cl100k_base counts, offline, and the per-message overhead rule."""

import random
from types import SimpleNamespace

import pytest
import trio
import trio.lowlevel
from tests_support import OPENAI_EXAMPLE, OPENAI_EXAMPLE_PROMPT_TOKENS

from ctxd.tokens import OFF_LOOP_BYTES, REPLY_PRIMING, SPAN_CHARS, TokenCounter


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter("cl100k_base")


def test_loads_the_real_cl100k_offline(counter: TokenCounter) -> None:
    # Token ids published for cl100k_base: "hello world" -> [15339, 1917].
    assert counter._encoding.encode_ordinary("hello world") == [15339, 1917]
    assert counter._encoding.n_vocab == 100277


def test_plain_counts(counter: TokenCounter) -> None:
    assert counter.count("") == 0
    assert counter.count("hello world") == 2
    assert counter.count("You are helpful.") == 4
    # Special-token text is ordinary text: a client cannot smuggle in <|endoftext|>.
    assert counter.count("<|endoftext|>") == 7


def test_message_rule_matches_the_chat_api(counter: TokenCounter) -> None:
    total = sum(counter.message_tokens(m["role"], m["content"], m.get("name"))
                for m in OPENAI_EXAMPLE)
    assert total + REPLY_PRIMING == OPENAI_EXAMPLE_PROMPT_TOKENS


def test_message_overheads(counter: TokenCounter) -> None:
    assert counter.message_tokens("user", "hello world") == 3 + 1 + 2
    # name and tool_call_id each cost their tokens plus one.
    assert counter.message_tokens("user", "hello world", name="get_weather") == 6 + 2 + 1
    assert counter.message_tokens("tool", "hello world", tool_call_id="call_1") == 6 + 3 + 1


def test_parts(counter: TokenCounter) -> None:
    parts = [{"type": "text", "text": "hello world"}, {"type": "text", "text": "You are helpful."}]
    assert counter.content_tokens(parts) == 2 + 4
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    assert counter.content_tokens([image]) == counter.count(
        '{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}')


async def test_large_batches_are_counted_off_the_loop_with_the_same_result(
        counter: TokenCounter) -> None:
    text = "The daemon keeps each transcript and decides what goes into the next prompt. "
    messages = [SimpleNamespace(role="user", content=f"{i}: " + text * 40, name=None,
                                tool_call_id=None) for i in range(60)]
    assert sum(len(m.content) for m in messages) > OFF_LOOP_BYTES
    expected = [counter.message_tokens(m.role, m.content) for m in messages]
    loop_thread_busy = False

    async def watch_loop() -> None:
        nonlocal loop_thread_busy
        # If counting ran on the loop, this task could not run until it finished.
        await trio.lowlevel.checkpoint()
        loop_thread_busy = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_loop)
        assert await counter.count_messages(messages) == expected
    assert loop_thread_busy


SKILL = ("## Skill: release notes\nRead the changelog, group the entries by area, and write "
         "one line per change in the imperative mood; cite the pull request. ")
CJK = "上下文守护进程为每个会话保存完整的对话记录\uff0c并决定下一个提示中包含哪些内容。"


def skill_prompts(count: int, size: int, text: str = SKILL) -> list[str]:
    """``count`` different texts of ``size`` characters each."""
    return [(f"{i}: " + text * (size // len(text) + 1))[:size] for i in range(count)]


async def count_with_the_loop_watched(counter: TokenCounter, texts: list[str]) -> int:
    """Count ``texts`` with `count_texts` while a task counts how often the loop ran it;
    check the counts against `count`, item by item, and return the runs."""
    expected = [counter.count(text) for text in texts]
    runs = 0

    async def watch_loop() -> None:
        nonlocal runs
        while True:
            runs += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_loop)
        assert await counter.count_texts(texts) == expected
        nursery.cancel_scope.cancel()
    return runs


@pytest.mark.parametrize(("count", "size", "text"), [
    # 48 skill prompts of 64 KiB, 192 times OFF_LOOP_BYTES (240 of them took 3.1 s on the
    # loop before it was counted off it).
    (48, 64 * 1024, SKILL),
    (16, 64 * 1024, CJK),     # CJK costs about twice as much per character
    (160, 4 * 1024, SKILL),   # many medium items
])
async def test_counting_a_large_request_leaves_the_loop_free(
        counter: TokenCounter, count: int, size: int, text: str) -> None:
    texts = skill_prompts(count, size, text)
    runs = await count_with_the_loop_watched(counter, texts)
    # Counted item by item on the loop, the watcher ran once or twice in all; at most
    # OFF_LOOP_BYTES are counted between two of its runs.
    assert runs > count * size // OFF_LOOP_BYTES


async def test_a_small_request_is_counted_on_the_loop(counter: TokenCounter) -> None:
    texts = skill_prompts(4, OFF_LOOP_BYTES // 4)
    assert await count_with_the_loop_watched(counter, texts) == 1


async def test_large_and_small_items_mixed_keep_their_order_and_counts(
        counter: TokenCounter) -> None:
    texts = [*skill_prompts(3, 5000), "x" * (SPAN_CHARS + 1), *skill_prompts(2, 9000),
             "", CJK * 40_000]
    assert await counter.count_texts(texts) == [counter.count(text) for text in texts]
    messages = [SimpleNamespace(role="user", content=text, name=None, tool_call_id=None)
                for text in texts]
    assert await counter.count_messages(messages) == [
        counter.message_tokens("user", text) for text in texts]


def letters(count: int, alphabet: str, seed: int) -> str:
    return "".join(random.Random(seed).choices(alphabet, k=count))


@pytest.mark.parametrize("text", [
    letters(3 * SPAN_CHARS, "abcdefghijklmnopqrstuvwxyz", 1),  # one piece: cut in the run
    letters(3 * SPAN_CHARS, "ab", 2),
    "a" * (3 * SPAN_CHARS),
    letters(SPAN_CHARS + 5000, CJK, 3),
    (SKILL * (3 * SPAN_CHARS // len(SKILL))),                 # prose: cut between words
    "\n".join(letters(SPAN_CHARS // 2, "xyz 'll.,0123", i) for i in range(5)),
], ids=["letters", "ab", "a", "cjk", "prose", "mixed"])
def test_long_texts_are_counted_in_spans_exactly(counter: TokenCounter, text: str) -> None:
    assert counter.count(text) == len(counter._encoding.encode_ordinary(text))


def test_span_cuts_add_up_exactly(counter: TokenCounter) -> None:
    # Short spans put many cuts, inside runs and between pieces, into varied texts.
    rng = random.Random(7)
    alphabets = ["abcdefghijklmnopqrstuvwxyz", "aaaab", "ABCabc", CJK[:20], "ab" + CJK[:3]]
    between = [[" ", "'ll ", "'s", ", ", "\n", "  ", "123", "", "-"],
               ["'ll", "'s", "'S", "'re", ",", "123", "", "-"]]  # no space: cuts in runs
    for trial in range(400):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append("".join(rng.choices(rng.choice(alphabets), k=rng.randint(1, 400))))
            parts.append(rng.choice(between[trial % 2]))
        text = "".join(parts)
        expected = len(counter._encoding.encode_ordinary(text))
        assert [counter._count_in_spans(text, span) for span in (3, 8, 17, 50)] == [
            expected] * 4, text


def test_unknown_encoding_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no_such_encoding"):
        TokenCounter("no_such_encoding")


def test_large_texts_count_the_same_by_either_path(counter: TokenCounter) -> None:
    # Texts over OFF_LOOP_BYTES are counted through tiktoken's numpy buffer (it holds the
    # GIL far less); the count must be exactly the list-based one.
    text = "def fold(branch):\n    return summary  # <|endoftext|> é 🎉\n" * 2000
    assert len(text) > OFF_LOOP_BYTES
    assert counter.count(text) == len(counter._encoding.encode_ordinary(text))
