"""Plan.replace, which every compaction strategy goes through: the stand-in takes the
place of exactly the messages it replaces (found by identity), in a thread that earlier
replacements already changed (docs/protocol.md, "Compaction")."""

from __future__ import annotations

from ctxd.hygiene import ThreadMessage
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
