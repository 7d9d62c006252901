"""The memory methods: memory.record, .search, .context, .get, .feedback, .outcome, .delete,
.list, .reindex (docs/protocol.md, Memory)."""

from __future__ import annotations

from ctxd.memory._service import Memory
from ctxd.wire import Call, Dispatcher
from ctxd.wire.types import (
    Empty,
    MemoryContextParams,
    MemoryContextResult,
    MemoryDeleteResult,
    MemoryFeedbackParams,
    MemoryIdParams,
    MemoryIndexStatus,
    MemoryListParams,
    MemoryListResult,
    MemoryOutcomeParams,
    MemoryRecordParams,
    MemoryRecordResult,
    MemoryResult,
    MemorySearchParams,
    MemorySearchResult,
)


def register(dispatcher: Dispatcher, memory: Memory) -> None:
    """Add the memory methods to the dispatcher."""

    async def record(call: Call, p: MemoryRecordParams) -> MemoryRecordResult:
        return await memory.record(p)

    async def search(call: Call, p: MemorySearchParams) -> MemorySearchResult:
        return await memory.search(p)

    async def context(call: Call, p: MemoryContextParams) -> MemoryContextResult:
        # Injection's retrieval and fitting, with a hook's budget (docs/protocol.md,
        # memory.context): nothing is recorded as a use, as nothing says it was shown.
        cap = p.max_tokens or memory.config.hook_inject_tokens
        scope = p.scope or "global"
        injected = await memory.inject(p.query, scope, cap)
        return MemoryContextResult(text=injected.text, tokens=injected.tokens,
                                   items=injected.items, injection=injected.injection)

    async def get(call: Call, p: MemoryIdParams) -> MemoryResult:
        return MemoryResult(memory=await memory.get(p.id))

    async def feedback(call: Call, p: MemoryFeedbackParams) -> MemoryResult:
        return MemoryResult(memory=await memory.signal(p.id, "feedback", p.helpful))

    async def outcome(call: Call, p: MemoryOutcomeParams) -> MemoryResult:
        return MemoryResult(memory=await memory.signal(p.id, "outcome", p.succeeded))

    async def delete(call: Call, p: MemoryIdParams) -> MemoryDeleteResult:
        await memory.delete(p.id)
        return MemoryDeleteResult(id=p.id, deleted=True)

    async def list_(call: Call, p: MemoryListParams) -> MemoryListResult:
        return await memory.list(p)

    async def reindex(call: Call, p: Empty) -> MemoryIndexStatus:
        return await memory.reindex()

    dispatcher.register("memory.record", MemoryRecordParams, record)
    dispatcher.register("memory.search", MemorySearchParams, search)
    dispatcher.register("memory.context", MemoryContextParams, context)
    dispatcher.register("memory.get", MemoryIdParams, get)
    dispatcher.register("memory.feedback", MemoryFeedbackParams, feedback)
    dispatcher.register("memory.outcome", MemoryOutcomeParams, outcome)
    dispatcher.register("memory.delete", MemoryIdParams, delete)
    dispatcher.register("memory.list", MemoryListParams, list_)
    dispatcher.register("memory.reindex", Empty, reindex)
