"""``ctxctl status``'s daemon line and its pending injections, as a terminal and a pipe
read them."""

from __future__ import annotations

from typing import Any

from ctxclient._cli_daemon import daemon_line, injections_listing
from ctxclient._output import plain_lines

STATUS: dict[str, Any] = {
    "version": "0.1.0", "pid": 25411, "uptime_s": 61.5, "sessions_open": 1,
    "sessions_total": 12, "session_actors": 1, "connections": 3, "db_size_bytes": 543_834,
    "rss_bytes": 113_164_288, "requests_per_s": 1.1, "latency_p50_ms": 2.01,
    "latency_p99_ms": 12.5, "socket": "/run/user/1000/ctxd/ctxd.sock",
    "data_dir": "/home/u/.local/share/ctxd"}
FIGURES = ["pid 25411", "up 1m01s", "sessions 1 open / 12", "actors 1", "conns 3",
           "db 531.1 KiB", "rss 107.9 MiB", "1.1 req/s", "p50 2.01 ms", "p99 12.50 ms"]


def test_on_a_terminal_the_daemon_line_breaks_between_figures() -> None:
    for width in (40, 60, 80, 100):
        lines = daemon_line(STATUS, width).plain.splitlines()
        figures = [lines[0].removeprefix("ctxd 0.1.0"), *lines[1:-1]]
        assert [figure for line in figures for figure in line.split("  ") if figure] == \
            FIGURES, width
        assert max(len(line) for line in lines[:-1]) <= width, width
        assert lines[-1] == ("socket /run/user/1000/ctxd/ctxd.sock  "
                             "data /home/u/.local/share/ctxd")
    # Unbroken for a pipe (plain output joins it on one line).
    assert daemon_line(STATUS).plain.splitlines()[0] == "ctxd 0.1.0  " + "  ".join(FIGURES)


def test_the_pending_injections_header_is_one_word_a_column() -> None:
    listing = injections_listing([
        {"session_id": "s1", "injections": {"pending": 2, "delivered": 1}},
        {"session_id": "s2", "injections": {"pending": 0, "delivered": 0}}])
    assert plain_lines(listing, True) == ["SESSION  PENDING  UNACKNOWLEDGED",
                                          "s1             2               1"]
