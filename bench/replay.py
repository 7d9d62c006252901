"""Replay: context saved, and cost (docs/performance.md). Each transcript replayed turn by
turn into a private ctxd with its default hygiene (``ctxctl replay --json``), at ctxd's
default window and at a 32,000-token window; the baseline, in the same run, is the raw
thread (the same transcript imported with hygiene off). Targets at 32k: peak rendered
context ≤ 15 % of the raw peak, key facts kept ≥ 90 %, every removed byte retrievable.
The floor column is the lowest share reachable: automatic compaction triggers at
compact_trigger (0.95) of the effective window, so once the raw thread passes that,
ctxd's peak is about there (min(raw peak, trigger) / raw peak).

Cost, in the same runs: every policy's requests priced with Anthropic's prompt cache
(input 1, cache write 1.25, cache read 0.1, output 5). Targets, at both windows: ctxd's
cost ≤ 0.8 times the cheapest other policy's (the median over the transcripts of that
ratio), its key facts ≥ that policy's, retrievable 100 %, and one transcript's replay
under all policies in under 30 s. The shared transcripts are the development set.
SWE-agent trajectories are replayed as the Claude Code transcript of the same calls
(`_transcripts.as_claude_code`).

    .venv/bin/python bench/replay.py [FILES…]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _transcripts import as_claude_code

REPO_ROOT = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO_ROOT.parent / "shared" / "bench-data" / "transcripts"
WINDOWS = (None, 32_000)
SMALL = 32_000
TARGET_SHARE = 0.15
TARGET_FACTS = 0.90
TARGET_COST = 0.8
TARGET_SECONDS = 30.0
CTXCTL = str(Path(sys.executable).parent / "ctxctl")


def replay(path: Path, window: int | None) -> tuple[Any, float]:
    """``ctxctl replay --json``'s report, its fields as attributes (the facts missed and
    the policies too), and the seconds it took.

    Raises:
        subprocess.CalledProcessError: the replay failed (its stderr was shown).
    """
    flags = [] if window is None else ["--window", str(window)]
    started = time.monotonic()
    done = subprocess.run([CTXCTL, "replay", str(path), "--json", *flags], check=True,
                          stdout=subprocess.PIPE, text=True)
    seconds = time.monotonic() - started
    report = json.loads(done.stdout, object_hook=lambda fields: SimpleNamespace(**fields))
    report.policies = {name: policy for name, policy in vars(report.policies).items()}
    return report, seconds


def cost_table(report: Any) -> tuple[float, str, bool]:
    """Print each policy's figures; return ctxd's cost over the cheapest other policy's,
    that policy's name, and whether ctxd keeps as many facts and every removed byte."""
    print(f"    {'policy':<20} {'peak':>7} {'input':>10} {'cache read':>11} "
          f"{'cache write':>11} {'output':>7} {'cost':>10} {'$':>7} {'facts':>6} "
          f"{'retr.':>6}")
    for name, policy in report.policies.items():
        print(f"    {name:<20} {policy.peak_tokens:>7,} {policy.input_tokens:>10,} "
              f"{policy.cache_read_tokens:>11,} {policy.cache_write_tokens:>11,} "
              f"{policy.output_tokens:>7,} {policy.cost:>10,.0f} {policy.dollars:>7.2f} "
              f"{policy.key_facts_kept:>6.1%} {policy.retrievable_fraction:>6.1%}")
    ctxd = report.policies["ctxd"]
    best = min((name for name in report.policies if name != "ctxd"),
               key=lambda name: report.policies[name].cost)
    other = report.policies[best]
    return (ctxd.cost / other.cost, best,
            ctxd.key_facts_kept >= other.key_facts_kept and ctxd.retrievable_fraction == 1.0)


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("files", nargs="*", type=Path,
                     help="transcripts (default: the shared Claude Code sessions)")
    args = cli.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ctxd-bench-replay-"))
    files = args.files or [
        *sorted(TRANSCRIPTS.glob("claude-code_*")),
        *(as_claude_code(path, scratch) for path in sorted(TRANSCRIPTS.glob("*.traj")))]
    if not files:
        print(f"no transcripts given and none in {TRANSCRIPTS}", file=sys.stderr)
        return 2
    missed_targets = 0
    ratios: dict[int, list[float]] = {}
    slowest = 0.0
    for path in files:
        print(f"\n{path.name}")
        for window in WINDOWS:
            report, seconds = replay(path, window)  # killed, ctxctl stops its daemons
            slowest = max(slowest, seconds)
            share = report.peak_tokens / report.raw_peak_tokens
            print(f"  {'window':>8} {'turns':>5} {'raw peak':>9} {'ctxd peak':>9} "
                  f"{'share':>6} {'reduction':>9} {'floor':>6} {'facts':>7} {'kept':>6} "
                  f"{'retrievable':>11} {'offloaded':>9} {'compacted':>9}")
            print(f"  {report.window:>8,} {report.turns:>5} {report.raw_peak_tokens:>9,} "
                  f"{report.peak_tokens:>9,} {share:>6.1%} {report.reduction:>9.1%} "
                  f"{report.floor_share:>6.1%} "
                  f"{report.key_facts:>7} {report.key_facts_kept:>6.1%} "
                  f"{report.retrievable_fraction:>11.1%} {report.offloaded:>9} "
                  f"{report.compacted:>9}")
            if window == SMALL:
                misses = [name for name, ok in (
                    (f"peak {share:.1%} > {TARGET_SHARE:.0%} of raw", share <= TARGET_SHARE),
                    (f"facts {report.key_facts_kept:.1%} < {TARGET_FACTS:.0%}",
                     report.key_facts_kept >= TARGET_FACTS),
                    ("not every removed byte retrievable", report.retrievable_fraction == 1.0))
                    if not ok]
                missed_targets += bool(misses)
                print("  32k targets: " + ("met" if not misses else "; ".join(misses)))
                print(f"  floor: compaction triggers at {report.trigger_tokens:,} tokens, so "
                      f"the peak cannot be much under {report.floor_share:.1%} of raw")
                kinds: dict[str, int] = {}
                for fact in report.facts_missed:
                    kinds[fact.kind] = kinds.get(fact.kind, 0) + 1
                if kinds:
                    print("  facts missed by kind: " + ", ".join(
                        f"{kind} {count}" for kind, count in sorted(kinds.items())))
            ratio, best, kept = cost_table(report)
            ratios.setdefault(report.window, []).append(ratio)
            missed_targets += not kept
            print(f"    ctxd / {best} (the cheapest other): {ratio:.2f}; replayed in "
                  f"{seconds:.1f} s" + ("" if kept else "; fewer key facts or not all "
                                                          "retrievable"))
    print("\ncost: ctxd / the cheapest other policy, median over the transcripts "
          f"(target ≤ {TARGET_COST}):")
    for window, values in ratios.items():
        median = statistics.median(values)
        missed_targets += median > TARGET_COST
        print(f"  {window:>8,}: {median:.2f} ({', '.join(f'{v:.2f}' for v in values)})")
    missed_targets += slowest > TARGET_SECONDS
    print(f"slowest replay (all policies): {slowest:.1f} s (target < {TARGET_SECONDS:.0f} s)")
    return 1 if missed_targets else 0


if __name__ == "__main__":
    sys.exit(main())
