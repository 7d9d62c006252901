"""The trio client against a peer that breaks the protocol (ctxd itself never does)."""

import socket
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
