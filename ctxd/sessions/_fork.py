"""context.fork and session.open's ``fork_from`` (docs/protocol.md, "context.fork"): read a
thread on its session's actor and run the fork pipeline of ``ctxd.hygiene`` over it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import trio

from ctxd.errors import params_error, scrub_failed
from ctxd.hygiene import (
    CHAR_BUDGET,
    COMPACTION_META,
    NO_REMOVAL_CHARS,
    Fork,
    ToolResultBlob,
    fork,
    offload,
    originals,
    sliced,
)
from ctxd.scrub import ScrubError
from ctxd.sessions import _queries as q
from ctxd.wire.types import (
    Budget,
    ContextForkParams,
    ContextForkResult,
    ForkFrom,
    ForkSeedInfo,
    MessageIn,
    StoredMessage,
)

if TYPE_CHECKING:
    from ctxd.sessions._actor import SessionActor

T = TypeVar("T")

ON_LOOP_TOKENS = 4_000
"""A thread of at most this many tokens (about `ctxd.tokens.OFF_LOOP_BYTES` of text) is
forked on the loop: a worker thread would cost more than the work."""
FORK_META = "fork"
"""The ``meta`` key of the preamble that seeds a forked session: the source."""


def _whole_thread(conn: Any, session_id: str,
                  branch_id: str | None) -> tuple[list[StoredMessage], bool]:
    """The thread's kept messages in thread order, offloaded tool results whole (a result
    compaction cleared keeps its marker), in the store's thread; and whether any original
    was loaded (its stored row's tokens are its stub's, not its size)."""
    messages = q.thread_rows(conn, session_id, branch_id)
    whole = originals(conn, session_id, [m.seq for m in messages if m.role == "tool"
                                         and not (m.meta and COMPACTION_META in m.meta)])
    return [m if m.seq not in whole else msgspec.structs.replace(m, content=whole[m.seq][1])
            for m in messages], bool(whole)


async def _read(actor: SessionActor, branch_id: str | None, char_budget: int,
                no_removal_chars: int) -> tuple[list[StoredMessage], bool]:
    """The thread to fork, whole (`_whole_thread`), after the checks of its parameters.

    Raises:
        CtxdError: -32602 when ``no_removal_chars`` is above ``char_budget``; -32004 for an
            unknown session or branch.
    """
    actor.require()
    if no_removal_chars > char_budget:
        raise params_error("$.no_removal_chars",
                           f"no_removal_chars ({no_removal_chars:,}) is above char_budget "
                           f"({char_budget:,}): a context is never cut at or under "
                           "no_removal_chars, and always fits char_budget; lower it, or "
                           "raise char_budget")
    if branch_id is not None:
        await actor.branches.stored(branch_id)
    return await actor.services.store.read(_whole_thread, actor.session_id, branch_id)


async def _run(messages: list[StoredMessage], loaded: bool, stage: Callable[..., T],
               *args: Any) -> T:
    """``stage(*args)`` of the fork pipeline, on the loop for a small thread, else in a
    worker thread: a thread of millions of characters takes tens of milliseconds
    (docs/performance.md, "Fork pipeline"), and an offloaded original's size is known only
    once loaded (its row counts its stub); the messages are immutable.

    Raises:
        CtxdError: -32603 when the thread could not be scrubbed of secrets: nothing of it
            leaves (docs/security.md).
    """
    try:
        if not loaded and sum(m.tokens for m in messages) <= ON_LOOP_TOKENS:
            return stage(*args)
        return await trio.to_thread.run_sync(stage, *args)
    except ScrubError as exc:
        raise scrub_failed("the forked context", exc, "nothing was forked") from exc


async def forked(actor: SessionActor, branch_id: str | None, char_budget: int,
                 no_removal_chars: int) -> Fork:
    """The forked context of one of the actor's threads, scrubbed of secrets (errors:
    `_read`'s and `_run`'s)."""
    messages, loaded = await _read(actor, branch_id, char_budget, no_removal_chars)
    return await _run(messages, loaded, fork, messages, actor.services.counter.count,
                      char_budget, no_removal_chars)


async def context_fork(actor: SessionActor, p: ContextForkParams) -> ContextForkResult:
    """context.fork on the session's actor."""
    done = await forked(actor, p.branch_id, p.char_budget, p.no_removal_chars)
    return ContextForkResult(session_id=actor.session_id, branch_id=p.branch_id,
                             preamble=done.preamble, context=done.context,
                             stats=done.stats, tokens=done.tokens,
                             context_state=actor.context_state())


SEED_PASSES = 4
"""At most this many forks to fit a seed to its session's compaction target."""


def seed_target(budget: Budget, compact_target: float) -> int:
    """The tokens a seed must fit in: the compaction target of the new session's effective
    window (what its compaction brings a thread under: docs/protocol.md, "Compaction")."""
    return math.floor(budget.effective_window * min(compact_target, budget.compact_trigger))


@dataclass(frozen=True)
class Seed:
    """A forked session's first messages as stored (large tool results as their offload
    stubs), their exact tokens, and the blobs of the offloaded ones (placed at their seq)."""

    messages: list[MessageIn]
    tokens: list[int]
    blobs: list[ToolResultBlob]
    info: ForkSeedInfo


async def fork_seed(actor: SessionActor, source: ForkFrom, session_id: str,
                    target: int) -> Seed:
    """What seeds ``session_id``, forked from the actor's session: the preamble as a user
    message, then the forked messages, the tool results among them offloaded as an append
    would; fitted to ``target`` tokens by forking again with a smaller character budget,
    in proportion, a few passes at most (docs/decisions.md, "Fork pipeline")."""
    messages, loaded = await _read(actor, source.branch_id, CHAR_BUDGET, NO_REMOVAL_CHARS)
    kept = await _run(messages, loaded, sliced, messages)
    services = actor.services
    threshold = services.config.hygiene.offload_threshold_bytes
    origin = {FORK_META: {"session_id": actor.session_id, "branch_id": source.branch_id}}
    char_budget, no_removal = CHAR_BUDGET, NO_REMOVAL_CHARS
    for attempt in range(SEED_PASSES):
        done = await _run(messages, loaded, fork, kept, services.counter.count,
                          char_budget, no_removal)
        seed = [MessageIn(role="user", content=done.preamble, meta=origin)] + [
            MessageIn(role=m.role, content=m.content, name=m.name,
                      tool_call_id=m.tool_call_id) for m in done.messages]
        offloads = [offload(message, threshold, session_id, seq)
                    for seq, message in enumerate(seed, 1)]
        shown = [message if offloaded is None else offloaded[0]
                 for message, offloaded in zip(seed, offloads, strict=True)]
        tokens = await services.counter.count_messages(shown)
        total = sum(tokens)
        if total <= target or attempt == SEED_PASSES - 1 or done.stats.total_chars <= 1:
            break
        char_budget = max(1, min(done.stats.total_chars - 1,
                                 done.stats.total_chars * target // total))
        no_removal = min(no_removal, char_budget)
    blobs = [offloaded[1].placed(seq, None, 0.0)
             for seq, offloaded in enumerate(offloads, 1) if offloaded is not None]
    info = ForkSeedInfo(preamble=done.preamble, stats=done.stats, char_budget=char_budget,
                        tokens=total)
    return Seed(messages=shown, tokens=tokens, blobs=blobs, info=info)
