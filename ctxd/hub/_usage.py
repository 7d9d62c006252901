"""The usage ledger: owner of the ``usage_records`` table; totals, groups, cost and
calibration (docs/protocol.md, "Usage").

Functions taking a ``conn`` run in the store's thread (`Store.read` / `Store.write`); the
session actor calls them, so one session's records are written one at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import apsw

from ctxd.config import ModelPrice
from ctxd.errors import params_error
from ctxd.wire.types import (
    USAGE_COUNTERS,
    Calibration,
    UsageCost,
    UsageEntry,
    UsageGetResult,
    UsageGroup,
    UsageGroupBy,
    UsageRecordParams,
    UsageTotals,
)

PRICE_OF = {"input_tokens": "input", "output_tokens": "output",
            "cache_read_tokens": "cache_read", "cache_write_tokens": "cache_write",
            "thinking_tokens": "thinking"}
"""The `ModelPrice` field that prices each counter."""
COST_PLACES = 6

_COLUMNS = ("usage_id, session_id, branch_id, request_id, model, idempotency_key, "
            + ", ".join(USAGE_COUNTERS) + ", local_input_tokens, recorded_at")


def counters_of(p: UsageRecordParams) -> dict[str, int]:
    """The record's counters (0 for those not given).

    Raises:
        CtxdError: -32602 when none is given.
    """
    given = {name: getattr(p, name) for name in USAGE_COUNTERS}
    if all(value is None for value in given.values()):
        raise params_error("$", "give at least one of " + ", ".join(USAGE_COUNTERS))
    return {name: value or 0 for name, value in given.items()}


CALIBRATION_CALLS = 20
"""How many of a model's latest calls `provider_ratio` reads."""
RATIO_BOUNDS = (0.5, 2.0)
"""`provider_ratio`'s bounds: one odd call (a count of another body, a provider's
accounting change) cannot make the thresholds fire at a quarter of the window or never."""


def provider_ratio(conn: apsw.Connection, model: str) -> float | None:
    """How many tokens ``model``'s provider reports per token ctxd counted for the same
    calls: its whole input (plain, cache read and cache write) over ctxd's count, summed
    over its `CALIBRATION_CALLS` latest calls in any session, within `RATIO_BOUNDS`; None
    before a call of it with both figures was recorded (docs/protocol.md, "Usage")."""
    [(reported, counted)] = conn.execute(
        "SELECT coalesce(sum(whole), 0), coalesce(sum(local), 0) FROM ("
        "SELECT input_tokens + cache_read_tokens + cache_write_tokens AS whole, "
        "local_input_tokens AS local FROM usage_records "
        "WHERE model = ? AND local_input_tokens > 0 ORDER BY usage_id DESC LIMIT ?)",
        (model, CALIBRATION_CALLS)).fetchall()
    if not isinstance(reported, int) or not isinstance(counted, int) or not reported \
            or not counted:
        return None
    low, high = RATIO_BOUNDS
    return min(high, max(low, reported / counted))


def _entry(row: tuple[Any, ...]) -> UsageEntry:
    return UsageEntry(**dict(zip(_COLUMNS.split(", "), row, strict=True)))


def find_usage(conn: apsw.Connection, session_id: str, idempotency_key: str
               ) -> UsageEntry | None:
    """The session's record with this idempotency key, if any."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM usage_records "
                        "WHERE session_id = ? AND idempotency_key = ?",
                        (session_id, idempotency_key)).fetchall()
    return _entry(rows[0]) if rows else None


def insert_usage(conn: apsw.Connection, p: UsageRecordParams, counters: Mapping[str, int],
                 local_input_tokens: int, recorded_at: float) -> UsageEntry:
    """Write one record (in a `Store.write` transaction) and return it."""
    conn.execute(
        "INSERT INTO usage_records (session_id, branch_id, request_id, model, "
        f"idempotency_key, {', '.join(USAGE_COUNTERS)}, local_input_tokens, recorded_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (p.session_id, p.branch_id, p.request_id, p.model, p.idempotency_key,
         *(counters[name] for name in USAGE_COUNTERS), local_input_tokens, recorded_at))
    return UsageEntry(usage_id=conn.last_insert_rowid(), session_id=p.session_id,
                      branch_id=p.branch_id, request_id=p.request_id, model=p.model,
                      idempotency_key=p.idempotency_key, local_input_tokens=local_input_tokens,
                      recorded_at=recorded_at, **counters)


@dataclass
class _Sum:
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_COUNTERS, 0))
    calls: int = 0
    cost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(USAGE_COUNTERS, 0.0))
    priced_calls: int = 0

    def add(self, counters: Mapping[str, int], calls: int, price: ModelPrice | None) -> None:
        for name in USAGE_COUNTERS:
            self.counters[name] += counters[name]
            if price is not None:
                self.cost[name] += counters[name] * getattr(price, PRICE_OF[name]) / 1e6
        self.calls += calls
        self.priced_calls += calls if price is not None else 0

    def totals(self) -> UsageTotals:
        return UsageTotals(calls=self.calls, **self.counters)

    def priced(self) -> UsageCost | None:
        if not self.priced_calls:
            return None
        return UsageCost(total=round(sum(self.cost.values()), COST_PLACES),
                         unpriced_calls=self.calls - self.priced_calls,
                         **{name: round(value, COST_PLACES)
                            for name, value in self.cost.items()})


def usage_summary(conn: apsw.Connection, session_id: str, branch_id: str | None,
                  group_by: UsageGroupBy | None, prices: Mapping[str, ModelPrice]
                  ) -> UsageGetResult:
    """Totals (and groups, and cost) of a session's records, or of one branch's."""
    where, bindings = "session_id = ?", [session_id]
    if branch_id is not None:
        where += " AND branch_id = ?"
        bindings.append(branch_id)
    rows: list[tuple[Any, ...]] = conn.execute(
        "SELECT branch_id, model, CAST(recorded_at AS INTEGER) / 86400, COUNT(*), "
        + ", ".join(f"SUM({name})" for name in USAGE_COUNTERS)
        + f" FROM usage_records WHERE {where} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        bindings).fetchall()
    whole = _Sum()
    groups: dict[str | None, _Sum] = {}
    for row in rows:
        branch, model, day, calls, *sums = row
        counters = dict(zip(USAGE_COUNTERS, sums, strict=True))
        price = prices.get(model) if model is not None else None
        whole.add(counters, calls, price)
        if group_by is not None:
            key = {"model": model, "branch": branch,
                   "day": datetime.fromtimestamp(day * 86400, UTC).date().isoformat()
                   }[group_by]
            groups.setdefault(key, _Sum()).add(counters, calls, price)
    latest = conn.execute(f"SELECT {_COLUMNS} FROM usage_records WHERE {where} "
                          "ORDER BY usage_id DESC LIMIT 1", bindings).fetchall()
    calibration = None
    if latest:
        entry = _entry(latest[0])
        ratio = (round(entry.input_tokens / entry.local_input_tokens, 4)
                 if entry.input_tokens and entry.local_input_tokens else None)
        calibration = Calibration(usage_id=entry.usage_id, input_tokens=entry.input_tokens,
                                  local_input_tokens=entry.local_input_tokens, ratio=ratio)
    shown = None
    if group_by is not None:
        shown = [UsageGroup(key=key, totals=group.totals(), cost=group.priced())
                 for key, group in sorted(groups.items(), key=lambda pair: pair[0] or "")]
    return UsageGetResult(session_id=session_id, branch_id=branch_id, totals=whole.totals(),
                          cost=whole.priced(), group_by=group_by, groups=shown,
                          calibration=calibration)
