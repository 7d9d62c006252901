"""Hygiene benchmark: offloaded tool results, render, compaction and replayed transcripts,
each figure against a baseline measured in the same run.

1. Appending a 1 MB tool result (offloaded: stored in ``tool_result_blobs``, rendered as
   its stub) against appending a 1 KB one (inline), alternated on one daemon, one
   ``message.append`` at a time: p50 and p99 of each, and their ratio (target: p99 within
   10x). The blob's write is the floor of the offloaded path: its MB/s (1 MB over the
   append's p50) is set against a raw SQLite insert of the same 1 MB text in its own
   transaction, with the daemon's pragmas (WAL, synchronous NORMAL), in a file beside
   the daemon's database.
2. ``result.read`` with a pattern over a 10 MB blob (about 165,000 lines of a test log, one in
   1,000 matching): MB/s at p50 (target: at least 100), against the same search
   (``ctxd.hygiene.grep``) run in this process on the same text: the floor, without the
   blob's read from SQLite and the round trip.
3. ``ctxd.render`` of 1,000 messages (a system prompt, a task, 499 tool calls and their
   results), 300 of the results 5,000 bytes and offloaded (target: p50 within 1.5x),
   against the same messages on a daemon whose offload threshold is at its maximum
   (every result inline) and against the same shape with those 300 results cut to 4,000
   bytes (under the threshold), renders alternated.
4. ``context.compact`` of a 190k-token session (default budget: effective window 191,808,
   so at 99%; appended with ``allow_over`` on a daemon without auto-compaction), each run
   on a fresh copy, the default chain and summarisation alone, extractive summarizer
   (target: 100 ms), against ``ctxd.render`` of the same session.
5. Context saved on the recorded transcripts (``bench/_transcripts.py`` says what of each
   is replayed): each message appended on its own with the default hygiene, at a 200k
   window and a 32k one; the peak of the thread's tokens after an append against the
   same peak of the raw thread (a daemon with the offload threshold at its maximum and
   without auto-compaction).

Run: ``python bench/hygiene.py`` (about a minute and a half); ``--only PART`` runs parts.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw
import msgspec

sys.path.append(str(Path(__file__).resolve().parent))
from _common import Connection, percentile, request_line
from _transcripts import load
from daemon_process import DaemonProcess

from ctxd.hygiene import compile_pattern, grep

MB = 1_000_000
TRANSCRIPTS = Path(__file__).resolve().parents[2] / "shared" / "bench-data" / "transcripts"


def log_text(size: int, every: int = 1000) -> str:
    """A test run's output of ``size`` characters (ASCII), a failure every ``every`` lines."""
    lines = []
    total = 0
    i = 0
    while total < size:
        i += 1
        line = (f"tests/unit/test_module_{i % 97}.py::test_case_{i} "
                f"{'FAILED assert 1 == 2' if i % every == 0 else 'PASSED'} [{i % 100:3d}%]\n")
        lines.append(line)
        total += len(line)
    return "".join(lines)[:size]


def timed(conn: Connection, line: bytes) -> float:
    start = time.perf_counter()
    answer = conn.call_line(line)
    elapsed = time.perf_counter() - start
    if b'"error"' in answer[:200]:
        raise RuntimeError(answer[:500].decode())
    return elapsed


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def raw_sqlite_inserts(folder: Path, text: str, runs: int) -> list[float]:
    """A 1 MB TEXT inserted by apsw in its own transaction, with the daemon's pragmas."""
    conn = apsw.Connection(str(folder / "raw.db"))
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO blobs (text) VALUES (?)", (text,))
        conn.execute("COMMIT")
        samples.append(time.perf_counter() - start)
    conn.close()
    return samples


def offload_figures(root: Path, conn: Connection, args: argparse.Namespace) -> None:
    big, small = log_text(MB), log_text(1_000)
    for sid in ("big", "small", "search"):
        conn.call("session.open", {"session_id": sid,
                                   "budget": {"context_window": 10_000_000}})
    lines = {sid: request_line("message.append", {"session_id": sid, "messages": [
        {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": text}]})
             for sid, text in (("big", big), ("small", small))}
    for sid in ("big", "small"):  # warm up
        for _ in range(5):
            timed(conn, lines[sid])
    samples: dict[str, list[float]] = {"big": [], "small": []}
    for _ in range(args.runs):
        for sid in ("big", "small"):
            samples[sid].append(timed(conn, lines[sid]))
    raw = raw_sqlite_inserts(root, big, args.runs)
    print(f"appends, {args.runs} of each, alternated: p50 / p99")
    for sid, what in (("small", "1 KB tool result (inline)  "),
                      ("big", "1 MB tool result (offloaded)")):
        print(f"  {what} {ms(percentile(samples[sid], 0.5))} / "
              f"{ms(percentile(samples[sid], 0.99))}")
    ratio50 = percentile(samples["big"], 0.5) / percentile(samples["small"], 0.5)
    ratio99 = percentile(samples["big"], 0.99) / percentile(samples["small"], 0.99)
    print(f"  ratio 1 MB / 1 KB: p50 {ratio50:.1f}x, p99 {ratio99:.1f}x (target p99 <= 10x)")
    blob_rate = 1 / percentile(samples["big"], 0.5)
    raw_rate = 1 / percentile(raw, 0.5)
    print(f"  blob path {blob_rate:,.0f} MB/s (1 MB / append p50); raw SQLite insert "
          f"{raw_rate:,.0f} MB/s (p50 {ms(percentile(raw, 0.5))}); "
          f"{blob_rate / raw_rate:.2f}x of raw")

    ten = log_text(10 * MB)
    conn.call("message.append", {"session_id": "search", "messages": [
        {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": ten}]})
    [message] = conn.call("message.list", {"session_id": "search"})["messages"]  # type: ignore[index]
    ref_id = message["ref_id"]
    pattern = r"FAILED assert \d+ == \d+"
    read = request_line("result.read", {"session_id": "search", "ref_id": ref_id,
                                        "pattern": pattern, "max_matches": 100})
    answer = conn.call("result.read", {"session_id": "search", "ref_id": ref_id,
                                       "pattern": pattern, "max_matches": 100})
    reads = [timed(conn, read) for _ in range(args.reads)]
    compiled = compile_pattern(pattern, literal=False)
    local = []
    for _ in range(args.reads):
        start = time.perf_counter()
        _, found = grep(ten, compiled, 100, 60.0)
        local.append(time.perf_counter() - start)
    assert found == answer["matched_lines"], (found, answer["matched_lines"])
    print(f"result.read with a pattern over 10 MB ({answer['matched_lines']:,} matching "
          f"lines, {len(answer['matches']):,} returned), {args.reads} runs:")
    daemon_rate = 10 / percentile(reads, 0.5)
    local_rate = 10 / percentile(local, 0.5)
    print(f"  daemon p50 {ms(percentile(reads, 0.5))}, p99 {ms(percentile(reads, 0.99))}: "
          f"{daemon_rate:,.0f} MB/s (target >= 100)")
    print(f"  the same search in this process (hygiene.grep) p50 {ms(percentile(local, 0.5))}: "
          f"{local_rate:,.0f} MB/s; daemon at {daemon_rate / local_rate:.2f}x of it")


def call_answer(conn: Connection, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The decoded answer (``result`` or ``error``) of one request."""
    answer: dict[str, Any] = msgspec.json.decode(conn.call_line(request_line(method, params)))
    return answer


def tool_call(step: int, name: str, command: str) -> dict[str, Any]:
    """An assistant turn that calls a tool, as Anthropic's API sends it (a ``tool_use``
    part)."""
    return {"role": "assistant", "content": [
        {"type": "text", "text": f"Step {step}: I'll run {name} to check the next part."},
        {"type": "tool_use", "id": f"toolu_{step:05d}", "name": name,
         "input": {"command": command}}]}


def tool_output(rng: random.Random, step: int, size: int) -> str:
    """``size`` characters of varied output: source lines, test results, paths."""
    words = ("def", "return", "self", "value", "config", "parse", "token", "assert", "None",
             "session", "render", "append", "result", "error", "path", "import", "class")
    lines = []
    total = 0
    while total < size:
        line = (f"src/module_{rng.randrange(40)}.py:{rng.randrange(1, 900)}: "
                + " ".join(rng.choice(words) for _ in range(rng.randrange(4, 14)))
                + f" # step {step}\n")
        lines.append(line)
        total += len(line)
    return "".join(lines)[:size]


def coding_session(seed: int, steps: int) -> list[dict[str, Any]]:
    """A coding agent's thread: a system prompt, a task, then ``steps`` tool calls with
    their results (a fifth of them 5-30 KB, offloaded; an eighth errors of 1-3 KB, inline;
    the rest 1-4 KB, inline), a user message every 40 steps."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent working in a Python "
                                      "repository. " + tool_output(rng, 0, 1_500)},
        {"role": "user", "content": "Fix the failing tests in tests/unit. Never edit the "
                                    "migrations; keep the public API stable."}]
    for step in range(steps):
        if step and step % 40 == 0:
            messages.append({"role": "user", "content": f"Also check module {step}; do not "
                                                        "add dependencies."})
        name = rng.choice(("bash", "read_file", "grep", "edit_file"))
        messages.append(tool_call(step, name, f"pytest tests/unit -k case_{step}"))
        kind = rng.random()
        result: dict[str, Any] = {"role": "tool", "name": name,
                                  "tool_call_id": f"toolu_{step:05d}"}
        if kind < 0.2:
            result["content"] = tool_output(rng, step, rng.randrange(5_000, 30_000))
        elif kind < 0.325:
            result["content"] = ("Traceback (most recent call last):\n"
                                 + tool_output(rng, step, rng.randrange(1_000, 3_000))
                                 + "AssertionError: expected 2, got 1\n")
            result["meta"] = {"is_error": True}
        else:
            result["content"] = tool_output(rng, step, rng.randrange(1_000, 4_000))
        messages.append(result)
    return messages


def render_figures(conn: Connection, raw: Connection, args: argparse.Namespace) -> None:
    """``ctxd.render`` of 1,000 messages, 300 of them offloaded results, against the same
    session with every result inline: the same messages on a daemon whose offload threshold
    is at its maximum, and the same shape with the 300 results cut under the threshold."""
    rng = random.Random(7)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the failing tests."}]
    under = list(messages)
    big_steps = set(rng.sample(range(499), 300))
    for step in range(499):
        call = tool_call(step, "bash", f"pytest -k case_{step}")
        size = 5_000 if step in big_steps else rng.randrange(500, 2_000)
        text = tool_output(rng, step, size)
        result = {"role": "tool", "name": "bash", "tool_call_id": f"toolu_{step:05d}"}
        messages += [call, {**result, "content": text}]
        under += [call, {**result, "content": text[:4_000]}]
    assert len(messages) == 1_000
    budget = {"context_window": 10_000_000}
    sessions = (("offloaded", conn, messages), ("under", conn, under), ("inline", raw, messages))
    for sid, client, thread in sessions:
        client.call("session.open", {"session_id": f"render-{sid}", "budget": budget})
        client.call("message.append", {"session_id": f"render-{sid}", "messages": thread})
    lines = {sid: request_line("ctxd.render", {"session_id": f"render-{sid}"})
             for sid, _, _ in sessions}
    samples: dict[str, list[float]] = {sid: [] for sid, _, _ in sessions}
    for _ in range(3):
        for sid, client, _ in sessions:
            timed(client, lines[sid])
    for _ in range(args.renders):
        for sid, client, _ in sessions:
            samples[sid].append(timed(client, lines[sid]))
    tokens = {sid: client.call("ctxd.render", {"session_id": f"render-{sid}"})["tokens"]
              for sid, client, _ in sessions}
    print(f"ctxd.render of 1,000 messages (499 tool results), {args.renders} runs each, "
          "alternated: p50 / p99")
    for sid, what in (("inline", "300 results of 5,000 B inline (threshold at max)  "),
                      ("under", "300 results cut to 4,000 B (under the threshold)  "),
                      ("offloaded", "300 results of 5,000 B offloaded (stubs)      ")):
        print(f"  {what} {ms(percentile(samples[sid], 0.5))} / "
              f"{ms(percentile(samples[sid], 0.99))}  ({tokens[sid]:,} tokens)")
    for sid in ("inline", "under"):
        print(f"  ratio offloaded / {sid}: p50 "
              f"{percentile(samples['offloaded'], 0.5) / percentile(samples[sid], 0.5):.2f}x, "
              f"p99 {percentile(samples['offloaded'], 0.99) / percentile(samples[sid], 0.99):.2f}x"
              " (target p50 <= 1.5x)")


def compaction_figures(manual: Connection, args: argparse.Namespace) -> None:
    """``context.compact`` of a 190k-token session (default budget: effective window
    191,808), each run on a fresh copy, against ``ctxd.render`` of the same session."""
    thread = coding_session(11, 2_000)
    # How much of the thread makes 190k tokens: one session grown a turn at a time.
    manual.call("session.open", {"session_id": "probe"})
    answer = manual.call("message.append", {"session_id": "probe", "messages": thread[:2],
                                            "allow_over": True})
    used = 2
    while answer["context_state"]["main_thread_tokens"] < 190_000:  # type: ignore[index]
        answer = manual.call("message.append", {"session_id": "probe",
                                                "messages": thread[used:used + 2],
                                                "allow_over": True})
        used += 2
    thread = thread[:used]
    offloaded = sum(1 for m in thread if m["role"] == "tool" and "meta" not in m
                    and len(m["content"].encode()) > 4_096)
    errors = sum(1 for m in thread if "meta" in m)
    print(f"context.compact of a {answer['context_state']['main_thread_tokens']:,}-token "  # type: ignore[index]
          f"session ({len(thread)} messages: {offloaded} results offloaded, {errors} errors, "
          "the rest 1-4 KB inline), default budget, extractive summarizer, "
          f"{args.compactions} runs each on a fresh copy:")
    variants = (("chain", None), ("summarize", ["summarize", "truncate"]))
    for variant, _ in variants:
        for run in range(args.compactions):
            sid = f"{variant}-{run}"
            manual.call("session.open", {"session_id": sid})
            for start in range(0, len(thread), 200):
                manual.call("message.append", {"session_id": sid, "allow_over": True,
                                               "messages": thread[start:start + 200]})
    renders: list[float] = []
    for variant, strategies in variants:
        samples = []
        results = []
        for run in range(args.compactions):
            sid = f"{variant}-{run}"
            if variant == "chain":
                renders.append(timed(manual, request_line("ctxd.render", {"session_id": sid})))
            params: dict[str, Any] = {"session_id": sid}
            if strategies is not None:
                params["strategies"] = strategies
            line = request_line("context.compact", params)
            start = time.perf_counter()
            answer = msgspec.json.decode(manual.call_line(line))
            samples.append(time.perf_counter() - start)
            results.append(answer["result"])
        done = results[0]
        print(f"  {variant:9} strategies_run {done['strategies_run']}: "
              f"{done['before_tokens']:,} -> {done['after_tokens']:,} tokens, "
              f"{done['before_msgs']} -> {done['after_msgs']} messages, "
              f"{done.get('cleared', 0)} cleared, {done.get('summarized', 0)} summarised; "
              f"p50 {ms(percentile(samples, 0.5))}, p99 {ms(percentile(samples, 0.99))} "
              f"(target <= 100 ms); {percentile(samples, 0.5) / percentile(renders, 0.5):.1f}x "
              "the render's p50")
    print(f"  baseline ctxd.render of the same session (before compaction): p50 "
          f"{ms(percentile(renders, 0.5))}, p99 {ms(percentile(renders, 0.99))}")


def replay(client: Connection, sid: str, budget: dict[str, int],
           messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Append ``messages`` one at a time; the peak of the rendered thread's tokens after
    each append (what the next model call is sent), each message's tokens, compactions."""
    client.call("session.open", {"session_id": sid, "budget": budget})
    peak = 0
    tokens = []
    compactions = 0
    over = 0
    for message in messages:
        params: dict[str, Any] = {"session_id": sid, "messages": [message]}
        answer = call_answer(client, "message.append", params)
        if "error" in answer and answer["error"]["code"] == -32001:
            over += 1  # Past the hard block even after compaction: appended anyway.
            answer = call_answer(client, "message.append", {**params, "allow_over": True})
        if "error" in answer:
            raise RuntimeError(f"{sid}: {answer['error']}")
        result = answer["result"]
        compactions += len(result["compactions"])
        tokens.append(result["appended"][0]["tokens"])
        peak = max(peak, result["context_state"]["main_thread_tokens"])
    return {"peak": peak, "tokens": tokens, "compactions": compactions, "over": over}


def replay_figures(conn: Connection, raw: Connection, folder: Path) -> None:
    """Peak rendered tokens of each transcript replayed with ctxd's default hygiene,
    against the raw thread (every message inline, no compaction) counted the same way."""
    windows = (("200k", {"context_window": 200_000, "max_output_tokens": 8_192}),
               ("32k", {"context_window": 32_000, "max_output_tokens": 4_096}))
    rows = []
    for index, path in enumerate(sorted(p for p in folder.iterdir() if p.name != "README.md")):
        messages = load(path)
        base = replay(raw, f"raw-{index}", {"context_window": 10_000_000}, messages)
        row = {"name": path.name, "messages": len(messages), "raw": base["peak"]}
        for label, budget in windows:
            got = replay(conn, f"replay-{label}-{index}", budget, messages)
            row[label] = got
            row[f"{label}-offloads"] = sum(
                1 for m, mine, full in zip(messages, got["tokens"], base["tokens"], strict=True)
                if m["role"] == "tool" and mine != full)
        rows.append(row)
    print("replayed transcripts: peak rendered tokens (main thread, after each append)")
    print(f"  {'transcript':52} {'msgs':>5} {'raw peak':>9} | "
          + " | ".join(f"{label} window: peak  saved  compactions offloads"
                       for label, _ in windows))
    savings: dict[str, list[float]] = {label: [] for label, _ in windows}
    for row in rows:
        cells = []
        for label, _ in windows:
            got = row[label]
            saved = 100 * (1 - got["peak"] / row["raw"])
            savings[label].append(saved)
            cells.append(f"{got['peak']:>20,} {saved:5.1f}% {got['compactions']:>11} "
                         f"{row[f'{label}-offloads']:>8}"
                         + (f" ({got['over']} over)" if got["over"] else ""))
        print(f"  {row['name'][:52]:52} {row['messages']:>5} {row['raw']:>9,} | "
              + " | ".join(cells))
    print("  median saving: " + ", ".join(f"{label} window {statistics.median(s):.1f}%"
                                          for label, s in savings.items()))


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--runs", type=int, default=200, help="appends of each size")
    options.add_argument("--reads", type=int, default=20, help="searches of the 10 MB blob")
    options.add_argument("--renders", type=int, default=100,
                         help="renders of each 1,000-message session")
    options.add_argument("--compactions", type=int, default=10,
                         help="190k-token sessions compacted, of each strategy list")
    options.add_argument("--transcripts", type=Path, default=TRANSCRIPTS,
                         help="folder of the transcripts to replay")
    options.add_argument("--only", choices=("offload", "render", "compact", "replay"),
                         action="append", help="run only these parts (repeatable)")
    args = options.parse_args()
    parts = set(args.only or ("offload", "render", "compact", "replay"))
    with tempfile.TemporaryDirectory(prefix="ctxd-bh-") as folder, contextlib.ExitStack() as stack:
        root = Path(folder)
        big_requests = ["--max-request-bytes", str(64 << 20)]
        daemons = {
            "ctxd": DaemonProcess(root, extra_args=big_requests),
            # Every message inline and never compacted: the raw thread, counted exactly.
            "raw": DaemonProcess(root, name="raw", data=root / "raw", extra_args=[
                *big_requests, "--hygiene-offload-threshold-bytes", str(1 << 30),
                "--hygiene-auto-compact", "false"]),
            "manual": DaemonProcess(root, name="manual", data=root / "manual", extra_args=[
                *big_requests, "--hygiene-auto-compact", "false"]),
        }
        conns = {}
        for name, daemon in daemons.items():
            stack.enter_context(daemon.running())
            conns[name] = Connection(daemon.socket)
            stack.callback(conns[name].close)
        if "offload" in parts:
            offload_figures(root, conns["ctxd"], args)
        if "render" in parts:
            render_figures(conns["ctxd"], conns["raw"], args)
        if "compact" in parts:
            compaction_figures(conns["manual"], args)
        if "replay" in parts:
            replay_figures(conns["ctxd"], conns["raw"], args.transcripts)
    return 0

if __name__ == "__main__":
    sys.exit(main())
