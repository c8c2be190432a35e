"""What follows an applied change, in one place and one order, whatever made the change.

An entry change a client asked for, an entry expiration and a region change (clear,
destroy, invalidate) all end the same way, in the order of a Geode server (docs/behaviour.md §1:
apply, server ``CacheListener``s, distribution):

1. the server's listeners (not for a recognised duplicate: they heard it the first time);
2. routing to the subscription queues of the clients with interest or a CQ it matches,
   and to ``{ns}.events`` (`regionbus.broker.notifier.CacheClientNotifier`);
3. the region's gateway senders and async event queues (entry changes only; each queue's
   filter decides what it takes, `regionbus.broker.gateway_queues`).

The reply to the client that asked, if any, comes after, from the caller. The old value of
an entry is read by the apply only when someone after it needs it: a server listener of
the region or a CQ on it (:meth:`Distribution.wants_old_value`).
"""

from __future__ import annotations

from regionbus.broker.cq_registry import CqTable
from regionbus.broker.gateway_queues import GatewayEnqueuer
from regionbus.broker.notifier import CacheClientNotifier
from regionbus.broker.outbox import Outbox
from regionbus.broker.plugins import ServerPlugins
from regionbus.schemas.messages import Event


class Distribution:
    """The tail of every applied change.

    Args:
        plugins: The server's listeners (and writers, which come before the apply).
        notifier: Routing to subscription queues and ``{ns}.events``.
        gateways: The gateway senders' and async event queues' topics.
        outbox: Where the gateway queues' records are produced.
        cqs: The continuous queries (a region with any needs old values).
    """

    def __init__(
        self,
        plugins: ServerPlugins,
        notifier: CacheClientNotifier,
        gateways: GatewayEnqueuer,
        outbox: Outbox,
        cqs: CqTable,
    ) -> None:
        self._plugins = plugins
        self._notifier = notifier
        self._gateways = gateways
        self._outbox = outbox
        self._cqs = cqs

    def wants_old_value(self, region: str) -> bool:
        """Whether an apply in ``region`` should return the entry's old value: a server
        listener (``EntryEvent.old_value``) or a CQ (its query operation) needs it."""
        return self._plugins.has_listeners(region) or self._cqs.has_queries(region)

    def entry_changed(
        self,
        event: Event,
        bucket: int,
        old_value: bytes | None,
        old_serializer: str | None,
        *,
        duplicate: bool,
    ) -> None:
        """An entry change was applied (or recognised as applied before: ``duplicate``).

        Args:
            event: Its event, as subscribers receive it.
            bucket: The bucket it was applied in.
            old_value: The entry's value before, when :meth:`wants_old_value` asked for it.
            old_serializer: That value's serializer.
            duplicate: Its EventID was applied before (a failover): distributed again,
                flagged ``possible_duplicate``, but the listeners are not told twice.
        """
        if not duplicate:
            self._plugins.after_entry(event, old_value)
        self._notifier.entry_event(event, bucket, old_value, old_serializer)
        if self._gateways:
            self._gateways.enqueue(event, bucket, self._outbox.produce)

    def entry_changed_locally(
        self, event: Event, old_value: bytes | None, *, duplicate: bool
    ) -> None:
        """A local destroy or invalidate of a server's function was applied: the server's
        listeners hear it (Geode tells the member's own listeners of a local operation);
        no client, CQ or gateway does.

        Args:
            event: Its event (DESTROY or INVALIDATE).
            old_value: The entry's value before, when :meth:`wants_old_value` asked for it.
            duplicate: As for :meth:`entry_changed`.
        """
        if not duplicate:
            self._plugins.after_entry(event, old_value)

    def region_changed(self, event: Event, bucket: int, *, duplicate: bool) -> None:
        """A region change was applied (or recognised as applied before: ``duplicate``).

        Args:
            event: Its event (REGION_CLEAR, REGION_DESTROY, REGION_INVALIDATE).
            bucket: The region's bucket, where it was applied.
            duplicate: As for :meth:`entry_changed`.
        """
        if not duplicate:
            self._plugins.after_region(event)
        self._notifier.region_event(event, bucket)


__all__ = ["Distribution"]
