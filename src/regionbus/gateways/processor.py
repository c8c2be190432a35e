"""The queue processor shared by gateway senders and async event queue dispatchers.

Geode's ``AbstractGatewaySenderEventProcessor`` peeks a batch from its queue, dispatches
it and removes it only after a successful dispatch. Here the queue is a Kafka topic
(``{ns}.gw.<sender>`` or ``{ns}.aeq.<queue>``), "peek" is reading from the committed
offsets and "remove" is committing the offsets past the batch (invariant 5: a batch leaves
the queue only after the remote site acked it), then deleting the records before them
(:mod:`regionbus.gateways.queue_trim`). One processor per queue is primary at a
time: it holds the queue's lease (:class:`regionbus.runtime.leases.Lease`), renewed on a thread;
a processor that loses it stops dispatching and re-reads from the committed offsets when
it is primary again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import redis
from confluent_kafka import Producer

from regionbus.gateways.queue_reader import QueueReader
from regionbus.runtime.leases import Lease
from regionbus.runtime.observability import Metric, MetricsEndpoint
from regionbus.runtime.redis_outage import RedisOutage, is_redis_unavailable
from regionbus.runtime.worker import BackgroundWorker
from regionbus.schemas.dead_letter import Source, dead_letter_headers
from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.kafka_clients import kafka_producer
from regionbus.schemas.messages import Event, EventKind
from regionbus.schemas.naming import Topics

log = logging.getLogger("regionbus.gateways")


def conflate(events: Sequence[Event]) -> list[Event]:
    """Batch conflation (Geode ``batch-conflation-enabled``): an UPDATE followed in the same
    batch by another UPDATE of the same key is dropped. Creates and destroys always stay,
    and an update is never moved across them."""
    last_update: dict[tuple[str, str | None], int] = {}
    dropped: set[int] = set()
    for index, event in enumerate(events):
        slot = (event.region, event.key)
        if event.kind is EventKind.UPDATE:
            previous = last_update.get(slot)
            if previous is not None:
                dropped.add(previous)
            last_update[slot] = index
        else:
            last_update.pop(slot, None)
    return [e for i, e in enumerate(events) if i not in dropped]


class ProcessorStats:
    """Counters of one queue processor since it started.

    Attributes:
        batches_dispatched: Batches dispatched successfully (acked / listener returned True).
        batches_redispatched: Dispatches repeated with ``possible_duplicate`` (no ack in
            time, listener returned False or raised).
        events_dispatched: Events in successfully dispatched batches.
        events_failed: Events the remote site reported as failed (dropped, logged).
        events_filtered: Events left out by ``before_transmit``.
        unreachable_retries: Waits because the remote site could not be reached.
        batches_sent: Gateway senders: batches the remote Kafka took (first sends and
            resends).
        backlog_events: Events of the queue not yet removed (see
            :meth:`QueueReader.backlog_events`), measured by the primary after each peek and
            removal; None while not primary.
        batch_sizes: Sizes of the dispatched batches, in order (the last 10,000).
        batches_in_flight: Gateway senders: batches sent and not acked yet, as of the
            dispatching thread's last turn.
        batches_in_flight_peak: Gateway senders: most batches in flight at once, measured
            as acks come in.
    """

    def __init__(self) -> None:
        self.batches_sent = 0
        self.backlog_events: int | None = None
        self.batches_dispatched = 0
        self.batches_redispatched = 0
        self.events_dispatched = 0
        self.events_failed = 0
        self.events_filtered = 0
        self.unreachable_retries = 0
        self.batch_sizes: list[int] = []
        self.batches_in_flight = 0
        self.batches_in_flight_peak = 0

    def dispatched(self, size: int) -> None:
        """Count one successfully dispatched batch of ``size`` events."""
        self.batches_dispatched += 1
        self.events_dispatched += size
        self.batch_sizes.append(size)
        del self.batch_sizes[:-10_000]


class QueueProcessor(BackgroundWorker):
    """Primary election, peek, dispatch and remove for one queue topic (a worker thread).

    Subclasses implement :meth:`_dispatch`.

    Args:
        role: Lease role (e.g. ``"gateway-sender:ny"``).
        namespace: Local site namespace.
        kafka_config: librdkafka settings of the local Kafka (connection and security).
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the queue consumer.
        redis_client: The local Redis (leases), from
        `regionbus.runtime.redis_connect.connect_redis`.
        member_id: This worker's member id (lease holder).
        topic: Queue topic.
        group_id: Consumer group of the queue's committed offsets.
        batch_size: Most events per batch.
        batch_time_interval_ms: Longest wait after a batch's first event.
        lease_ttl_ms: Lease time to live; renewed every third of it.
        metrics_port: Port of the worker's Prometheus endpoint: None = none, 0 = any free
            port (then read :attr:`metrics_port`). Source: the worker's settings.
        metrics_host: Address of that endpoint (the ``metrics_host`` setting, loopback
            by default).
        liveness_timeout_s: Longest time between two turns of its live loop, seconds (the
            ``liveness_timeout_s`` setting).
        shard: Which shard of the queue's partitions this processor reads (0-based; see
            :func:`shard_partitions`).
        shards: Shards the queue's partitions are split into (1: it reads them all).
    """

    def __init__(
        self,
        *,
        role: str,
        namespace: str,
        kafka_config: dict[str, Any],
        fetch_wait_max_ms: int,
        redis_client: redis.Redis,
        member_id: str,
        topic: str,
        group_id: str,
        batch_size: int,
        batch_time_interval_ms: int,
        lease_ttl_ms: int,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        liveness_timeout_s: float = 60.0,
        shard: int = 0,
        shards: int = 1,
    ) -> None:
        self.role = role
        self.member_id = member_id
        self.batch_size = batch_size
        self.batch_time_interval_ms = batch_time_interval_ms
        self.stats = ProcessorStats()
        self.topics = Topics(namespace)
        self._kafka_config = kafka_config
        self._redis = redis_client
        self._lease = Lease(self._redis, namespace, role, member_id, lease_ttl_ms)
        self._lease_ttl_ms = lease_ttl_ms
        self._reader = QueueReader(
            kafka_config,
            topic,
            group_id,
            self._dead_letter,
            fetch_wait_max_ms,
            shard=shard,
            shards=shards,
        )
        self._local_producer: Producer | None = None
        self._primary = threading.Event()
        self._reading = threading.Event()
        super().__init__(
            role,
            MetricsEndpoint(metrics_port, self._metric_families, address=metrics_host),
            liveness_timeout_s,
        )

    # --- lifecycle ---------------------------------------------------------------------

    def _setup(self) -> None:
        # Dead letters only, each flushed alone, so order and a rare duplicate do not matter;
        # not idempotent, as a refused Write would be fatal to an idempotent producer.
        self._local_producer = kafka_producer({**self._kafka_config, "acks": "all"})
        self.spawn(self._hold_lease, "lease")

    def _teardown(self) -> None:
        self._reader.close()
        self._lease.release()
        if self._local_producer is not None:
            self._local_producer.flush(5)
        self._close()
        self._redis.close()

    def _metric_families(self) -> list[Metric]:
        """The worker's metric families at a scrape (subclasses name theirs)."""
        return []

    @property
    def is_primary(self) -> bool:
        """True while this processor holds the queue's lease."""
        return self._primary.is_set()

    def wait_primary(self, timeout_s: float) -> bool:
        """Wait until this processor is primary and reads its queue."""
        return self._reading.wait(timeout_s)

    # --- lease -------------------------------------------------------------------------

    def _hold_lease(self) -> None:
        every_s = self._lease_ttl_ms / 3000
        outage = RedisOutage(self._redis, self.role, self.stopping)
        while not self.stopping.is_set():
            try:
                if self._lease.held:
                    if not self._lease.renew():
                        log.warning("%s: lease lost", self.role)
                        self._primary.clear()
                elif self._lease.try_acquire() is not None:
                    log.info("%s: %s is primary", self.role, self.member_id)
                    self._primary.set()
                outage.ended()
            except RegionBusError as exc:
                # Not primary while the lease cannot be renewed; an outage is logged once.
                if is_redis_unavailable(exc):
                    outage.began(exc)
                else:
                    log.warning("%s: lease: %s", self.role, exc)
                self._primary.clear()
            self.stopping.wait(every_s)

    # --- processing --------------------------------------------------------------------

    def _serve(self) -> None:
        opened = False
        while not self.stopping.is_set():
            self.turned()
            if not self._primary.is_set():
                if opened:
                    self._reader.close()
                    opened = False
                    self._reading.clear()
                self.stats.backlog_events = None
                self._primary.wait(0.2)
                continue
            if not opened:
                self._reader.open()
                opened = True
                self._reading.set()
            self._reader.trimmer.trim()
            self.stats.backlog_events = self._reader.backlog_events()
            if not self._can_peek():
                self.stopping.wait(0.05)
                continue
            batch = self._reader.peek(
                self.batch_size, self.batch_time_interval_ms, 0.2, self.stopping
            )
            if not batch:
                if self._reader.has_uncommitted:
                    self._reader.commit()
                continue
            # Measured again with the batch in hand: a dispatch may wait long (no ack).
            self.stats.backlog_events = self._reader.backlog_events()
            if self._dispatch([q.event for q in batch]) and self._primary.is_set():
                self._reader.commit()
            elif opened:
                # Stopping or no longer primary: re-read from the committed offsets later.
                self._reader.close()
                opened = False
                self._reading.clear()

    def _can_peek(self) -> bool:
        """False while dispatching is paused (async event queues)."""
        return True

    def _dispatch(self, events: list[Event]) -> bool:
        """Deliver one batch; True once it may leave the queue, False when stopping."""
        raise NotImplementedError

    def _close(self) -> None:
        """Release what a subclass opened."""

    def _dead_letter(
        self,
        raw: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        reason: str,
        last_offset: int | None = None,
    ) -> None:
        log.warning("dead-lettered %s[%d]@%d: %s", topic, partition, offset, reason)
        assert self._local_producer is not None
        source = Source(topic, partition, offset)
        headers = dead_letter_headers(reason, source, self.member_id, last_offset)
        self._local_producer.produce(self.topics.dead_letter, raw, None, headers=headers)
        self._local_producer.flush(10)


__all__ = ["ProcessorStats", "QueueProcessor", "conflate"]
