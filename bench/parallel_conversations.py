"""Parallel conversations benchmark: what conversations that share a session cost.

An agent that names no session of its own is known to the gateway by its system prompt
and first message, so two runs of one task (in parallel, or one after the other) share a
session. Each such conversation must still be sent the bytes it was sent before, or the
provider's prompt cache is lost on every turn. This benchmark runs the same conversations
through two real daemons, the ``--baseline`` revision (default e61cd7d, one ledger line a
thread) and this tree, in the same run, against one local scripted model server that
keeps every body it receives, and prices those bodies with the prompt cache's rules
(ctxd.cost.PromptCache: input 1, cache write 1.25, cache read 0.1; one cache for the
API key, 2 s between calls, so nothing expires).

Each conversation: a system prompt (marked for the cache), the shared first message, then
``--turns`` turns of a Bash call and its output (most under the offload threshold, one in
four 6-40 KB, which ctxd offloads), the last message marked for the cache as Claude Code
marks it. Configurations, each with a system prompt of its own:

* ``own sessions``: ``--conversations`` conversations, each with its own
  ``x-ctxd-session``, taken in turn (the reference: nothing shared);
* ``shared, in turn``: the same conversations without the header (one session), taken in
  turn, a turn of each at a time;
* ``shared, one after another``: the same, each conversation whole before the next.

Figures: the cost of what the model received, per configuration and daemon, and what the
agent's own bodies would cost sent directly; messages recorded. Target: for this tree,
each shared configuration costs at most 1% more than own sessions (ratio <= 1.01).

Run: ``python bench/parallel_conversations.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import sys
from typing import Any

from _common import start_daemons
from gateway import Endpoint, ModelServer

from ctxd.cost import PromptCache

CALL_SECONDS = 2.0
TARGET_RATIO = 1.01
WORDS = ("build test module import error warning passed failed cache token index line "
         "function value return config daemon socket request session branch memory").split()


def output(rng: random.Random, size: int) -> str:
    """A tool's output of about ``size`` bytes: numbered lines of words."""
    lines, total = [], 0
    while total < size:
        line = f"{len(lines):05d} " + " ".join(rng.choice(WORDS) for _ in range(10))
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)


def conversation(number: int, turns: int, seed: int) -> list[list[dict[str, Any]]]:
    """The message lists of one conversation's requests, one per turn (the last message
    of each marked for the cache in the request, not here)."""
    rng = random.Random(seed * 1000 + number)
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix the failing test in the build and run it again."}]
    requests = [list(history)]
    for turn in range(turns - 1):
        call_id = f"toolu_{number:02d}{turn:04d}"
        size = rng.randint(6_000, 40_000) if rng.random() < 0.25 else rng.randint(200, 1_500)
        history += [
            {"role": "assistant", "content": [
                {"type": "text", "text": f"Step {turn} of conversation {number}."},
                {"type": "tool_use", "id": call_id, "name": "Bash",
                 "input": {"command": f"make test-{number}-{turn}"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                          "content": output(rng, size)}]}]
        requests.append(list(history))
    return requests


def body(system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A request as Claude Code shapes its cache marks: the system prompt's and the last
    message's last block."""
    *before, last = messages
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    marked = {**last, "content": [*blocks[:-1], {**blocks[-1],
                                                 "cache_control": {"type": "ephemeral"}}]}
    return {"model": "claude-bench", "max_tokens": 64,
            "system": [{"type": "text", "text": system,
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [*before, marked]}


def cost_of(bodies: list[dict[str, Any]]) -> float:
    """What the bodies cost in turn, through one prompt cache, ``CALL_SECONDS`` apart."""
    now = [0.0]
    cache = PromptCache(lambda: now[0])
    total = 0.0
    for sent in bodies:
        total += cache.charge(sent).cost()
        now[0] += CALL_SECONDS
    return total


def recorded(daemon: Any) -> int:
    """Messages the daemon's sessions hold."""
    with daemon.client() as client:
        sessions = client.call("session.list", {"limit": 1000})["sessions"]
    return sum(session["message_count"] for session in sessions)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="e61cd7d",
                        help="the revision to compare with (default e61cd7d)")
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    conversations = [conversation(n, args.turns, args.seed)
                     for n in range(args.conversations)]
    in_turn = [(n, turn) for turn in range(args.turns) for n in range(args.conversations)]
    one_after_another = [(n, turn) for n in range(args.conversations)
                         for turn in range(args.turns)]
    configurations = [("own sessions", in_turn, True), ("shared, in turn", in_turn, False),
                      ("shared, one after another", one_after_another, False)]
    results: dict[str, dict[str, tuple[float, int]]] = {}
    direct: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        model = stack.enter_context(ModelServer(keep=True))
        daemons = start_daemons(stack, args.baseline, {
            "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": model.origin})
        print(f"ctxd parallel conversations benchmark: CPython {platform.python_version()}, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{args.conversations} conversations of {args.turns} turns with one start; "
              f"prompt cache: input 1, write 1.25, read 0.1\n")
        for label, daemon in daemons.items():
            with daemon.client() as client:
                base_url = client.call("daemon.status")["gateway"]["base_url"]
            endpoint = Endpoint(base_url)
            stack.callback(endpoint.close)
            for name, order, own in configurations:
                system = f"You are a build agent ({name}).\n" + output(random.Random(1), 6_000)
                before = recorded(daemon)
                model.received.clear()
                agent_bodies = []
                for number, turn in order:
                    sent = body(system, conversations[number][turn])
                    agent_bodies.append(sent)
                    endpoint.post(json.dumps(sent).encode(),
                                  (("x-ctxd-session", f"bench-{name}-{number}"),) if own else ())
                received = [json.loads(raw) for raw in model.received]
                results.setdefault(name, {})[label] = (cost_of(received),
                                                       recorded(daemon) - before)
                direct[name] = cost_of(agent_bodies)
    labels = list(daemons)
    print(f"  {'configuration':<27} {'sent directly':>14} "
          + "".join(f"{label:>20}" for label in labels) + "   ratio")
    for name, _, _ in configurations:
        row = results[name]
        print(f"  {name:<27} {direct[name]:>14,.0f} "
              + "".join(f"{row[label][0]:>20,.0f}" for label in labels)
              + f"   {row[labels[1]][0] / row[labels[0]][0]:.2f}x")
    print(f"  {'messages recorded':<27} {'':>14} "
          + "".join(f"{'/'.join(str(results[n][label][1]) for n, _, _ in configurations):>20}"
                    for label in labels))
    reference = results["own sessions"]
    met = True
    print("\n  shared / own sessions (cost)   "
          + "".join(f"{label:>20}" for label in labels) + "   target   result")
    for name, _, _ in configurations[1:]:
        ratios = [results[name][label][0] / reference[label][0] for label in labels]
        ok = ratios[1] <= TARGET_RATIO
        met &= ok
        print(f"  {name:<31}" + "".join(f"{ratio:>19.2f}x" for ratio in ratios)
              + f"   <= {TARGET_RATIO:.2f}   {'ok' if ok else 'MISS'}")
    print("\nall targets met" if met else "\ntargets missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
