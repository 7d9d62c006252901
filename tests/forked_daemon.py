"""What a test's forked daemon runs (`DaemonProcess.forked`): the suite's forkserver
imports this module once, so ctxd and its default tokenizer are loaded before any daemon
forks from it (0.5 s of CPU a daemon saved: the imports and the encoding, of a 0.7 s
start). Each daemon is a child of the forkserver that runs its entry as ``python -P ENTRY
ARGS`` runs it (``-m ctxd``, a script that wraps ctxd's ``main``, ``-c CODE``), with its
own arguments, environment, working directory and log (docs/decisions.md, The test
suite)."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import ctxd.daemon  # noqa: F401 (imported once, for every child)
from ctxclient._spawn import open_log
from ctxd.tokens import load_encoding

load_encoding("cl100k_base")  # the default encoding, kept by tiktoken's registry
IMPORTED_BY = os.getpid()
"""The process that imported this module: in a daemon, its parent (the forkserver) when
the forkserver's preload found it."""


def run(entry: Sequence[str], args: Sequence[str], env: Mapping[str, str], log: Path,
        cwd: Path | None) -> None:
    """In the forked child: become the daemon ``python -P ENTRY ARGS`` that
    `ctxclient.spawn_daemon` starts (its stdout and stderr appended to ``log``, made 0600;
    ``env`` its whole environment) and exit with its code."""
    descriptor = open_log(log)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    first, *rest = entry
    if first == "-m":
        sys.argv = [*rest, *args]  # runpy puts the module's file first, as -m does
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    elif first == "-c":
        sys.argv = ["-c", *rest[1:], *args]
        exec(compile(rest[0], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = [first, *rest, *args]
        runpy.run_path(first, run_name="__main__")
