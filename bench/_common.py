"""What the benchmarks that compare this tree with another revision in one run share: that
revision's code in a temporary folder, and a blocking NDJSON client."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import msgspec

REPO_ROOT = Path(__file__).resolve().parents[1]
# The daemon starter of the end-to-end tests, shared with them (tests/daemon_process.py).
sys.path.append(str(REPO_ROOT / "tests"))
from daemon_process import DaemonProcess  # noqa: E402


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """The files of ``ref`` (``git archive``), removed afterwards. A daemon given them as
    its code (``DaemonProcess(code=…)``) runs that revision with this tree's interpreter.

    Raises:
        subprocess.CalledProcessError: ``ref`` is not a revision of this repository.
    """
    with tempfile.TemporaryDirectory(prefix="ctxd-ref-") as folder:
        archive = Path(folder) / "tree.tar"
        subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--output", str(archive), ref],
                       check=True)
        tree = Path(folder) / "tree"
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        yield tree


class Connection:
    """A blocking NDJSON client on the daemon's socket."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.buffer = b""

    def call_line(self, line: bytes) -> bytes:
        """Send one request line and return its answer line."""
        self.sock.sendall(line)
        return self.read_line()

    def read_line(self) -> bytes:
        """The next line the daemon sends (an answer or a notification)."""
        while b"\n" not in self.buffer:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the daemon closed the connection")
            self.buffer += data
        answer, _, self.buffer = self.buffer.partition(b"\n")
        return answer

    def call(self, method: str, params: dict[str, object]) -> dict[str, object]:
        answer = msgspec.json.decode(self.call_line(request_line(method, params)))
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, object] = answer["result"]
        return result

    def close(self) -> None:
        self.sock.close()


def request_line(method: str, params: dict[str, object] | None = None) -> bytes:
    """The NDJSON line of a request (id 1)."""
    request: dict[str, object] = {"jsonrpc": "2.0", "id": 1, "method": method}
    if params is not None:
        request["params"] = params
    return msgspec.json.encode(request) + b"\n"


def start_daemons(stack: contextlib.ExitStack, baseline: str,
                  env: dict[str, str]) -> dict[str, DaemonProcess]:
    """A daemon of ``baseline`` (labelled with it) and one of this tree ("this tree"), each
    on its own temporary socket and data directory, stopped when ``stack`` closes."""
    base_tree = stack.enter_context(checkout(baseline))
    daemons = {}
    for label, code in ((baseline, base_tree), ("this tree", REPO_ROOT)):
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ctxd-b")))
        daemon = DaemonProcess(root, env=env, code=code)
        daemon.start()
        stack.callback(daemon.stop)
        daemons[label] = daemon
    return daemons


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The sample at ``fraction`` (nearest rank) of ``samples``; 0.0 when there are none."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))] if ordered \
        else 0.0


def timed(call: Callable[[], object], count: int) -> list[float]:
    """Milliseconds of each of ``count`` calls, one at a time."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples
