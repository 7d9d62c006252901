"""Replay: context saved (docs/performance.md). Each transcript replayed turn by turn into
a private ctxd with its default hygiene (``ctxctl replay --json``), at ctxd's default
window and at a 32,000-token window; the baseline, in the same run, is the raw thread
(the same transcript imported with hygiene off). Targets at 32k: peak rendered context
≤ 15 % of the raw peak, key facts kept ≥ 90 %, every removed byte retrievable. The floor
column is the lowest share reachable: automatic compaction triggers at compact_trigger
(0.95) of the effective window, so once the raw thread passes that, ctxd's peak is about
there (min(raw peak, trigger) / raw peak).

    .venv/bin/python bench/replay.py [FILES…]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO_ROOT.parent / "shared" / "bench-data" / "transcripts"
WINDOWS = (None, 32_000)
SMALL = 32_000
TARGET_SHARE = 0.15
TARGET_FACTS = 0.90
CTXCTL = str(Path(sys.executable).parent / "ctxctl")


def replay(path: Path, window: int | None) -> Any:
    """``ctxctl replay --json``'s report, its fields as attributes (the facts missed too).

    Raises:
        subprocess.CalledProcessError: the replay failed (its stderr was shown).
    """
    flags = [] if window is None else ["--window", str(window)]
    done = subprocess.run([CTXCTL, "replay", str(path), "--json", *flags], check=True,
                          stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout, object_hook=lambda fields: SimpleNamespace(**fields))


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("files", nargs="*", type=Path,
                     help="transcripts (default: the shared Claude Code sessions)")
    args = cli.parse_args()
    files = args.files or sorted(TRANSCRIPTS.glob("claude-code_*"))
    if not files:
        print(f"no transcripts given and none in {TRANSCRIPTS}", file=sys.stderr)
        return 2
    missed_targets = 0
    for path in files:
        print(f"\n{path.name}")
        print(f"  {'window':>8} {'turns':>5} {'raw peak':>9} {'ctxd peak':>9} {'share':>6} "
              f"{'reduction':>9} {'floor':>6} {'facts':>7} {'kept':>6} {'retrievable':>11} "
              f"{'offloaded':>9} {'compacted':>9}")
        for window in WINDOWS:
            report = replay(path, window)  # killed, ctxctl stops its private daemons
            share = report.peak_tokens / report.raw_peak_tokens
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
    return 1 if missed_targets else 0


if __name__ == "__main__":
    sys.exit(main())
