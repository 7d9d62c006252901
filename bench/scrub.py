"""Scrubbing benchmark: MB/s of ``ctxd.scrub.scrub`` against the previous scrubber, same run.

The baseline is the scrubber of a git revision (``--baseline``, default the one before the
rules of docs/security.md "What the scrubber recognises"), read with ``git show`` into a
module of its own, so both run in this process on the same texts, interleaved round by
round:

* ``clean``: this repository's own source and docs (ctxd/, clients/, docs/, man/,
  README.md), repeated to ``--mib`` MiB: code and prose with the words the rules look for
  (token, password, secret, key, ://) and no secret.
* ``dense``: one fake credential of a format the rules know in every line of about 80
  characters, repeated to ``--mib`` MiB.

Each text is scrubbed in pieces of ``--piece`` KiB (the size of a long message); a figure is
the best of ``--rounds`` rounds (MB = 10^6 bytes of UTF-8). Also printed: how many secrets
each scrubber found in the dense text (the baseline misses formats it does not know).

Run: ``python bench/scrub.py`` (about 30 s).
"""

from __future__ import annotations

import argparse
import string
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ctxd import scrub as current  # noqa: E402

ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


def fake(prefix: str, length: int, alphabet: str = ALNUM, seed: int = 0) -> str:
    return prefix + "".join(alphabet[(i * 7 + seed) % len(alphabet)] for i in range(length))


def dense_lines(seed: int) -> list[str]:
    """One line per format, each with a fake credential."""
    return [
        f"deploying with GITHUB_TOKEN={fake('ghp_', 36, seed=seed)} on the staging host",
        f"the AWS key {fake('AKIA', 16, string.ascii_uppercase, seed)} was rotated today",
        f"curl -H 'Authorization: Bearer {fake('', 40, seed=seed)}' https://api.example.com",
        f"postgresql://admin:Pa@ss!w0rd{seed % 10}@db.internal:5432/app is the DSN here",
        f"credentials:\n  password: {fake('', 16, seed=seed)}\n  user: deploy",
        f'{{"password": "a b c {seed}", "signing_key": "{fake("", 24, seed=seed)}"}}',
        f"mysql -u root -p{fake('S', 10, seed=seed)} app < dump.sql  # restore the dump",
        f"vault login {fake('hvs.', 90, seed=seed)} then read the secret",
        f"DD_APP_KEY={fake('', 40, HEX, seed)} and ENCRYPTION_KEY={fake('', 24, seed=seed)}",
        f"the model answered with {fake('sk-proj-', 60, seed=seed)} in its output",
    ]


def own_text() -> str:
    files = [ROOT / "README.md", *(path for folder in ("ctxd", "clients", "docs", "man")
                                   for path in sorted((ROOT / folder).rglob("*"))
                                   if path.is_file() and path.suffix in (".py", ".md", ".1",
                                                                         ".5", ".sh"))]
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def to_size(parts: Callable[[int], str], size: int) -> str:
    chunks: list[str] = []
    total = 0
    seed = 0
    while total < size:
        chunk = parts(seed)
        chunks.append(chunk)
        total += len(chunk.encode())
        seed += 1
    return "".join(chunks)


def load_baseline(revision: str) -> ModuleType:
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:ctxd/scrub.py"],
                            check=True, capture_output=True, text=True).stdout
    module = ModuleType("baseline_scrub")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{revision}:ctxd/scrub.py", "exec"), module.__dict__)
    return module


def pieces(text: str, size: int) -> list[str]:
    return [text[start:start + size] for start in range(0, len(text), size)]


def run(scrub: Callable[[str], Any], chunks: list[str]) -> tuple[float, int]:
    """Seconds to scrub every piece, and the secrets found."""
    found = 0
    start = time.perf_counter()
    for chunk in chunks:
        found += scrub(chunk).total
    return time.perf_counter() - start, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="af37075",
                        help="git revision whose ctxd/scrub.py is the baseline")
    parser.add_argument("--mib", type=float, default=4.0, help="MiB of each text")
    parser.add_argument("--piece", type=int, default=16, help="KiB scrubbed per call")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    baseline = load_baseline(args.baseline)
    size = int(args.mib * (1 << 20))
    corpus = own_text()
    texts = {"clean": to_size(lambda _: corpus, size),
             "dense": to_size(lambda seed: "\n".join(dense_lines(seed)) + "\n", size)}
    scrubbers = {"baseline": baseline.scrub, "current": current.scrub}
    print(f"baseline: ctxd/scrub.py at {args.baseline} ({len(baseline.RULES)} rules); "
          f"current: {len(current.RULES)} rules; {args.mib:g} MiB per text in "
          f"{args.piece} KiB pieces; best of {args.rounds} rounds")
    for name, text in texts.items():
        chunks = pieces(text, args.piece * 1024)
        megabytes = len(text.encode()) / 1e6
        best = {label: float("inf") for label in scrubbers}
        found = {}
        for _ in range(args.rounds):
            for label, scrub in scrubbers.items():
                seconds, found[label] = run(scrub, chunks)
                best[label] = min(best[label], seconds)
        rate = {label: megabytes / best[label] for label in scrubbers}
        print(f"{name:6}  baseline {rate['baseline']:7.1f} MB/s ({found['baseline']:6d} found)"
              f"   current {rate['current']:7.1f} MB/s ({found['current']:6d} found)"
              f"   current/baseline {rate['current'] / rate['baseline']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
