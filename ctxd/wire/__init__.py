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
from ctxd.wire._dispatch import (
    NO_REPLY,
    NOT_INLINE,
    Call,
    ConnectionExtension,
    Dispatcher,
    EventSource,
    Peer,
)

__all__ = ["NOT_INLINE", "NO_REPLY", "Call", "ConnectionExtension", "Dispatcher", "Envelope",
           "EventSource", "Peer", "RequestId", "encode", "error_response", "notification",
           "replace_lone_surrogates", "response", "salvage_id", "types"]
