"""The tool-call lifecycle: owner of the ``tool_calls`` and ``tool_call_states`` tables
(docs/protocol.md, "Tool states").

A tool call moves forward through ``pending → awaiting_approval → running →`` one terminal
state (``completed``, ``failed``, ``denied``, ``timeout``, ``cancelled``); it may skip
states, never go back, and a terminal state is final. Functions taking a ``conn`` run in
the store's thread; the session actor calls them, one request of a session at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw

from ctxd.errors import invalid_state
from ctxd.store import scalar_int
from ctxd.wire.types import (
    TERMINAL_TOOL_STATES,
    TOOL_CALL_STATES,
    ToolCall,
    ToolCallState,
    ToolStateEntry,
    ToolStateParams,
)

PLACES = 6
_RANK = {state: min(i, 3) for i, state in enumerate(TOOL_CALL_STATES)}
"""The order of the states; the terminal ones share the last rank."""


def allowed_next(state: ToolCallState) -> list[ToolCallState]:
    """The states a tool call in ``state`` may move to (none once terminal)."""
    if state in TERMINAL_TOOL_STATES:
        return []
    return [s for s in TOOL_CALL_STATES if _RANK[s] > _RANK[state]]


def check_transition(tool_call_id: str, current: ToolCallState, to: ToolCallState) -> None:
    """Refuse a move that is not forward (a repeat of the current state is no move).

    Raises:
        CtxdError: -32003 naming the current state and the allowed next ones.
    """
    if to == current or to in allowed_next(current):
        return
    allowed = allowed_next(current)
    why = ("it is final" if not allowed else "a tool call never goes back")
    raise invalid_state(
        f"tool call {tool_call_id!r} is {current}: it cannot move to {to} ({why})",
        ("report one of " + ", ".join(allowed)) if allowed
        else "report a new tool call under a new tool_call_id",
        tool_call_id=tool_call_id, state=current, requested=to, allowed_next=allowed)


def _history(conn: apsw.Connection, session_id: str, tool_call_ids: list[str] | None
             ) -> dict[str, list[tuple[Any, ...]]]:
    rows: list[tuple[Any, ...]]
    if tool_call_ids is None:
        rows = conn.execute("SELECT tool_call_id, state, detail, entered_at "
                            "FROM tool_call_states WHERE session_id = ? "
                            "ORDER BY tool_call_id, seq", (session_id,)).fetchall()
    else:
        rows = []
        for tool_call_id in tool_call_ids:
            rows += conn.execute("SELECT tool_call_id, state, detail, entered_at "
                                 "FROM tool_call_states WHERE session_id = ? AND "
                                 "tool_call_id = ? ORDER BY seq",
                                 (session_id, tool_call_id)).fetchall()
    found: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        found.setdefault(row[0], []).append(row[1:])
    return found


def _shown(row: tuple[Any, ...], history: list[tuple[Any, ...]],
           now: float) -> ToolCall:
    tool_call_id, tool_name, state, created_at, updated_at = row
    entries = []
    seconds_in: dict[str, float] = {}
    for i, (entered, detail, entered_at) in enumerate(history):
        if i + 1 < len(history):
            seconds: float | None = round(history[i + 1][2] - entered_at, PLACES)
        else:
            seconds = None
        entries.append(ToolStateEntry(state=entered, entered_at=entered_at, detail=detail,
                                      seconds=seconds))
        if seconds is not None:
            seconds_in[entered] = seconds
        elif entered not in TERMINAL_TOOL_STATES:
            seconds_in[entered] = round(max(0.0, now - entered_at), PLACES)
    return ToolCall(tool_call_id=tool_call_id, tool_name=tool_name, state=state,
                    terminal=state in TERMINAL_TOOL_STATES, created_at=created_at,
                    updated_at=updated_at, history=entries, seconds_in_state=seconds_in)


_CALL_COLUMNS = "tool_call_id, tool_name, state, created_at, updated_at"


def load_tool_call(conn: apsw.Connection, session_id: str, tool_call_id: str, now: float
                   ) -> ToolCall | None:
    """One tool call of the session with its history (None: unknown)."""
    rows = conn.execute(f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE session_id = ? AND "
                        "tool_call_id = ?", (session_id, tool_call_id)).fetchall()
    if not rows:
        return None
    return _shown(rows[0], _history(conn, session_id, [tool_call_id]).get(tool_call_id, []),
                  now)


def list_tool_calls(conn: apsw.Connection, session_id: str, state: ToolCallState | None,
                    now: float) -> list[ToolCall]:
    """The session's tool calls (in ``state`` only, if given), oldest first."""
    sql = f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE session_id = ?"
    bindings: list[Any] = [session_id]
    if state is not None:
        sql += " AND state = ?"
        bindings.append(state)
    rows: list[tuple[Any, ...]] = conn.execute(
        sql + " ORDER BY created_at, tool_call_id", bindings).fetchall()
    history = _history(conn, session_id, None if state is None else [r[0] for r in rows])
    return [_shown(row, history.get(row[0], []), now) for row in rows]


def set_tool_state(conn: apsw.Connection, p: ToolStateParams, now: float
                   ) -> tuple[ToolCall, ToolCallState | None]:
    """Move a tool call to ``p.state`` (creating it on its first state), in a `Store.write`
    transaction.

    Returns:
        The tool call as it is now, and the state it was in (None: it was created).

    Raises:
        CtxdError: -32003 when the move is not forward (see `check_transition`).
    """
    rows: list[tuple[Any, ...]] = conn.execute(
        "SELECT state, tool_name FROM tool_calls WHERE session_id = ? AND tool_call_id = ?",
        (p.session_id, p.tool_call_id)).fetchall()
    if not rows:
        conn.execute("INSERT INTO tool_calls (session_id, tool_call_id, tool_name, state, "
                     "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                     (p.session_id, p.tool_call_id, p.tool_name, p.state, now, now))
        previous: ToolCallState | None = None
        seq = 1
    else:
        previous, tool_name = rows[0]
        assert previous is not None
        check_transition(p.tool_call_id, previous, p.state)
        if previous == p.state:
            called = load_tool_call(conn, p.session_id, p.tool_call_id, now)
            assert called is not None
            return called, previous
        seq = 1 + scalar_int(conn, "SELECT MAX(seq) FROM tool_call_states WHERE session_id = ? "
                               "AND tool_call_id = ?",
                               (p.session_id, p.tool_call_id))
        conn.execute("UPDATE tool_calls SET state = ?, updated_at = ?, tool_name = ? "
                     "WHERE session_id = ? AND tool_call_id = ?",
                     (p.state, now, tool_name or p.tool_name, p.session_id, p.tool_call_id))
    conn.execute("INSERT INTO tool_call_states (session_id, tool_call_id, seq, state, detail, "
                 "entered_at) VALUES (?, ?, ?, ?, ?, ?)",
                 (p.session_id, p.tool_call_id, seq, p.state, p.detail, now))
    called = load_tool_call(conn, p.session_id, p.tool_call_id, now)
    assert called is not None
    return called, previous


def tool_states(conn: apsw.Connection, session_id: str, tool_call_ids: Sequence[str]
                ) -> dict[str, ToolCallState]:
    """The state of each of ``tool_call_ids`` the session has (an unknown one is left
    out)."""
    found: dict[str, ToolCallState] = {}
    for start in range(0, len(tool_call_ids), 500):  # within SQLite's bound on parameters
        chunk = tool_call_ids[start:start + 500]
        found.update(conn.execute(
            f"SELECT tool_call_id, state FROM tool_calls WHERE session_id = ? AND tool_call_id "
            f"IN ({', '.join('?' * len(chunk))})", (session_id, *chunk)))
    return found


def finish_tool_calls(conn: apsw.Connection, session_id: str,
                      finished: Sequence[tuple[str, str | None, ToolCallState]], detail: str,
                      now: float) -> None:
    """Move each ``(tool_call_id, tool_name, terminal state)`` there (creating the call),
    with ``detail``, in a transaction of the caller's; the caller leaves out the calls in
    a terminal state already (`tool_states`), whose state is final."""
    for tool_call_id, tool_name, state in finished:
        set_tool_state(conn, ToolStateParams(session_id=session_id, tool_call_id=tool_call_id,
                                             state=state, detail=detail, tool_name=tool_name),
                       now)
