"""Distribution: each applied change to the subscription queues of the interested clients.

Geode's ``CacheClientNotifier``: an event is routed once, by the interest registry, to
every client with a matching registration in its bucket except the originator, as a value
or, for a client that registered with ``receive_values=False``, as an invalidation
(docs/behaviour.md §3). Every event also goes to ``{ns}.events`` (Spark, peers). Region clears and
destroys go to every client with any interest in the region.

Continuous queries (docs/behaviour.md §9) are evaluated here too, by the CQ registry, and what a
change does to a client's CQs goes to its subscription queue as a ``CqEvent`` beside the interest
event (:meth:`CacheClientNotifier.queue_cq_events`): a change matching both a client's
interest and one of its CQs reaches both its region listeners and its CQ listeners, as in
Geode; unlike interest events, CQ events reach the originator too (Geode
``CacheClientNotifier.getFilterClientIDs``). The holders of the same CQs (same names, same
query operation for the change) that read one partition get one record, as an interest
group does.

Each client is served through its :class:`regionbus.broker.client_proxy.ClientProxy`, which
knows where its queue is and how full it is, and delivers to it. Capacity is checked when
an event is queued (docs/behaviour.md §4; Geode ``HARegionQueue`` / ``CacheClientProxy``): a client
whose queue holds ``maximum_message_count`` unacked events holds the writers of its events (their
events for it, and their replies, wait in the outbox) until the client acks or
``maximum_queue_full_wait_ms`` has passed; then its queue may grow (not held for again
until it drains below the capacity), or, if the operator chose
``disconnect_unresponsive_clients``, the client is disconnected and what waited for it is
dropped (`regionbus.broker.queue_holds`). Other writers and other clients do not wait. The
records a group shares are counted in the group's own account
(:class:`regionbus.broker.client_proxy.SharedQueue`, as deep as its slowest member): the
capacity applies to each stream of records a client reads, its own and each group's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from regionbus.broker.audiences import Audience
from regionbus.broker.client_proxy import (
    ClientProxies,
    ClientProxy,
    QueueAccount,
    SharedQueue,
)
from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqRegistry
from regionbus.broker.interest import InterestRegistry
from regionbus.broker.outbox import Outbox
from regionbus.broker.permissions import data_read
from regionbus.broker.queue_acks import AckRead, QueueAcks
from regionbus.broker.queue_holds import QueueHolds
from regionbus.broker.queue_runs import Recipients
from regionbus.broker.stats import ServerStats
from regionbus.schemas.addressing import shared_key
from regionbus.schemas.codec import encode
from regionbus.schemas.messages import CqEvent, CqMatch, Event, EventKind, Marker
from regionbus.schemas.naming import Topics

log = logging.getLogger("regionbus.server")

DEPTH_REFRESHES_PER_SYNC: Final = 8
"""Readers whose acks are re-read per sync for the queue depth gauges (round robin):
bounds the admin requests a sync may make when many clients are connected."""
_AUDIENCE_TARGETS_KEPT: Final = 10_000
"""Audiences whose records are kept made (all forgotten past this many)."""
_ANYONE: Final = object()
"""The principal of a record's clients when security is off: anyone may read."""


def _cq_source(cqs: tuple[CqMatch, ...]) -> tuple[str, ...]:
    """What the holders of one CQ record share, as text (names and query operations)."""
    return tuple(
        f"{m.name}\x00{m.query_operation.name if m.query_operation else ''}\x00{m.error or ''}"
        for m in cqs
    )


def _invalidation(event: Event) -> bytes:
    """The invalidation a client that registered without values gets for an update."""
    return encode(event._replace(kind=EventKind.INVALIDATE, value=None))


class CacheClientNotifier:
    """Routes events to subscription queues and checks their capacity as it queues.

    Args:
        settings: The server's settings (capacity limits).
        topics: The namespace's topic names.
        registry: The interest registry routing is computed from.
        cqs: The continuous queries changes are evaluated against.
        outbox: Where events, shared records and markers go.
        proxies: The clients this server serves; each delivers its own events (read
            permission, capacity, counts). Their security guard, when security is on,
            also filters shared records by their principals' read permission.
        acks: Reads the queues' acks (their depths).
        stats: The server's counters (events routed, holds).
        holds: The full queues held now; routing starts a hold when it counts a shared
            queue at its capacity.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        settings: ServerSettings,
        topics: Topics,
        registry: InterestRegistry,
        cqs: CqRegistry,
        outbox: Outbox,
        proxies: ClientProxies,
        acks: QueueAcks,
        stats: ServerStats,
        holds: QueueHolds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._topics = topics
        self._registry = registry
        self._cqs = cqs.table
        self._outbox = outbox
        self.proxies = proxies
        self._acks = acks
        self._stats = stats
        self._security = None if proxies.services is None else proxies.services.security
        self._holds = holds
        self._clock = clock
        self._limit = settings.maximum_message_count
        self._depth_cursor = 0
        self._depth_reads: dict[tuple[QueueAccount, str | None], AckRead] = {}
        """Ack reads asked for the depths, answered by a later sync."""
        self._audience_targets: dict[
            Audience, tuple[Audience, tuple[tuple[ClientProxy | Recipients, Any], ...]]
        ] = {}
        """``{audience: (the audience object keyed, its targets)}``."""
        self._targets_version = -1

    def serve(self, client_id: str, kafka_principal: str | None) -> ClientProxy:
        """The proxy of a client this server routes to, made now if new (at its interest
        registration, its readiness, or from its record when registrations are loaded)."""
        return self.proxies.get(client_id, kafka_principal)

    def _proxy(self, client_id: str) -> ClientProxy:
        proxy = self.proxies.find(client_id)
        return proxy if proxy is not None else self.proxies.get(client_id, None)

    # --- routing -----------------------------------------------------------------------

    def entry_event(
        self,
        event: Event,
        bucket: int,
        old_value: bytes | None = None,
        old_serializer: str | None = None,
    ) -> None:
        """Distribute an applied entry change of ``bucket`` (duplicates included: a client
        drops what it has seen by EventID): to each client routed alone, and once per
        partition to the clients that share an interest (`regionbus.broker.audiences`);
        and what it does to the continuous queries of its region, evaluated on
        ``old_value`` (the value before the change, written by ``old_serializer``) and the
        new value."""
        assert event.key is not None
        full = encode(event)
        self._outbox.produce(
            self._topics.events, self._applied(event, full), event.key.encode(), partition=bucket
        )
        route = self._registry.table.audiences(event.region, event.key, bucket)
        carries_value = event.kind in (EventKind.CREATE, EventKind.UPDATE)
        invalidate: bytes | None = None
        routed = 0
        targets = route.individual
        if targets:
            targets.pop(event.originator, None)
            for client_id, receive_values in targets.items():
                if not receive_values and carries_value and invalidate is None:
                    invalidate = _invalidation(event)
                payload = full if receive_values or not carries_value else invalidate
                assert payload is not None
                routed += self._proxy(client_id).deliver(
                    payload, event.originator, region=event.region, key=event.key
                )
        if route.audiences:
            now = self._clock()
            for audience in route.audiences:
                if not audience.receive_values and carries_value and invalidate is None:
                    invalidate = _invalidation(event)
                payload = full if audience.receive_values or not carries_value else invalidate
                assert payload is not None
                for target, principal in self._targets(audience):
                    if principal is not _ANYONE and not self._may_read(principal, event):
                        continue
                    if isinstance(target, ClientProxy):
                        if target.client_id != event.originator:
                            routed += target.deliver(payload, event.originator)
                    else:
                        routed += self._to_audience(target, payload, now, event.originator)
        self._stats.events_routed += routed
        if self._cqs.has_queries(event.region):
            matches = self._cqs.entry_matches(event, bucket, old_value, old_serializer)
            self.queue_cq_events(event, matches)

    def _applied(self, event: Event, framed: bytes) -> bytes:
        """What ``{ns}.events`` gets of an event: ``framed`` again, or the event in the
        framing the servers' ``events_framing`` names for standard Avro tools (queues keep
        the regionbus frame)."""
        framing = self._settings.events_framing
        return framed if framing == "regionbus" else encode(event, framing)

    def _to_audience(
        self, recipients: Recipients, payload: bytes, now: float, originator: str
    ) -> int:
        """Queue one event of ``originator``'s operation for the clients of one record,
        holding their shared queue when it is counted full; how many got it."""
        queue = recipients.queue
        if queue.depth >= self._limit and not queue.overflowing and not self._holds.is_held(queue):
            self._holds.full(queue, ", ".join(sorted(queue.members)))
        self._outbox.queue_shared(recipients, payload, originator)
        queue.events += 1
        queue.last_used = now
        return len(queue.members)

    def _may_read(self, principal: str | None, event: Event) -> bool:
        assert self._security is not None
        return principal is not None and self._security.check(
            principal, data_read(event.region, event.key or "*")
        )

    def _targets(self, audience: Audience) -> tuple[tuple[ClientProxy | Recipients, Any], ...]:
        """An audience's clients as records to send: one per partition (and principal,
        with security on) holding its members there, or a client's own when it is alone
        there; each with the principal whose read permission it needs (:data:`_ANYONE`
        without security). Kept until the audience changes."""
        if self._targets_version != self.proxies.version:
            self._audience_targets.clear()
        kept = self._audience_targets.get(audience)
        if kept is not None:
            keyed, found = kept
            if keyed is not audience:
                # An equal audience of another object (rebuilt routing, a CQ event's) is
                # found by comparing its clients, one by one: keyed by this object
                # instead, the next lookups stop at identity.
                del self._audience_targets[audience]
                self._audience_targets[audience] = (audience, found)
            return found
        if len(self._audience_targets) >= _AUDIENCE_TARGETS_KEPT:
            self._audience_targets.clear()
        groups: dict[tuple[str, int, Any], list[ClientProxy]] = {}
        complete = True
        for client_id in audience.clients:
            proxy = self._proxy(client_id)
            principal = _ANYONE if self._security is None else proxy.security_principal()
            if proxy.queue_partition < 0 or principal is None:
                complete = False  # not addressable yet: looked at again next event
                continue
            groups.setdefault((proxy.queue_topic, proxy.queue_partition, principal), []).append(
                proxy
            )
        targets: list[tuple[ClientProxy | Recipients, Any]] = []
        for (topic, partition, principal), proxies in groups.items():
            if len(proxies) == 1:
                targets.append((proxies[0], principal))
                continue
            members = frozenset(p.client_id for p in proxies)
            named = f"{'/'.join(audience.source)}|{audience.receive_values}|{principal}"
            identity = (topic, partition, *audience.source, audience.receive_values, principal)
            targets.append(
                (
                    Recipients(
                        topic,
                        partition,
                        shared_key(named),
                        members,
                        self.proxies.shared(identity, members),
                    ),
                    principal,
                )
            )
        found = tuple(targets)
        if complete:
            self._audience_targets[audience] = (audience, found)
        self._targets_version = self.proxies.version
        return found

    def region_event(self, event: Event, bucket: int) -> None:
        """Distribute an applied region clear or destroy to every client with any interest
        in the region, except the originator. A region invalidate goes to the applied-event
        log only: "Region invalidation in the server is not forwarded to the client" (Geode
        documentation, *How Client/Server Distribution Works*; docs/behaviour.md §3)."""
        payload = encode(event)
        self._outbox.produce(
            self._topics.events, self._applied(event, payload), None, partition=bucket
        )
        if event.kind is EventKind.REGION_INVALIDATE:
            return
        if self._cqs.has_queries(event.region):
            self.queue_cq_events(event, self._cqs.region_matches(event.region, event.kind))
        recipients = self._registry.clients_of_region(event.region) - {event.originator}
        routed = 0
        for client_id in recipients:
            routed += self._proxy(client_id).deliver(payload, event.originator, region=event.region)
        self._stats.events_routed += routed

    def queue_cq_events(self, event: Event, matches: Mapping[str, Sequence[CqMatch]]) -> None:
        """Queue what a change did to clients' continuous queries: one ``CqEvent`` (the
        change, with the client's CQs it concerns and their query operations) into each
        client's subscription queue, carrying the change's EventID, so message tracking,
        failover, capacity and conflation treat it as any event. The holders of the same
        matches (same CQ names and query operations: the same record) in one partition get
        one record for all of them. The one place CQ events leave routing.

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
        holders: dict[tuple[CqMatch, ...], list[str]] = {}
        for client_id in clients:
            holders.setdefault(tuple(matches[client_id]), []).append(client_id)
        routed = 0
        now = self._clock()
        for cqs, ids in holders.items():
            payload = encode(CqEvent(event, cqs))
            if len(ids) == 1:
                routed += self._proxy(ids[0]).deliver(payload, event.originator)
                continue
            audience = Audience(("cq", event.region, *_cq_source(cqs)), True, frozenset(ids))
            for target, _principal in self._targets(audience):
                if isinstance(target, ClientProxy):
                    routed += target.deliver(payload, event.originator)
                else:
                    routed += self._to_audience(target, payload, now, event.originator)
        self._stats.events_routed += routed

    def marker(self, marker: Marker, kafka_principal: str | None) -> None:
        """Put a durable client's marker into its queue after what was queued while it was
        away (docs/behaviour.md §5)."""
        self._outbox.queue(self.serve(marker.client_id, kafka_principal), encode(marker))

    # --- capacity ----------------------------------------------------------------------

    def refresh_depths(self, gauges: bool) -> None:
        """Per sync: re-read the acks of the queues that were let grow, so a drained one is
        held for again when it fills up; with ``gauges``, also of a few other queues,
        clients' own and shared ones (round robin), so the depth gauges stay current.

        Each read is asked now and its answer taken at a later sync: the loop never waits
        on Kafka for a depth."""
        limit = self._limit
        for asked, read in list(self._depth_reads.items()):
            if read.done():
                del self._depth_reads[asked]
                account = asked[0]
                if self._acks.take_acks(account, read.answers()) < limit:
                    account.overflowing = False
        accounts: list[QueueAccount] = [*self.proxies, *self.proxies.shared_queues()]
        for account in accounts:
            if account.overflowing:
                self._read_depth(account, None)
        self.proxies.forget_idle_shared()
        if not gauges:
            return
        # One ack read per reader: a shared queue's members are read one at a time, so a
        # sync makes at most DEPTH_REFRESHES_PER_SYNC admin requests however large it is.
        readers: list[tuple[QueueAccount, str | None]] = [(p, None) for p in self.proxies]
        for queue in self.proxies.shared_queues():
            readers.extend((queue, member) for member in sorted(queue.members))
        if not readers:
            return
        count = min(DEPTH_REFRESHES_PER_SYNC, len(readers))
        for step in range(count):
            account, member = readers[(self._depth_cursor + step) % len(readers)]
            self._read_depth(account, member if isinstance(account, SharedQueue) else None)
        self._depth_cursor = (self._depth_cursor + count) % len(readers)

    def _read_depth(self, account: QueueAccount, member: str | None) -> None:
        """Ask a queue's ack (all its readers', or one member's), unless asked already."""
        if (account, member) not in self._depth_reads:
            readers = None if member is None else [member]
            self._depth_reads[(account, member)] = self._acks.ask_acks(account, readers)


__all__ = ["DEPTH_REFRESHES_PER_SYNC", "CacheClientNotifier"]
