"""The ``ctxctl`` console script: ``ctxctl hook`` takes a path that imports the standard
library only (Claude Code runs it at every tool call); every other command loads the CLI."""

from __future__ import annotations

import sys


def main() -> int:
    """Dispatch to the hook's fast path or to the CLI."""
    argv = sys.argv[1:]
    if argv[:1] == ["hook"]:
        from ctxclient._hook import main as hook

        return hook(argv)
    from ctxclient.cli import main as cli

    return cli()
