"""Injection's relevance floor: what memory.context injects beside prompts that a memory
answers, and beside prompts that none does, with the floor and without it (same run).

Three real daemons (``python -m ctxd``, temporary sockets and data directories) hold the same
memories: every turn of the LoCoMo development conversations, recorded as
bench/locomo_recall.py records them (scope ``project:locomo-<file stem>``). One runs with
the defaults (``[memory] inject_shared_words`` 2), one with 1, the baseline with
``--memory-inject-shared-words 0`` (any match is injected, as before the floor). Each
query is a ``memory.context`` call (the hooks' injection: at most 10 memories,
confidence ≥ 0.7, within ``hook_inject_tokens``, 1,000), in three sets:

* ``answered``: each question of categories 1-4 in its own conversation's scope; a hit is
  an evidence turn among the memories injected.
* ``other conversation``: each question in each other conversation's scope: other people,
  other events (a memory may still share a topic).
* ``agent prompts``: the user prompts of the real Claude Code transcripts in the data
  folder (bench-data/transcripts), in each conversation's scope: none of these memories
  is about them.

It prints, per set and daemon, the share of queries given any memory, the memories and
tokens injected per query, and (``answered``) the share given an evidence turn; then
memory.context's latency on the ``answered`` set, the daemons interleaved one request
at a time. Exits 0 once it has figures, 1 when it could not measure.

Run: ``python bench/injection_relevance.py`` (about 40 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import percentile
from locomo_recall import (
    DEFAULT_DIR,
    Conversation,
    data_arguments,
    load,
    record_all,
    running,
    wait_memory_ready,
)
from rpc import BenchError, print_table, run_and_report, scratch_root

TRANSCRIPTS = DEFAULT_DIR.parents[1] / "transcripts"
DAEMONS: tuple[tuple[str, dict[str, str]], ...] = (
    ("floor (defaults: 2 words)", {}),
    ("floor of 1 word", {"inject-shared-words": "1"}),
    ("baseline: no floor", {"inject-shared-words": "0"}))


def agent_prompts(folder: Path) -> list[str]:
    """The user prompts of the Claude Code transcripts in ``folder``: a user record's text
    that is not a tool result, a command, a compaction summary, a side chain's or meta."""
    prompts: list[str] = []
    for path in sorted(folder.glob("claude-code_*")):
        text = path.read_text()
        records = (json.loads(text) if path.suffix == ".json"
                   else [json.loads(line) for line in text.splitlines() if line.strip()])
        for record in records:
            if (record.get("type") != "user" or record.get("isMeta")
                    or record.get("isCompactSummary") or record.get("isSidechain")):
                continue
            content = record.get("message", {}).get("content")
            if isinstance(content, list):
                if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
                    continue
                content = " ".join(b.get("text", "") for b in content
                                   if isinstance(b, dict) and b.get("type") == "text")
            if isinstance(content, str) and content.strip() and not content.startswith("<"):
                prompts.append(content[:8_000])
    return list(dict.fromkeys(prompts))


@dataclass(frozen=True)
class Query:
    kind: str
    text: str
    scope: str
    evidence: frozenset[str]


def queries(conversations: Sequence[Conversation], prompts: Sequence[str]) -> list[Query]:
    asked = []
    for conversation in conversations:
        for question in conversation.questions:
            asked.append(Query("answered", question.text, conversation.scope,
                               question.evidence))
            asked += [Query("other conversation", question.text, other.scope, frozenset())
                      for other in conversations if other is not conversation]
        asked += [Query("agent prompts", prompt, conversation.scope, frozenset())
                  for prompt in prompts]
    return asked


@dataclass
class Tally:
    queries: int = 0
    given: int = 0
    memories: int = 0
    tokens: int = 0
    evidence: int = 0


@dataclass
class Report:
    args: argparse.Namespace
    turns: int = 0
    prompts: int = 0
    tallies: dict[str, dict[str, Tally]] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)

    def print(self) -> None:
        print()
        print(f"Injection's relevance floor: {self.turns:,} LoCoMo turns as memories, "
              f"{self.prompts} agent prompts; memory.context, hook budget")
        rows: list[tuple[str, ...]] = [("queries", "daemon", "n", "given any", "memories",
                                        "tokens", "evidence given")]
        for kind in ("answered", "other conversation", "agent prompts"):
            for label, tallies in self.tallies.items():
                tally = tallies.get(kind)
                if tally is None or not tally.queries:
                    continue
                n = tally.queries
                rows.append((kind, label, str(n), f"{tally.given / n:.1%}",
                             f"{tally.memories / n:.2f}", f"{tally.tokens / n:.0f}",
                             f"{tally.evidence / n:.1%}" if kind == "answered" else ""))
        print_table(rows)
        if self.latency:
            print()
            rows = [("memory.context, answered set", "p50 ms", "p99 ms")]
            rows += [(label, f"{percentile(times, 0.5) * 1e3:.2f}",
                      f"{percentile(times, 0.99) * 1e3:.2f}")
                     for label, times in self.latency.items()]
            print_table(rows)


def injected(caller: Any, asked: Sequence[Query], window: int) -> list[dict[str, Any]]:
    return list(caller.pipelined("memory.context", (
        (lambda q=q: {"query": q.text, "scope": q.scope}) for q in asked), window))


def run_benchmark(report: Report) -> None:
    args = report.args
    conversations = load(Path(args.dir))
    prompts = agent_prompts(Path(args.transcripts))
    report.turns = sum(len(c.turns) for c in conversations)
    report.prompts = len(prompts)
    asked = queries(conversations, prompts)
    with scratch_root("ctxd-r", args.keep_logs) as root, contextlib.ExitStack() as stack:
        callers = {}
        dia_of: dict[str, dict[int, str]] = {}
        for index, (label, settings) in enumerate(DAEMONS):
            _, caller = stack.enter_context(running(
                root, root / f"data{index}", f"relevance{index}", sys.executable, settings))
            record_all(caller, conversations, args.window)
            if (problem := wait_memory_ready(caller, report.turns, 120.0)) is not None:
                raise BenchError(problem)
            dia_of[label] = {memory_id: dia_id for c in conversations
                             for memory_id, dia_id in c.dia_of.items()}
            callers[label] = caller
        for label, caller in callers.items():
            tallies = report.tallies[label] = {}
            for query, result in zip(asked, injected(caller, asked, args.window), strict=True):
                tally = tallies.setdefault(query.kind, Tally())
                given = {dia_of[label][item["id"]] for item in result["items"]}
                tally.queries += 1
                tally.given += bool(given)
                tally.memories += len(given)
                tally.tokens += result["tokens"]
                tally.evidence += bool(given & query.evidence)
        answered = [q for q in asked if q.kind == "answered"]
        report.latency = {label: [] for label in callers}
        for query in answered:
            for label, caller in callers.items():
                started = time.perf_counter()
                caller.call("memory.context", {"query": query.text, "scope": query.scope})
                report.latency[label].append(time.perf_counter() - started)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    data_arguments(cli)
    cli.add_argument("--transcripts", default=str(TRANSCRIPTS),
                     help=f"folder of Claude Code transcripts (default {TRANSCRIPTS})")
    cli.add_argument("--keep-logs", metavar="DIR", help="copy the daemons' logs to DIR")
    return cli.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    run_and_report(Report(parse_args(argv)), run_benchmark)


if __name__ == "__main__":
    main()
