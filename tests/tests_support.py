"""Test data and helpers shared by unit and end-to-end tests."""

import atexit
import contextlib
import functools
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from daemon_process import NO_PROVIDER

from ctxclient import Client, RpcError
from ctxd.config import Config
from ctxd.gateway._ledger import LedgerRow, chained, load_line
from ctxd.gateway._rewrite import digest_of, thread_of
from ctxd.hub import EventBus
from ctxd.sessions import Supervisor
from ctxd.store import Store
from ctxd.tokens import TokenCounter

COUNTER = TokenCounter()
LESSONS = [
    ("Run the tests with the project's venv",
     "Always run the test suite with the project's virtualenv: .venv/bin/pytest -q"),
    ("Migrations must bump user_version",
     "Every schema migration must bump PRAGMA user_version, or the migration test fails."),
    ("Coffee machine", "The coffee machine is on the third floor, next to the stairs."),
    ("Rebase before pushing", "Rebase the feature branch on main before pushing to avoid "
     "merge commits in the history."),
]
"""Memories for retrieval tests: ids 1-4 in this order when recorded first."""

# OpenAI's worked example ("How to count tokens with tiktoken"): the chat API itself
# reported 129 prompt tokens for these messages on gpt-3.5-turbo-0613 and gpt-4-0613.
OPENAI_EXAMPLE = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that "
     "translates corporate jargon into plain English."},
    {"role": "system", "name": "example_user",
     "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant",
     "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user",
     "content": "Let's circle back when we have more bandwidth to touch base on opportunities "
     "for increased leverage."},
    {"role": "system", "name": "example_assistant",
     "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean "
     "for the client deliverable."},
]
OPENAI_EXAMPLE_PROMPT_TOKENS = 129


def hello_text(tokens: int) -> str:
    """A text of exactly ``tokens`` cl100k_base tokens ("hello hello …")."""
    return "hello" + " hello" * (tokens - 1)


def next_event(client: Client, timeout: float = 10) -> dict[str, Any]:
    """The next `event` notification a subscribed client receives."""
    message = client.notifications.get(timeout=timeout)
    assert message["method"] == "event"
    return message["params"]  # type: ignore[no-any-return]


def rpc_error(client: Client, method: str, params: dict[str, Any]) -> RpcError:
    """The error a call must fail with."""
    with pytest.raises(RpcError) as caught:
        client.call(method, params)
    return caught.value


def search(client: Client, query: str, **extra: Any) -> dict[str, Any]:
    """memory.search."""
    return client.call("memory.search", {"query": query, **extra})  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def running_supervisor(path: Path, config: Config) -> AsyncIterator[Supervisor]:
    """A Supervisor with its own store at ``path``, in-process, for the block."""
    store = Store(path)
    store.open()
    try:
        async with trio.open_nursery() as nursery:
            yield await nursery.start(Supervisor(store, COUNTER, EventBus(), config).run)
            nursery.cancel_scope.cancel()
    finally:
        store.close()


REPOSITORY = Path(__file__).resolve().parents[1]


async def ledger_line(store: Store, session_id: str, shape: Any, body: dict[str, Any]
                      ) -> tuple[int | None, list[LedgerRow]]:
    """The gateway ledger's line that holds the most of a request's messages (of those,
    the last used), and its rows (None and none: no line holds its first message), read
    from the tables message by message."""
    bares = [shape.bare(message) for message in body["messages"]]
    thread = thread_of(shape, body, bares)
    nodes, parent = [], thread
    for message in bares:
        parent = chained(parent, digest_of(message))
        nodes.append(parent)

    def read(conn: Any) -> tuple[int | None, list[LedgerRow]]:
        best, most = None, 0
        for (line,) in conn.execute("SELECT line FROM gateway_lines WHERE session_id = ? "
                                    "AND thread = ? ORDER BY used DESC", (session_id, thread)):
            held = 0
            for (node,) in conn.execute(
                    "SELECT node FROM gateway_ledger WHERE session_id = ? AND thread = ? "
                    "AND line = ? ORDER BY position", (session_id, thread, line)):
                if held == len(nodes) or node != nodes[held]:
                    break
                held += 1
            if held > most:
                best, most = line, held
        return best, [] if best is None else load_line(conn, session_id, thread, best)

    return await store.read(read)


def bundled_claude() -> Path | None:
    """The Claude Code CLI that claude-agent-sdk bundles, if installed. Found without
    importing the package: that takes a second, which every pytest-xdist worker would
    spend collecting each module that asks."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or spec.origin is None:
        return None
    cli = Path(spec.origin).parent / "_bundled" / "claude"
    return cli if cli.exists() else None

OPTIONAL_TOOLS = {"socat": "socat", "shellcheck": "shellcheck", "dash": "dash",
                  "busybox": "busybox", "zsh": "zsh", "fish": "fish", "groff": "groff-base",
                  "man": "man-db", "systemd-analyze": "systemd", "useradd": "passwd",
                  "runuser": "util-linux", "node": "nodejs"}
"""The programs some tests run beside Python, each with its Debian package: README.md
names them, .ci/run installs them, and a test that needs one is skipped without it."""


NPM_TOOLS = {"opencode": "opencode-ai"}
"""The programs some tests run that npm installs, each with its npm package: README.md
names them, .ci/run installs them into .ci/node (`npm_tool` finds them there)."""


def npm_tool(tool: str) -> str | None:
    """Where ``tool`` (of `NPM_TOOLS`) is: on PATH, else where .ci/run installs it."""
    found = shutil.which(tool)
    local = REPOSITORY / ".ci" / "node" / "node_modules" / ".bin" / tool
    return found or (str(local) if local.exists() else None)


def needs(*tools: str) -> pytest.MarkDecorator:
    """Skip a test when one of ``tools`` (of `OPTIONAL_TOOLS`) is not installed."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    packages = " ".join(OPTIONAL_TOOLS[tool] for tool in missing)
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed "
                                                    f"(apt-get install {packages})")


@functools.cache
def installed_prefix() -> Path:
    """A prefix holding what installing ctxd's wheel puts outside site-packages (its
    ``.data/data`` tree: the manual pages under share/man), as pip would lay it out.

    The wheel is built (once a session) from a copy of the sources, so that the build
    leaves nothing in the repository.
    """
    work = Path(tempfile.mkdtemp(prefix="ctxd-wheel-"))
    atexit.register(shutil.rmtree, work, True)
    source = work / "source"
    shutil.copytree(REPOSITORY, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(work / "dist"), str(source)], check=True, timeout=300,
                   capture_output=True)
    (wheel,) = (work / "dist").glob("ctxd-*.whl")
    prefix = work / "prefix"
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            parts = Path(name).parts
            if len(parts) > 2 and parts[0].endswith(".data") and parts[1] == "data":
                target = prefix.joinpath(*parts[2:])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    return prefix


SOCKET_FIX = "set XDG_RUNTIME_DIR or CTXD_SOCKET to a private directory (mode 0700) of your own"


def others_could_have_placed(tmp_path: Path, where: str) -> tuple[Path, str]:
    """A socket path whose directory is not private, and why a client refuses it."""
    if where == "shared":
        return (Path("/tmp") / f"{tmp_path.name}.sock",
                f"/tmp is shared with other users, so a socket there may not be your ctxd's: "
                f"{SOCKET_FIX}")
    directory = tmp_path / "open"
    directory.mkdir()
    os.chmod(directory, 0o755)
    return (directory / "ctxd.sock",
            f"{directory} has mode 0755, so others could have put a socket there: make it "
            f"private with `chmod 700 {directory}`, or {SOCKET_FIX}")


@contextlib.contextmanager
def placed_by_others(tmp_path: Path, where: str) -> Iterator[tuple[Path, str]]:
    """A socket listening at `others_could_have_placed`'s path for the block, and why a
    client refuses it; after the block, that nobody connected to it."""
    path, reason = others_could_have_placed(tmp_path, where)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        try:
            listener.listen(4)
            listener.setblocking(False)
            yield path, reason
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody connected
        finally:
            path.unlink()


NO_PROVIDER_NOTE = (
    "ctxctl: calls to an upstream out of reach fail (HTTP 502): check anthropic_upstream, "
    "openai_upstream under [gateway], and the network (unless no agent of yours calls that "
    "API)\n")
"""What `ctxctl doctor` says on standard error of a test daemon's gateway, whose upstreams
refuse every connection (`daemon_process.NO_PROVIDER`)."""


def doctor_gateway_lines(client: Client) -> list[str]:
    """The lines `ctxctl doctor` prints for the gateway of the test daemon ``client`` talks
    to (a healthy one: it answers its health check; its upstreams `NO_PROVIDER`)."""
    gateway = client.call("daemon.status").get("gateway")
    if gateway is None:
        return ["gateway: disabled"]
    return [f"gateway {gateway['listen']}: ok (/_ctxd/health answered)",
            *[f"upstream {NO_PROVIDER}: could not be reached (ConnectError)"] * 2]
