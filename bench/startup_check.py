"""What checking the database costs at start-up, on a database of about ``--gib`` GiB of
messages: ``Store.open`` after a clean shutdown (each table's first page read) and after an
unclean one (``PRAGMA quick_check``: a WAL file was left), against the same open without
any check (the baseline, same run, same file); and ``ctxd --check``'s full
``PRAGMA integrity_check``.

    .venv/bin/python bench/startup_check.py [--gib 1]

Each open is timed twice, the second with the file in the OS page cache (a restart); the
first after the cache was dropped when run as root (a boot), else also warm.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from ctxd.store import Store, integrity_problems

ROW_BYTES = 4000
BATCH = 10_000


def build(path: Path, gib: float) -> None:
    store = Store(path)
    store.open(check=False)
    conn = store.connection
    rows = int(gib * (1 << 30) / (ROW_BYTES + 100))
    with conn:
        for n in range(200):
            conn.execute("INSERT INTO sessions (id, context_window, max_output_tokens, "
                         "compact_trigger, hard_block, warn, caution, created_at, updated_at) "
                         "VALUES (?, 200000, 8192, 0.95, 0.98, 0.8, 0.9, 0, 0)", (f"s{n}",))
    for start in range(0, rows, BATCH):
        with conn:
            conn.executemany(
                "INSERT INTO messages (session_id, seq, role, content, component, tokens, "
                "created_at) VALUES (?, ?, 'user', ?, 'conversation', 1000, 0)",
                ((f"s{n % 200}", n, os.urandom(ROW_BYTES // 2).hex().encode())
                 for n in range(start, min(rows, start + BATCH))))
    store.close()


def drop_caches() -> bool:
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        return False
    return True


def timed_open(path: Path, check: bool, unclean: bool = False) -> float:
    if unclean:
        Path(f"{path}-wal").touch()  # what a killed daemon leaves
    store = Store(path)
    started = time.perf_counter()
    store.open(check=check)
    elapsed = time.perf_counter() - started
    store.close()
    return elapsed


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--gib", type=float, default=1.0)
    args = cli.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ctxd-bench-check"))
    try:
        path = folder / "ctxd.db"
        started = time.perf_counter()
        build(path, args.gib)
        print(f"database: {path.stat().st_size / (1 << 30):.2f} GiB, built in "
              f"{time.perf_counter() - started:.0f} s")
        for cache in ("cold", "warm"):
            dropped = cache == "warm" or drop_caches()
            label = cache if dropped else "warm (could not drop the cache)"
            baseline = timed_open(path, check=False)
            if cache == "cold":
                drop_caches()
            clean = timed_open(path, check=True)
            if cache == "cold":
                drop_caches()
            unclean = timed_open(path, check=True, unclean=True)
            print(f"{label}: open {baseline * 1000:.1f} ms (baseline, no check); after a "
                  f"clean shutdown {clean * 1000:.1f} ms ({clean / baseline:.1f}x); after an "
                  f"unclean one (quick_check) {unclean * 1000:.0f} ms "
                  f"({unclean / baseline:.0f}x)")
        started = time.perf_counter()
        problems = integrity_problems(path)
        print(f"integrity_check (ctxd --check): {time.perf_counter() - started:.2f} s, "
              f"{'ok' if not problems else problems[:3]}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
