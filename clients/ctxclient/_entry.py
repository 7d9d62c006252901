"""The ``ctxctl`` console script: ``ctxctl hook`` takes a path that imports the standard
library only (Claude Code runs it at every tool call); every other command, and ``hook``
with other arguments (``--help``), loads the CLI."""

from __future__ import annotations

import os
import sys


def _keep_the_working_directory_off_the_path() -> None:
    """Take off ``sys.path`` what an empty or relative ``PYTHONPATH`` entry put there from
    the current directory, before anything of ctxd is imported: a folder named ``ctxd``
    where the user stands must not shadow the package (ctxclient._spawn does the same for
    the daemons it starts)."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    absolute = {entry for entry in entries if os.path.isabs(entry)}
    relative = {os.path.abspath(entry) for entry in entries if not os.path.isabs(entry)}
    if relative - absolute:
        sys.path[:] = [entry for entry in sys.path if entry not in relative - absolute]


EXIT_BROKEN_PIPE = 128 + 13
"""The exit status of a program that SIGPIPE ended, as a shell reports it."""


def main() -> int:
    """Dispatch to the hook's fast path or to the CLI."""
    if os.environ.get("PYTHONPATH"):
        _keep_the_working_directory_off_the_path()
    argv = sys.argv[1:]
    if argv[:1] == ["hook"]:
        from ctxclient import _hook

        if _hook.takes(argv):
            return _hook.main(argv)
    from ctxclient.cli import main as cli

    try:
        code = cli()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`ctxctl status | head -1`): stop quietly, as a program that
        # SIGPIPE ends (Python ignores it, so the write raised), not with a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code
