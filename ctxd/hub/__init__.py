"""The local hub between agents and their UIs: for now the event stream."""

from ctxd.hub._events import EventBus, Subscription
from ctxd.hub._methods import register

__all__ = ["EventBus", "Subscription", "register"]
