"""Agents benchmark: what the model receives from a real agent, alone, with ctxd's hooks,
and through ctxd's model gateway — tokens and cost per call, one scripted session each.

The agent is the real Claude Code CLI (the one the ``claude-agent-sdk`` wheel bundles),
run hermetically (its own HOME, a dummy key, non-essential traffic off). The model is the
scripted Messages API of tests/mock_anthropic.py, which prices every main-loop request as
Anthropic's prompt cache would (tests/prompt_cache.py: breakpoints, 20-block lookback,
5-minute lifetime). One script of ``--calls`` model calls (default 32): large Bash outputs,
Read of large files, failing test runs and small commands, then a final answer. Three
configurations of the same script, each in a fresh project, HOME and daemon:

* ``alone``: the agent talks to the model directly (the baseline);
* ``hooks``: ``ctxctl install claude-code`` with the gateway left out of the agent's
  settings (hooks and MCP only), the agent still talking to the model directly;
* ``gateway``: ``ctxctl install claude-code``, the agent's base URL the daemon's gateway,
  whose upstream is the model.

Per configuration: model calls, tokens the model received (summed and the last call's),
cache reads and writes, and cost at Anthropic's price ratios (input 1, cache write 1.25,
cache read 0.1, output 5), each against ``alone`` of the same run. Targets: the gateway at
most 0.5x ``alone`` in summed input tokens and 0.7x in cost, and the agent finishes.
``--per-call`` prints every call's figures.

Run: ``python bench/agents.py`` (about three minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import DaemonProcess
from mock_anthropic import MockAnthropic, text, tool_use
from prompt_cache import CacheUsage, PromptCache

CTXCTL = str(Path(sys.executable).with_name("ctxctl"))
OUTPUT_TOKENS = 10
"""What the scripted model answers per call (tests/mock_anthropic.py)."""


def bundled_claude() -> Path | None:
    try:
        import claude_agent_sdk
    except ImportError:
        return None
    cli = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    return cli if cli.exists() else None


def script(project: Path, calls: int) -> list[list[dict[str, Any]]]:
    """The model's turns: ``calls - 1`` tool calls in a repeating mix, then the answer."""
    files = []
    for index in range(4):
        path = project / "src" / f"module_{index}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(f"def handler_{index}_{n}(request):\n"
                                f"    return respond(request, code={n}, module={index})\n\n"
                                for n in range(700)))
        files.append(path)
    (project / "test_suite.py").write_text(
        "import sys\nfor n in range(400):\n    print(f'test_case_{n} ... ok')\n"
        "print('FAIL: test_parser_handles_unicode (AssertionError: 3 != 4)')\n"
        "print('  File \"parser.py\", line 88\\n    return x +\\n SyntaxError: invalid syntax')\n"
        "sys.exit(1)\n")
    mix: list[Callable[[int], dict[str, Any]]] = [
        lambda n: tool_use(f"toolu_{n:03d}", "Bash", {
            "command": f"python3 -c \"print('\\n'.join(f'log {n}-{{i:05d}} request served "
                       f"in {{i % 97}} ms' for i in range(1200)))\"",
            "description": f"Show log {n}"}),
        lambda n: tool_use(f"toolu_{n:03d}", "Read", {"file_path": str(files[n % 4])}),
        lambda n: tool_use(f"toolu_{n:03d}", "Bash", {"command": "python3 test_suite.py",
                                                      "description": "Run the tests"}),
        lambda n: tool_use(f"toolu_{n:03d}", "Bash", {"command": f"echo step {n}",
                                                      "description": "Note progress"}),
    ]
    turns = [[text(f"Step {n}."), mix[n % len(mix)](n)] for n in range(calls - 1)]
    return turns


@dataclass
class Outcome:
    """One configuration's session as the model received it."""

    name: str
    charged: list[CacheUsage]
    finished: bool

    @property
    def input_tokens(self) -> int:
        return sum(c.total for c in self.charged)

    @property
    def cost(self) -> float:
        return sum(c.cost() + 5 * OUTPUT_TOKENS for c in self.charged)


def run_claude(claude: Path, project: Path, home: Path, base_url: str | None,
               prompt: str) -> bool:
    """One ``claude -p`` run; whether it ended with the scripted answer."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_API_KEY": "sk-ant-dummy",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "ENABLE_TOOL_SEARCH": "false"}
    if base_url is not None:
        env["ANTHROPIC_BASE_URL"] = base_url
    done = subprocess.run([str(claude), "-p", prompt, "--output-format", "json",
                           "--allowedTools", "Bash", "Read"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        print(f"  claude exited {done.returncode}: {done.stderr[-500:]}")
        return False
    return bool(json.loads(done.stdout).get("result") == "Finished.")


def configuration(name: str, claude: Path, calls: int) -> Outcome:
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"ctxd-{name}-")))
        home, project = root / "home", root / "project"
        home.mkdir()
        project.mkdir()
        mock = stack.enter_context(MockAnthropic(script(project, calls), final="Finished.",
                                                 cache=PromptCache()))
        base_url: str | None = mock.url
        if name != "alone":
            config = root / "daemon" / "config" / "ctxd" / "config.toml"
            config.parent.mkdir(parents=True)
            config.write_text(f'[gateway]\nlisten = "127.0.0.1:0"\n'
                              f'anthropic_upstream = "{mock.url}"\n')
            daemon = stack.enter_context(DaemonProcess(root / "daemon").running())
            install = [CTXCTL, "install", "claude-code", "--scope", "project",
                       "--socket", str(daemon.socket)]
            subprocess.run(install, cwd=project, env={**os.environ, "HOME": str(home)},
                           capture_output=True, text=True, timeout=60, check=True)
            if name == "gateway":
                with daemon.client() as client:
                    base_url = client.call("daemon.status")["gateway"]["base_url"]
        finished = run_claude(claude, project, home, base_url,
                              "Work through the steps, then say Finished.")
        return Outcome(name, list(mock.charged), finished)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--per-call", action="store_true")
    parser.add_argument("--only", default="alone,hooks,gateway")
    args = parser.parse_args()
    claude = bundled_claude()
    if claude is None:
        print("claude-agent-sdk (with its bundled Claude Code CLI) is not installed")
        return 1
    outcomes = [configuration(name, claude, args.calls) for name in args.only.split(",")]
    base = outcomes[0]
    print(f"\nClaude Code, one scripted session of {args.calls} model calls per configuration; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  {'configuration':<14} {'calls':>5} {'input tokens':>13} {'ratio':>6} "
          f"{'cache read':>11} {'cache write':>12} {'last call':>10} {'cost':>11} "
          f"{'ratio':>6}  finished")
    for outcome in outcomes:
        last = outcome.charged[-1].total if outcome.charged else 0
        print(f"  {outcome.name:<14} {len(outcome.charged):>5} {outcome.input_tokens:>13,} "
              f"{outcome.input_tokens / max(1, base.input_tokens):>5.2f}x "
              f"{sum(c.cache_read_tokens for c in outcome.charged):>11,} "
              f"{sum(c.cache_write_tokens for c in outcome.charged):>12,} {last:>10,} "
              f"{outcome.cost:>11,.0f} {outcome.cost / max(1.0, base.cost):>5.2f}x  "
              f"{'yes' if outcome.finished else 'NO'}")
    if args.per_call:
        for outcome in outcomes:
            print(f"\n  {outcome.name}: per call (input / cache read / cache write)")
            for index, charged in enumerate(outcome.charged, 1):
                print(f"    {index:>3} {charged.input_tokens:>8,} {charged.cache_read_tokens:>9,}"
                      f" {charged.cache_write_tokens:>9,}")
    gateway = next((o for o in outcomes if o.name == "gateway"), None)
    if gateway is not None and base.name == "alone":
        met = (gateway.finished and gateway.input_tokens <= 0.5 * base.input_tokens
               and gateway.cost <= 0.7 * base.cost)
        print(f"\ntargets (gateway <= 0.5x input tokens, <= 0.7x cost, finished): "
              f"{'met' if met else 'MISSED'}")
    return 0 if all(o.charged for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
