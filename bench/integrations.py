"""Integration benchmarks (docs/performance.md): each against a baseline measured in the
same run.

Importers (``bench_import``): ``transcript.import`` throughput (MB/s) of a 50 MB Claude
Code JSONL, built in a temporary folder by repeating the lines of the recorded transcripts
(bench-data, both projects) with fresh ``uuid``/``parentUuid`` chains and message ids (so
every response's usage is new and every sub-agent a new branch), against reading the same
file line by line and JSON-decoding each line in Python (the floor of any importer in
Python). The import runs on a daemon of this tree, one call on one connection, timed from
the request to its answer; then the same file again (nothing new: the cost of a no-op
re-import, as the Stop hook makes after every turn).

Run: ``python bench/integrations.py [--only import]``. It reports; it exits 0 once the
daemon started.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, Connection, DaemonProcess

TRANSCRIPTS = REPO_ROOT.parent / "shared" / "bench-data" / "transcripts"
SOURCES = ("claude-code_claude-code-viewer_fe5e1c67.jsonl",
           "claude-code_claude-code-log_deep-manifest_a7da6a22.jsonl")


def _fresh(record: dict[str, Any], ids: dict[str, str], round_: int) -> dict[str, Any]:
    """``record`` with this round's uuids and message id (chains kept: a parent is renamed
    the same way as the record it names)."""
    def renamed(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if value not in ids:
            ids[value] = str(uuid.uuid4())
        return ids[value]

    record = dict(record, uuid=renamed(record.get("uuid")),
                  parentUuid=renamed(record.get("parentUuid")), sessionId="bench-import")
    message = record.get("message")
    if isinstance(message, dict) and isinstance(message.get("id"), str):
        record["message"] = dict(message, id=f"{message['id']}-{round_}")
    return record


def build_transcript(path: Path, megabytes: int) -> tuple[int, int]:
    """Write a Claude Code JSONL of at least ``megabytes`` MB; its size and lines."""
    lines = [raw for name in SOURCES
             for raw in (TRANSCRIPTS / name).read_text().splitlines() if raw.strip()]
    records = [json.loads(raw) for raw in lines]
    size = count = 0
    round_ = 0
    with path.open("w") as file:
        while size < megabytes * 1_000_000:
            ids: dict[str, str] = {}
            for record in records:
                text = json.dumps(_fresh(record, ids, round_)) + "\n"
                file.write(text)
                size += len(text.encode())
                count += 1
            round_ += 1
    return size, count


def decode_baseline(path: Path) -> float:
    """Seconds to read ``path`` line by line and JSON-decode each line."""
    start = time.perf_counter()
    with path.open("rb") as file:
        for raw in file:
            if raw.strip():
                json.loads(raw)
    return time.perf_counter() - start


def bench_import(megabytes: int, rounds: int) -> None:
    """transcript.import of a ``megabytes`` MB Claude Code JSONL, against decoding it."""
    with tempfile.TemporaryDirectory(prefix="ctxd-bi-") as folder:
        root = Path(folder)
        path = root / "bench-import.jsonl"
        size, lines = build_transcript(path, megabytes)
        mb = size / 1_000_000
        baseline = min(decode_baseline(path) for _ in range(rounds))
        (root / "d").mkdir()
        daemon = DaemonProcess(root / "d")
        with daemon.running():
            connection = Connection(daemon.socket)
            timings, again = [], []
            result: dict[str, Any] = {}
            for round_ in range(rounds):
                params = {"format": "claude-code", "path": str(path),
                          "session_id": f"bench-import-{round_}"}
                start = time.perf_counter()
                result = connection.call("transcript.import", params)
                timings.append(time.perf_counter() - start)
                start = time.perf_counter()
                repeat = connection.call("transcript.import", params)
                again.append(time.perf_counter() - start)
                assert repeat["messages_added"] == 0, repeat
            connection.close()
        best = min(timings)
        print(f"## transcript.import of a {mb:.1f} MB Claude Code JSONL ({lines:,} lines; "
              f"best of {rounds})")
        print(f"  import: {best:.2f} s, {mb / best:.1f} MB/s ({result['messages_added']:,} "
              f"messages, {result['tool_results']:,} tool results, "
              f"{result['usage_records']:,} usage records, {result['branches']:,} branches, "
              f"{result['compactions']:,} compactions); all rounds "
              f"{', '.join(f'{t:.2f}' for t in timings)} s")
        print(f"  baseline, read + json.loads per line in Python: {baseline:.2f} s, "
              f"{mb / baseline:.1f} MB/s")
        print(f"  ratio import / baseline: {best / baseline:.1f}x the time")
        print(f"  re-import, nothing new: {min(again) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("import",), help="run only this part (default: all)")
    parser.add_argument("--import-mb", type=int, default=50,
                        help="import: size of the transcript in MB (default 50)")
    parser.add_argument("--import-rounds", type=int, default=2,
                        help="import: rounds, each into a new session (default 2)")
    args = parser.parse_args()
    if args.only in (None, "import"):
        bench_import(args.import_mb, args.import_rounds)


if __name__ == "__main__":
    main()
