"""Agents benchmark: what the model receives from a real agent, alone, with ctxd's hooks
or plugin, and through ctxd's model gateway — tokens and cost per call, one scripted
session each.

The agents are the real Claude Code CLI (the one the ``claude-agent-sdk`` wheel bundles),
run hermetically (its own HOME, a dummy key, non-essential traffic off), and the real
OpenCode (the npm package ``opencode-ai``, on PATH or where .ci/run installs it) on its
Anthropic provider, run hermetically as tests/opencode_runs.py does. The model is the
scripted Messages API of tests/mock_anthropic.py, which prices every main-loop request as
Anthropic's prompt cache would (ctxd/cost.py: breakpoints, 20-block lookback,
5-minute lifetime). One script of ``--calls`` model calls (default 32): large Bash outputs,
Read of large files, failing test runs and small commands, then a final answer (the
tools by each agent's names). Three configurations of the same script per agent, each in
a fresh project, HOME and daemon:

* ``alone``: the agent talks to the model directly (the baseline);
* ``hooks``: ctxd installed with the gateway left out (Claude Code: ``ctxctl install
  claude-code`` at project scope, hooks and MCP; OpenCode: ``ctxctl install opencode
  --no-gateway``, plugin and MCP), the agent still talking to the model directly;
* ``gateway``: ctxd installed, the agent's base URL the daemon's gateway (Claude Code:
  ``ANTHROPIC_BASE_URL``; OpenCode: ``ctxctl install opencode`` at user scope, which sets
  its Anthropic provider's baseURL), whose upstream is the model.

Per configuration: model calls, tokens the model received (summed and the last call's),
cache reads and writes, and cost at Anthropic's price ratios (input 1, cache write 1.25,
cache read 0.1, output 5), each against ``alone`` of the same run. Targets: the gateway at
most 0.5x ``alone`` in summed input tokens and 0.7x in cost, and the agent finishes.
``--per-call`` prints every call's figures; ``--agents`` picks the agents.

Run: ``python bench/agents.py`` (about five minutes).
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
from opencode_runs import OPENCODE, gateway_project, hermetic_env, point_anthropic_at

from ctxd.cost import CacheUsage, PromptCache

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


TOOL_NAMES = {"claude-code": ("Bash", "Read", "file_path"),
              "opencode": ("bash", "read", "filePath")}
"""Each agent's shell and file-reading tools, and the reading tool's path parameter."""


def script(project: Path, calls: int, agent: str = "claude-code"
           ) -> list[list[dict[str, Any]]]:
    """The model's turns: ``calls - 1`` tool calls in a repeating mix, then the answer."""
    bash, read, path_key = TOOL_NAMES[agent]
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
        lambda n: tool_use(f"toolu_{n:03d}", bash, {
            "command": f"python3 -c \"print('\\n'.join(f'log {n}-{{i:05d}} request served "
                       f"in {{i % 97}} ms' for i in range(1200)))\"",
            "description": f"Show log {n}"}),
        lambda n: tool_use(f"toolu_{n:03d}", read, {path_key: str(files[n % 4])}),
        lambda n: tool_use(f"toolu_{n:03d}", bash, {"command": "python3 test_suite.py",
                                                    "description": "Run the tests"}),
        lambda n: tool_use(f"toolu_{n:03d}", bash, {"command": f"echo step {n}",
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


def run_opencode(project: Path, env: dict[str, str], prompt: str) -> bool:
    """One ``opencode run``; whether it ended with the scripted answer."""
    assert OPENCODE is not None
    done = subprocess.run([str(OPENCODE), "run", "--format", "json", prompt], cwd=project,
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        print(f"  opencode exited {done.returncode}: {done.stderr[-500:]}")
        return False
    texts = [event["part"].get("text") for event in map(json.loads, (
        line for line in done.stdout.splitlines() if line.startswith("{")))
        if event.get("type") == "text"]
    return bool(texts) and texts[-1] == "Finished."


def opencode_configuration(name: str, calls: int) -> Outcome:
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"ctxd-oc-{name}-")))
        mock = stack.enter_context(MockAnthropic([], final="Finished.", cache=PromptCache()))
        socket = root / "no-ctxd.sock"
        if name != "alone":
            config = root / "daemon" / "config" / "ctxd" / "config.toml"
            config.parent.mkdir(parents=True)
            config.write_text('[gateway]\nlisten = "127.0.0.1:0"\n')
            socket = stack.enter_context(DaemonProcess(root / "daemon", env={
                "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": mock.url}).running()).socket
        env = {**hermetic_env(root, socket), "ANTHROPIC_API_KEY": "sk-ant-dummy"}
        ctxd = {"alone": "none", "hooks": "plugin", "gateway": "gateway"}[name]
        project = gateway_project(root, env, socket, ctxd=ctxd)
        if name != "gateway":
            point_anthropic_at(project, mock.url + "/v1")
        mock.turns = list(script(project, calls, "opencode"))
        finished = run_opencode(project, env, "Work through the steps, then say Finished.")
        return Outcome(name, list(mock.charged), finished)


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
            config.write_text('[gateway]\nlisten = "127.0.0.1:0"\n')
            # The daemon in Claude Code's home, as a user runs both: the gateway reads
            # Claude Code's saved outputs under that home's ~/.claude.
            daemon = stack.enter_context(DaemonProcess(root / "daemon", env={
                "HOME": str(home), "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": mock.url}).running())
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


AGENTS = {"claude-code": "Claude Code", "opencode": "OpenCode"}


def report(agent: str, outcomes: list[Outcome], calls: int, per_call: bool) -> bool:
    """Print one agent's table; whether its targets were met (or not measured)."""
    base = outcomes[0]
    print(f"\n{AGENTS[agent]}, one scripted session of {calls} model calls per "
          f"configuration; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
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
    if per_call:
        for outcome in outcomes:
            print(f"\n  {outcome.name}: per call (input / cache read / cache write)")
            for index, charged in enumerate(outcome.charged, 1):
                print(f"    {index:>3} {charged.input_tokens:>8,} {charged.cache_read_tokens:>9,}"
                      f" {charged.cache_write_tokens:>9,}")
    gateway = next((o for o in outcomes if o.name == "gateway"), None)
    if gateway is None or base.name != "alone":
        return True
    met = (gateway.finished and gateway.input_tokens <= 0.5 * base.input_tokens
           and gateway.cost <= 0.7 * base.cost)
    print(f"\ntargets (gateway <= 0.5x input tokens, <= 0.7x cost, finished): "
          f"{'met' if met else 'MISSED'}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--per-call", action="store_true")
    parser.add_argument("--only", default="alone,hooks,gateway")
    parser.add_argument("--agents", default="claude-code,opencode")
    args = parser.parse_args()
    names = args.only.split(",")
    agents = args.agents.split(",")
    if unknown := [n for n in names if n not in ("alone", "hooks", "gateway")] + \
            [a for a in agents if a not in AGENTS]:
        parser.error(f"unknown configuration or agent: {', '.join(unknown)}")
    if args.calls < 2:
        parser.error("--calls must be at least 2")
    ran = True
    for agent in agents:
        if agent == "claude-code":
            claude = bundled_claude()
            if claude is None:
                print("claude-agent-sdk (with its bundled Claude Code CLI) is not installed")
                ran = False
                continue
            outcomes = [configuration(name, claude, args.calls) for name in names]
        else:
            if OPENCODE is None:
                print("opencode is not installed (npm install opencode-ai; .ci/run does)")
                ran = False
                continue
            outcomes = [opencode_configuration(name, args.calls) for name in names]
        report(agent, outcomes, args.calls, args.per_call)
        ran = ran and all(o.charged for o in outcomes)
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
