"""A scripted HTTP server on 127.0.0.1, in a thread: the base of the tests' stand-ins for
the remote services that cannot run here (a model's API, an embedding service), the only
parts the tests replace."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass(frozen=True)
class SeenRequest:
    """A request as the server received it, for a test to inspect."""

    path: str
    authorization: str | None
    content_type: str | None
    body: Any


class ScriptedHandler(BaseHTTPRequestHandler):
    """A request handler that reads and answers JSON and logs nothing."""

    def read_json(self, seen: list[SeenRequest]) -> Any:
        """The request's JSON body, the request kept in ``seen``."""
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seen.append(SeenRequest(self.path, self.headers["Authorization"],
                                self.headers["Content-Type"], body))
        return body

    def answer(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except OSError:
            pass  # the client gave up (a timeout test)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LocalServer:
    """Serves ``handler`` on 127.0.0.1 (a free port) while in a ``with`` block."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], path: str = "") -> None:
        self.path = path
        """Where the service's API starts (``/v1``): `url` is the origin and the path."""
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._http.daemon_threads = True
        # A short poll interval: shutdown() waits for the serving loop to notice.
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.01,),
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.origin + self.path

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()
