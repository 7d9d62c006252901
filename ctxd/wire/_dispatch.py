"""The dispatcher: one line in, one line out; method table with a decoder built per method."""

from __future__ import annotations

import difflib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import msgspec
import trio

from ctxd.errors import CtxdError, ErrorCode, internal_error, params_error
from ctxd.wire import _codec
from ctxd.wire.types import Event

log = logging.getLogger("ctxd.wire")

P = TypeVar("P", bound=msgspec.Struct)


class EventSource(Protocol):
    """A stream of events that a connection forwards to its client (a subscription of the
    hub's event bus)."""

    @property
    def subscription_id(self) -> str: ...

    async def receive(self) -> Event:
        """The next event; raises ``trio.EndOfChannel`` once unsubscribed."""
        ...

    def receive_nowait(self) -> Event | None:
        """The next event if one is waiting, else None."""
        ...


class ConnectionExtension(Protocol):
    """State a protocol keeps with one connection (MCP's session binding and calls in
    flight: docs/protocol.md, "MCP"), told when the client goes away."""

    def connection_lost(self) -> None:
        """The client closed its end (or the connection broke): stop what it asked."""


class Peer(Protocol):
    """The connection a request arrived on, as a handler may use it (the server's
    ``Connection`` is one)."""

    extension: ConnectionExtension | None
    """Per-connection state of a protocol spoken on it (None until one sets it)."""

    @property
    def peer_uid(self) -> int:
        """The uid of the process at the other end (SO_PEERCRED)."""
        ...

    @property
    def subscription_count(self) -> int: ...

    def attach(self, source: EventSource) -> None:
        """Forward ``source``'s events to the client until it is detached."""

    def detach(self, subscription_id: str) -> bool:
        """Stop forwarding a subscription; False when this connection has no such one."""
        ...

    async def send_notification(self, method: str, params: Any) -> None:
        """Send one notification line to the client now (MCP's progress)."""


class Call(NamedTuple):
    """What a handler knows about the request besides its params."""

    request_id: _codec.RequestId
    peer: Peer
    dispatcher: Dispatcher
    """The dispatcher answering it, through which a method may call others (MCP's tools
    call the native methods: `Dispatcher.invoke`)."""


Handler = Callable[[Call, Any], Any]
"""A coroutine function, or for inline methods a plain function."""


@dataclass(frozen=True, slots=True)
class _Method(Generic[P]):
    name: str
    decode: Callable[[bytes], P]
    handler: Handler
    inline: bool
    connection_ids: bool = False
    """Its request ids are its connection's own (MCP's): `request.cancel` from elsewhere
    does not reach it."""


class NotInline(enum.Enum):
    NOT_INLINE = enum.auto()


class NoReply(enum.Enum):
    NO_REPLY = enum.auto()


NO_REPLY = NoReply.NO_REPLY
"""What a handler returns for a request that must go unanswered (an MCP call the client
cancelled: the MCP specification says no response is sent for it)."""


NOT_INLINE = NotInline.NOT_INLINE
"""`Dispatcher.answer_inline` could not answer: the method must run in a task."""

_UNPARSABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What a line that is not JSON can raise: msgspec's own errors, invalid UTF-8 inside a
string (msgspec raises UnicodeDecodeError there), nesting deeper than msgspec recurses."""


def _check_utf8(line: bytes) -> None:
    """Reject invalid UTF-8 anywhere in a line, even in a field nobody reads (callers
    skip this call for ASCII lines, the common case)."""
    line.decode("utf-8")


def _parse_error(exc: BaseException) -> bytes:
    reason = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc)
    return _codec.error_response(None, CtxdError(
        ErrorCode.PARSE_ERROR, f"parse error: {reason}", {"fix": "send valid UTF-8 JSON"}))


class Dispatcher:
    """Maps method names to handlers and turns request lines into response lines."""

    def __init__(self) -> None:
        self._methods: dict[str, _Method[Any]] = {}

    def register(self, name: str, params_type: type[P],
                 handler: Callable[[Call, P], Awaitable[Any]], *,
                 connection_ids: bool = False) -> None:
        """Add a method; its params decoder is built once, here. With ``connection_ids``
        its request ids are its connection's own (see `connection_ids`)."""
        self._add(_Method(name, msgspec.json.Decoder(params_type).decode, handler, False,
                          connection_ids))

    def register_inline(self, name: str, params_type: type[P],
                        handler: Callable[[Call, P], Any]) -> None:
        """Add a method whose handler is a plain function: it cannot wait (no I/O, no
        actor), so the server answers it on the connection's reader, without a task."""
        self._add(_Method(name, msgspec.json.Decoder(params_type).decode, handler, True))

    def _add(self, method: _Method[Any]) -> None:
        if method.name in self._methods:
            raise ValueError(f"method {method.name} registered twice")
        self._methods[method.name] = method

    @property
    def method_names(self) -> list[str]:
        return sorted(self._methods)

    def connection_ids(self, name: str) -> bool:
        """Whether a request of this method is cancelled only from its own connection (MCP's
        ids are per connection), not by `request.cancel`."""
        method = self._methods.get(name)
        return method is not None and method.connection_ids

    async def invoke(self, name: str, params: bytes, call: Call) -> Any:
        """Run a registered method for another method's handler (MCP's tools call the
        native methods through here): its params are validated as a client's would be.

        Returns:
            The handler's result object (not encoded).

        Raises:
            CtxdError: what the method answers with: -32602 for bad params, its own errors.
        """
        method = self._methods[name]
        try:
            decoded = method.decode(params)
        except msgspec.ValidationError as exc:
            raise _codec.invalid_params(exc) from None
        if method.inline:
            return method.handler(call, decoded)
        return await method.handler(call, decoded)

    async def answer_batch(self, line: bytes, peer: Peer) -> bytes | None:
        """Answer a batch line (a JSON array): its items in order, one after the other.

        Returns:
            The array of answers without its newline, or None when every item was a
            notification. (Single requests go through `decode` and `answer`.)
        """
        try:
            if not line.isascii():
                _check_utf8(line)
            items = _codec.decode_json(_codec.decode_batch, line)
        except _UNPARSABLE as exc:
            return _parse_error(exc)
        if not items:
            return _codec.error_response(None, CtxdError(
                ErrorCode.INVALID_REQUEST, "invalid request: empty batch",
                {"fix": "send at least one request in a batch"}))
        # In order, one after the other: a batch that appends then renders sees its appends.
        replies = []
        for item in items:
            replies.append(await self._handle_one(bytes(item), peer))
            await trio.lowlevel.checkpoint()  # a batch of inline calls never waits otherwise
        kept = [reply for reply in replies if reply is not None]
        return b"[" + b",".join(kept) + b"]" if kept else None

    def decode(self, line: bytes) -> _codec.Envelope | bytes:
        """The envelope of a single request, or the error response to send instead."""
        try:
            if not line.isascii():
                _check_utf8(line)
            return _codec.decode_json(_codec.decode_envelope, line)
        except msgspec.ValidationError as exc:
            return _codec.error_response(_codec.salvage_id(line), CtxdError(
                ErrorCode.INVALID_REQUEST, f"invalid request: {exc}",
                {"fix": 'send {"jsonrpc":"2.0","id":1,"method":"daemon.ping"}'}))
        except _UNPARSABLE as exc:
            return _parse_error(exc)

    async def _handle_one(self, line: bytes, peer: Peer) -> bytes | None:
        envelope = self.decode(line)
        if isinstance(envelope, bytes):
            return envelope
        return await self.answer(envelope, peer)

    async def answer(self, envelope: _codec.Envelope, peer: Peer) -> bytes | None:
        """Run a decoded request; the response line, or None for a notification."""
        try:
            method, params = self._validate(envelope)
            call = Call(_request_id(envelope), peer, self)
            try:
                if method.inline:
                    result = method.handler(call, params)
                else:
                    result = await method.handler(call, params)
            except Exception as exc:
                raise _internal_error(method.name, exc) from exc
        except CtxdError as error:
            return _error_reply(envelope, error)
        return _reply(envelope, result)

    def answer_inline(self, envelope: _codec.Envelope, peer: Peer) -> bytes | NotInline | None:
        """`answer` without waiting, or `NOT_INLINE` when the method needs `answer`."""
        known = self._methods.get(envelope.method)
        if known is None or not known.inline:
            return NOT_INLINE
        try:
            method, params = self._validate(envelope, known)
            try:
                result = method.handler(Call(_request_id(envelope), peer, self), params)
            except Exception as exc:
                raise _internal_error(method.name, exc) from exc
        except CtxdError as error:
            return _error_reply(envelope, error)
        return _reply(envelope, result)

    def _validate(self, envelope: _codec.Envelope,
                  method: _Method[Any] | None = None) -> tuple[_Method[Any], Any]:
        """The method (looked up unless given) and its decoded params; problems raise
        `CtxdError`."""
        if envelope.jsonrpc != "2.0":
            raise CtxdError(ErrorCode.INVALID_REQUEST,
                            f'invalid request: jsonrpc must be "2.0", got {envelope.jsonrpc!r}',
                            {"fix": 'set "jsonrpc":"2.0"'})
        method = method or self._methods.get(envelope.method)
        if method is None:
            raise _method_not_found(envelope.method, self.method_names)
        raw = b"{}" if envelope.params is msgspec.UNSET else bytes(envelope.params)
        try:
            return method, method.decode(raw)
        except msgspec.ValidationError as exc:
            raise _codec.invalid_params(exc) from None
        except RecursionError:
            raise params_error("$", "params are nested too deeply") from None


def _method_not_found(name: str, available: list[str]) -> CtxdError:
    """-32601, with the closest known name as a suggestion when one is close enough."""
    close = difflib.get_close_matches(name, available, n=1)
    suggestion = close[0] if close else None
    fix = (f"did you mean {suggestion}?" if suggestion
           else "call one of the methods in data.available (docs/protocol.md)")
    return CtxdError(ErrorCode.METHOD_NOT_FOUND, f"method not found: {name!r}",
                     {"method": name, "available": available, "suggestion": suggestion,
                      "fix": fix})


def _request_id(envelope: _codec.Envelope) -> _codec.RequestId:
    return None if envelope.id is msgspec.UNSET else envelope.id


def _reply(envelope: _codec.Envelope, result: Any) -> bytes | None:
    if envelope.id is msgspec.UNSET or result is NO_REPLY:
        return None  # a notification is never answered
    return _codec.response(envelope.id, result)


def _error_reply(envelope: _codec.Envelope, error: CtxdError) -> bytes | None:
    if envelope.id is msgspec.UNSET:
        return None
    return _codec.error_response(envelope.id, error)


def _internal_error(method: str, exc: Exception) -> CtxdError:
    """The actor boundary: an unexpected failure becomes a typed reply, never a crash."""
    if isinstance(exc, CtxdError):
        return exc
    log.exception("internal error in %s", method)
    return internal_error(f"internal error in {method}: {type(exc).__name__}",
                          {"method": method})
