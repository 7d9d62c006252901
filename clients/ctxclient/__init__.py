"""ctxclient: the Python client of ctxd (blocking `Client`, trio `connect`), `ctxctl`, and
`spawn_daemon`, the one way to start a ctxd process.

It imports nothing of the daemon but its wire types, error codes and default paths, so a
client does not load the tokenizer or the store.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself is not imported: `ctxctl hook` starts with this package

if TYPE_CHECKING:
    from typing import Any

    from ctxclient._async import AsyncClient, connect
    from ctxclient._errors import (
        ERRORS,
        BadSocketPath,
        BudgetExhausted,
        Cancelled,
        ContextLimitExceeded,
        CtxdClientError,
        DaemonUnavailable,
        InternalError,
        InvalidParams,
        InvalidRequest,
        InvalidState,
        LimitReached,
        MethodNotFound,
        NotFound,
        Overloaded,
        ParseError,
        RpcError,
        StorageError,
        Timeout,
        UntrustedSocket,
    )
    from ctxclient._spawn import daemon_command, private_environment, spawn_daemon
    from ctxclient._sync import Client

__all__ = ["ERRORS", "AsyncClient", "BadSocketPath", "BudgetExhausted", "Cancelled", "Client",
           "ContextLimitExceeded", "CtxdClientError", "DaemonUnavailable", "InternalError",
           "InvalidParams", "InvalidRequest", "InvalidState", "LimitReached", "MethodNotFound",
           "NotFound", "Overloaded", "ParseError", "RpcError", "StorageError", "Timeout",
           "UntrustedSocket", "connect", "daemon_command", "private_environment",
           "spawn_daemon"]

_HOMES = {"AsyncClient": "_async", "connect": "_async", "Client": "_sync",
          "daemon_command": "_spawn", "private_environment": "_spawn", "spawn_daemon": "_spawn"}


def __getattr__(name: str) -> Any:
    # Loaded on first use: `ctxctl hook` imports this package and must not pay for trio.
    if name not in __all__:
        raise AttributeError(f"module 'ctxclient' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"ctxclient.{_HOMES.get(name, '_errors')}"), name)
    globals()[name] = value
    return value
