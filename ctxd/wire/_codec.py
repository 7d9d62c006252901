"""NDJSON JSON-RPC 2.0 framing: the envelope, responses, notifications, error objects."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, get_args, get_origin, get_type_hints

import msgspec

from ctxd.errors import CtxdError, params_error

RequestId = int | str | None
T = TypeVar("T")


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """A request with its params kept raw, decoded later by the method's own decoder."""

    jsonrpc: str
    method: str
    id: RequestId | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _IdOnly(msgspec.Struct):
    id: RequestId = None


decode_envelope = msgspec.json.Decoder(Envelope).decode
_decode_id = msgspec.json.Decoder(_IdOnly).decode
decode_batch = msgspec.json.Decoder(list[msgspec.Raw]).decode
encode = msgspec.json.Encoder().encode


# Scanned left to right, an escaped backslash is consumed whole, so a ``\\u`` that follows it
# is text, not an escape; a surrogate pair is kept; what is left is a lone surrogate's escape.
_SURROGATE_ESCAPES = re.compile(
    rb"\\\\"
    rb"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _keep_or_replace(match: re.Match[bytes]) -> bytes:
    token = match.group()
    return b"\\ufffd" if len(token) == 6 and token[1:2] == b"u" else token


def replace_lone_surrogates(data: bytes) -> bytes:
    """JSON text with each escaped lone surrogate (``\\ud83d`` alone) replaced by ``\\ufffd``.

    Such a document is valid JSON syntax but not valid Unicode: JavaScript writes one for an
    emoji cut in half. Browsers and JavaScript runtimes decode it as U+FFFD; so does ctxd
    (docs/protocol.md, "Framing"). A document without a surrogate escape is returned as is,
    found by a scan that costs little beside a decode.
    """
    if b"\\ud" not in data and b"\\uD" not in data:
        return data
    return _SURROGATE_ESCAPES.sub(_keep_or_replace, data)


def decode_json(decode: Callable[[bytes], T], line: bytes) -> T:
    """``decode(line)``; a line msgspec refuses is decoded again with its lone surrogates
    replaced (`replace_lone_surrogates`), so a well-formed line costs one strict decode as
    before. Raw values (the params) are views of the text decoded: a method's own decoder
    sees the replacement too.

    Raises:
        msgspec.DecodeError: not JSON even so (the replacement keeps every byte offset).
        msgspec.ValidationError: JSON, not of the type ``decode`` reads.
    """
    try:
        return decode(line)
    except msgspec.ValidationError:
        raise  # a DecodeError too, but of valid JSON
    except msgspec.DecodeError:
        repaired = replace_lone_surrogates(line)
        if repaired == line:
            raise
        return decode(repaired)


def salvage_id(line: bytes) -> RequestId:
    """The id of a request that failed validation, when one can be read."""
    try:
        return decode_json(_decode_id, line).id
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None


def response(request_id: RequestId, result: Any) -> bytes:
    """One encoded success response (no trailing newline)."""
    return b'{"jsonrpc":"2.0","id":' + encode(request_id) + b',"result":' + encode(result) + b"}"


def error_response(request_id: RequestId, error: CtxdError) -> bytes:
    """One encoded error response (no trailing newline)."""
    body: dict[str, Any] = {"code": int(error.code), "message": error.message}
    if error.data is not None:
        body["data"] = error.data
    return encode({"jsonrpc": "2.0", "id": request_id, "error": body})


def notification(method: str, params: Any) -> bytes:
    """One encoded notification (no trailing newline)."""
    return b'{"jsonrpc":"2.0","method":' + encode(method) + b',"params":' + encode(params) + b"}"


def invalid_params(exc: msgspec.ValidationError) -> CtxdError:
    """-32602 with msgspec's path to the bad field in ``data.path``; a pattern that a text
    did not match is named by its description, not shown as a regular expression."""
    text = str(exc)
    message, _, at = text.partition(" - at `")
    described = _described_patterns().get(message)
    return params_error(at.rstrip("`") if at else "$",
                        message if described is None else f"Expected {described}")


@functools.cache
def _described_patterns() -> dict[str, str]:
    """msgspec's message for a text that does not match a pattern of the wire's types
    (``ctxd.wire.types``) → that pattern's description, or its `PATTERN_MEANINGS`."""
    from ctxd.wire import types

    found: dict[str, str] = {}

    def collect(annotation: Any) -> None:
        if get_origin(annotation) is Annotated:
            for meta in annotation.__metadata__:
                if isinstance(meta, msgspec.Meta) and meta.pattern and meta.description:
                    found[f"Expected `str` matching regex {meta.pattern!r}"] = (
                        meta.description)
        for argument in get_args(annotation):
            collect(argument)

    for value in vars(types).values():
        if isinstance(value, type) and issubclass(value, msgspec.Struct):
            for annotation in get_type_hints(value, include_extras=True).values():
                collect(annotation)
        else:
            collect(value)
    found.update((f"Expected `str` matching regex {pattern!r}", meaning)
                 for pattern, meaning in types.PATTERN_MEANINGS.items())
    return found
