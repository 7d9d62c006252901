"""The wire: msgspec types of every method, NDJSON codec, dispatcher."""

from ctxd.wire import types
from ctxd.wire._codec import (
    Envelope,
    RequestId,
    encode,
    error_response,
    notification,
    replace_lone_surrogates,
    response,
    salvage_id,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ctxd.wire._dispatch import (
        NO_REPLY,
        NOT_INLINE,
        Call,
        ConnectionExtension,
        Dispatcher,
        EventSource,
        Peer,
    )

_DISPATCH = frozenset({"NO_REPLY", "NOT_INLINE", "Call", "ConnectionExtension", "Dispatcher",
                       "EventSource", "Peer"})


def __getattr__(name: str) -> object:
    """The dispatcher's names, imported on first use: they bring in trio, which the clients
    (that read only `types`) do not need (docs/architecture.md, Layers)."""
    if name in _DISPATCH:
        from ctxd.wire import _dispatch
        return getattr(_dispatch, name)
    raise AttributeError(f"module 'ctxd.wire' has no attribute {name!r}")

__all__ = ["NOT_INLINE", "NO_REPLY", "Call", "ConnectionExtension", "Dispatcher", "Envelope",
           "EventSource", "Peer", "RequestId", "encode", "error_response", "notification",
           "replace_lone_surrogates", "response", "salvage_id", "types"]
