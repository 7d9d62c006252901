"""The local hub between agents and their UIs: the event stream, the usage ledger, the
tool-call lifecycle, the injection queue, and cancellation of requests and turns."""

from ctxd.hub._cancel import Requests
from ctxd.hub._events import EventBus, Subscription
from ctxd.hub._injections import (
    NewInjection,
    ack_injection,
    find_by_key,
    insert_injection,
    list_injections,
    load_injection,
    pull_injections,
)
from ctxd.hub._tools_state import (
    allowed_next,
    finish_tool_calls,
    list_tool_calls,
    load_tool_call,
    set_tool_state,
    tool_states,
)
from ctxd.hub._turns import Turns
from ctxd.hub._usage import (
    counters_of,
    find_usage,
    insert_usage,
    provider_ratio,
    usage_summary,
)

__all__ = ["EventBus", "NewInjection", "Requests", "Subscription", "Turns", "ack_injection",
           "allowed_next", "counters_of", "find_by_key", "find_usage", "finish_tool_calls",
           "insert_injection", "insert_usage", "list_injections", "list_tool_calls",
           "load_injection", "load_tool_call", "provider_ratio", "pull_injections",
           "set_tool_state", "tool_states", "usage_summary"]
