"""Plan.replace, which every compaction strategy goes through: the stand-in takes the
place of exactly the messages it replaces (found by identity), in a thread that earlier
replacements already changed; and the choice and clearing of old tool calls' large
inputs (docs/protocol.md, "Compaction")."""

from __future__ import annotations

from ctxd.hygiene import ThreadMessage, clear_inputs, input_clear_candidates
from ctxd.sessions._compaction import Plan
from ctxd.wire.types import MessageIn


def kept(seq: int, role: str = "tool", tokens: int = 100) -> ThreadMessage:
    return ThreadMessage(seq=seq, position=seq, role=role, content=f"output {seq}",  # type: ignore[arg-type]
                         tokens=tokens, component="conversation", tool_call_id=f"c{seq}")


def test_replacements_land_where_the_replaced_messages_were() -> None:
    view = [kept(1, "system", 10), kept(2, "user", 20), *(kept(seq) for seq in range(3, 9))]
    plan = Plan(session_id="s", thread=None, next_seq=9, now=0.0, used=sum(m.tokens for m in view))
    marker = MessageIn(role="tool", content="[cleared]", tool_call_id="c5")
    # Clear seq 5, then seq 7; then summarise seqs 2-6 (the marker for 5 among them).
    view = plan.replace(view, [view[4]], "cleared", marker, 5, {"seq": 5})
    view = plan.replace(view, [view[6]], "cleared", marker, 5, {"seq": 7})
    assert [(m.seq, m.position) for m in view] == [
        (1, 1), (2, 2), (3, 3), (4, 4), (9, 5), (6, 6), (10, 7), (8, 8)]
    summary = MessageIn(role="user", content="[Summary]")
    view = plan.replace(view, view[1:6], "summarized", summary, 30, {})
    assert [(m.seq, m.position) for m in view] == [(1, 1), (11, 2), (10, 7), (8, 8)]
    assert plan.marks == [(5, "cleared", 9), (7, "cleared", 10), (2, "summarized", 11),
                          (3, "summarized", 11), (4, "summarized", 11),
                          (9, "summarized", 11), (6, "summarized", 11)]
    assert [r.at_seq for r in plan.replacements] == [5, 7, 2]
    assert plan.used == 10 + 30 + 5 + 100
    assert plan.next_seq == 12


def test_a_message_out_of_position_order_is_still_found() -> None:
    # Positions need not be sorted for the replacement to be right (found by identity).
    view = [kept(4), kept(2), kept(3)]
    plan = Plan(session_id="s", thread=None, next_seq=5, now=0.0, used=300)
    view = plan.replace(view, [view[2]], "cleared", MessageIn(role="tool", content="x",
                                                              tool_call_id="c3"), 1, {})
    assert [(m.seq, m.position) for m in view] == [(4, 4), (2, 2), (5, 3)]


# ---- clearing old tool calls' inputs ------------------------------------------------------

BIG_CODE = "x = 1\n" * 200  # 1,200 bytes
EDITS = [{"old_string": "a" * 2_000, "new_string": "b"},
         {"old_string": "short", "new_string": "é" * 600}]  # 1,200 bytes, 600 chars


def test_clear_inputs_replaces_large_strings_and_keeps_the_shape() -> None:
    content = [
        {"type": "text", "text": "Writing both files."},
        {"type": "tool_use", "id": "t1", "name": "Write",
         "input": {"file_path": "/p/a.py", "content": BIG_CODE}},
        {"type": "tool_use", "id": "t2", "name": "MultiEdit",
         "input": {"file_path": "/p/b.py", "edits": EDITS}},
        {"type": "tool_use", "id": "t3", "name": "Bash", "input": {"command": "y" * 5_000}},
    ]
    cleared = clear_inputs(content, [1, 2, 3], "res_0123456789abcdef")
    assert cleared is not None
    new, text = cleared
    ref = 'read it with read_result ref_id="res_0123456789abcdef"'
    shell = "or ctxctl result res_0123456789abcdef"
    assert new == [
        {"type": "text", "text": "Writing both files."},
        {"type": "tool_use", "id": "t1", "name": "Write",
         "input": {"file_path": "/p/a.py",
                   "content": f"[Old tool input cleared — 1,200 chars; {ref} offset=0 "
                              f"limit=1200 {shell} --offset 0 --limit 1200]"}},
        {"type": "tool_use", "id": "t2", "name": "MultiEdit",
         "input": {"file_path": "/p/b.py", "edits": [
             {"old_string": f"[Old tool input cleared — 2,000 chars; {ref} offset=1200 "
                            f"limit=2000 {shell} --offset 1200 --limit 2000]",
              "new_string": "b"},
             {"old_string": "short",
              "new_string": f"[Old tool input cleared — 600 chars; {ref} offset=3200 "
                            f"limit=600 {shell} --offset 3200 --limit 600]"}]}},
        # A command is never cleared, however long.
        {"type": "tool_use", "id": "t3", "name": "Bash", "input": {"command": "y" * 5_000}},
    ]
    assert text == BIG_CODE + "a" * 2_000 + "é" * 600
    assert text[1200:1200 + 2000] == EDITS[0]["old_string"]
    # Only the parts named; none large: nothing to clear.
    assert clear_inputs(content, [0, 3], "res_0123456789abcdef") is None


def test_input_clear_candidates_spare_the_newest_calls() -> None:
    def assistant(seq: int, calls: int) -> ThreadMessage:
        parts = [{"type": "tool_use", "id": f"t{seq}_{i}", "name": "Write",
                  "input": {"content": BIG_CODE}} for i in range(calls)]
        return ThreadMessage(seq=seq, position=seq, role="assistant", content=parts,
                             tokens=300, component="conversation")

    view = [assistant(1, 1), assistant(2, 2), assistant(3, 1), assistant(4, 1)]
    # Five calls, the newest two kept: the first message's call and the second's both.
    assert [(m.seq, calls) for m, calls in input_clear_candidates(view, 2)] == [
        (1, [0]), (2, [0, 1])]
    # Three kept: the second message's first call only.
    assert [(m.seq, calls) for m, calls in input_clear_candidates(view, 3)] == [
        (1, [0]), (2, [0])]
    assert input_clear_candidates(view, 5) == []
