"""The local hub between agents and their UIs: the event stream, the usage ledger and the
tool-call lifecycle."""

from ctxd.hub._events import EventBus, Subscription
from ctxd.hub._methods import register
from ctxd.hub._tools_state import (
    allowed_next,
    list_tool_calls,
    load_tool_call,
    set_tool_state,
)
from ctxd.hub._usage import counters_of, find_usage, insert_usage, usage_summary

__all__ = ["EventBus", "Subscription", "allowed_next", "counters_of", "find_usage",
           "insert_usage", "list_tool_calls", "load_tool_call", "register", "set_tool_state",
           "usage_summary"]
