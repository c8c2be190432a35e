"""Distribution: each applied change to the subscription queues of the interested clients.

Geode's ``CacheClientNotifier``: an event is routed once, by the interest registry, to
every client with a matching registration in its bucket except the originator, as a value
or, for a client that registered with ``receive_values=False``, as an invalidation (SPEC
§3). Every event also goes to ``{ns}.events`` (Spark, peers). Region clears and destroys go
to every client with any interest in the region.

Continuous queries (SPEC §9) are evaluated here too, by the CQ registry, and what a change
does to a client's CQs goes to its subscription queue as a ``CqEvent`` beside the interest
event (:meth:`CacheClientNotifier.queue_cq_events`): a change matching both a client's
interest and one of its CQs reaches both its region listeners and its CQ listeners, as in
Geode; unlike interest events, CQ events reach the originator too (Geode
``CacheClientNotifier.getFilterClientIDs``).

It also watches the queues' capacity (SPEC §4): when a client's queue holds
``maximum_message_count`` unacked events, the server stops taking operations for up to
``maximum_queue_full_wait_ms``; then the queue may grow, or the client is disconnected if
the operator chose ``disconnect_unresponsive_clients``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqRegistry
from regionbus.broker.interest import InterestRegistry
from regionbus.broker.outbox import Outbox
from regionbus.broker.queue_depth import QueueDepths
from regionbus.broker.security import SecurityGuard
from regionbus.broker.stats import ServerStats
from regionbus.schemas.codec import encode
from regionbus.schemas.messages import CqEvent, CqMatch, Event, EventKind, Marker
from regionbus.schemas.naming import Topics

log = logging.getLogger("regionbus.server")

DEPTH_REFRESHES_PER_SYNC: Final = 8
"""Clients whose acked offsets are re-read per sync for the queue depth gauges (round
robin): bounds the admin requests a sync may make when many clients are connected."""
_THROTTLE_PAUSE_S = 0.05


class CacheClientNotifier:
    """Routes events to subscription queues and watches their capacity.

    Args:
        settings: The server's settings (capacity limits).
        topics: The namespace's topic names.
        registry: The interest registry routing is computed from.
        cqs: The continuous queries changes are evaluated against.
        outbox: Where events and markers go.
        depths: Each client's unacked queue depth.
        stats: The server's counters (events routed, holds).
        security: Filters recipients by their read permission when security is on.
    """

    def __init__(
        self,
        settings: ServerSettings,
        topics: Topics,
        registry: InterestRegistry,
        cqs: CqRegistry,
        outbox: Outbox,
        depths: QueueDepths,
        stats: ServerStats,
        security: SecurityGuard | None,
    ) -> None:
        self._settings = settings
        self._topics = topics
        self._registry = registry
        self._cqs = cqs.table
        self._outbox = outbox
        self.depths = depths
        self._stats = stats
        self._security = security
        self._full_queues: set[str] = set()
        self._overflowing: set[str] = set()
        self._throttled_until = 0.0
        self._depth_cursor = 0

    # --- routing -----------------------------------------------------------------------

    def entry_event(
        self,
        event: Event,
        bucket: int,
        old_value: bytes | None = None,
        old_serializer: str | None = None,
    ) -> None:
        """Distribute an applied entry change of ``bucket`` (duplicates included: a client
        drops what it has seen by EventID), and what it does to the continuous queries of
        its region, evaluated on ``old_value`` (the value before the change, written by
        ``old_serializer``) and the new value."""
        assert event.key is not None
        full = encode(event)
        self._outbox.produce(self._topics.events, full, event.key.encode(), partition=bucket)
        targets = self._registry.route(event.region, event.key, bucket)
        targets.pop(event.originator, None)
        if self._security is not None:
            targets = self._security.readers(targets, event.region, event.key)
        invalidate: bytes | None = None
        queue = self._outbox.queue
        carries_value = event.kind in (EventKind.CREATE, EventKind.UPDATE)
        for client_id, receive_values in targets.items():
            if receive_values or not carries_value:
                payload = full
            else:
                if invalidate is None:
                    invalidate = encode(event._replace(kind=EventKind.INVALIDATE, value=None))
                payload = invalidate
            queue(client_id, payload)
        self._stats.routed_to(targets)
        if self._cqs.has_queries(event.region):
            matches = self._cqs.entry_matches(event, bucket, old_value, old_serializer)
            self.queue_cq_events(event, matches)

    def region_event(self, event: Event, bucket: int) -> None:
        """Distribute an applied region clear or destroy to every client with any interest
        in the region, except the originator. A region invalidate goes to the applied-event
        log only: "Region invalidation in the server is not forwarded to the client" (Geode
        documentation, *How Client/Server Distribution Works*; SPEC §3)."""
        payload = encode(event)
        self._outbox.produce(self._topics.events, payload, None, partition=bucket)
        if event.kind is EventKind.REGION_INVALIDATE:
            return
        if self._cqs.has_queries(event.region):
            self.queue_cq_events(event, self._cqs.region_matches(event.region, event.kind))
        recipients = self._registry.clients_of_region(event.region) - {event.originator}
        if self._security is not None:
            recipients = self._security.region_readers(recipients, event.region)
        for client_id in recipients:
            self._outbox.queue(client_id, payload)
            self._stats.routed(client_id)

    def queue_cq_events(self, event: Event, matches: Mapping[str, Sequence[CqMatch]]) -> None:
        """Queue what a change did to clients' continuous queries: one ``CqEvent`` (the
        change, with the client's CQs it concerns and their query operations) into each
        client's subscription queue, carrying the change's EventID, so message tracking,
        failover, capacity and conflation treat it as any event. The one place CQ events
        leave routing.

        Args:
            event: The applied change.
            matches: ``{client id: its CQs' matches}`` (`regionbus.broker.cq_registry`).

        Raises:
            TransportError: Redis failed (checking read permissions, security on).
        """
        if not matches:
            return
        clients: Iterable[str] = matches
        if self._security is not None:
            clients = self._security.region_readers(matches, event.region)
        encoded: dict[tuple[CqMatch, ...], bytes] = {}
        for client_id in clients:
            cqs = tuple(matches[client_id])
            payload = encoded.get(cqs)
            if payload is None:
                payload = encoded[cqs] = encode(CqEvent(event, cqs))
            self._outbox.queue(client_id, payload)
            self._stats.routed(client_id)

    def marker(self, marker: Marker) -> None:
        """Put a durable client's marker into its queue after what was queued while it was
        away (seed 001)."""
        self._outbox.queue(marker.client_id, encode(marker))

    # --- capacity ----------------------------------------------------------------------

    def check_capacity(self, now: float) -> None:
        """Start holding operations back when a client's queue is full (called per sync)."""
        if self._throttled_until:
            return
        limit = self._settings.maximum_message_count
        full = [
            c
            for c in self.depths.clients_at_or_over(limit)
            if c not in self._overflowing and self.depths.refresh(c) >= limit
        ]
        for client_id in list(self._overflowing):
            if self.depths.refresh(client_id) < limit:
                self._overflowing.discard(client_id)
        if full:
            log.warning(
                "subscription queues full (%d unacked events): %s; holding operations for up "
                "to %d ms",
                limit,
                ", ".join(full),
                self._settings.maximum_queue_full_wait_ms,
            )
            self._stats.queue_full_waits += 1
            self._full_queues = set(full)
            self._throttled_until = now + self._settings.maximum_queue_full_wait_ms / 1000

    def hold(self, now: float) -> tuple[bool, list[str]]:
        """Whether to take no operations now, because a client's queue is full.

        Returns:
            ``(hold, unresponsive)``: hold is True (after a short pause) until the full
            queues drain or the wait is over. Then each client still full is returned in
            ``unresponsive`` when the operator chose ``disconnect_unresponsive_clients``
            (the caller disconnects it), or else left to grow.
        """
        if not self._throttled_until:
            return False, []
        limit = self._settings.maximum_message_count
        self._full_queues = {c for c in self._full_queues if self.depths.refresh(c) >= limit}
        if self._full_queues and now < self._throttled_until:
            time.sleep(_THROTTLE_PAUSE_S)
            return True, []
        unresponsive: list[str] = []
        for client_id in self._full_queues:
            if self._settings.disconnect_unresponsive_clients:
                log.warning("disconnecting unresponsive client %s (queue full)", client_id)
                self._stats.clients_disconnected += 1
                unresponsive.append(client_id)
            else:
                log.warning("queue of %s stays over its capacity: not waiting again", client_id)
                self._overflowing.add(client_id)
        self._full_queues = set()
        self._throttled_until = 0.0
        return False, unresponsive

    def refresh_depths(self) -> None:
        """Re-read the acks of a few clients (round robin), so the depth gauges stay
        current (capacity checks re-read only clients near the limit)."""
        clients = self.depths.clients()
        if not clients:
            return
        count = min(DEPTH_REFRESHES_PER_SYNC, len(clients))
        for step in range(count):
            self.depths.refresh(clients[(self._depth_cursor + step) % len(clients)])
        self._depth_cursor = (self._depth_cursor + count) % len(clients)


__all__ = ["DEPTH_REFRESHES_PER_SYNC", "CacheClientNotifier"]
