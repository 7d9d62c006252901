"""The local hub between agents and their UIs: the event stream and the injection queue."""

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
from ctxd.hub._methods import register

__all__ = ["EventBus", "NewInjection", "Subscription", "ack_injection", "find_by_key",
           "insert_injection", "list_injections", "load_injection", "pull_injections",
           "register"]
