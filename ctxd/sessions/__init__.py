"""Sessions: the Supervisor, one SessionActor per session and its operations, budgets,
render."""

from ctxd.sessions._actor import SessionActor
from ctxd.sessions._methods import register
from ctxd.sessions._services import Services, SessionCounts
from ctxd.sessions._session_ops import get_session
from ctxd.sessions._state import SessionRecord, effective_window, health_of, resolve_budget
from ctxd.sessions._supervisor import Supervisor
from ctxd.sessions._usage_tools import register_hub

__all__ = ["Services", "SessionActor", "SessionCounts", "SessionRecord", "Supervisor",
           "effective_window", "get_session", "health_of", "register", "register_hub",
           "resolve_budget"]
