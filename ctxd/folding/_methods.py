"""The folding methods: branch.create, branch.return, branch.status, branch.list,
branch.rollback (DESIGN §7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxd.folding import _ops
from ctxd.wire import Call, Dispatcher
from ctxd.wire.types import (
    BranchCreateParams,
    BranchCreateResult,
    BranchIdParams,
    BranchListParams,
    BranchListResult,
    BranchReturnParams,
    BranchReturnResult,
    BranchRollbackParams,
    BranchRollbackResult,
    BranchStatusResult,
)

if TYPE_CHECKING:
    from ctxd.sessions import Supervisor


def register(dispatcher: Dispatcher, supervisor: Supervisor) -> None:
    """Add the branch methods to the dispatcher."""

    async def create(call: Call, p: BranchCreateParams) -> BranchCreateResult:
        return await supervisor.call(p.session_id, lambda a: _ops.create(a, p))

    async def return_(call: Call, p: BranchReturnParams) -> BranchReturnResult:
        session_id = await supervisor.session_of_branch(p.branch_id)
        return await supervisor.call(session_id, lambda a: _ops.return_branch(a, p))

    async def status(call: Call, p: BranchIdParams) -> BranchStatusResult:
        session_id = await supervisor.session_of_branch(p.branch_id)
        return await supervisor.call(session_id, lambda a: _ops.status(a, p.branch_id))

    async def list_(call: Call, p: BranchListParams) -> BranchListResult:
        return await supervisor.call(p.session_id, lambda a: _ops.list_branches(a, p))

    async def rollback(call: Call, p: BranchRollbackParams) -> BranchRollbackResult:
        return await supervisor.call(p.session_id, lambda a: _ops.rollback(a, p))

    dispatcher.register("branch.create", BranchCreateParams, create)
    dispatcher.register("branch.return", BranchReturnParams, return_)
    dispatcher.register("branch.status", BranchIdParams, status)
    dispatcher.register("branch.list", BranchListParams, list_)
    dispatcher.register("branch.rollback", BranchRollbackParams, rollback)
