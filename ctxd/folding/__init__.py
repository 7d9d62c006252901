"""Context folding: BranchActors with deadlines and budgets, fold, rollback (DESIGN §7)."""

from ctxd.folding._actor import BranchActor
from ctxd.folding._methods import register
from ctxd.folding._state import BranchRecord

__all__ = ["BranchActor", "BranchRecord", "register"]
