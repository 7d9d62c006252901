"""The wire: msgspec types of every method, NDJSON codec, dispatcher."""

from ctxd.wire import types
from ctxd.wire._codec import (
    Envelope,
    RequestId,
    encode,
    error_response,
    notification,
    response,
    salvage_id,
)
from ctxd.wire._dispatch import NOT_INLINE, Call, Dispatcher, EventSource, Peer

__all__ = ["NOT_INLINE", "Call", "Dispatcher", "Envelope", "EventSource", "Peer", "RequestId",
           "encode", "error_response", "notification", "response", "salvage_id", "types"]
