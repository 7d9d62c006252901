"""The client library: a peer that breaks the protocol (ctxd itself never does), and what
importing it loads."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import ctxclient
from ctxclient import DaemonUnavailable


async def test_a_garbled_answer_ends_the_connection_as_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "peer.sock"
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(str(path))
    listener.listen()

    async def garbling_peer() -> None:
        connection, _ = await listener.accept()
        with connection:
            await connection.recv(65536)
            await connection.send(b"this is not json\n")
            await trio.sleep_forever()

    with listener:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(garbling_peer)
            with pytest.raises(DaemonUnavailable, match="connection closed"):
                async with ctxclient.connect(path) as client:
                    await client.call("daemon.ping")
            nursery.cancel_scope.cancel()


def test_importing_the_client_loads_nothing_of_the_daemon() -> None:
    # ctxctl starts in a shell hook; the tokenizer alone takes longer to load than a call.
    code = ("import json, sys, ctxclient, ctxclient.cli; "
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True, timeout=60).stdout)
    assert [name for name in ("tiktoken", "apsw", "faiss", "numpy") if name in loaded] == []
    assert sorted(name for name in loaded if name.split(".")[0] == "ctxd"
                  and not name.startswith("ctxd.wire")) == ["ctxd", "ctxd.errors", "ctxd.paths"]

