"""Distribution: each applied change to the subscription queues of the interested clients.

Geode's ``CacheClientNotifier``: an event is routed once, by the interest registry, to
every client with a matching registration in its bucket except the originator, as a value
or, for a client that registered with ``receive_values=False``, as an invalidation (SPEC
§3). Every event also goes to ``{ns}.events`` (Spark, peers). Region clears and destroys go
to every client with any interest in the region.

Each client is served through its :class:`regionbus.broker.client_proxy.ClientProxy`, which
knows where its queue is and how full it is. Capacity is checked when an event is queued
(SPEC §4; Geode ``HARegionQueue`` / ``CacheClientProxy``): a client whose queue holds
``maximum_message_count`` unacked events holds the writer (the server takes no other
operation) until the client acks or ``maximum_queue_full_wait_ms`` has passed; then its
queue may grow (not held for again until it drains below the capacity), or, if the
operator chose ``disconnect_unresponsive_clients``, the client is disconnected and the
event, and every later one, is not queued for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from regionbus.broker.client_proxy import ClientProxies, ClientProxy
from regionbus.broker.config import ServerSettings
from regionbus.broker.interest import InterestRegistry
from regionbus.broker.outbox import Outbox
from regionbus.broker.security import SecurityGuard
from regionbus.broker.stats import ServerStats
from regionbus.schemas.codec import encode
from regionbus.schemas.messages import Event, EventKind, Marker
from regionbus.schemas.naming import Topics

log = logging.getLogger("regionbus.server")

DEPTH_REFRESHES_PER_SYNC: Final = 8
"""Clients whose acks are re-read per sync for the queue depth gauges (round robin):
bounds the admin requests a sync may make when many clients are connected."""
FULL_RECHECK_S: Final = 0.02
"""A queue found full is believed full for this long before its ack is read again."""
HOLD_POLL_S: Final = 0.05
"""How often a held writer's full queue is looked at again."""


class CacheClientNotifier:
    """Routes events to subscription queues and checks their capacity as it queues.

    Args:
        settings: The server's settings (capacity limits).
        topics: The namespace's topic names.
        registry: The interest registry routing is computed from.
        outbox: Where events and markers go.
        proxies: The clients this server serves (their queues' addresses and depths).
        stats: The server's counters (events routed, holds).
        security: Filters recipients by their read permission when security is on.
        disconnect: Disconnects a client as unresponsive (its queue stayed full through
            a whole wait, and the operator chose ``disconnect_unresponsive_clients``).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        settings: ServerSettings,
        topics: Topics,
        registry: InterestRegistry,
        outbox: Outbox,
        proxies: ClientProxies,
        stats: ServerStats,
        security: SecurityGuard | None,
        disconnect: Callable[[str], object] = lambda _client_id: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._topics = topics
        self._registry = registry
        self._outbox = outbox
        self.proxies = proxies
        self._stats = stats
        self._security = security
        self.disconnect = disconnect
        self._clock = clock
        self._limit = settings.maximum_message_count
        self._depth_cursor = 0

    def serve(self, client_id: str, kafka_principal: str | None) -> ClientProxy:
        """The proxy of a client this server routes to, made now if new (at its interest
        registration, its readiness, or from its record when registrations are loaded)."""
        return self.proxies.get(client_id, kafka_principal)

    def _proxy(self, client_id: str) -> ClientProxy:
        proxy = self.proxies.find(client_id)
        return proxy if proxy is not None else self.proxies.get(client_id, None)

    # --- routing -----------------------------------------------------------------------

    def entry_event(self, event: Event, bucket: int) -> None:
        """Distribute an applied entry change of ``bucket`` (duplicates included: a client
        drops what it has seen by EventID)."""
        assert event.key is not None
        full = encode(event)
        self._outbox.produce(self._topics.events, full, event.key.encode(), partition=bucket)
        targets = self._registry.route(event.region, event.key, bucket)
        targets.pop(event.originator, None)
        if self._security is not None:
            targets = self._security.readers(targets, event.region, event.key)
        invalidate: bytes | None = None
        queue = self._outbox.queue
        limit = self._limit
        carries_value = event.kind in (EventKind.CREATE, EventKind.UPDATE)
        routed = 0
        for client_id, receive_values in targets.items():
            proxy = self._proxy(client_id)
            if proxy.depth >= limit and not proxy.overflowing and not self._room(proxy):
                continue
            if receive_values or not carries_value:
                payload = full
            else:
                if invalidate is None:
                    invalidate = encode(event._replace(kind=EventKind.INVALIDATE, value=None))
                payload = invalidate
            queue(proxy, payload)
            proxy.events_routed += 1
            routed += 1
        self._stats.events_routed += routed

    def region_event(self, event: Event, bucket: int) -> None:
        """Distribute an applied region clear or destroy to every client with any interest
        in the region, except the originator. A region invalidate goes to the applied-event
        log only: "Region invalidation in the server is not forwarded to the client" (Geode
        documentation, *How Client/Server Distribution Works*; SPEC §3)."""
        payload = encode(event)
        self._outbox.produce(self._topics.events, payload, None, partition=bucket)
        if event.kind is EventKind.REGION_INVALIDATE:
            return
        recipients = self._registry.clients_of_region(event.region) - {event.originator}
        if self._security is not None:
            recipients = self._security.region_readers(recipients, event.region)
        for client_id in recipients:
            proxy = self._proxy(client_id)
            if proxy.depth >= self._limit and not proxy.overflowing and not self._room(proxy):
                continue
            self._outbox.queue(proxy, payload)
            proxy.events_routed += 1
            self._stats.events_routed += 1

    def marker(self, marker: Marker, kafka_principal: str | None) -> None:
        """Put a durable client's marker into its queue after what was queued while it was
        away (seed 001)."""
        self._outbox.queue(self.serve(marker.client_id, kafka_principal), encode(marker))

    # --- capacity ----------------------------------------------------------------------

    def _room(self, proxy: ClientProxy) -> bool:
        """Whether an event may be queued for a client whose queue looked full: after a
        fresh read of its ack it has room; or it was held for (the writer waited up to
        ``maximum_queue_full_wait_ms``) and then may grow; False when it was disconnected
        as unresponsive instead (nothing more is queued for it)."""
        limit = self._limit
        now = self._clock()
        if now - proxy.refreshed_at >= FULL_RECHECK_S and self.proxies.refresh(proxy) < limit:
            return True
        wait_ms = self._settings.maximum_queue_full_wait_ms
        log.warning(
            "subscription queues full (%d unacked events): %s; holding operations for up to %d ms",
            limit,
            proxy.client_id,
            wait_ms,
        )
        self._stats.queue_full_waits += 1
        # What this batch gathered goes now: the full client may be waiting on nothing else,
        # and the other clients need not wait for the hold.
        self._outbox.send()
        deadline = now + wait_ms / 1000
        while self._clock() < deadline:
            self._outbox.producer.poll(min(HOLD_POLL_S, max(0.0, deadline - self._clock())))
            if self.proxies.refresh(proxy) < limit:
                log.info("subscription queue of %s has room again", proxy.client_id)
                return True
        if self._settings.disconnect_unresponsive_clients:
            log.warning("disconnecting unresponsive client %s (queue full)", proxy.client_id)
            self._stats.clients_disconnected += 1
            self.disconnect(proxy.client_id)
            return False
        log.warning("queue of %s stays over its capacity: not waiting again", proxy.client_id)
        proxy.overflowing = True
        return True

    def refresh_depths(self, gauges: bool) -> None:
        """Per sync: re-read the acks of the queues that were let grow, so a drained one is
        held for again when it fills up; with ``gauges``, also of a few other clients
        (round robin), so the depth gauges stay current."""
        limit = self._limit
        for proxy in self.proxies:
            if proxy.overflowing and self.proxies.refresh(proxy) < limit:
                proxy.overflowing = False
        if not gauges:
            return
        proxies = list(self.proxies)
        if not proxies:
            return
        count = min(DEPTH_REFRESHES_PER_SYNC, len(proxies))
        for step in range(count):
            self.proxies.refresh(proxies[(self._depth_cursor + step) % len(proxies)])
        self._depth_cursor = (self._depth_cursor + count) % len(proxies)


__all__ = ["DEPTH_REFRESHES_PER_SYNC", "CacheClientNotifier"]
