"""Sessions: the Supervisor, one SessionActor per session, budgets, render."""

from ctxd.sessions._actor import SessionActor
from ctxd.sessions._methods import register
from ctxd.sessions._state import SessionRecord, effective_window, health_of, resolve_budget
from ctxd.sessions._supervisor import Supervisor
from ctxd.sessions._usage_tools import register_hub

__all__ = ["SessionActor", "SessionRecord", "Supervisor", "effective_window", "health_of",
           "register", "register_hub", "resolve_budget"]
