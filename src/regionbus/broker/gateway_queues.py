"""The cache server's side of gateways: queue each distributable event for every gateway
sender and async event queue attached to its region (docs/behaviour.md §6, §7).

The server calls :meth:`GatewayEnqueuer.enqueue` for each applied entry event (duplicates
included: a re-processed operation re-emits the same EventID, which the remote site and the
write-behind listener recognise), through the server's own producer, before it commits its
``{ns}.ops`` offsets, so a queued event is never lost (at-least-once, ARCHITECTURE.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import NamedTuple

from regionbus.broker.config import GatewayQueueSpec, GatewaySenderSpec, OrderPolicy, ServerSettings
from regionbus.schemas.codec import encode
from regionbus.schemas.hooks import GatewayEventFilter, load_hook
from regionbus.schemas.messages import Event, EventKind
from regionbus.schemas.naming import Topics, bucket_of
from regionbus.schemas.topics import KEEP_UNTIL_ACKED, TopicSpec, acked_queue_spec

DISTRIBUTABLE_KINDS = frozenset({EventKind.CREATE, EventKind.UPDATE, EventKind.DESTROY})
"""Entry create, update and distributed destroy (docs/behaviour.md §6). Not invalidate, region
events, gets or local operations (these never reach the queues).

Expiration events (``Event.expiration``) never go to a gateway sender, and an expiration
destroy goes to an async event queue only when its ``forward_expiration_destroy`` is set
(Geode ``AbstractGatewaySender.checkForDistribution``)."""

Produce = Callable[[str, bytes, bytes | None, int], None]
"""``produce(topic, value, key, partition)`` of the server's producer."""


class _Target(NamedTuple):
    topic: str
    parallel: bool
    remote_site_id: int | None
    filters: tuple[GatewayEventFilter, ...]
    partitions: int
    order_policy: OrderPolicy
    takes_expiration: bool


def dispatcher_event(event: Event, dispatcher: int) -> Event:
    """The event with its thread id widened by the serial dispatcher it goes to (Geode
    ``ConcurrentSerialGatewaySenderEventProcessor`` with
    ``ThreadIdentifier.createFakeThreadIDForParallelGateway``: the index in bits 32-47 and a
    WAN type in bits 48-55, the thread in bits 0-31)."""
    thread = (event.event_id.thread & 0xFFFF_FFFF) | (dispatcher << 32) | (1 << 48)
    return event._replace(event_id=event.event_id._replace(thread=thread))


def queue_partition(
    event: Event, bucket: int, *, parallel: bool, partitions: int, order_policy: OrderPolicy
) -> int:
    """The partition of a queue topic an event goes to.

    A parallel queue: the event's bucket. A serial one: the dispatcher its order policy picks
    among ``partitions`` (Geode ``ConcurrentSerialGatewaySenderEventProcessor``): by region
    and key (``KEY``), by originating member and thread (``THREAD``), or by bucket
    (``PARTITION``), each with CRC-32 so every server agrees.
    """
    if parallel:
        return bucket
    if partitions == 1:
        return 0
    if order_policy is OrderPolicy.THREAD:
        origin = f"{event.event_id.member}\0{event.event_id.thread}".encode()
        return zlib.crc32(origin) % partitions
    if order_policy is OrderPolicy.PARTITION:
        return bucket % partitions
    return bucket_of(event.region, event.key or "", partitions)


def stamp_origin(event: Event, site_id: int) -> Event:
    """The event with its origin site set (when it has none) and ``site_id`` among the
    sites it reached: what a gateway carries for loop prevention."""
    origin = event.origin_site_id or site_id
    reached = event.sites_reached
    if site_id not in reached:
        reached = (*reached, site_id)
    return event._replace(origin_site_id=origin, sites_reached=reached)


class GatewayEnqueuer:
    """Routes applied events into ``{ns}.gw.<sender>`` and ``{ns}.aeq.<queue>`` topics.

    Args:
        settings: The server's settings (``gateway_senders``, ``async_event_queues`` and
            their attachment to regions).

    Raises:
        ConfigurationError: an event filter cannot be loaded.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.site_id = settings.distributed_system_id
        self.total_buckets = settings.total_buckets
        topics = Topics(settings.namespace)
        self._partitions: dict[str, int] = {}
        self._retention_ms: dict[str, int] = {}
        self._by_region: dict[str, list[_Target]] = {}
        built: dict[str, _Target] = {}

        def target(topic: str, spec: GatewayQueueSpec, async_queue: bool) -> _Target:
            if topic not in built:
                filters = tuple(load_hook(n, GatewayEventFilter) for n in spec.event_filters)
                serial_partitions, policy = 1, OrderPolicy.KEY
                if isinstance(spec, GatewaySenderSpec):
                    serial_partitions, policy = spec.dispatcher_threads, spec.order_policy
                partitions = self.total_buckets if spec.parallel else serial_partitions
                built[topic] = _Target(
                    topic,
                    spec.parallel,
                    spec.remote_distributed_system_id,
                    filters,
                    partitions,
                    policy,
                    async_queue and spec.forward_expiration_destroy,
                )
                self._partitions[topic] = partitions
                if spec.queue_retention_ms is not None:
                    self._retention_ms[topic] = spec.queue_retention_ms
            return built[topic]

        for region, sender_ids in settings.region_gateway_senders.items():
            for sender_id in sender_ids:
                spec = settings.gateway_senders[sender_id]
                self._by_region.setdefault(region, []).append(
                    target(topics.gateway(sender_id), spec, async_queue=False)
                )
        for region, queue_ids in settings.region_async_event_queues.items():
            for queue_id in queue_ids:
                queue_spec = settings.async_event_queues[queue_id]
                self._by_region.setdefault(region, []).append(
                    target(topics.async_event_queue(queue_id), queue_spec, async_queue=True)
                )

    @property
    def topics(self) -> dict[str, int]:
        """``{queue topic: partitions}`` the server must create at start."""
        return dict(self._partitions)

    def topic_specs(self) -> list[TopicSpec]:
        """The queue topics the server must create at start, with their partitions and
        retention (kept until acknowledged, unless the queue's spec bounds it)."""
        return [
            acked_queue_spec(topic, partitions, self._retention_ms.get(topic, KEEP_UNTIL_ACKED))
            for topic, partitions in self._partitions.items()
        ]

    def __bool__(self) -> bool:
        return bool(self._by_region)

    def enqueue(self, event: Event, bucket: int, produce: Produce) -> int:
        """Queue one applied entry event for the senders and queues of its region.

        Args:
            event: The event as the server distributes it.
            bucket: Its bucket (the partition of a parallel queue).
            produce: The server's produce function.

        Returns:
            How many queues it went into.
        """
        targets = self._by_region.get(event.region)
        if not targets or event.kind not in DISTRIBUTABLE_KINDS:
            return 0
        stamped = stamp_origin(event, self.site_id) if self.site_id else event
        payload: bytes | None = None
        queued = 0
        for t in targets:
            if event.expiration and not t.takes_expiration:
                continue
            if t.remote_site_id is not None and t.remote_site_id in stamped.sites_reached:
                continue
            if t.filters and not all(f.before_enqueue(stamped) for f in t.filters):
                continue
            key = stamped.key.encode() if stamped.key is not None else None
            partition = queue_partition(
                stamped,
                bucket,
                parallel=t.parallel,
                partitions=t.partitions,
                order_policy=t.order_policy,
            )
            if not t.parallel and t.partitions > 1:
                # The dispatchers of one queue reorder a thread's events between them, so
                # the receiving site must track each dispatcher's share apart, or a later
                # sequence id applied first would drop an earlier one as a duplicate.
                produce(t.topic, encode(dispatcher_event(stamped, partition)), key, partition)
            else:
                if payload is None:
                    payload = encode(stamped)
                produce(t.topic, payload, key, partition)
            queued += 1
        return queued


__all__ = [
    "DISTRIBUTABLE_KINDS",
    "GatewayEnqueuer",
    "dispatcher_event",
    "queue_partition",
    "stamp_origin",
]
