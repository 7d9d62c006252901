"""events.subscribe / events.unsubscribe: a connection becomes a stream of `event` notifications."""

from __future__ import annotations

from ctxd.errors import limit_reached, not_found
from ctxd.hub._events import EventBus
from ctxd.wire import Call, Dispatcher
from ctxd.wire.types import (
    EventsSubscribeParams,
    EventsSubscribeResult,
    EventsUnsubscribeParams,
    EventsUnsubscribeResult,
)


def register(dispatcher: Dispatcher, bus: EventBus, max_per_connection: int) -> None:
    """Add the event-stream methods to the dispatcher."""

    async def subscribe(call: Call, p: EventsSubscribeParams) -> EventsSubscribeResult:
        if call.peer.subscription_count >= max_per_connection:
            raise limit_reached("max_subscriptions_per_connection", max_per_connection,
                                f"this connection already has {max_per_connection} "
                                "subscriptions",
                                "unsubscribe one, or filter one subscription by types")
        subscription = bus.subscribe(p.session_id, p.types, p.since_seq)
        # The result goes out before the first notification: the pump starts after this
        # handler returns and the writer is fed in order.
        seq = bus.seq
        call.peer.attach(subscription)
        return EventsSubscribeResult(subscription_id=subscription.subscription_id, seq=seq)

    async def unsubscribe(call: Call, p: EventsUnsubscribeParams) -> EventsUnsubscribeResult:
        if not call.peer.detach(p.subscription_id):
            raise not_found("subscription", p.subscription_id,
                            "use the subscription_id that events.subscribe returned on "
                            "this connection")
        return EventsUnsubscribeResult(unsubscribed=True)

    dispatcher.register("events.subscribe", EventsSubscribeParams, subscribe)
    dispatcher.register("events.unsubscribe", EventsUnsubscribeParams, unsubscribe)
