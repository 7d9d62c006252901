"""How ctxctl shows a value in a cell or a line: sizes, durations, times, percentages, the
usage bar and the colours of a health or a branch's status."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from rich.text import Text

from ctxclient._output import Cell, cell
from ctxd.wire import types as wire

HEALTH_STYLE = {"ok": "green", "warn": "yellow", "caution": "dark_orange",
                "compact": "red", "blocked": "bold red"}
BRANCH_STATUS_STYLE = {"active": "green", "completed": "", "budget_exhausted": "dark_orange",
                       "timeout": "dark_orange", "failed": "red", "discarded": "dim"}
DESCRIPTION_SHOWN = 40
"""Characters of a branch description that fit in a table cell."""
CONTENT_SHOWN = 60
"""Characters of a memory's or message's content that fit in a table cell."""


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def seconds(value: float) -> str:
    """Seconds with a tenth under a minute, else a `duration`."""
    return f"{value:.1f}s" if value < 60 else duration(value)


def timestamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def shorten(text: str, width: int = DESCRIPTION_SHOWN) -> Cell:
    """One line of at most ``width`` characters in a table; the whole text in plain
    output."""
    line = " ".join(text.split())
    return cell(line if len(line) <= width else line[:width - 1] + "…", plain=text)


def percent(usage: float) -> str:
    return f"{usage * 100:.1f}%"


def usage_bar(usage: float, health: str, width: int = 12) -> Cell:
    """A bar of ``width`` cells filled to ``usage`` (0..1), coloured by health; the
    percentage alone in plain output."""
    filled = min(width, round(usage * width))
    bar = Text("█" * filled, style=HEALTH_STYLE.get(health, ""))
    bar.append("░" * (width - filled), style="dim")
    bar.append(f" {usage * 100:5.1f}%")
    return cell(bar, plain=percent(usage))


def health_cell(health: str) -> Cell:
    return cell(Text(health, style=HEALTH_STYLE.get(health, "")))


def branch_budget_bar(branch: dict[str, Any], budget: dict[str, Any]) -> Cell:
    """The usage bar of a branch's budget, coloured by the health its session's thresholds
    give that share (`wire.Budget.health`, the daemon's own levels)."""
    usage = branch["budget_used"] / branch["budget"]
    thresholds = wire.Budget(**{name: budget[name] for name in wire.Budget.__struct_fields__})
    return usage_bar(usage, thresholds.health(usage))


def confidence(value: float) -> str:
    return f"{value:.3f}"


def compact_json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def content_text(content: Any) -> str:
    """A message's content as text: itself, or its parts as compact JSON."""
    return content if isinstance(content, str) else compact_json(content)
