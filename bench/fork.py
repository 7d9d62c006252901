"""Fork pipeline benchmark (docs/performance.md, "Fork pipeline"): ``context.fork`` of a
session of 200,000 characters and of one of 2,000,000, p50 over repeated calls, against a
``message.list`` of the whole same session (every page) measured in the same run on the same
daemon: reading the thread is the floor a fork cannot beat.

The sessions are a realistic mix made up here: user requests, assistant turns with text and
a tool call (``read``, ``bash``, ``grep``, ``edit``), and tool outputs of varied sizes (200
characters to 30,000; some bash outputs end in an error), appended with ``message.append``
(outputs over the offload threshold are offloaded, as in a real session: the fork reads them
whole).

Targets: the 200,000-character fork ≤ 20 ms; the 2,000,000-character fork ≤ 10 times that.

Run: ``python bench/fork.py [--runs N]`` (about a minute). It reports; it exits 0 once the
daemon started.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Connection, DaemonProcess, percentile, timed

TOOLS = ("read", "bash", "grep", "edit")
OUTPUT_SIZES = (200, 600, 1_500, 3_000, 6_000, 12_000, 30_000)
OUTPUT_WEIGHTS = (20, 25, 20, 15, 10, 7, 3)


def session_messages(target_chars: int, seed: int) -> list[dict[str, Any]]:
    """Messages whose contents add up to about ``target_chars`` characters."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
             for _ in range(3_000)]

    def text(size: int) -> str:
        parts: list[str] = []
        length = 0
        while length < size:
            word = rng.choice(words)
            parts.append(word)
            length += len(word) + 1
            if rng.random() < 0.08:
                parts.append("\n")
        return " ".join(parts)[:size]

    messages: list[dict[str, Any]] = []
    total = 0
    turn = 0
    while total < target_chars:
        if turn % 4 == 0:
            request = text(rng.randint(50, 400))
            messages.append({"role": "user", "content": request})
            total += len(request)
        tool = rng.choice(TOOLS)
        params = {"path": f"src/module_{rng.randint(1, 80)}.py"} if tool != "bash" \
            else {"command": "pytest -q " + text(rng.randint(10, 120))}
        said = text(rng.randint(40, 300))
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": said},
            {"type": "tool_use", "id": f"call_{turn}", "name": tool, "input": params}]})
        output = text(rng.choices(OUTPUT_SIZES, OUTPUT_WEIGHTS)[0])
        if tool == "bash" and rng.random() < 0.3:
            output += "\nTraceback (most recent call last):\nAssertionError: FAILED"
        messages.append({"role": "tool", "content": output, "tool_call_id": f"call_{turn}",
                         "name": tool})
        total += len(said) + len(json.dumps(params)) + len(output)
        turn += 1
    return messages


def fill(connection: Connection, session: str, messages: list[dict[str, Any]]) -> None:
    connection.call("session.open", {"session_id": session, "budget": {
        "context_window": 10_000_000, "max_output_tokens": 8_192}})
    for start in range(0, len(messages), 1_000):
        connection.call("message.append", {"session_id": session,
                                           "messages": messages[start:start + 1_000]})


def list_all(connection: Connection, session: str) -> int:
    """Every message of the session, page by page (``message.list``'s largest page)."""
    count = 0
    cursor = None
    while True:
        params: dict[str, object] = {"session_id": session, "limit": 1_000}
        if cursor is not None:
            params["cursor"] = cursor
        page = connection.call("message.list", params)
        count += len(page["messages"])  # type: ignore[arg-type]
        cursor = page["next_cursor"]
        if cursor is None:
            return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed calls of each (30)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ctxd-bf") as root:
        daemon = DaemonProcess(Path(root))
        daemon.start()
        try:
            connection = Connection(daemon.socket)
            p50s: dict[int, float] = {}
            for chars in (200_000, 2_000_000):
                session = f"bench_fork_{chars}"
                messages = session_messages(chars, seed=chars)
                fill(connection, session, messages)
                runs = args.runs if chars == 200_000 else max(5, args.runs // 3)
                fork = connection.call("context.fork", {"session_id": session})
                stats: dict[str, Any] = fork["stats"]  # type: ignore[assignment]
                timed(lambda s=session: connection.call("context.fork", {"session_id": s}), 3)
                fork_ms = timed(lambda s=session: connection.call(
                    "context.fork", {"session_id": s}), runs)
                listed = list_all(connection, session)
                list_ms = timed(lambda s=session: list_all(connection, s), runs)
                p50s[chars] = percentile(fork_ms, 0.5)
                rows.append((chars, len(messages), listed, stats, p50s[chars],
                             percentile(list_ms, 0.5)))
            connection.close()
        finally:
            daemon.stop()
    print(f"{'session':>10} {'messages':>8} {'fork ms p50':>11} {'list ms p50':>11} "
          f"{'ratio':>6}  fork result")
    for chars, count, listed, stats, fork_p50, list_p50 in rows:
        print(f"{chars:>10,} {count:>8,} {fork_p50:>11.2f} {list_p50:>11.2f} "
              f"{fork_p50 / list_p50:>6.2f}  {stats['final_count']} messages, "
              f"{stats['total_chars']:,} chars, {stats['removed_messages']} removed "
              f"(listed {listed})")
    growth = p50s[2_000_000] / p50s[200_000]
    print(f"2M fork / 200k fork: {growth:.2f}x (target ≤ 10x); 200k fork "
          f"{p50s[200_000]:.2f} ms (target ≤ 20 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
