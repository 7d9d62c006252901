"""``python -m ctxd``, with the process SIGKILLing itself at a chosen commit of a
transcript.import or of the gateway's preparation of a model request: the end-to-end
tests' way to stop either at each of its commit points, deterministically
(`DaemonProcess(entry=[KILL_AT_COMMIT])`).

Only the commits a ``transcript.import`` request, or the gateway's rewrite of a model
request, makes into the session ``TEST_KILL_SESSION`` are counted (its own `Store.write`
calls, in the task that runs it: not the event bus's), from 1 in the process:

- ``TEST_KILL_AT_COMMIT=before:N``: killed as the N-th is about to start (it is not
  written); ``after:N``: killed as soon as the N-th has committed, before anything else
  runs (its request is not answered).
- ``TEST_COMMIT_LOG=path``: each commit counted appends a line to ``path`` (to learn how
  many commits an import makes).

Nothing of this is in ctxd: the launcher wraps the store's write and the import's entry
point, then runs ctxd's ``main`` as ``python -m ctxd`` does.
"""

from __future__ import annotations

import contextvars
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ctxd.daemon import main
from ctxd.gateway import _rewrite
from ctxd.sessions import _import
from ctxd.store import Store

KILL_AT_COMMIT = str(Path(__file__).resolve())

_counted: contextvars.ContextVar[bool] = contextvars.ContextVar("counted", default=False)
_commits = 0


def _kill_spec() -> tuple[str, int] | None:
    spec = os.environ.get("TEST_KILL_AT_COMMIT")
    if not spec:
        return None
    when, _, number = spec.partition(":")
    if when not in ("before", "after"):
        raise SystemExit(f"TEST_KILL_AT_COMMIT={spec!r}: give before:N or after:N")
    return when, int(number)


def _wrap_write(kill: tuple[str, int] | None, log: str | None) -> None:
    write = Store.write
    log_fd = None if log is None else os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                              0o600)

    async def counted_write(self: Store, fn: Callable[..., Any], *args: Any,
                            **kwargs: Any) -> Any:
        global _commits
        if not _counted.get():
            return await write(self, fn, *args, **kwargs)
        _commits += 1
        if kill == ("before", _commits):
            os.kill(os.getpid(), signal.SIGKILL)
        result = await write(self, fn, *args, **kwargs)
        if log_fd is not None:
            os.write(log_fd, f"{_commits}\n".encode())
        if kill == ("after", _commits):
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    Store.write = counted_write  # type: ignore[method-assign]


def _counting(operation: Callable[..., Awaitable[Any]], session_id: str
              ) -> Callable[..., Awaitable[Any]]:
    """``operation`` (an actor's, its actor first), its writes counted in the session."""
    async def counted(actor: Any, *args: Any) -> Any:
        if actor.session_id != session_id:
            return await operation(actor, *args)
        token = _counted.set(True)
        try:
            return await operation(actor, *args)
        finally:
            _counted.reset(token)

    return counted


if __name__ == "__main__":
    _wrap_write(_kill_spec(), os.environ.get("TEST_COMMIT_LOG"))
    _import.run_import = _counting(_import.run_import, os.environ["TEST_KILL_SESSION"])
    _rewrite._reconcile = _counting(  # type: ignore[assignment]
        _rewrite._reconcile, os.environ["TEST_KILL_SESSION"])
    sys.exit(main())
