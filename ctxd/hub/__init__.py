"""The local hub between agents and their UIs: the event stream; cancellation of requests
and turns."""

from ctxd.hub._cancel import Requests
from ctxd.hub._events import EventBus, Subscription
from ctxd.hub._methods import register
from ctxd.hub._turns import Turns
from ctxd.hub._turns import register as register_cancel

__all__ = ["EventBus", "Requests", "Subscription", "Turns", "register", "register_cancel"]
