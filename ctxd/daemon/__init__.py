"""The daemon process: start-up, shutdown, signals, systemd notify/activation, the server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import trio

from ctxd import __version__, config
from ctxd.daemon._app import Daemon
from ctxd.daemon._socket import PlacementError, check_socket_path
from ctxd.errors import CtxdError

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
    _setup_logging(cfg.log_level)
    # A thread that gets the GIL back after numpy or FAISS let it go waits for whoever
    # holds it to reach the switch interval: at the default 5 ms, a memory search's 600
    # numpy calls in the store's thread took 1 s beside a busy thread instead of 4 ms;
    # at 0.5 ms, 0.1 s.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        # Before the data directory is created or the database migrated: a socket that
        # cannot be bound must leave nothing behind. An activated daemon binds nothing
        # (the LISTEN_PID test of _systemd.activated_socket).
        if os.environ.get("LISTEN_PID") != str(os.getpid()):
            check_socket_path(Path(cfg.socket))
        trio.run(Daemon(cfg).run)
    except PlacementError as error:
        print(f"ctxd: {error}", file=sys.stderr)
        return 1
    return 0


__all__ = ["Daemon", "main"]
