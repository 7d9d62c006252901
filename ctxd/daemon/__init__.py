"""The daemon process: start-up, shutdown, signals, systemd notify/activation, the server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import trio

from ctxd import __version__, config
from ctxd.daemon._app import Daemon
from ctxd.daemon._routes import ROUTES, On, Route
from ctxd.daemon._socket import Lock, PlacementError, check_private_directory, check_socket_path
from ctxd.errors import CtxdError
from ctxd.store import DatabaseError, integrity_problems, recover

log = logging.getLogger("ctxd")

EX_CONFIG = 78
"""sysexits.h: the daemon cannot run on its data as it is (a corrupt database); systemd's
unit does not restart on it (RestartPreventExitStatus=78)."""

_SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                    logging.CRITICAL: 2}


class _JournalFormatter(logging.Formatter):
    """``<priority>`` prefixes under journald (it strips them into the log level)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="ctxd", description="ctxd: the local context manager for LLM agents.",
        epilog="Every option is also a config.toml key and a CTXD_<KEY> environment variable.")
    cli.add_argument("--version", action="version", version=f"ctxd {__version__}")
    cli.add_argument("--config", metavar="FILE",
                     help="the TOML file (default $CTXD_CONFIG, else "
                          "$XDG_CONFIG_HOME/ctxd/config.toml); a file named here or by "
                          "$CTXD_CONFIG must exist")
    cli.add_argument("--print-config", action="store_true",
                     help="print the effective configuration and exit")
    once = cli.add_mutually_exclusive_group()
    once.add_argument("--check", action="store_true",
                      help="check the whole database (PRAGMA integrity_check), read-only, "
                           "and exit: 0 when sound, 1 with what is wrong")
    once.add_argument("--recover", action="store_true",
                      help="salvage what can be read of a corrupt database into a new one "
                           "(the corrupt file is kept aside, renamed .corrupt-<time>) and "
                           "exit; the daemon must be stopped")
    config.add_flags(cli)
    return cli


SWITCH_INTERVAL_S = 0.0005


def main(argv: list[str] | None = None) -> int:
    """Run the daemon until it is told to stop; the console script ``ctxd``."""
    args = parser().parse_args(argv)
    try:
        cfg = config.load(args, config_path=Path(args.config) if args.config else None)
    except CtxdError as error:
        print(f"ctxd: {error.message}", file=sys.stderr)
        return 2
    if args.print_config:
        sys.stdout.write(config.to_toml(cfg))
        return 0
    database = Path(cfg.data_dir) / "ctxd.db"
    if args.check:
        return _check(database)
    if args.recover:
        return _recover(database)
    _setup_logging(cfg.log_level)
    # A thread that gets the GIL back after numpy or FAISS let it go waits for whoever
    # holds it to reach the switch interval: at the default 5 ms, a memory search's 600
    # numpy calls in the store's thread took 1 s beside a busy thread instead of 4 ms;
    # at 0.5 ms, 0.1 s.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        # Before the data directory is created or the database migrated: a socket that
        # cannot be bound must leave nothing behind. An activated daemon binds nothing
        # (the LISTEN_PID test of _systemd.activated_sockets).
        problems = _placement_problems(cfg)
        for problem in problems:
            print(f"ctxd: {problem}", file=sys.stderr)
        if problems:
            return 1
        trio.run(Daemon(cfg).run)
    except PlacementError as error:
        print(f"ctxd: {error}", file=sys.stderr)
        return 1
    except DatabaseError as error:
        log.critical("%s", error)  # one line, no traceback: it says what to do
        return EX_CONFIG if error.corrupt else 1
    return 0


def _placement_problems(cfg: config.Config) -> list[str]:
    """What is wrong with the socket's place and with an existing data directory, all at
    once (a user fixing one would otherwise meet the next at the next start). The socket's
    directory is created here when missing, so that one that cannot be is refused before
    the data directory is touched, unless the data directory is refused: then nothing is
    created. An activated daemon binds nothing (the LISTEN_PID test of
    _systemd.activated_sockets), so its socket's place is the unit's."""
    def problem(check: Callable[[], None]) -> str | None:
        try:
            check()
        except PlacementError as error:
            return str(error)
        return None

    data = problem(lambda: check_private_directory(Path(cfg.data_dir), create=False))
    place = None
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        place = problem(lambda: check_socket_path(Path(cfg.socket), create=data is None))
    # A socket in the data directory: the same directory, said once.
    return list(dict.fromkeys(found for found in (place, data) if found is not None))


def _check(database: Path) -> int:
    """``ctxd --check``: the whole database checked, read-only (beside a running daemon too)."""
    try:
        problems = integrity_problems(database)
    except DatabaseError as error:
        print(f"ctxd: {error}", file=sys.stderr)
        return 1
    if not problems:
        print(f"{database}: ok")
        return 0
    for problem in problems:
        print(f"{database}: {problem}")
    print(f"ctxd: the database {database} is corrupt; stop ctxd and run `ctxd --recover`",
          file=sys.stderr)
    return 1


def _recover(database: Path) -> int:
    """``ctxd --recover``: under the data directory's lock, so never beside a daemon."""
    try:
        check_private_directory(database.parent)
        lock = Lock(database.parent / "ctxd.lock", f"data directory {database.parent}")
    except PlacementError as error:
        print(f"ctxd: {error}", file=sys.stderr)
        return 1
    try:
        recovery = recover(database)
    except DatabaseError as error:
        print(f"ctxd: {error}", file=sys.stderr)
        return 1
    finally:
        lock.release()
    print(f"the corrupt database is kept at {recovery.aside}")
    for table, rows in recovery.rows.items():
        lost = recovery.unreadable.get(table, 0)
        note = ("; unreadable" if lost < 0 else f"; {lost} unreadable range(s) skipped"
                if lost else "")
        print(f"{table}: {rows} row(s) recovered{note}")
    if recovery.orphans:
        print(f"{recovery.orphans} row(s) dropped whose session or branch was lost")
    print(f"recovered into {database}; start ctxd again")
    return 0


__all__ = ["ROUTES", "Daemon", "On", "Route", "main"]
