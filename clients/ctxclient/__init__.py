"""ctxclient: the Python client of ctxd (blocking `Client`, trio `connect`) and `ctxctl`.

It imports nothing of the daemon but its wire types, error codes and default paths, so a
client does not load the tokenizer or the store.
"""

from ctxclient._async import AsyncClient, connect
from ctxclient._errors import (
    ERRORS,
    BadSocketPath,
    BudgetExhausted,
    Cancelled,
    ContextLimitExceeded,
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
)
from ctxclient._sync import Client

__all__ = ["ERRORS", "AsyncClient", "BadSocketPath", "BudgetExhausted", "Cancelled", "Client",
           "ContextLimitExceeded", "DaemonUnavailable", "InternalError", "InvalidParams",
           "InvalidRequest", "InvalidState", "LimitReached", "MethodNotFound", "NotFound",
           "Overloaded", "ParseError", "RpcError", "StorageError", "Timeout", "connect"]
