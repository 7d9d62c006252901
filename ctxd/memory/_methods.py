"""The memory operations the route table (ctxd/daemon/_routes.py) names besides `Memory`'s
own (``record``, ``search``, ``list``): memory.context, .get, .feedback, .outcome,
.share, .delete, .reindex (docs/protocol.md, Memory)."""

from __future__ import annotations

from ctxd.errors import params_error
from ctxd.memory._injection import PROMPT_HEADER
from ctxd.memory._service import Memory
from ctxd.wire.types import (
    Empty,
    MemoryContextParams,
    MemoryContextResult,
    MemoryDeleteResult,
    MemoryFeedbackParams,
    MemoryIdParams,
    MemoryIndexStatus,
    MemoryOutcomeParams,
    MemoryResult,
    MemoryShareParams,
)


async def memory_context(memory: Memory, p: MemoryContextParams) -> MemoryContextResult:
    """Injection's retrieval and fitting, with a hook's budget (docs/protocol.md,
    memory.context): nothing is recorded as a use, as nothing says it was shown. With a
    session, a memory is given to it once until its agent compacts its context."""
    if p.compacted and p.session_id is None:
        raise params_error("$.compacted", "compacted needs the session_id it is about")
    cap = p.max_tokens or memory.config.hook_inject_tokens
    scope = p.scope or "global"
    if p.session_id is not None:
        injected = await memory.inject_once(p.session_id, p.query, scope, cap, p.compacted,
                                            PROMPT_HEADER)
    else:
        injected = await memory.inject(p.query, scope, cap, header=PROMPT_HEADER)
    return MemoryContextResult(text=injected.text, tokens=injected.tokens,
                               items=injected.items, injection=injected.injection)


async def memory_get(memory: Memory, p: MemoryIdParams) -> MemoryResult:
    return MemoryResult(memory=await memory.get(p.id))


async def memory_feedback(memory: Memory, p: MemoryFeedbackParams) -> MemoryResult:
    return MemoryResult(memory=await memory.signal(p.id, "feedback", p.helpful))


async def memory_outcome(memory: Memory, p: MemoryOutcomeParams) -> MemoryResult:
    return MemoryResult(memory=await memory.signal(p.id, "outcome", p.succeeded))


async def memory_share(memory: Memory, p: MemoryShareParams) -> MemoryResult:
    return MemoryResult(memory=await memory.share(p.id, p.scope))


async def memory_delete(memory: Memory, p: MemoryIdParams) -> MemoryDeleteResult:
    await memory.delete(p.id)
    return MemoryDeleteResult(id=p.id, deleted=True)


async def memory_reindex(memory: Memory, p: Empty) -> MemoryIndexStatus:
    return await memory.reindex()
