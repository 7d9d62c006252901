"""The gateway's floor, for bench/gateway.py ``--floor``: ctxd's gateway server (the same
h11 listener, body checks, JSON decode, httpx2 upstream call, relay and usage record) with
an identity rewrite that sends the agent's bytes as they came, in a process of its own.
What it adds over a direct call is what the HTTP relay costs without any rewrite.

Run: ``python bench/_gateway_floor.py UPSTREAM``; prints the base URL on one line, serves
until its standard input closes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import msgspec
import trio

from ctxd.config import Config, GatewayConfig
from ctxd.gateway import Gateway, GatewayRequest, Prepared, bind, session_of
from ctxd.hub import EventBus, Requests
from ctxd.sessions import Supervisor
from ctxd.store import Store
from ctxd.tokens import TokenCounter


async def identity(supervisor: Supervisor, request: GatewayRequest) -> Prepared:
    """The agent's body as it came: no ledger, no count."""
    model = request.body.get("model")
    return Prepared(session_id=session_of(request),
                    body=request.raw or msgspec.json.encode(request.body),
                    tokens={"system_prompt": 0, "tool_descriptions": 0, "conversation": 0},
                    removed_tokens=0, model=model if isinstance(model, str) else None)


async def serve(upstream: str, folder: Path) -> None:
    config = GatewayConfig(listen="127.0.0.1:0", anthropic_upstream=upstream,
                           max_body_bytes=64 << 20)
    store = Store(folder / "ctxd.db")
    store.open()
    try:
        bus = EventBus()
        async with trio.open_nursery() as nursery:
            supervisor = await nursery.start(Supervisor(store, TokenCounter(), bus, Config()).run)
            gateway = Gateway(config, supervisor, bus, Requests(), "floor", prepare=identity)
            await nursery.start(gateway.run, bind(config))
            print(gateway.base_url, flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
            nursery.cancel_scope.cancel()
    finally:
        store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="ctxd-floor-") as folder:
        trio.run(serve, sys.argv[1], Path(folder))
