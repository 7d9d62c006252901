"""Where ctxd's socket, data and configuration are when nothing else is said; see ctxd(1), FILES.

Only the standard library: the clients import this module, and must not load the daemon
(its tokenizer, its store) just to find the socket.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

MAX_SOCKET_PATH = 107
"""Bytes of a Unix socket's path (sun_path is 108 with the terminating NUL)."""


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ["HOME"]) if environ.get("HOME") else Path.home()


def default_socket_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the daemon listens and clients connect when nothing else is said."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("CTXD_SOCKET")
    if explicit:
        return Path(explicit)
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "ctxd" / "ctxd.sock"
    return Path(f"/tmp/ctxd-{os.getuid()}") / "ctxd.sock"


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the database lives when nothing else is said."""
    environ = os.environ if environ is None else environ
    data_home = environ.get("XDG_DATA_HOME") or str(_home(environ) / ".local" / "share")
    return Path(data_home) / "ctxd"


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the TOML file is looked for (``$CTXD_CONFIG`` overrides)."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("CTXD_CONFIG")
    if explicit:
        return Path(explicit)
    config_home = environ.get("XDG_CONFIG_HOME") or str(_home(environ) / ".config")
    return Path(config_home) / "ctxd" / "config.toml"


__all__ = ["MAX_SOCKET_PATH", "default_config_path", "default_data_dir", "default_socket_path"]
