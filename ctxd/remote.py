"""Remote endpoints: one JSON request to an HTTP(S) endpoint and the one-line reason when it
fails, shared by the clients of OpenAI-compatible endpoints (the memory's `HttpEmbedder`,
hygiene's ``http`` summarizer; docs/architecture.md, "Layers").

Blocking (urllib): callers run it in a worker thread."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any


class RemoteError(Exception):
    """The request failed or its answer is not JSON; the message says why, in one line."""


def _detail(error: urllib.error.HTTPError) -> str:
    """The start of an error answer's body, e.g. the server's reason; closes the
    connection the error holds (else it stays open until garbage collection)."""
    try:
        detail = error.read(200).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException):
        detail = ""
    finally:
        error.close()
    return f" ({detail})" if detail else ""


def post_json(url: str, payload: Any, api_key: str | None, timeout_s: float) -> Any:
    """POST ``payload`` as JSON to ``url`` and return its decoded JSON answer. Blocking.

    Args:
        url: the endpoint, e.g. ``http://127.0.0.1:11434/v1/embeddings``.
        payload: what ``json.dumps`` can encode.
        api_key: sent as ``Authorization: Bearer …`` when given.
        timeout_s: of each socket operation (connect, each read); a caller that needs a
            deadline on the whole request sets its own around the worker thread.

    Raises:
        RemoteError: an HTTP error status (with the start of its body), a connection
            error, a timeout, or an answer that is not JSON.
    """
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        request = urllib.request.Request(url, body, headers, method="POST")
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RemoteError(f"{exc}{_detail(exc)}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        raise RemoteError(str(exc) or type(exc).__name__) from exc
