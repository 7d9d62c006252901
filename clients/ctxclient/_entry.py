"""The ``ctxctl`` console script: ``ctxctl hook`` takes a path that imports the standard
library only (Claude Code runs it at every tool call); every other command, and ``hook``
with other arguments (``--help``), loads the CLI."""

from __future__ import annotations

import sys


def main() -> int:
    """Dispatch to the hook's fast path or to the CLI."""
    argv = sys.argv[1:]
    if argv[:1] == ["hook"]:
        from ctxclient import _hook

        if _hook.takes(argv):
            return _hook.main(argv)
    from ctxclient.cli import main as cli

    return cli()
