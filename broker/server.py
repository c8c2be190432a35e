"""The cache server: applies operations from ``{ns}.ops`` and pushes the events to clients.

One server owns every bucket for now (the HA issue adds election over the same buckets).
Per poll it takes a batch of operations, applies the plain ones to Redis in one pipelined
round trip (Lua scripts: entry versions, duplicate detection by EventID), runs server
``CacheWriter``s and ``CacheListener``s, routes each event into the subscription queue
``{ns}.queue.<client>`` of every interested client except the originator, replies on
``{ns}.reply.<client>`` and appends the event to ``{ns}.events``. Every
``message_sync_interval_s`` it flushes what it produced and only then commits its offsets
(ARCHITECTURE.md), so a restart re-processes a bounded window whose EventIDs Redis
recognises.

Undecodable or malformed messages go to ``{ns}.dead-letter`` with the reason; the server
keeps going (invariant 6).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka import Message as KafkaMessage
from confluent_kafka.admin import AdminClient

from broker.buckets import BucketElection
from broker.client_registry import (
    CLIENT_UNKNOWN,
    ClientRecord,
    ClientRegistry,
)
from broker.client_topics import ClientTopicPresence
from broker.config import ServerSettings
from broker.election import Lease, now_ms
from broker.interest import InterestRegistry, compile_interest_regex
from broker.observability import MetricsEndpoint, ServesMetrics
from broker.principals import Principal
from broker.queue_depth import QueueDepths
from broker.redis_connect import connect_redis
from broker.redis_outage import RedisOutage, is_redis_unavailable
from broker.security import SecurityGuard, audit_refusal
from broker.server_metrics import server_metric_families
from broker.store import ApplyResult, GatewayVersion, RegionStore, redis_errors
from broker.topic_keeper import TopicKeeper
from gateways.enqueue import GatewayEnqueuer
from schemas.callbacks import CacheListener, CacheWriter, EntryEvent, RegionEvent
from schemas.codec import decode, encode, encode_batches, split_batch
from schemas.errors import (
    AuthenticationError,
    CacheWriterError,
    ConfigurationError,
    DuplicateDurableClientError,
    MessageDecodeError,
    NotAuthorizedError,
    RegionBusError,
    RegionNotFoundError,
    TransportError,
    ValueTooLargeError,
)
from schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from schemas.messages import (
    Control,
    ControlKind,
    Entry,
    Event,
    EventKind,
    InterestKind,
    InterestResultPolicy,
    Marker,
    Operation,
    OperationKind,
    Reply,
)
from schemas.naming import Topics, bucket_of, bucket_role, check_name, region_bucket
from schemas.serializers import serializer_named
from schemas.signing import HEADER_PRINCIPAL, HeaderList, Headers
from schemas.topics import acked_queue_spec, server_topic_specs
from schemas.transport import assign_from, committed_offsets, poll_batch

log = logging.getLogger("regionbus.server")

_ENTRY_CHANGES = (OperationKind.PUT, OperationKind.DESTROY, OperationKind.INVALIDATE)
_REGION_CHANGES = (OperationKind.CLEAR, OperationKind.DESTROY_REGION)
_REGISTRY_CHANGES = (
    OperationKind.REGISTER_INTEREST,
    OperationKind.UNREGISTER_INTEREST,
    OperationKind.DISCONNECT,
)
# Clients whose acked offsets are re-read per sync for the queue depth gauges (round robin):
# bounds the admin requests a sync may make when many clients are connected.
_DEPTH_REFRESHES_PER_SYNC = 8
# Longest wait for a bucket's committed offsets, retries while the group coordinator loads.
_COMMITTED_TIMEOUT_S = 30.0


class InvalidOperationError(RegionBusError):
    """An operation decoded but is malformed (missing key, wrong bucket, no EventID)."""


@dataclass
class ServerStats:
    """Counters of one server since it started; its Prometheus metrics are read from here
    at scrape time (:mod:`broker.server_metrics`), so the two never disagree.

    Attributes:
        operations_applied: Changes applied to Redis (not counting duplicates).
        duplicates: Operations recognised as already applied by EventID.
        events_routed: Events produced into subscription queues.
        replies: Replies produced.
        replies_dropped: Replies not produced because the client has no reply topic.
        dead_letters: Messages sent to the dead-letter topic.
        errors: Operations refused with an error reply.
        durable_clients_expired: Durable clients unregistered by this server as the reaper.
        buckets_gained: Buckets this server became primary of (start, failover, handoff).
        buckets_lost: Buckets whose lease this server lost or was fenced out of.
        queue_full_waits: Times operations were held because a client's queue was full.
        clients_disconnected: Clients disconnected as unresponsive (queue full too long).
        buckets_fenced: Of ``buckets_lost``, those another server had taken over (a write
            refused for a stale fencing epoch).
        operations_applied_by_region: ``{region: {kind: count}}`` of
            ``operations_applied``, kind the lower-case ``OperationKind`` (``put``,
            ``destroy``, ``invalidate``, ``clear``, ``destroy_region``).
        events_routed_by_client: ``{client id: count}`` of ``events_routed``, for the
            clients this server still knows (a forgotten client's count goes with it).
        dead_letters_by_category: ``{category: count}`` of ``dead_letters``: ``undecodable``,
            ``unexpected_type``, ``invalid_operation`` or ``refused`` (security).
    """

    operations_applied: int = 0
    duplicates: int = 0
    events_routed: int = 0
    replies: int = 0
    replies_dropped: int = 0
    dead_letters: int = 0
    errors: int = 0
    durable_clients_expired: int = 0
    buckets_gained: int = 0
    buckets_lost: int = 0
    queue_full_waits: int = 0
    clients_disconnected: int = 0
    buckets_fenced: int = 0
    operations_applied_by_region: dict[str, dict[str, int]] = field(default_factory=dict)
    events_routed_by_client: dict[str, int] = field(default_factory=dict)
    dead_letters_by_category: dict[str, int] = field(default_factory=dict)

    def applied(self, region: str, kind: OperationKind) -> None:
        """Count one change applied to Redis (a duplicate is not one)."""
        self.operations_applied += 1
        by_kind = self.operations_applied_by_region.setdefault(region, {})
        name = kind.value.lower()
        by_kind[name] = by_kind.get(name, 0) + 1

    def routed(self, client_id: str) -> None:
        """Count one event queued for a client's subscription queue."""
        self.events_routed += 1
        self.events_routed_by_client[client_id] = (
            self.events_routed_by_client.get(client_id, 0) + 1
        )

    def dead_lettered(self, category: str) -> None:
        """Count one message sent to the dead-letter topic, by reason category."""
        self.dead_letters += 1
        self.dead_letters_by_category[category] = (
            self.dead_letters_by_category.get(category, 0) + 1
        )


@dataclass
class _Plugins:
    listeners: dict[str, list[CacheListener]] = field(default_factory=dict)
    writers: dict[str, list[CacheWriter]] = field(default_factory=dict)


def load_plugins(
    spec: dict[str, list[str]],
) -> tuple[dict[str, list[CacheListener]], dict[str, list[CacheWriter]]]:
    """Instantiate server-side listeners and writers named ``"module:Class"`` per region.

    Args:
        spec: ``{region: ["package.module:ClassName", ...]}``.

    Returns:
        ``(listeners, writers)`` by region; a class that is both is in both.

    Raises:
        ConfigurationError: a name does not import, or is neither a ``CacheListener`` nor a
            ``CacheWriter``.
    """
    listeners: dict[str, list[CacheListener]] = {}
    writers: dict[str, list[CacheWriter]] = {}
    for region, names in spec.items():
        for name in names:
            module_name, _, class_name = name.partition(":")
            try:
                instance = getattr(importlib.import_module(module_name), class_name)()
            except (ImportError, AttributeError, TypeError) as exc:
                raise ConfigurationError(f"cannot load plugin {name!r}: {exc}") from exc
            if not isinstance(instance, CacheListener | CacheWriter):
                raise ConfigurationError(
                    f"plugin {name!r} is neither CacheListener nor CacheWriter"
                )
            if isinstance(instance, CacheListener):
                listeners.setdefault(region, []).append(instance)
            if isinstance(instance, CacheWriter):
                writers.setdefault(region, []).append(instance)
    return listeners, writers


class CacheServer(ServesMetrics):
    """A cache server process (or thread) of one namespace.

    Args:
        settings: Validated server settings.
        listeners: Server-side ``CacheListener``s by region, in addition to
            ``settings.plugins``.
        writers: Server-side ``CacheWriter``s by region, in addition to ``settings.plugins``.

    Raises:
        ConfigurationError: a plugin cannot be loaded.
    """

    def __init__(
        self,
        settings: ServerSettings,
        *,
        listeners: dict[str, list[CacheListener]] | None = None,
        writers: dict[str, list[CacheWriter]] | None = None,
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.namespace)
        self.stats = ServerStats()
        loaded_listeners, loaded_writers = load_plugins(settings.plugins)
        self._plugins = _Plugins(loaded_listeners, loaded_writers)
        for region, items in (listeners or {}).items():
            self._plugins.listeners.setdefault(region, []).extend(items)
        for region, witems in (writers or {}).items():
            self._plugins.writers.setdefault(region, []).extend(witems)
        self._redis = connect_redis(settings)
        self.security = SecurityGuard(self._redis, settings) if settings.security_enabled else None
        self.store = RegionStore(self._redis, settings.namespace, settings.total_buckets)
        self.registry = InterestRegistry(self._redis, settings.namespace, settings.total_buckets)
        self._gateways = GatewayEnqueuer(settings)
        self.clients = ClientRegistry(
            self._redis, settings.namespace, settings.maximum_time_between_pings_ms
        )
        self._clients: dict[str, ClientRecord] = {}
        self._reaper = Lease(
            self._redis,
            settings.namespace,
            "reaper",
            settings.member_id,
            ttl_ms=int(settings.durable_client_reaper_interval_s * 3000),
        )
        self._admin: AdminClient | None = None
        self._topic_keeper: TopicKeeper | None = None
        self.election = BucketElection(
            self._redis,
            settings.namespace,
            settings.member_id,
            settings.total_buckets,
            settings.subscription_redundancy,
            settings.lease_ttl_ms,
        )
        self._owned: dict[int, int] = {}
        self._queue_clients: dict[str, str] = {}
        self._depths: QueueDepths | None = None
        self._full_queues: set[str] = set()
        self._overflowing: set[str] = set()
        self._throttled_until = 0.0
        self._queue_topics: dict[str, str] = {}
        self._reply_topics: ClientTopicPresence | None = None
        self._outbox: dict[str, list[bytes]] = {}
        self._positions: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._delivery_failures = 0
        self._metrics = MetricsEndpoint(
            settings.metrics_port, lambda: server_metric_families(self)
        )
        self._depth_cursor = 0
        self._redis_outage = RedisOutage(self._redis, settings.member_id, self._stop)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self, ready_timeout_s: float = 30.0) -> None:
        """Run the server on a background thread; return once it consumes.

        Args:
            ready_timeout_s: Longest wait for start-up, in seconds.

        Raises:
            RegionBusError: start-up failed (the cause is chained), or took too long.
        """
        self._thread = threading.Thread(target=self._run_guarded, name="cache-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(ready_timeout_s):
            self.stop()
            raise TransportError(f"cache server did not start within {ready_timeout_s} s")
        if self._failure is not None:
            raise TransportError(
                f"cache server failed to start: {self._failure}"
            ) from self._failure

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the server after a final flush and offset commit.

        Args:
            timeout_s: Longest wait for the server thread, in seconds.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        """True while the server thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the server thread, if one did."""
        return self._failure

    # --- observability (issue 7) ------------------------------------------------------

    @property
    def redis_outages(self) -> int:
        """Redis outages this server waited out since it started."""
        return self._redis_outage.outages

    @property
    def primary_buckets(self) -> tuple[int, ...]:
        """The buckets this server is primary of now."""
        return tuple(sorted(list(self._owned)))

    @property
    def secondary_buckets(self) -> tuple[int, ...]:
        """The buckets this server is a secondary of, as of the last election tick."""
        me = self.settings.member_id
        return tuple(v.bucket for v in list(self.election.views) if me in v.secondaries)

    @property
    def handles_client_lifecycle(self) -> bool:
        """True while this server is primary of bucket 0, which reads ``{ns}.control``
        (connects, pings, closes) for the whole namespace."""
        return 0 in self._owned

    def queue_depths_events(self) -> dict[str, int]:
        """``{client id: events}`` this server queued for each client and the client has
        not acked, as of the last re-read of its acks (see :mod:`broker.queue_depth`)."""
        return {} if self._depths is None else self._depths.snapshot()

    def _refresh_queue_depths(self) -> None:
        """While metrics are served, re-read the acks of a few clients per sync so their
        depth gauges stay current (capacity checks re-read only clients near the limit)."""
        if self._depths is None or self._metrics.port is None:
            return
        clients = self._depths.clients()
        if not clients:
            return
        count = min(_DEPTH_REFRESHES_PER_SYNC, len(clients))
        for step in range(count):
            self._depths.refresh(clients[(self._depth_cursor + step) % len(clients)])
        self._depth_cursor = (self._depth_cursor + count) % len(clients)

    def __enter__(self) -> CacheServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run_guarded(self) -> None:
        try:
            self.serve()
        except BaseException as exc:
            self._failure = exc
            log.exception("cache server %s stopped on error", self.settings.member_id)
        finally:
            self._ready.set()

    def serve(self) -> None:
        """Run the server loop in this thread until :meth:`stop` (or a signal) ends it,
        serving its metrics meanwhile when ``settings.metrics_port`` is set.

        Raises:
            TransportError: Kafka or Redis cannot be reached at start.
            ConfigurationError: the metrics port cannot be bound.
        """
        self._metrics.start()
        try:
            self._serve_until_stopped()
        finally:
            self._metrics.stop()

    def _serve_until_stopped(self) -> None:
        self._setup()
        self._ready.set()
        try:
            while not self._serve_until_redis_fails():
                pass
        finally:
            try:
                self._sync()
                self._reaper.release()
                self.election.leave()
            finally:
                assert self._consumer is not None and self._producer is not None
                self._consumer.close()
                self._producer.flush(10)

    def _serve_until_redis_fails(self) -> bool:
        """The server loop: True once stopped; False after it rode out a Redis outage (the
        caller runs it again, with fresh timers)."""
        sync_every_s = self.settings.message_sync_interval_s
        liveness_every_s = min(5.0, self.settings.maximum_time_between_pings_ms / 4000)
        next_sync = time.monotonic() + sync_every_s
        next_liveness = time.monotonic() + liveness_every_s
        reaper_every_s = self.settings.durable_client_reaper_interval_s
        next_reap = time.monotonic() + reaper_every_s
        elect_every_s = self.settings.lease_ttl_ms / 4000
        next_elect = time.monotonic() + elect_every_s
        assert self._consumer is not None and self._producer is not None
        try:
            while not self._stop.is_set():
                if self._throttle(time.monotonic()):
                    messages = []
                else:
                    messages = poll_batch(
                        self._consumer,
                        self.settings.poll_batch_size,
                        self.settings.poll_timeout_ms / 1000,
                    )
                if messages:
                    self._process(messages)
                self._producer.poll(0)
                now = time.monotonic()
                if now >= next_elect:
                    self._elect()
                    next_elect = time.monotonic() + elect_every_s
                self._keep_topics()
                if now >= next_sync:
                    self._sync(wait=False)
                    self._check_queue_capacity(now)
                    self._refresh_queue_depths()
                    next_sync = now + sync_every_s
                if now >= next_liveness:
                    if 0 in self._owned:
                        self._expire_silent_clients(now_ms())
                    next_liveness = now + liveness_every_s
                if now >= next_reap:
                    self._reap_durable_clients()
                    next_reap = now + reaper_every_s
        except Exception as exc:
            if not is_redis_unavailable(exc):
                raise
            self._ride_out_redis_outage(exc)
            return False
        return True

    def _setup(self) -> None:
        s = self.settings
        admin = self._admin = kafka_admin(s.librdkafka())
        self._depths = QueueDepths(admin, s.namespace)
        self._reply_topics = ClientTopicPresence(admin)
        self._topic_keeper = TopicKeeper(
            admin,
            [
                *server_topic_specs(self.topics, s.total_buckets),
                *(acked_queue_spec(name, n) for name, n in self._gateways.topics.items()),
            ],
            check_interval_s=s.message_sync_interval_s,
        )
        self._topic_keeper.ensure()
        for region in s.regions:
            self.store.create_region(region)
        self._clients = self.clients.all()
        loaded = self.registry.load(self._clients)
        self._producer = kafka_producer(
            s.librdkafka(
                **{
                    "linger.ms": s.linger_ms,
                    "acks": "all",
                    "enable.idempotence": True,
                    "queue.buffering.max.messages": 1_000_000,
                    # Every topic this server produces to was created and waited for before
                    # use, so an unknown one is gone (a closed client's), not propagating:
                    # fail its messages at once instead of after librdkafka's 30 s.
                    "topic.metadata.propagation.max.ms": 1000,
                    "client.id": s.member_id,
                }
            )
        )
        self._consumer = kafka_consumer(
            s.librdkafka(
                **{
                    "group.id": self.topics.server_group,
                    # An explicit offset, not OFFSET_BEGINNING: librdkafka resolves a logical
                    # offset on a just-created topic only on a 500 ms retry timer. Past the
                    # log start (retention), fall back to the earliest offset.
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "fetch.wait.max.ms": s.fetch_wait_max_ms,
                    "on_commit": self._on_commit,
                    "client.id": s.member_id,
                }
            )
        )
        self._consumer.assign([])
        self.election.join()
        self._elect()
        log.info(
            "cache server %s serving %s: primary of %d of %d buckets, %d clients, %d registrations",
            s.member_id,
            s.namespace,
            len(self._owned),
            s.total_buckets,
            len(self._clients),
            loaded,
        )

    # --- buckets: election, takeover, handoff ------------------------------------------

    def _elect(self) -> None:
        """Take part in the bucket election and act on what changed for this server."""
        try:
            result = self.election.tick()
        except TransportError as exc:
            if is_redis_unavailable(exc):
                raise  # the serve loop pauses every bucket until Redis is back
            log.error("bucket election failed, stopping every bucket: %s", exc)
            for bucket in list(self._owned):
                self._drop_bucket(bucket)
                self.election.release(bucket)
            return
        for bucket in result.lost:
            self._drop_bucket(bucket)
        if result.gained:
            self._take_buckets(result.gained)
        for bucket, receiver in result.to_hand_over.items():
            self._hand_over(bucket, receiver)

    def _partitions(self, bucket: int) -> list[TopicPartition]:
        partitions = [TopicPartition(self.topics.ops, bucket)]
        if bucket == 0:
            # The control topic (client connections) goes with bucket 0's primary.
            partitions.append(TopicPartition(self.topics.control, 0))
        return partitions

    def _take_buckets(self, gained: dict[int, int]) -> None:
        """Become primary of buckets: reload what other primaries persisted, then consume
        each bucket from its committed offset (the re-processing window is bounded by
        ``message_sync_interval_s``; re-applied EventIDs are recognised)."""
        assert self._consumer is not None
        self.stats.buckets_gained += len(gained)
        self._clients = self.clients.all()
        registry = InterestRegistry(
            self._redis, self.settings.namespace, self.settings.total_buckets
        )
        registry.load(self._clients)
        self.registry = registry
        wanted = [tp for bucket in gained for tp in self._partitions(bucket)]
        committed = committed_offsets(self._consumer, wanted, _COMMITTED_TIMEOUT_S)
        assignment = []
        for tp in committed:
            assignment.append(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
            if tp.offset >= 0:
                self._committed[(tp.topic, tp.partition)] = tp.offset
        self._owned.update(gained)
        assign_from(self._consumer, assignment, _COMMITTED_TIMEOUT_S, incremental=True)

    def _drop_bucket(self, bucket: int) -> None:
        """Stop processing a bucket at once (lease lost or fenced): nothing more of it is
        applied or committed here."""
        if bucket not in self._owned:
            return
        assert self._consumer is not None
        del self._owned[bucket]
        self.stats.buckets_lost += 1
        partitions = self._partitions(bucket)
        for tp in partitions:
            self._positions.pop((tp.topic, tp.partition), None)
            self._committed.pop((tp.topic, tp.partition), None)
        self._consumer.incremental_unassign(partitions)
        log.warning("%s stopped processing bucket %d", self.settings.member_id, bucket)

    def _hand_over(self, bucket: int, receiver: str) -> None:
        """Pass a bucket to a less loaded server cleanly: stop consuming it, flush and commit
        what was processed, then release the lease with a handoff note."""
        assert self._consumer is not None
        partitions = self._partitions(bucket)
        self._consumer.incremental_unassign(partitions)
        self._sync()
        del self._owned[bucket]
        for tp in partitions:
            self._positions.pop((tp.topic, tp.partition), None)
            self._committed.pop((tp.topic, tp.partition), None)
        self.election.hand_over(bucket, receiver)

    def _fenced(self, bucket: int) -> None:
        self.stats.buckets_fenced += 1
        log.warning(
            "%s was fenced out of bucket %d (another server took it over)",
            self.settings.member_id,
            bucket,
        )
        self._drop_bucket(bucket)
        self.election.release(bucket)

    # --- Redis outages ------------------------------------------------------------------

    def _ride_out_redis_outage(self, cause: BaseException) -> None:
        """Pause on a retriable Redis error until Redis is back, then resume from the
        committed offsets.

        What the outbox holds belongs to changes Redis applied, so it is sent; nothing
        after the committed offsets is committed before it has been applied again (the
        Lua apply recognises each EventID it applied before the outage and returns the
        stored result, so its event and reply are produced again, flagged
        ``possible_duplicate``).
        """
        self._redis_outage.began(cause)
        self._send_outbox()
        self._rewind_to_committed()
        while self._redis_outage.wait():
            try:
                self._resume_after_redis_outage()
            except Exception as exc:
                if not is_redis_unavailable(exc):
                    raise
                continue
            self._redis_outage.ended()
            return

    def _rewind_to_committed(self) -> None:
        """Consume every bucket held here again from its committed offset."""
        assert self._consumer is not None
        partitions = [tp for bucket in self._owned for tp in self._partitions(bucket)]
        if not partitions:
            return
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        # A handoff that failed half way may have unassigned its partitions already.
        self._consumer.incremental_unassign(
            [tp for tp in partitions if (tp.topic, tp.partition) in assigned]
        )
        unknown = [tp for tp in partitions if (tp.topic, tp.partition) not in self._committed]
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in (
                committed_offsets(self._consumer, unknown, _COMMITTED_TIMEOUT_S) if unknown else []
            )
        }
        assignment = []
        for tp in partitions:
            where = (tp.topic, tp.partition)
            self._positions.pop(where, None)
            offset = self._committed.get(where, committed.get(where, -1))
            assignment.append(TopicPartition(tp.topic, tp.partition, max(offset, 0)))
        self._consumer.incremental_assign(assignment)

    def _keep_topics(self) -> None:
        """Recreate server topics that disappeared (:class:`TopicKeeper`); read the
        partitions held here of each recreated topic from its start, and refresh the
        producer's metadata, which otherwise refuses the topic as unknown for minutes."""
        assert self._topic_keeper is not None
        assert self._consumer is not None and self._producer is not None
        renewed = self._topic_keeper.keep()
        if not renewed:
            return
        for topic in renewed:
            with suppress(KafkaException):
                self._producer.list_topics(topic=topic, timeout=5)
        held = [
            tp
            for bucket in self._owned
            for tp in self._partitions(bucket)
            if tp.topic in renewed
        ]
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        self._consumer.incremental_unassign(
            [tp for tp in held if (tp.topic, tp.partition) in assigned]
        )
        for tp in held:
            self._positions.pop((tp.topic, tp.partition), None)
            self._committed.pop((tp.topic, tp.partition), None)
        # The consumer's metadata still names the old topic: asked again before the fetch.
        assign_from(
            self._consumer,
            [TopicPartition(tp.topic, tp.partition, 0) for tp in held],
            _COMMITTED_TIMEOUT_S,
            incremental=True,
        )

    def _resume_after_redis_outage(self) -> None:
        """Before applying anything again: do not count the outage as the clients' silence,
        give up buckets whose lease this server no longer believes it holds (and leases of
        buckets it never started), then run the election, so a lease that lapsed during a
        long outage is lost here rather than through a fenced write.

        Raises:
            TransportError: Redis failed again.
        """
        now = now_ms()
        for record in self._clients.values():
            if record.connected:
                record.last_seen_ms = max(record.last_seen_ms, now)
        held = self.election.owned
        for bucket, epoch in list(self._owned.items()):
            if held.get(bucket) != epoch:
                self._drop_bucket(bucket)
        for bucket in held:
            if bucket not in self._owned:
                self.election.release(bucket)
        self._elect()

    # --- batch processing --------------------------------------------------------------

    def _process(self, messages: Sequence[KafkaMessage]) -> None:
        pending: list[tuple[Operation, int, int]] = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", error)
                if error.code() in _TOPIC_GONE and self._topic_keeper is not None:
                    self._topic_keeper.suspect(message.topic())
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None
            owner_bucket = partition if topic == self.topics.ops else 0
            if owner_bucket not in self._owned:
                continue
            self._positions[(topic, partition)] = offset + 1
            source = (topic, partition, offset)
            principal = None
            if self.security is not None:
                principal = self._authenticate(message, source)
                if principal is None:
                    continue
            try:
                items = split_batch(message.value())
            except MessageDecodeError as exc:
                self._dead_letter(message.value(), source, str(exc), category="undecodable")
                continue
            for raw in items:
                self._process_one(raw, source, pending, principal)
        self._flush(pending)
        self._send_outbox()

    def _process_one(
        self,
        raw: bytes,
        source: tuple[str, int, int],
        pending: list[tuple[Operation, int, int]],
        principal: Principal | None = None,
    ) -> None:
        topic, partition, offset = source
        try:
            decoded = decode(raw)
            if isinstance(decoded, Operation | Control):
                # Replies and queues are topics named after the client: a client id no topic
                # name can hold would fail the reply after the apply, killing this thread.
                check_name("client id", decoded.client_id)
        except MessageDecodeError as exc:
            self._dead_letter(raw, source, str(exc), category="undecodable")
            return
        except ConfigurationError as exc:
            self._dead_letter(raw, source, str(exc), category="invalid_operation")
            return
        if principal is not None and not self._authorize(decoded, raw, source, principal):
            return
        if topic == self.topics.control:
            if isinstance(decoded, Control):
                self._handle_control(decoded)
            else:
                self._dead_letter(
                    raw,
                    source,
                    f"expected Control, got {type(decoded).__name__}",
                    category="unexpected_type",
                )
            return
        if not isinstance(decoded, Operation):
            self._dead_letter(
                raw,
                source,
                f"expected Operation, got {type(decoded).__name__}",
                category="unexpected_type",
            )
            return
        op = decoded
        self._seen(op.client_id)
        try:
            self._validate(op, partition)
        except RegionBusError as exc:
            self._flush(pending)
            self._dead_letter(raw, source, str(exc), category="invalid_operation")
            self._reply_error(op, partition, exc)
            return
        if op.kind in _ENTRY_CHANGES or op.kind is OperationKind.GET:
            if op.kind is not OperationKind.GET and self._plugins.writers.get(op.region):
                self._flush(pending)
                if not self._run_entry_writers(op, partition):
                    return
            pending.append((op, partition, offset))
            return
        self._flush(pending)
        try:
            self._handle_other(op, partition, offset)
        except TransportError:
            raise
        except RegionBusError as exc:
            self._reply_error(op, partition, exc)

    def _validate(self, op: Operation, bucket: int) -> None:
        if op.kind in _ENTRY_CHANGES or op.kind is OperationKind.GET:
            if op.key is None:
                raise InvalidOperationError(f"{op.kind.value} needs a key")
            expected = bucket_of(op.region, op.key, self.settings.total_buckets)
            if expected != bucket:
                raise InvalidOperationError(
                    f"key {op.key!r} of region {op.region!r} belongs to bucket {expected}, "
                    f"not {bucket}"
                )
        if (op.kind in _ENTRY_CHANGES or op.kind in _REGION_CHANGES) and op.event_id is None:
            raise InvalidOperationError(f"{op.kind.value} needs an EventID")
        if op.kind is OperationKind.PUT:
            if op.value is None:
                raise InvalidOperationError("PUT needs a value")
            if len(op.value) > self.settings.max_value_size_bytes:
                raise ValueTooLargeError(
                    f"value of {len(op.value)} bytes exceeds max_value_size_bytes="
                    f"{self.settings.max_value_size_bytes}"
                )
        if op.kind in (OperationKind.REGISTER_INTEREST, OperationKind.UNREGISTER_INTEREST):
            if op.interest is None:
                raise InvalidOperationError(f"{op.kind.value} needs an interest spec")
            if op.interest.kind is InterestKind.REGEX:
                compile_interest_regex(op.interest.regex)

    def _flush(self, pending: list[tuple[Operation, int, int]]) -> None:
        if not pending:
            return
        batch: list[Any] = []
        # A bucket fenced earlier in this poll batch is no longer ours: drop its operations.
        pending[:] = [p for p in pending if p[1] in self._owned]
        site_id = self.settings.distributed_system_id
        for op, bucket, offset in pending:
            assert op.key is not None
            if op.kind is OperationKind.GET:
                batch.append((op.region, op.key, bucket))
            else:
                assert op.event_id is not None
                batch.append(
                    self.store.entry_args(
                        op.kind,
                        op.region,
                        op.key,
                        op.value,
                        op.serializer,
                        op.event_id._replace(bucket=bucket),
                        bucket,
                        offset,
                        want_old=bool(self._plugins.listeners.get(op.region)),
                        epoch=self._owned[bucket],
                        gateway_version=GatewayVersion(
                            op.timestamp_ms, op.origin_site_id or site_id
                        )
                        if site_id
                        else None,
                        from_gateway=op.origin_site_id not in (0, site_id),
                    )
                )
        results = self.store.run_batch(batch)
        for (op, bucket, _), result in zip(pending, results, strict=True):
            if isinstance(result, ApplyResult):
                self._after_entry_apply(op, bucket, result)
            else:
                self._reply_get(op, bucket, result)
        pending.clear()

    def _reply_get(self, op: Operation, bucket: int, result: tuple[bool, Entry | None]) -> None:
        exists, entry = result
        if not exists:
            self._reply_error(op, bucket, RegionNotFoundError(f"region {op.region!r} not found"))
            return
        self._reply(
            Reply(
                request_id=op.request_id,
                bucket=bucket,
                ok=True,
                found=entry is not None,
                version=entry.version if entry else None,
                value=entry.value if entry else None,
                serializer=entry.serializer if entry else None,
            ),
            op.client_id,
        )

    def _after_entry_apply(self, op: Operation, bucket: int, result: ApplyResult) -> None:
        if result.status == "FENCED":
            if bucket in self._owned:
                self._fenced(bucket)
            return
        if result.status == "ERR":
            self.stats.errors += 1
            self._reply(
                Reply(
                    request_id=op.request_id,
                    bucket=bucket,
                    ok=False,
                    error_type=result.error_type,
                    error_message=_error_text(result.error_type, op),
                ),
                op.client_id,
            )
            return
        duplicate = result.status == "DUP"
        if result.event_kind is not None and result.version is not None:
            assert op.event_id is not None
            event = Event(
                event_id=op.event_id._replace(bucket=bucket),
                kind=result.event_kind,
                region=op.region,
                version=result.version,
                timestamp_ms=op.timestamp_ms,
                originator=op.client_id,
                key=op.key,
                value=op.value
                if result.event_kind in (EventKind.CREATE, EventKind.UPDATE)
                else None,
                serializer=op.serializer,
                possible_duplicate=op.possible_duplicate or duplicate,
                callback_argument=op.callback_argument,
                origin_site_id=op.origin_site_id,
                sites_reached=op.sites_reached,
            )
            if not duplicate:
                self._run_entry_listeners(event, result.old_value)
            self._distribute_entry_event(event, bucket)
            if self._gateways:
                self._gateways.enqueue(event, bucket, self._produce)
        self._reply_applied(op, bucket, result)

    def _reply_applied(self, op: Operation, bucket: int, result: ApplyResult) -> None:
        """Count an applied (or recognised duplicate) change and tell its originator."""
        duplicate = result.status == "DUP"
        if duplicate:
            self.stats.duplicates += 1
        else:
            self.stats.applied(op.region, op.kind)
        self._reply(
            Reply(
                request_id=op.request_id,
                bucket=bucket,
                ok=True,
                event_kind=result.event_kind,
                duplicate=duplicate,
                version=result.version,
            ),
            op.client_id,
        )

    # --- writers and listeners ---------------------------------------------------------

    def _decoder(self) -> Callable[[bytes | None, str | None], Any]:
        def decode_value(data: bytes | None, serializer: str | None) -> Any:
            return None if data is None else serializer_named(serializer).loads(data)

        return decode_value

    def _run_entry_writers(self, op: Operation, bucket: int) -> bool:
        """Run server writers before an entry change; False (error replied) if one aborts."""
        assert op.key is not None
        exists, entry = self.store.get(op.region, op.key, bucket)
        if not exists or (entry is None and op.kind is not OperationKind.PUT):
            return True  # the apply script reports the missing region / entry
        kind = (
            (EventKind.UPDATE if entry is not None else EventKind.CREATE)
            if op.kind is OperationKind.PUT
            else EventKind.DESTROY
            if op.kind is OperationKind.DESTROY
            else EventKind.INVALIDATE
        )
        event = EntryEvent(
            region=op.region,
            key=op.key,
            kind=kind,
            event_id=op.event_id,
            version=-1,
            origin_remote=True,
            new_value_bytes=op.value,
            old_value_bytes=entry.value if entry else None,
            serializer=op.serializer,
            possible_duplicate=op.possible_duplicate,
            callback_argument=op.callback_argument,
            decoder=self._decoder(),
        )
        for writer in self._plugins.writers.get(op.region, []):
            method = {
                EventKind.CREATE: writer.before_create,
                EventKind.UPDATE: writer.before_update,
                EventKind.DESTROY: writer.before_destroy,
            }.get(kind)
            if method is None:
                continue
            try:
                method(event)
            except Exception as exc:
                self._reply_error(op, bucket, _as_writer_error(exc))
                return False
        return True

    def _run_entry_listeners(self, event: Event, old_value: bytes | None) -> None:
        listeners = self._plugins.listeners.get(event.region)
        if not listeners:
            return
        assert event.key is not None
        entry_event = EntryEvent(
            region=event.region,
            key=event.key,
            kind=event.kind,
            event_id=event.event_id,
            version=event.version,
            origin_remote=True,
            new_value_bytes=event.value,
            old_value_bytes=old_value,
            serializer=event.serializer,
            possible_duplicate=event.possible_duplicate,
            callback_argument=event.callback_argument,
            decoder=self._decoder(),
        )
        for listener in listeners:
            method = {
                EventKind.CREATE: listener.after_create,
                EventKind.UPDATE: listener.after_update,
                EventKind.INVALIDATE: listener.after_invalidate,
                EventKind.DESTROY: listener.after_destroy,
            }[event.kind]
            try:
                method(entry_event)
            except Exception:
                log.exception("server CacheListener %r failed on %s", listener, event.event_id)

    # --- distribution ------------------------------------------------------------------

    def _queue_topic(self, client_id: str) -> str:
        topic = self._queue_topics.get(client_id)
        if topic is None:
            topic = self._queue_topics[client_id] = self.topics.queue(client_id)
            self._queue_clients[topic] = client_id
        return topic

    def _distribute_entry_event(self, event: Event, bucket: int) -> None:
        assert event.key is not None
        full = encode(event)
        key_bytes = event.key.encode()
        self._produce(self.topics.events, full, key_bytes, partition=bucket)
        targets = self.registry.route(event.region, event.key, bucket)
        targets.pop(event.originator, None)
        if self.security is not None:
            targets = self.security.readers(targets, event.region, event.key)
        if not targets:
            return
        invalidate: bytes | None = None
        for client_id, receive_values in targets.items():
            if receive_values or event.kind not in (EventKind.CREATE, EventKind.UPDATE):
                payload = full
            else:
                if invalidate is None:
                    invalidate = encode(event._replace(kind=EventKind.INVALIDATE, value=None))
                payload = invalidate
            self._outbox.setdefault(self._queue_topic(client_id), []).append(payload)
            self.stats.routed(client_id)

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int = -1,
        on_delivery: Callable[[KafkaError | None, KafkaMessage], None] | None = None,
        headers: HeaderList | None = None,
    ) -> None:
        assert self._producer is not None
        callback = on_delivery or self._on_delivery
        while True:
            try:
                if partition >= 0:
                    self._producer.produce(
                        topic,
                        value,
                        key,
                        partition=partition,
                        on_delivery=callback,
                        headers=headers,
                    )
                else:
                    self._producer.produce(
                        topic, value, key, on_delivery=callback, headers=headers
                    )
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                # The producer knows the topic is gone (deleted): as a failed delivery.
                self._delivery_failed(topic, exc.args[0])
                return

    def _on_delivery(self, error: KafkaError | None, message: KafkaMessage) -> None:
        if error is not None:
            self._delivery_failed(message.topic() or "", error)

    def _delivery_failed(self, topic: str, error: KafkaError) -> None:
        if error.code() in _TOPIC_GONE and self.topics.is_client_topic(topic):
            # The client closed and deleted its topics: what was meant for it is moot, and
            # must not hold back the commit of everything else.
            if self._reply_topics is not None:
                self._reply_topics.forget(topic)
            log.info("dropped a message for %s: the topic is gone (%s)", topic, error)
            return
        self._delivery_failures += 1
        log.error("delivery to %s failed: %s", topic, error)
        if error.code() in _TOPIC_GONE and self._topic_keeper is not None:
            self._topic_keeper.suspect(topic)

    def _reply(self, reply: Reply, client_id: str) -> None:
        topic = self.topics.reply(client_id)
        assert self._reply_topics is not None
        if not self._reply_topics.exists(topic):
            # No such client (a server-side application writing to {ns}.ops, or a client
            # that has closed): nobody reads the reply.
            self.stats.replies_dropped += 1
            return
        self._outbox.setdefault(topic, []).append(encode(reply))
        self.stats.replies += 1

    def _send_outbox(self) -> None:
        """Produce what one poll batch queued per subscription queue and reply topic, as
        few Kafka messages as possible (:func:`schemas.codec.encode_batches`), in order."""
        outbox, self._outbox = self._outbox, {}
        for topic, framed in outbox.items():
            client_id = self._queue_clients.get(topic)
            values = list(encode_batches(framed))
            for value in values:
                if client_id is None:
                    self._produce(topic, value, None)
                    continue
                count = len(framed) if len(values) == 1 else len(split_batch(value))
                self._produce(
                    topic, value, None, on_delivery=self._queue_delivery(client_id, count)
                )

    def _queue_delivery(
        self, client_id: str, events: int
    ) -> Callable[[KafkaError | None, KafkaMessage], None]:
        def delivered(error: KafkaError | None, message: KafkaMessage) -> None:
            if error is not None:
                self._on_delivery(error, message)
            elif self._depths is not None:
                self._depths.delivered(client_id, message.offset() or 0, events)

        return delivered

    # --- subscription queue capacity ---------------------------------------------------

    def _check_queue_capacity(self, now: float) -> None:
        """Start slowing operations down when a client's queue holds
        ``maximum_message_count`` unacked events (SPEC §4: a full queue slows producers
        for a bounded time rather than dropping events)."""
        if self._depths is None or self._throttled_until:
            return
        limit = self.settings.maximum_message_count
        full = [
            c
            for c in self._depths.clients_at_or_over(limit)
            if c not in self._overflowing and self._depths.refresh(c) >= limit
        ]
        for client_id in list(self._overflowing):
            if self._depths.refresh(client_id) < limit:
                self._overflowing.discard(client_id)
        if full:
            log.warning(
                "subscription queues full (%d unacked events): %s; holding operations for up "
                "to %d ms",
                limit,
                ", ".join(full),
                self.settings.maximum_queue_full_wait_ms,
            )
            self.stats.queue_full_waits += 1
            self._full_queues = set(full)
            self._throttled_until = now + self.settings.maximum_queue_full_wait_ms / 1000

    def _throttle(self, now: float) -> bool:
        """While a queue is full: True (do not take new operations) until it drains or the
        wait is over; then the client's queue may grow, or it is disconnected if the
        operator chose ``disconnect_unresponsive_clients``."""
        if not self._throttled_until:
            return False
        assert self._depths is not None
        limit = self.settings.maximum_message_count
        self._full_queues = {c for c in self._full_queues if self._depths.refresh(c) >= limit}
        if self._full_queues and now < self._throttled_until:
            time.sleep(0.05)
            return True
        for client_id in self._full_queues:
            if self.settings.disconnect_unresponsive_clients:
                log.warning("disconnecting unresponsive client %s (queue full)", client_id)
                self.stats.clients_disconnected += 1
                self._disconnect_everywhere(client_id, keep_alive=False)
                # Stop routing to it here at once: the DISCONNECTs wait behind every bucket's
                # backlog, and what is routed meanwhile would fill a new count to the limit.
                self.registry.drop_client(client_id)
                self._depths.forget(client_id)
                self.clients.remove(client_id)
                self._clients.pop(client_id, None)
            else:
                log.warning("queue of %s stays over its capacity: not waiting again", client_id)
                self._overflowing.add(client_id)
        self._full_queues = set()
        self._throttled_until = 0.0
        return False

    def _reply_error(self, op: Operation, bucket: int, exc: RegionBusError) -> None:
        self.stats.errors += 1
        try:
            self._reply(
                Reply(
                    request_id=op.request_id,
                    bucket=bucket,
                    ok=False,
                    error_type=type(exc).__name__,
                    error_message=str(exc),
                ),
                op.client_id,
            )
        except RegionBusError:
            log.warning("cannot reply to %r: %s", op.client_id, exc)

    def _dead_letter(
        self,
        raw: bytes | None,
        source: tuple[str, int, int],
        reason: str,
        extra_headers: HeaderList | None = None,
        *,
        category: str,
    ) -> None:
        """Send a message the server cannot process to ``{ns}.dead-letter``, unchanged, with
        the reason and where it came from in headers (``rb.reason``, ``rb.source.*``);
        ``category`` (see :class:`ServerStats`) labels the dead-letter metric."""
        self.stats.dead_lettered(category)
        topic, partition, offset = source
        log.warning("dead-lettered %s[%d]@%d: %s", topic, partition, offset, reason)
        headers: HeaderList = [
            ("rb.reason", reason.encode()),
            ("rb.source.topic", topic.encode()),
            ("rb.source.partition", str(partition).encode()),
            ("rb.source.offset", str(offset).encode()),
            ("rb.server", self.settings.member_id.encode()),
            *(extra_headers or []),
        ]
        self._produce(self.topics.dead_letter, raw, None, headers=headers)

    # --- region operations, interest, keys ---------------------------------------------

    def _handle_other(self, op: Operation, bucket: int, offset: int) -> None:
        if op.kind in _REGION_CHANGES:
            self._handle_region_change(op, bucket, offset)
            return
        if op.kind in _REGISTRY_CHANGES and not self._still_primary(bucket):
            return
        if op.kind is OperationKind.REGISTER_INTEREST:
            self._handle_register(op, bucket)
        elif op.kind is OperationKind.UNREGISTER_INTEREST:
            assert op.interest is not None
            self.registry.unregister(op.client_id, op.region, op.interest)
            self._reply(Reply(request_id=op.request_id, bucket=bucket, ok=True), op.client_id)
        elif op.kind is OperationKind.DISCONNECT:
            self._handle_disconnect(op, bucket)
        elif op.kind is OperationKind.READY_FOR_EVENTS:
            self._handle_ready_for_events(op, bucket)
        elif op.kind is OperationKind.KEYS:
            exists, entries, _ = self.store.snapshot(op.region, bucket, with_values=False)
            if not exists:
                self._reply_region_missing(op, bucket)
                return
            self._reply_entries(op, bucket, [Entry(e.key, e.version) for e in entries])

    def _still_primary(self, bucket: int) -> bool:
        """Check the bucket's fencing epoch before an interest-registry write (those are
        plain Redis writes, not epoch-checked scripts): a primary that was paused past its
        lease must not undo what its successor registered. On a stale epoch the bucket is
        dropped and False returned."""
        if bucket not in self._owned:
            return False
        with redis_errors():
            current = self._redis.get(self.store.keys.epoch(bucket_role(bucket)))
        if current is not None and int(current) == self._owned[bucket]:
            return True
        self._fenced(bucket)
        return False

    def _reply_region_missing(self, op: Operation, bucket: int) -> None:
        self._reply_error(op, bucket, RegionNotFoundError(f"region {op.region!r} not found"))

    def _handle_region_change(self, op: Operation, bucket: int, offset: int) -> None:
        assert op.event_id is not None
        expected = region_bucket(op.region, self.settings.total_buckets)
        if bucket != expected:
            raise InvalidOperationError(
                f"{op.kind.value} of {op.region!r} belongs to bucket {expected}, not {bucket}"
            )
        writers = self._plugins.writers.get(op.region, [])
        if writers:
            region_event = RegionEvent(
                op.region, _region_kind(op.kind), op.event_id, True, op.callback_argument
            )
            for writer in writers:
                method = (
                    writer.before_region_clear
                    if op.kind is OperationKind.CLEAR
                    else writer.before_region_destroy
                )
                try:
                    method(region_event)
                except Exception as exc:
                    self._reply_error(op, bucket, _as_writer_error(exc))
                    return
        result = self.store.apply_region(
            op.kind,
            op.region,
            op.event_id._replace(bucket=bucket),
            bucket,
            offset,
            epoch=self._owned[bucket],
        )
        if result.status in ("ERR", "FENCED"):
            self._after_entry_apply(op, bucket, result)
            return
        duplicate = result.status == "DUP"
        if result.event_kind is not None and result.version is not None:
            event = Event(
                event_id=op.event_id._replace(bucket=bucket),
                kind=result.event_kind,
                region=op.region,
                version=result.version,
                timestamp_ms=op.timestamp_ms,
                originator=op.client_id,
                possible_duplicate=op.possible_duplicate or duplicate,
                callback_argument=op.callback_argument,
                origin_site_id=op.origin_site_id,
                sites_reached=op.sites_reached,
            )
            payload = encode(event)
            self._produce(self.topics.events, payload, None, partition=bucket)
            recipients = self.registry.clients_of_region(op.region) - {op.client_id}
            if self.security is not None:
                recipients = self.security.region_readers(recipients, op.region)
            for client_id in recipients:
                self._outbox.setdefault(self._queue_topic(client_id), []).append(payload)
                self.stats.routed(client_id)
            if not duplicate:
                self._run_region_listeners(event)
            if result.event_kind is EventKind.REGION_DESTROY:
                self.registry.forget_region(op.region)
        self._reply_applied(op, bucket, result)

    def _run_region_listeners(self, event: Event) -> None:
        region_event = RegionEvent(
            event.region, event.kind, event.event_id, True, event.callback_argument
        )
        for listener in self._plugins.listeners.get(event.region, []):
            method = (
                listener.after_region_clear
                if event.kind is EventKind.REGION_CLEAR
                else listener.after_region_destroy
            )
            try:
                method(region_event)
            except Exception:
                log.exception("server CacheListener %r failed on %s", listener, event.event_id)

    def _handle_register(self, op: Operation, bucket: int) -> None:
        spec = op.interest
        assert spec is not None
        keys = [
            k for k in spec.keys if bucket_of(op.region, k, self.settings.total_buckets) == bucket
        ]
        if spec.policy is InterestResultPolicy.NONE:
            exists = self._region_exists(op.region)
            entries: list[Entry] = []
            version = self.store.region_version(op.region)
        else:
            key_filter = None
            if spec.kind is InterestKind.REGEX:
                pattern = compile_interest_regex(spec.regex)
                key_filter = lambda key: pattern.fullmatch(key) is not None  # noqa: E731
            exists, entries, version = self.store.snapshot(
                op.region,
                bucket,
                keys if spec.kind is InterestKind.KEYS else None,
                key_filter,
                with_values=spec.policy is InterestResultPolicy.KEYS_VALUES,
            )
        if not exists:
            self._reply_region_missing(op, bucket)
            return
        self.registry.register(op.client_id, op.region, spec, bucket, keys)
        self._reply_entries(op, bucket, entries, version)

    def _region_exists(self, region: str) -> bool:
        with redis_errors():
            return bool(self._redis.sismember(self.store.keys.regions, region))

    def _reply_entries(
        self, op: Operation, bucket: int, entries: list[Entry], version: int | None = None
    ) -> None:
        """Reply with entries, split into chunks of ``reply_chunk_bytes``; the last chunk
        carries ``version`` (for registrations: the region version at the snapshot)."""
        chunks: list[list[Entry]] = [[]]
        size = 0
        for entry in entries:
            entry_size = len(entry.key) + len(entry.value or b"") + 24
            if chunks[-1] and size + entry_size > self.settings.reply_chunk_bytes:
                chunks.append([])
                size = 0
            chunks[-1].append(entry)
            size += entry_size
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            reply = Reply(
                request_id=op.request_id,
                bucket=bucket,
                ok=True,
                entries=tuple(chunk),
                more=not last,
                version=version if last else None,
            )
            self._reply(reply, op.client_id)

    # --- clients -----------------------------------------------------------------------

    def _seen(self, client_id: str) -> None:
        record = self._clients.get(client_id)
        if record is not None and record.connected:
            record.last_seen_ms = now_ms()

    def _handle_control(self, control: Control) -> None:
        client_id = control.client_id
        if control.kind is ControlKind.CONNECT:
            self._connect(control)
        elif control.kind is ControlKind.PING:
            record = self._clients.get(client_id)
            current = (
                record is not None
                and record.connected
                and (control.connection_id is None or record.connection_id == control.connection_id)
            )
            if current:
                assert record is not None
                record.last_seen_ms = now_ms()
                self.clients.save(client_id, record)
            if control.request_id:
                self._reply(
                    Reply(
                        request_id=control.request_id,
                        bucket=-1,
                        ok=True,
                        client_state=None if current else CLIENT_UNKNOWN,
                    ),
                    client_id,
                )
        elif control.kind is ControlKind.CLOSE:
            record = self._clients.get(client_id)
            if record is None or (
                control.connection_id is not None and record.connection_id != control.connection_id
            ):
                return
            # The client has already had every bucket drop its interest (DISCONNECT).
            keep = record.durable and control.keep_alive
            if keep:
                self._disconnect_durable(client_id, record, now_ms())
            else:
                self._forget_client(client_id)
            log.info("client %s closed (keep_alive=%s)", client_id, control.keep_alive)

    def _connect(self, control: Control) -> None:
        """Record a (re)connection, or refuse a second live connection of a durable id."""
        client_id = control.client_id
        durable = control.durable_client_id is not None
        connection_id = control.connection_id or client_id
        now = now_ms()
        result = self.clients.connect(
            client_id,
            connection_id,
            durable=durable,
            durable_client_timeout_s=control.durable_client_timeout_s,
            now_ms=now,
        )
        if result.state == "REFUSED":
            error = DuplicateDurableClientError(
                f"durable client {client_id!r} is already connected (connection "
                f"{result.live_connection_id}, last heard from "
                f"{now - (result.live_last_seen_ms or now)} ms ago)"
            )
            log.warning("refused a second connection %s: %s", connection_id, error)
            self._reply(
                Reply(
                    request_id=control.request_id,
                    bucket=-1,
                    ok=False,
                    error_type=type(error).__name__,
                    error_message=str(error),
                ),
                client_id,
            )
            return
        self._clients[client_id] = ClientRecord(
            durable, connection_id, True, now, control.durable_client_timeout_s
        )
        log.info("client %s connected (%s, %s)", client_id, connection_id, result.state)
        self._reply(
            Reply(
                request_id=control.request_id,
                bucket=-1,
                ok=True,
                client_state=result.state,
                subscription_conflation=self.settings.enable_subscription_conflation,
            ),
            client_id,
        )

    def _disconnect_durable(self, client_id: str, record: ClientRecord, at_ms: int) -> None:
        """Keep a durable client's queue and durable interest; start its timeout clock."""
        record.connected = False
        record.disconnected_at_ms = at_ms
        self.clients.save(client_id, record)

    def _forget_client(self, client_id: str) -> None:
        if self._depths is not None:
            self._depths.forget(client_id)
        self.stats.events_routed_by_client.pop(client_id, None)
        self._clients.pop(client_id, None)
        self._queue_topics.pop(client_id, None)
        if self._reply_topics is not None:
            self._reply_topics.forget(self.topics.reply(client_id))
        self.clients.remove(client_id)
        if self.security is not None:
            self.security.forget_client(client_id)

    def _expire_silent_clients(self, now: int) -> None:
        """Treat a client silent for ``maximum_time_between_pings_ms`` as gone: drop a
        non-durable one; keep a durable one's queue and durable interest (seed 001:
        abnormal disconnect) until its timeout."""
        limit_ms = self.settings.maximum_time_between_pings_ms
        for client_id, record in list(self._clients.items()):
            if not record.connected or now - record.last_seen_ms <= limit_ms:
                continue
            log.warning(
                "client %s sent nothing for more than %d ms: %s",
                client_id,
                limit_ms,
                "keeping its queue and durable interest" if record.durable else "dropping it",
            )
            self._disconnect_everywhere(client_id, keep_alive=record.durable)
            if record.durable:
                self._disconnect_durable(client_id, record, record.last_seen_ms)
            else:
                self._forget_client(client_id)

    def _reap_durable_clients(self) -> None:
        """As the reaper (a singleton role), unregister durable clients away too long: first
        every bucket's primary drops their interest (a DISCONNECT in each bucket), then,
        once all have, their topics and offsets are deleted."""
        if self._reaper.try_acquire() is None:
            return
        now = now_ms()
        for client_id, record in self.clients.all().items():
            if record.expired(now):
                self._start_unregistering(client_id, record)
            elif record.reaping:
                self._finish_unregistering(client_id)

    def _start_unregistering(self, client_id: str, record: ClientRecord) -> None:
        log.error(
            "ALERT: durable client %s stayed away longer than its durable-client-timeout of "
            "%d s: unregistering it (queue, offsets, durable interest)",
            client_id,
            record.durable_client_timeout_s,
        )
        self.stats.durable_clients_expired += 1
        record.reaping = True
        self.clients.save(client_id, record)
        self._clients.pop(client_id, None)
        with redis_errors():
            self._redis.delete(self.store.keys.dropped(client_id))
        self._disconnect_everywhere(client_id, keep_alive=False)

    def _finish_unregistering(self, client_id: str) -> None:
        with redis_errors():
            dropped = self._redis.scard(self.store.keys.dropped(client_id))
        if dropped < self.settings.total_buckets:
            return
        assert self._producer is not None and self._admin is not None
        # Deliver what was queued for the client before its topics go (afterwards each such
        # message would fail as "unknown topic" and only be dropped).
        self._producer.flush(10)
        queue, reply = self.topics.queue(client_id), self.topics.reply(client_id)
        group = self.topics.client_group(client_id)
        for future in self._admin.delete_topics([queue, reply], operation_timeout=10).values():
            try:
                future.result(timeout=15)
            except KafkaException as exc:
                log.warning("deleting the topics of %s: %s", client_id, exc)
        for future in self._admin.delete_consumer_groups(
            [group, f"{group}.reply"], request_timeout=10
        ).values():
            try:
                future.result(timeout=15)
            except KafkaException as exc:
                log.info("deleting the offsets of %s: %s", client_id, exc)
        self._forget_client(client_id)
        with redis_errors():
            self._redis.delete(self.store.keys.dropped(client_id))
        log.warning("durable client %s unregistered", client_id)

    def _disconnect_everywhere(self, client_id: str, *, keep_alive: bool) -> None:
        """Have every bucket's primary drop a client's interest (all, or all but the durable
        registrations), in the order of each bucket's operations."""
        op = Operation(
            request_id=0,
            client_id=client_id,
            kind=OperationKind.DISCONNECT,
            region="",
            timestamp_ms=now_ms(),
            keep_alive=keep_alive,
        )
        value = encode(op)
        for bucket in range(self.settings.total_buckets):
            headers = None
            if self.security is not None:
                headers = self.security.server_headers(self.topics.ops, bucket, value)
            self._produce(self.topics.ops, value, None, partition=bucket, headers=headers)

    def _handle_disconnect(self, op: Operation, bucket: int) -> None:
        self.registry.drop_client(op.client_id, keep_durable=op.keep_alive)
        if not op.keep_alive:
            with redis_errors():
                pipe = self._redis.pipeline()
                pipe.sadd(self.store.keys.dropped(op.client_id), bucket)
                pipe.expire(self.store.keys.dropped(op.client_id), 3600)
                pipe.execute()
        if op.request_id:
            self._reply(Reply(request_id=op.request_id, bucket=bucket, ok=True), op.client_id)

    def _handle_ready_for_events(self, op: Operation, bucket: int) -> None:
        """Write this bucket's marker into the client's queue: what the queue holds of this
        bucket before it was queued while the client was away (seed 001, step 1)."""
        connection_id = op.event_id.member if op.event_id is not None else None
        marker = Marker(op.client_id, now_ms(), bucket, connection_id)
        self._outbox.setdefault(self._queue_topic(op.client_id), []).append(encode(marker))
        self._reply(Reply(request_id=op.request_id, bucket=bucket, ok=True), op.client_id)

    # --- security (issue 8): authentication and authorization ---------------------------

    def _authenticate(
        self, message: KafkaMessage, source: tuple[str, int, int]
    ) -> Principal | None:
        """Check a Kafka message's signature before anything of it is decoded into effects;
        on refusal audit it, dead-letter it and tell the client(s) it names. None if refused."""
        assert self.security is not None
        topic, partition, offset = source
        try:
            return self.security.authenticate(
                message.headers(), topic, partition, offset, message.value()
            )
        except AuthenticationError as exc:
            claimed = _header(message.headers(), HEADER_PRINCIPAL)
            self._refuse(message.value(), source, exc, claimed, message.headers())
            return None

    def _authorize(
        self, decoded: object, raw: bytes, source: tuple[str, int, int], principal: Principal
    ) -> bool:
        """Check one decoded request against its principal's permissions; on refusal audit
        it, dead-letter it and reply ``NotAuthorizedError``."""
        assert self.security is not None
        try:
            if isinstance(decoded, Operation):
                self.security.authorize_operation(principal, decoded)
            elif isinstance(decoded, Control):
                self.security.authorize_control(principal, decoded)
        except NotAuthorizedError as exc:
            self._refuse(raw, source, exc, principal.name)
            return False
        return True

    def _refuse(
        self,
        raw: bytes | None,
        source: tuple[str, int, int],
        exc: RegionBusError,
        principal: str | None,
        headers: Headers | None = None,
    ) -> None:
        topic, partition, offset = source
        where = f"{topic}/{partition}/{offset}"
        try:
            items = [decode(item) for item in split_batch(raw)]
        except MessageDecodeError:
            items = []
        if not items:
            audit_refusal(principal, "message", None, None, str(exc), where)
        for item in items:
            if isinstance(item, Operation):
                audit_refusal(
                    principal, item.kind.value, item.region, item.client_id, str(exc), where
                )
                self._reply_error(item, partition, exc)
            elif isinstance(item, Control):
                audit_refusal(principal, item.kind.value, None, item.client_id, str(exc), where)
                if item.request_id:
                    self.stats.errors += 1
                    self._reply(
                        Reply(
                            request_id=item.request_id,
                            bucket=-1,
                            ok=False,
                            error_type=type(exc).__name__,
                            error_message=str(exc),
                        ),
                        item.client_id,
                    )
        pairs = list(headers.items()) if isinstance(headers, dict) else headers or []
        signing: HeaderList = [(k, v) for k, v in pairs if k.startswith("rb.")]
        self._dead_letter(
            raw,
            source,
            f"{type(exc).__name__}: {exc}",
            [("rb.refused", b"1"), *signing],
            category="refused",
        )

    # --- offsets -----------------------------------------------------------------------

    def _sync(self, *, wait: bool = True) -> None:
        """Flush produced events, then commit consumed offsets and prune stored results.

        Args:
            wait: Commit synchronously (a handoff, the stop). The periodic sync does not:
                the commit's round trip to the group coordinator would hold every bucket
                of this server, and :meth:`_on_commit` records and prunes once it is done.
        """
        if self._producer is None or self._consumer is None:
            return
        failures_before = self._delivery_failures
        remaining = self._producer.flush(30)
        if remaining or self._delivery_failures != failures_before:
            log.error("not committing: %d messages undelivered", remaining)
            return
        offsets = [
            TopicPartition(topic, partition, position)
            for (topic, partition), position in self._positions.items()
            if self._committed.get((topic, partition)) != position
        ]
        if not offsets:
            return
        try:
            if not wait:
                self._consumer.commit(offsets=offsets, asynchronous=True)
                return
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("offset commit failed (will retry): %s", exc)
            return
        self._committed_up_to(offsets)

    def _on_commit(self, error: KafkaError | None, offsets: list[TopicPartition]) -> None:
        """An asynchronous commit's answer (served by the consumer's poll)."""
        if error is not None:
            log.warning("offset commit failed (will retry): %s", error)
            return
        self._committed_up_to([tp for tp in offsets if tp.error is None])

    def _committed_up_to(self, offsets: list[TopicPartition]) -> None:
        """Note committed offsets of partitions still held, and prune the stored results
        of operations below them (no failover can re-process those any more)."""
        held = [tp for tp in offsets if (tp.topic, tp.partition) in self._positions]
        for tp in held:
            self._committed[(tp.topic, tp.partition)] = tp.offset
        self.store.prune_results(
            {tp.partition: tp.offset for tp in held if tp.topic == self.topics.ops}
        )


_TOPIC_GONE = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
"""Client errors that mean the topic (or its partition) does not exist (any more)."""


def _header(headers: Headers | None, name: str) -> str | None:
    pairs = list(headers.items()) if isinstance(headers, dict) else headers or []
    for key, value in pairs:
        if key == name and value is not None:
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None


def _region_kind(kind: OperationKind) -> EventKind:
    return EventKind.REGION_CLEAR if kind is OperationKind.CLEAR else EventKind.REGION_DESTROY


def _as_writer_error(exc: Exception) -> RegionBusError:
    if isinstance(exc, CacheWriterError):
        return exc
    return CacheWriterError(f"server CacheWriter aborted: {type(exc).__name__}: {exc}")


def _error_text(error_type: str | None, op: Operation) -> str:
    if error_type == "RegionNotFoundError":
        return f"region {op.region!r} not found"
    if error_type == "EntryNotFoundError":
        return f"entry {op.key!r} not found in region {op.region!r}"
    return f"{op.kind.value} failed: {error_type}"


__all__ = [
    "CacheServer",
    "InvalidOperationError",
    "ServerStats",
    "load_plugins",
]
