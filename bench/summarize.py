"""Summarizer benchmark: the extractive summarizer on a span of about 300 KB (70,000
tokens) of a coding session, against a baseline measured in the same run: JSON-encoding
the same span (msgspec), the least any code that reads every message must spend.

The span: user requests with rules, assistant messages with decisions and ``tool_use``
calls (a file read, an edit, a test run), tool results of 1 to 6 KB (a failing test run
every fifth call, resolved by the next). Both timings are in this process: the summary
itself (`extract_summary`) and the summarizer's ``summarize`` (which runs it in a worker
thread for a span this big). Target: well under 50 ms.

Run: ``python bench/summarize.py`` (a few seconds).
"""

from __future__ import annotations

import argparse
import statistics
import time

import msgspec
import trio
from _common import timed

from ctxd.config import HygieneConfig
from ctxd.hygiene import extract_summary, make_summarizer
from ctxd.tokens import TokenCounter
from ctxd.wire.types import RenderedMessage


def log(lines: int, seed: int, failing: bool) -> str:
    rows = [f"tests/unit/test_module_{(seed + i) % 53}.py::test_case_{i} PASSED [{i % 100:3d}%]"
            for i in range(lines)]
    if failing:
        rows.append(f"FAILED tests/unit/test_module_{seed % 53}.py::test_case_{seed} - "
                    "assert 1 == 2")
    return "\n".join(rows)


def session_span(target_bytes: int) -> list[RenderedMessage]:
    span: list[RenderedMessage] = []
    size = 0
    turn = 0
    while size < target_bytes:
        turn += 1
        module = f"src/pkg/module_{turn % 37}.py"
        messages = [
            RenderedMessage(role="user", content=(
                f"Step {turn}: make the parser in {module} accept trailing commas. You must "
                f"keep the public API stable, and don't touch vendor/ (rule {turn % 11}).")),
            RenderedMessage(role="assistant", content=[
                {"type": "text", "text": f"I'll use the tokenizer from {module} instead of "
                                         f"the regex. Reading it first (turn {turn})."},
                {"type": "tool_use", "id": f"read_{turn}", "name": "read_file",
                 "input": {"path": module}}]),
            RenderedMessage(role="user", content=[
                {"type": "tool_result", "tool_use_id": f"read_{turn}",
                 "content": "def parse(text):\n    ...\n" * (40 + turn % 60)}]),
            RenderedMessage(role="assistant", content=[
                {"type": "tool_use", "id": f"test_{turn}", "name": "bash",
                 "input": {"command": f"pytest -x tests/unit/test_module_{turn % 53}.py"}}]),
            RenderedMessage(role="user", content=[
                {"type": "tool_result", "tool_use_id": f"test_{turn}",
                 "is_error": turn % 5 == 0,
                 "content": log(20 + turn % 40, turn, turn % 5 == 0)}]),
        ]
        span += messages
        size += sum(len(msgspec.json.encode(m)) for m in messages)
    return span



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    span = session_span(args.bytes)
    encoded = msgspec.json.encode(span)
    counter = TokenCounter()
    tokens = counter.count(encoded.decode())
    summary = extract_summary(span, 2_000)
    print(f"span: {len(span)} messages, {len(encoded):,} bytes of JSON, {tokens:,} tokens; "
          f"summary: {len(summary):,} chars, {counter.count(summary):,} tokens")
    encode = msgspec.json.Encoder().encode
    baseline = timed(lambda: encode(span), args.runs)
    extract = timed(lambda: extract_summary(span, 2_000), args.runs)
    summarizer = make_summarizer(HygieneConfig())

    async def through_summarizer() -> list[float]:
        samples = []
        for _ in range(args.runs):
            start = time.perf_counter()
            await summarizer.summarize(span, 2_000)
            samples.append((time.perf_counter() - start) * 1000)
        return samples

    summarize = trio.run(through_summarizer)
    base = statistics.median(baseline)
    for label, samples in (("baseline: msgspec JSON encoding of the span", baseline),
                           ("extract_summary (in this thread)", extract),
                           ("ExtractiveSummarizer.summarize (worker thread)", summarize)):
        p50 = statistics.median(samples)
        print(f"{label:48} p50 {p50:7.2f} ms  max {max(samples):7.2f} ms  "
              f"ratio {p50 / base:6.1f}x")


if __name__ == "__main__":
    main()
