"""The fork pipeline's stages (ctxd/hygiene/_fork.py), one rule each, with exact outputs."""

from __future__ import annotations

from typing import Any

import pytest

from ctxd.hygiene import fork
from ctxd.hygiene._fork import (
    Boundary,
    Fitted,
    compaction_boundary,
    compaction_slice,
    cut,
    cut_within,
    fit,
    truncate,
    wants_head_tail,
)
from ctxd.scrub import ScrubError
from ctxd.tokens import TokenCounter
from ctxd.wire.types import Content, ForkStats, Role, StoredMessage, TierDistribution

_seq = iter(range(1, 1_000_000))


def msg(role: Role, content: Content, *, name: str | None = None,
        call_id: str | None = None, meta: dict[str, Any] | None = None) -> StoredMessage:
    return StoredMessage(seq=next(_seq), role=role, content=content, component="conversation",
                         tokens=1, created_at=0.0, name=name, tool_call_id=call_id, meta=meta)


def call(call_id: str, name: str, params: Any) -> StoredMessage:
    return msg("assistant", [{"type": "tool_use", "id": call_id, "name": name, "input": params}])


def result(call_id: str, text: str, name: str = "read",
           meta: dict[str, Any] | None = None) -> StoredMessage:
    return msg("tool", text, name=name, call_id=call_id, meta=meta)


def thread(results: int, size: int, name: str = "read") -> list[StoredMessage]:
    messages: list[StoredMessage] = [msg("user", "go")]
    for index in range(results):
        messages += [call(f"c{index}", name, {"i": index}), result(f"c{index}", "x" * size, name)]
    return messages


# ---- cut and the marker ---------------------------------------------------------------

def test_cut_head_only_keeps_the_limit_and_counts_what_went() -> None:
    assert cut("abcdefghij", 4, head_tail=False) == "abcd…[truncated 6 chars]…"


def test_cut_head_tail_is_80_20() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(30))
    assert cut(text, 10, head_tail=True) == "abcdefgh…[truncated 20 chars]…cd"


def test_cut_leaves_a_text_at_the_limit_alone() -> None:
    assert cut("abcd", 4, head_tail=True) == "abcd"


def test_cut_counts_code_points_not_bytes() -> None:
    text = "😀" * 10 + "é" * 5
    assert cut(text, 4, head_tail=False) == "😀😀😀😀…[truncated 11 chars]…"
    assert cut(text, 5, head_tail=True) == "😀😀😀😀…[truncated 10 chars]…é"


@pytest.mark.parametrize("name", ["bash", "Bash", "run_pty", "PTY", "exec_command", "EXEC"])
def test_head_tail_for_shell_like_tool_names(name: str) -> None:
    assert wants_head_tail(name, "plain output")


@pytest.mark.parametrize("word", ["error", "Error", "ERROR", "failed", "FAILED", "exception",
                                  "traceback"])
def test_head_tail_for_each_error_word(word: str) -> None:
    assert wants_head_tail("read", f"line 1\nsome {word} here\n")


@pytest.mark.parametrize("text", ["Failed", "Exception raised", "Traceback (most", "erro r"])
def test_head_only_otherwise(text: str) -> None:
    assert not wants_head_tail("read", text)
    assert not wants_head_tail(None, text)


# ---- Stage 2 -------------------------------------------------------------------------------

def test_tiers_counted_from_the_newest_result() -> None:
    messages = thread(17, 3_100)
    forked, counts = truncate(messages)
    results = [m.content for m in forked if m.role == "tool"]
    # Oldest two: tier 3 (500), the ten before the newest five: tier 2 (3,000).
    assert results[0] == "x" * 500 + "…[truncated 2600 chars]…"
    assert results[1] == "x" * 500 + "…[truncated 2600 chars]…"
    assert results[2:12] == ["x" * 3_000 + "…[truncated 100 chars]…"] * 10
    assert results[12:] == ["x" * 3_100] * 5
    assert (counts.tiers, counts.truncated, counts.head_tail) == ([5, 10, 2], 12, 0)


def test_tier_boundaries_exactly_at_the_limits() -> None:
    messages = [msg("user", "go"), result("a", "y" * 501), result("b", "y" * 500)] + \
        [result(f"t2_{i}", "z" * 3_000) for i in range(10)] + \
        [result(f"t1_{i}", "w" * 50_000) for i in range(5)]
    forked, counts = truncate(messages)
    assert forked[1].content == "y" * 500 + "…[truncated 1 chars]…"
    assert forked[2].content == "y" * 500
    assert [m.content for m in forked[3:13]] == ["z" * 3_000] * 10
    assert [m.content for m in forked[13:]] == ["w" * 50_000] * 5
    assert (counts.tiers, counts.truncated) == ([5, 10, 2], 1)


def test_bash_result_is_cut_head_and_tail() -> None:
    text = "h" * 400 + "m" * 1000 + "t" * 100
    messages = [result("a", text, name="Bash")] + [result(f"n{i}", "ok") for i in range(15)]
    forked, counts = truncate(messages)
    assert forked[0].content == "h" * 400 + "…[truncated 1000 chars]…" + "t" * 100
    assert counts.head_tail == 1


def test_error_text_is_cut_head_and_tail_and_plain_text_head_only() -> None:
    failing = "Error: " + "e" * 993 + "the cause"
    plain = "p" * 1000
    messages = [result("a", failing), result("b", plain)] + \
        [result(f"n{i}", "ok") for i in range(15)]
    forked, _ = truncate(messages)
    assert forked[0].content == failing[:400] + "…[truncated 509 chars]…" + failing[-100:]
    assert forked[1].content == "p" * 500 + "…[truncated 500 chars]…"


def test_parameters_cut_by_their_results_tier() -> None:
    big = {"command": "q" * 1000}
    messages: list[StoredMessage] = []
    for index in range(16):
        messages += [call(f"c{index}", "read", big), result(f"c{index}", "ok")]
    forked, counts = truncate(messages)
    encoded = '{"command": "' + "q" * 1000 + '"}'
    inputs = [m.content[0]["input"] for m in forked if m.role == "assistant"]  # type: ignore[index]
    assert inputs[0] == {"truncated_input": encoded[:100] + "…[truncated 915 chars]…"}
    assert inputs[1:11] == [{"truncated_input": encoded[:200] + "…[truncated 815 chars]…"}] * 10
    assert inputs[11:] == [{"truncated_input": encoded[:500] + "…[truncated 515 chars]…"}] * 5
    assert (counts.params, counts.truncated) == (16, 0)


def test_bash_parameters_cut_head_and_tail() -> None:
    forked, counts = truncate([call("c", "bash", {"command": "r" * 600}), result("c", "ok")])
    encoded = '{"command": "' + "r" * 600 + '"}'
    assert forked[0].content[0]["input"] == {  # type: ignore[index]
        "truncated_input": encoded[:400] + "…[truncated 115 chars]…" + encoded[-100:]}
    assert counts.head_tail == 1


def test_cleared_results_pass_through() -> None:
    ctxd_cleared = ('[Old tool result content cleared — read it with read_result '
                    'ref_id="res_0123456789abcdef"]')
    stub = ('[Tool result stored — 48,231 bytes, 120 lines from "bash". First and last lines, '
            'and lines with errors:\n' + "s" * 600 + '\n] Use read_result with '
            'ref_id="res_0123456789abcdef" (or run: ctxctl result res_0123456789abcdef) to '
            'read more.')
    messages = [result("a", "[Old tool result content cleared]"), result("b", ctxd_cleared),
                result("c", stub), result("d", "o" * 800, meta={"compacted": 1700000000000})] + \
        [result(f"n{i}", "ok") for i in range(15)]
    forked, counts = truncate(messages)
    # ctxd's markers name blobs of the forked session, which a child cannot read.
    assert [m.content for m in forked[:4]] == ["[Old tool result content cleared]"] * 4
    assert (counts.cleared, counts.truncated, counts.tiers) == (4, 0, [5, 10, 4])


def test_cleared_inputs_become_the_plain_marker_and_are_never_cut() -> None:
    marker = ('[Old tool input cleared — 5,000 chars; read it with read_result '
              'ref_id="res_0123456789abcdef" offset={} limit=5000]')
    edit = call("e1", "Edit", {"file_path": "/src/a.py", "old_string": marker.format(0),
                               "new_string": marker.format(5000)})
    big = call("e2", "Edit", {"file_path": "/src/b.py", "old_string": marker.format(0),
                              "new_string": "n" * 300})
    messages = [edit, result("e1", "ok"), big, result("e2", "ok")] + [
        result(f"n{index}", "ok") for index in range(15)]
    forked, counts = truncate(messages)
    # Both calls' results are tier 3 (parameters: 100 characters). The first holds only
    # markers besides its path: whole, its markers plain; the second is cut as usual,
    # after its marker was made plain.
    assert forked[0].content == [{"type": "tool_use", "id": "e1", "name": "Edit", "input": {
        "file_path": "/src/a.py", "old_string": "[Old tool input cleared]",
        "new_string": "[Old tool input cleared]"}}]
    assert forked[2].content == [{"type": "tool_use", "id": "e2", "name": "Edit", "input": {
        "truncated_input": '{"file_path": "/src/b.py", "old_string": "[Old tool input '
                           'cleared]", "new_string": "nnnnnnnnnnnnnnnn…[truncated 286 '
                           'chars]…'}}]
    assert counts.params == 1


# ---- Stage 1 -------------------------------------------------------------------------------

def test_no_boundary() -> None:
    assert compaction_boundary([msg("user", "a"), msg("assistant", "b")]) is None


def test_claude_code_summary_latest_wins() -> None:
    messages = [msg("user", "a"), msg("user", "s1", meta={"compact_summary": True}),
                msg("assistant", "b"),
                msg("user", "s2", meta={"compact_summary": True, "compact_boundary": {}}),
                msg("assistant", "c")]
    assert compaction_boundary(messages) == 3


def test_opencode_summary_after_a_compaction_part() -> None:
    asked = {"parts": [{"type": "compaction", "auto": True}]}
    messages = [msg("user", "a"), msg("assistant", "lone", meta={"summary": True}),
                msg("user", "", meta=asked), msg("assistant", "sum", meta={"summary": True}),
                msg("assistant", "sum2", meta={"summary": True}), msg("user", "next")]
    assert compaction_boundary(messages) == 3
    # A compaction asked for but not written yet is no boundary.
    assert compaction_boundary(messages[:3]) is None


@pytest.mark.parametrize("kind", ["summary", "truncated"])
def test_ctxd_compaction_is_a_boundary(kind: str) -> None:
    messages = [msg("system", "sys"), msg("user", "[Summary…]", meta={"compaction": kind}),
                msg("user", "q"),
                msg("tool", "[Old tool result content cleared — …]",
                    meta={"compaction": "cleared"})]
    assert compaction_boundary(messages) == 1


def test_the_latest_of_different_sources_wins() -> None:
    messages = [msg("user", "s", meta={"compaction": "summary"}), msg("user", "",
                meta={"parts": [{"type": "compaction"}]}),
                msg("assistant", "x", meta={"summary": True}), msg("user", "tail")]
    assert compaction_boundary(messages) == 2


# OpenCode 1.18 keeps the newest turns verbatim: its compaction part's `tail_start_id`
# names the first message of that tail (an OpenCode message id: meta.source.id), which comes
# before the compaction request; the agent then sees the summary, the tail, what followed.

def oc(role: Role, content: Content, message_id: str, **meta: Any) -> StoredMessage:
    return msg(role, content, meta={"source": {"format": "opencode", "id": message_id},
                                    **meta})


def asked(tail_start_id: str | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "compaction", "auto": True, "overflow": False}
    if tail_start_id is not None:
        part["tail_start_id"] = tail_start_id
    return {"parts": [part]}


def compacted(tail_start_id: str | None) -> list[StoredMessage]:
    return [oc("user", "first", "u1"),
            oc("assistant", [{"type": "tool_use", "id": "c0", "name": "bash",
                              "input": {"command": "make"}}], "a1"),
            msg("tool", "y" * 600, name="bash", call_id="c0",
                meta={"source": {"format": "opencode", "id": "a1"}}),
            oc("assistant", "", "a1"),
            oc("user", "second", "u2"),
            oc("assistant", "answer", "a2"),
            oc("user", "", "u3", **asked(tail_start_id)),
            oc("assistant", "the summary", "a3", summary=True),
            oc("user", "Continue", "u4")]


def test_opencode_tail_runs_from_its_first_message_to_the_request() -> None:
    # a1 was imported as three messages (call, result, step-finish): the tail starts at the
    # first of them and stops before the request (index 6).
    assert compaction_slice(compacted("a1")) == Boundary(summary=7, tail=range(1, 6))
    assert compaction_slice(compacted("u2")) == Boundary(summary=7, tail=range(4, 6))
    assert compaction_boundary(compacted("a1")) == 7


@pytest.mark.parametrize("tail_start_id", [None, "nowhere", "u3", "a3", "u4"])
def test_opencode_without_a_tail_before_the_request(tail_start_id: str | None) -> None:
    # No tail_start_id, an unknown one, or one naming the request or a later message:
    # the summary and what follows it, as before.
    assert compaction_slice(compacted(tail_start_id)) == Boundary(summary=7, tail=range(0))


def test_the_latest_compactions_tail_wins() -> None:
    messages = [*compacted("u2"), oc("assistant", "more", "a4"), oc("user", "", "u5",
                                                                    **asked("a4")),
                oc("assistant", "second summary", "a5", summary=True)]
    assert compaction_slice(messages) == Boundary(summary=11, tail=range(9, 10))
    # A later summary of ctxd's own compaction has no tail.
    assert compaction_slice([*messages, msg("user", "s", meta={"compaction": "summary"})]) == \
        Boundary(summary=12, tail=range(0))


def test_fork_shows_the_summary_then_the_tail_then_what_followed() -> None:
    messages = compacted("a1")
    for index in range(15):
        messages += [call(f"c{index + 1}", "read", {}), result(f"c{index + 1}", "ok")]
    messages.append(msg("assistant", "done"))
    forked = fork(messages, len)
    # The tail's result is the 16th newest: tier 3, cut to 500, head and tail (bash).
    assert forked.context.startswith("\n\n".join([
        "[assistant]\nthe summary",
        '[assistant]\n[tool_use bash id=c0] {"command": "make"}',
        "[tool: bash]\n" + "y" * 400 + "…[truncated 100 chars]…" + "y" * 100,
        "[assistant]\n", "[user]\nsecond", "[assistant]\nanswer", "[user]\nContinue",
        "[assistant]\n[tool_use read id=c1] {}"]))
    assert forked.context.endswith("[tool: read]\nok\n\n[assistant]\ndone")
    assert forked.stats == ForkStats(
        original_count=40, final_count=38, total_chars=len(forked.context),
        removed_messages=0, compaction_detected=True, compaction_slice_index=7,
        truncated_results=1, tier_distribution=TierDistribution(tier1=5, tier2=10, tier3=1),
        head_tail_applied=1, cleared_results=0, truncated_params=0)
    assert forked.preamble.splitlines()[1:3] == [
        "Compaction: the context was compacted before; it starts at the latest compaction "
        "summary, then the 5 messages the agent kept verbatim before it (2 earlier messages "
        "left out).",
        "Tool results: 5 newest kept whole, 10 cut to at most 3,000 characters, 1 cut to "
        "at most 500 characters (1 truncated, 0 already cleared)."]


def test_fork_without_a_tail_starts_at_the_summary() -> None:
    forked = fork(compacted(None), len)
    assert forked.context == "[assistant]\nthe summary\n\n[user]\nContinue"
    assert (forked.stats.final_count, forked.stats.compaction_slice_index) == (2, 7)
    assert forked.preamble.splitlines()[1] == (
        "Compaction: the context was compacted before; it starts at the latest compaction "
        "summary (7 earlier messages left out).")


# ---- Stage 3 -------------------------------------------------------------------------------

def test_no_removal_under_the_budget() -> None:
    assert fit(["a" * 150_000, "b" * 49_998], ["user", "assistant"], 200_000,
               120_000) == Fitted([0, 1])


def test_oldest_removed_above_the_budget() -> None:
    blocks = ["a" * 100_000, "b" * 50_000, "c" * 60_000]
    assert fit(blocks, ["user", "assistant", "user"], 200_000, 120_000) == Fitted([1, 2])


def test_a_tool_result_never_left_without_its_call() -> None:
    blocks = ["a" * 50_000, "b" * 60_000, "c" * 60_000, "d" * 10]
    assert fit(blocks, ["user", "assistant", "tool", "user"], 120_000, 120_000) == Fitted([3])


def test_smaller_budget() -> None:
    assert fit(["a" * 10, "b" * 10, "c" * 10], ["user"] * 3, 20, 5) == Fitted([2])


def test_what_must_stay_shares_the_budget() -> None:
    # Both kept: the newest and the latest user request; 100 - 2 for the separator: each
    # under an equal share stays whole, the rest share what is left.
    assert fit(["u" * 10, "a" * 500, "b" * 300], ["user", "assistant", "assistant"], 100,
               5, frozenset({0, 2})) == Fitted([0, 2], {2: 88})


def test_stage_3_never_leaves_an_empty_fork_of_tool_results_only() -> None:
    # Seven results of 50,000 characters without their calls: the two oldest (tier 2, cut
    # to 3,000) and the two next go; the three newest (3 x 50,013 and two separators) stay.
    messages = [result(f"c{index}", "x" * 50_000) for index in range(7)]
    forked = fork(messages, len)
    assert forked.context == "\n\n".join(["[tool: read]\n" + "x" * 50_000] * 3)
    assert (forked.stats.final_count, forked.stats.removed_messages,
            forked.stats.total_chars) == (3, 4, 150_043)


def test_a_huge_newest_result_stays_with_its_call_and_the_request_cut_to_fit() -> None:
    messages = [msg("user", "do it"), call("c1", "read", {"p": "x"}),
                result("c1", "y" * 3_000_000)]
    forked = fork(messages, len)
    # 12 + 44 characters, two separators: 199,940 left for the result's block, whose text
    # keeps 159,920 + 39,980 characters around its marker (head+tail).
    assert forked.context == (
        '[user]\ndo it\n\n[assistant]\n[tool_use read id=c1] {"p": "x"}\n\n[tool: read]\n'
        + "y" * 159_920 + "…[truncated 2800100 chars]…" + "y" * 39_980)
    assert (forked.stats.final_count, forked.stats.removed_messages,
            forked.stats.total_chars) == (3, 0, 200_000)
    assert forked.preamble.splitlines()[3] == (
        "Messages removed to fit the character budget: 0; 1 message that must stay (the "
        "newest, the latest user request) cut to fit it.")


def test_a_huge_single_user_message_is_cut_head_and_tail_to_the_budget() -> None:
    forked = fork([msg("user", "a" * 1_000_000)], len)
    assert forked.context == ("[user]\n" + "a" * 159_973 + "…[truncated 800033 chars]…"
                              + "a" * 39_994)
    assert (forked.stats.final_count, forked.stats.total_chars) == (1, 200_000)


def test_the_latest_user_request_stays_when_older_messages_go() -> None:
    messages = [msg("user", "first"), msg("user", "the request"), msg("assistant", "a" * 100),
                msg("assistant", "b" * 100), msg("assistant", "done")]
    forked = fork(messages, len, char_budget=150, no_removal_chars=50)
    assert forked.context == "[user]\nthe request\n\n[assistant]\n" + "b" * 100 + (
        "\n\n[assistant]\ndone")
    assert forked.stats.removed_messages == 2


def test_the_preamble_counts_the_results_kept_and_what_was_done_to_them() -> None:
    # 17 results: the two oldest (tier 3, 10,000 characters: cut to 500), then ten tier 2
    # (two of 10,000 cut to 3,000, eight of 10 characters left as they are), five whole.
    messages: list[StoredMessage] = [msg("user", "go")]
    sizes = [10_000] * 4 + [10] * 8 + [10] * 5
    for index, size in enumerate(sizes):
        messages += [call(f"c{index}", "read", {}), result(f"c{index}", "z" * size)]
    whole = fork(messages, len)
    assert whole.preamble.splitlines()[2] == (
        "Tool results: 5 newest kept whole, 10 cut to at most 3,000 characters, 2 cut to at "
        "most 500 characters (4 truncated, 0 already cleared).")
    # A budget that removes the oldest results: only those kept are counted.
    small = fork(messages, len, char_budget=5_000, no_removal_chars=100)
    assert small.stats.removed_messages == 6
    assert small.preamble.splitlines()[2:4] == [
        "Tool results: 5 newest kept whole, 9 cut to at most 3,000 characters, 0 cut to at "
        "most 500 characters (1 truncated, 0 already cleared).",
        "Messages removed to fit the character budget: 6."]
    # The stats keep stage 2's counts of every result.
    assert (small.stats.truncated_results, small.stats.tier_distribution) == (
        4, TierDistribution(tier1=5, tier2=10, tier3=2))


def test_cut_within_counts_the_marker() -> None:
    assert cut_within("abcdefghijklmnopqrstuvwxyz0123456789", 30) == (
        "abcdef…[truncated 28 chars]…89")
    assert cut_within("abc", 3) == "abc"


# ---- the pipeline ------------------------------------------------------------------------

def test_fork_formats_the_context_and_counts_its_tokens() -> None:
    counter = TokenCounter()
    messages = [msg("system", "be brief"), msg("user", "old"),
                msg("user", "the summary", meta={"compact_summary": True}),
                msg("user", "list files"),
                call("c1", "Bash", {"command": "ls"}),
                result("c1", "a.py\nb.py", name="Bash"),
                msg("assistant", "two files")]
    forked = fork(messages, counter.count)
    assert forked.preamble == (
        "[Forked context: a bounded copy of another session's conversation.]\n"
        "Compaction: the context was compacted before; it starts at the latest compaction "
        "summary (2 earlier messages left out).\n"
        "Tool results: 1 newest kept whole, 0 cut to at most 3,000 characters, 0 cut to "
        "at most 500 characters (0 truncated, 0 already cleared).\n"
        "Messages removed to fit the character budget: 0.\n"
        "Cut text is marked …[truncated N chars]…: re-read files for full contents.")
    assert forked.context == (
        "[user]\nthe summary\n\n[user]\nlist files\n\n"
        '[assistant]\n[tool_use Bash id=c1] {"command": "ls"}\n\n'
        "[tool: Bash]\na.py\nb.py\n\n[assistant]\ntwo files")
    assert forked.tokens == counter.count(forked.preamble + "\n\n" + forked.context)
    assert forked.stats == ForkStats(
        original_count=7, final_count=5, total_chars=len(forked.context), removed_messages=0,
        compaction_detected=True, compaction_slice_index=2, truncated_results=0,
        tier_distribution=TierDistribution(tier1=1, tier2=0, tier3=0), head_tail_applied=0,
        cleared_results=0, truncated_params=0)


def test_fork_without_compaction_and_with_removal() -> None:
    messages = [msg("user", "u" * 100), msg("assistant", "a" * 100), msg("user", "last")]
    # Blocks of 107, 112 and 11 characters and two separators: 234.
    forked = fork(messages, len, char_budget=130, no_removal_chars=50)
    assert forked.context == "[assistant]\n" + "a" * 100 + "\n\n[user]\nlast"
    assert forked.stats.removed_messages == 1
    assert forked.stats.final_count == 2
    assert forked.preamble.splitlines()[1] == (
        "Compaction: none found; the context starts at the first message.")
    assert forked.preamble.splitlines()[3] == (
        "Messages removed to fit the character budget: 1.")
    assert forked.tokens == len(forked.preamble) + 2 + len(forked.context)


# ---- secrets -------------------------------------------------------------------------

GITHUB = "ghp_" + "A1b2C3d4" * 5


def test_a_fork_is_scrubbed_before_anything_is_cut() -> None:
    """What a child reads leaves the session: scrubbed (docs/security.md), the whole text
    before a cut, so no piece of a secret stays; a tool call's secret-named parameter too."""
    messages = [msg("user", "deploy with DB_PASSWORD=hunter2hunter2"),
                call("c0", "read", {}), result("c0", "x" * 490 + f" {GITHUB} done")]
    for index in range(1, 15):
        messages += [call(f"c{index}", "read", {}), result(f"c{index}", "ok")]
    messages += [call("c15", "Bash", {"command": "mysql -u root -pS3cr3t! app",
                                      "password": "hunter2"}),
                 result("c15", [{"type": "text", "text": f"pushed with {GITHUB}"}], "Bash")]
    forked = fork(messages, len)
    blocks = forked.context.split("\n\n")
    assert blocks[:3] == [
        "[user]\ndeploy with DB_PASSWORD=[REDACTED:secret_assignment]",
        "[assistant]\n[tool_use read id=c0] {}",
        # The oldest result, cut to 500 characters after the token became its marker.
        "[tool: read]\n" + "x" * 490 + " [REDACTED…[truncated 19 chars]…"]
    assert blocks[-2:] == [
        '[assistant]\n[tool_use Bash id=c15] {"command": "mysql -u root '
        '-p[REDACTED:cli_password] app", "password": "[REDACTED:secret_assignment]"}',
        "[tool: Bash]\npushed with [REDACTED:github_token]"]
    assert forked.messages[-1].content == [{"type": "text",
                                            "text": "pushed with [REDACTED:github_token]"}]
    assert forked.stats.truncated_results == 1


def test_a_fork_that_cannot_be_scrubbed_fails_closed() -> None:
    deep: Any = "ghp"
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ScrubError, match="RecursionError"):
        fork([msg("user", "go"), msg("tool", [{"type": "text", "text": "x", "nested": deep}],
                                     call_id="c0")], len)
