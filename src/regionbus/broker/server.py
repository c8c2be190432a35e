"""The cache server: a loop that reads operations and hands them to its named parts.

Where an operation goes (docs/development.md, "How an operation travels"):

1. It enters from partition ``bucket`` of ``{ns}.ops`` (client lifecycle messages from
   ``{ns}.control``), read by the bucket's primary (:mod:`regionbus.broker.ownership`), checked at
   the front door when security is on (:mod:`regionbus.broker.admission`), decoded and validated
   (:mod:`regionbus.broker.intake`, :mod:`regionbus.broker.validation`); what cannot be processed is
   dead-lettered (invariant 6), and so is a message whose handling raised anything else
   (:mod:`regionbus.broker.poison`).
2. The handler of its kind runs (:mod:`regionbus.broker.handlers`, one table): entry operations are
   applied in batches (:mod:`regionbus.broker.entry_ops`) through the region store's Lua scripts,
   with server writers before and listeners after (:mod:`regionbus.broker.plugins`).
3. Each applied change is routed by interest to the subscription queues of the
   interested clients (:mod:`regionbus.broker.notifier`) and queued for gateways
   (:mod:`regionbus.broker.gateway_queues`); its originator gets a reply. All of it is produced by
   the outbox (:mod:`regionbus.broker.outbox`).
4. Every ``message_sync_interval_s`` the positions processed are noted, and committed
   once everything produced before them is delivered (ARCHITECTURE.md), so a new primary
   re-processes a bounded window whose EventIDs Redis recognises.

The loop also expires the entries of its buckets that are due (:mod:`regionbus.broker.expiration`),
takes part in the bucket election, expires silent clients and reaps durable
clients away too long (:mod:`regionbus.broker.client_lifecycle`), holds operations back while a
client's queue is full, and rides out Redis outages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from contextlib import suppress
from typing import Final

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from regionbus.broker.buckets import BucketElection, buckets_unready_reason
from regionbus.broker.client_registry import ClientRegistry
from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqRegistry
from regionbus.broker.functions import registered_functions
from regionbus.broker.gateway_queues import GatewayEnqueuer
from regionbus.broker.interest import InterestRegistry
from regionbus.broker.outbox import TOPIC_GONE
from regionbus.broker.plugins import ServerPlugins
from regionbus.broker.poison import is_infrastructure_error, set_aside
from regionbus.broker.security import SecurityGuard
from regionbus.broker.server_latency import ServerLatency
from regionbus.broker.server_metrics import server_metric_families
from regionbus.broker.server_parts import ServerParts, wire_parts
from regionbus.broker.stats import ServerStats
from regionbus.broker.store import RegionStore
from regionbus.broker.topic_keeper import TopicKeeper
from regionbus.runtime.observability import MetricsEndpoint
from regionbus.runtime.redis_connect import connect_redis, replica_wait
from regionbus.runtime.redis_outage import RedisOutage, is_redis_unavailable
from regionbus.runtime.worker import BackgroundWorker
from regionbus.schemas.callbacks import CacheListener, CacheLoader, CacheWriter
from regionbus.schemas.dead_letter import Source
from regionbus.schemas.errors import TransportError
from regionbus.schemas.functions import Function
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.kafka_outage import KafkaOutage, quiet_config
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_guard import Polled, UnreadableRecords
from regionbus.schemas.topics import (
    queue_retention_ms,
    server_topic_specs,
)
from regionbus.schemas.tracing import tracing_for
from regionbus.schemas.transport import poll_batch

log = logging.getLogger("regionbus.server")

SEND_EVERY_S: Final = 0.02
"""Longest a poll batch holds back what it produced (a busy 1,000-message batch took 0.7 s,
all of it the wait of its first event and reply); a quicker batch is still sent whole."""


class CacheServer(BackgroundWorker):
    """A cache server of one namespace, on its own thread (:meth:`start`, :meth:`stop`).

    Args:
        settings: Validated server settings.
        listeners: Server-side ``CacheListener``s by region, in addition to
            ``settings.plugins``.
        writers: Server-side ``CacheWriter``s by region, in addition to ``settings.plugins``.
        loaders: A server-side ``CacheLoader`` by region (one each), in addition to
            ``settings.plugins``.
        functions: Server-side ``Function``s to register by their ids, in addition to
            ``settings.functions`` (Geode ``FunctionService.registerFunction``).

    Raises:
        ConfigurationError: a plugin, function or gateway event filter cannot be loaded, or
            two functions share an id.
    """

    def __init__(
        self,
        settings: ServerSettings,
        *,
        listeners: dict[str, list[CacheListener]] | None = None,
        writers: dict[str, list[CacheWriter]] | None = None,
        loaders: dict[str, CacheLoader] | None = None,
        functions: list[Function] | None = None,
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.namespace)
        self.stats = ServerStats()
        self.plugins = ServerPlugins.load(settings.plugins, listeners, writers, loaders)
        self.functions = registered_functions(settings.functions, functions or [])
        self._redis = connect_redis(settings)
        waits = replica_wait(self._redis, settings)
        self.security = SecurityGuard(self._redis, settings) if settings.security_enabled else None
        self.store = RegionStore(
            self._redis, settings.namespace, settings.total_buckets, replica_wait=waits
        )
        self.registry = InterestRegistry(self._redis, settings.namespace, settings.total_buckets)
        self.cqs = CqRegistry(self._redis, settings.namespace, settings.total_buckets)
        self.clients = ClientRegistry(self._redis, settings.namespace)
        self.election = BucketElection(
            self._redis,
            settings.namespace,
            settings.member_id,
            settings.total_buckets,
            settings.subscription_redundancy,
            settings.lease_ttl_ms,
            replica_wait=waits,
        )
        self._gateways = GatewayEnqueuer(settings)
        self.tracing = tracing_for(settings, "regionbus-server", caller_spans=False)
        """The server's spans, None with tracing off (`regionbus.broker.tracing`)."""
        self._parts: ServerParts | None = None
        super().__init__(
            settings.member_id,
            MetricsEndpoint(
                settings.metrics_port,
                lambda: server_metric_families(self),
                address=settings.metrics_host,
            ),
            settings.liveness_timeout_s,
        )
        self.latency = (
            ServerLatency(
                self._metrics, {"namespace": settings.namespace, "member": settings.member_id}
            )
            if self._metrics.enabled
            else None
        )
        """The latency histograms, kept while a metrics endpoint is configured."""
        self._redis_outage = RedisOutage(self._redis, settings.member_id, self.stopping)
        self._kafka_outage = KafkaOutage(f"cache server {settings.member_id}")

    # --- what operators and tests read -------------------------------------------------

    @property
    def redis_outages(self) -> int:
        """Redis outages this server waited out since it started."""
        return self._redis_outage.outages

    @property
    def kafka_outages(self) -> int:
        """Kafka outages (every broker unreachable) this server waited out since it started."""
        return self._kafka_outage.outages

    @property
    def primary_buckets(self) -> tuple[int, ...]:
        """The buckets this server is primary of now."""
        return () if self._parts is None else tuple(sorted(self._parts.ownership.owned))

    @property
    def secondary_buckets(self) -> tuple[int, ...]:
        """The buckets this server is a secondary of, as of the last election tick."""
        me = self.settings.member_id
        return tuple(v.bucket for v in list(self.election.views) if me in v.secondaries)

    @property
    def buckets_without_primary(self) -> int:
        """Buckets of the namespace that had no primary in the last election tick (all of
        them before the first): a failover under way, or too few servers."""
        views = list(self.election.views)
        free = sum(1 for v in views if v.primary is None)
        return free + max(0, self.settings.total_buckets - len(views))

    @property
    def handles_client_lifecycle(self) -> bool:
        """True while this server is primary of bucket 0, which reads ``{ns}.control``
        (connects, pings, closes) for the whole namespace."""
        return 0 in self.primary_buckets

    def _unready_reason(self) -> str | None:
        """Not ready while Kafka is unreachable or a bucket has no primary (as of the last
        election tick: a failover or the first election is under way)."""
        if self._kafka_outage.ongoing:
            return "waiting: Kafka unreachable"
        return buckets_unready_reason(self.election.views, self.settings.total_buckets)

    def queue_depths_events(self) -> dict[str, int]:
        """``{client id: events}`` this server queued for each client and the client has
        not acked, as of the last re-read of its acks (see :mod:`regionbus.broker.client_proxy`)."""
        return {} if self._parts is None else self._parts.notifier.proxies.snapshot()

    def events_routed_by_client(self) -> dict[str, int]:
        """``{client id: events}`` this server routed to each client it serves."""
        return {} if self._parts is None else self._parts.notifier.proxies.routed()

    # --- set-up and tear-down ----------------------------------------------------------

    def _setup(self) -> None:
        s = self.settings
        admin = kafka_admin(s.librdkafka(**quiet_config()))
        topic_keeper = TopicKeeper(
            admin,
            [
                *server_topic_specs(
                    self.topics,
                    s.total_buckets,
                    s.client_topic_partitions,
                    queue_retention_ms(s.max_durable_client_timeout_s),
                ),
                *self._gateways.topic_specs(),
            ],
            check_interval_s=s.message_sync_interval_s,
        )
        topic_keeper.ensure()
        for region in s.regions:
            self.store.create_region(region)
        producer_config = {
            "acks": "all",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000,
            # Every topic this server produces to was created and waited for before use,
            # so an unknown one is gone (a closed client's), not propagating: fail its
            # messages at once instead of after librdkafka's 30 s.
            "topic.metadata.propagation.max.ms": 1000,
        }
        producer = kafka_producer(
            s.librdkafka(
                **{
                    **producer_config,
                    "linger.ms": s.linger_ms,
                    "client.id": s.member_id,
                    **self._kafka_outage.client_config("producer"),
                }
            )
        )
        # Its own producer, so that queue records and replies never wait behind an event's
        # request (librdkafka: one request per partition) and events may linger.
        events_producer = kafka_producer(
            s.librdkafka(
                **{
                    **producer_config,
                    "linger.ms": s.events_linger_ms,
                    "client.id": f"{s.member_id}.events",
                    **self._kafka_outage.client_config("events producer", watched=False),
                }
            )
        )
        consumer = kafka_consumer(
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
                    "client.id": s.member_id,
                    "on_commit": self._on_commit,
                    **self._kafka_outage.client_config("consumer"),
                }
            )
        )
        self._parts = wire_parts(
            self,
            self._redis,
            self._gateways,
            admin,
            topic_keeper,
            (producer, events_producer),
            consumer,
        )
        lifecycle = self._parts.lifecycle
        loaded = self._load_subscriptions(lifecycle.reload())
        consumer.assign([])
        self.election.join()
        # Renewing from before the first election: taking over every bucket (assigning its
        # partitions from their committed offsets) can take longer than a lease lives on a
        # loaded machine, and the leases taken first would lapse before any renewal.
        self.spawn(lambda: self.election.keep_leases(self.stopping), "leases")
        self._elect()
        log.info(
            "cache server %s serving %s: primary of %d of %d buckets, %d clients, %d registrations",
            s.member_id,
            s.namespace,
            len(self._parts.ownership.owned),
            s.total_buckets,
            len(lifecycle.records),
            loaded,
        )

    def _teardown(self) -> None:
        parts = self._parts
        if parts is None:
            return
        try:
            parts.ownership.sync(wait=True)
            parts.lifecycle.release_reaper()
            self.election.leave()
        finally:
            parts.loads.close()
            parts.handlers.queries.close()
            parts.functions.close()
            parts.outbox.send()  # the executions' answers: an is_ha one is executed again
            parts.consumer.close()
            parts.outbox.release_all()
            parts.outbox.flush(10)

    def _on_commit(self, error: KafkaError | None, offsets: list[TopicPartition]) -> None:
        """The consumer's answer to an asynchronous commit, for the bucket ownership (the
        consumer is made before the parts that use it)."""
        if self._parts is not None:
            self._parts.ownership.on_commit(error, offsets)

    # --- the loop ----------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._serve_until_redis_fails():
            pass

    def _serve_until_redis_fails(self) -> bool:
        """The server loop: True once stopped; False after it rode out a Redis outage (the
        caller runs it again, with fresh timers)."""
        parts = self._parts
        assert parts is not None
        s = self.settings
        sync_every_s = s.message_sync_interval_s
        liveness_every_s = min(5.0, s.maximum_time_between_pings_ms / 4000)
        reaper_every_s = s.durable_client_reaper_interval_s
        elect_every_s = s.lease_ttl_ms / 4000
        poll_timeout_s = s.poll_timeout_ms / 1000
        start = time.monotonic()
        next_sync, next_liveness = start + sync_every_s, start + liveness_every_s
        next_reap, next_elect = start + reaper_every_s, start + elect_every_s
        try:
            while not self.stopping.is_set():
                self.turned()
                parts.ownership.drop_lost()
                poll_s = parts.handlers.initial_results.poll_s(poll_timeout_s)
                messages = poll_batch(parts.consumer, s.poll_batch_size, poll_s)
                if messages:
                    self._process(messages)
                if parts.intake.connects.admit_due() + parts.handlers.initial_results.run():
                    parts.end_batch()
                parts.expiration.tick(time.monotonic())
                # What worker threads finished is answered now, not with the next batch of
                # messages (on an idle server, a client's next ping: seconds away).
                loads_answered = parts.loads.poll()
                queries_answered = parts.handlers.answer_queries()
                if parts.functions.poll() or loads_answered or queries_answered:
                    parts.end_batch()
                parts.release_holds()
                parts.outbox.poll()
                parts.ownership.commit_settled()
                now = time.monotonic()
                if now >= next_elect:
                    self._elect()
                    next_elect = time.monotonic() + elect_every_s
                self._keep_topics(parts)
                if now >= next_sync:
                    parts.ownership.sync()
                    parts.notifier.refresh_depths(gauges=self._metrics.port is not None)
                    next_sync = now + sync_every_s
                if now >= next_liveness:
                    if self.handles_client_lifecycle:
                        parts.lifecycle.expire_silent()
                    next_liveness = now + liveness_every_s
                if now >= next_reap:
                    parts.lifecycle.prune()
                    parts.lifecycle.reap()
                    next_reap = now + reaper_every_s
        except Exception as exc:
            if not is_redis_unavailable(exc):
                raise
            with self.waiting("Redis unavailable"):
                self._ride_out_redis_outage(exc)
            return False
        return True

    def _elect(self) -> None:
        """Take part in the bucket election; reload what other primaries persisted (clients
        and interest) when this server gained buckets."""
        parts = self._parts
        assert parts is not None
        try:
            gained = parts.ownership.elect()
        except TransportError as exc:
            if is_redis_unavailable(exc):
                raise  # the serve loop pauses every bucket until Redis is back
            log.error("bucket election failed, stopping every bucket: %s", exc)
            parts.ownership.stop_every_bucket()
            return
        if gained:
            self._load_subscriptions(parts.lifecycle.reload())

    def _load_subscriptions(self, client_ids: Iterable[str]) -> int:
        """Load the persisted interest and continuous queries of these clients, active in
        every bucket. Returns how many registrations and CQs were loaded."""
        clients = list(client_ids)
        return self.registry.load(clients) + self.cqs.load(clients)

    def _keep_topics(self, parts: ServerParts) -> None:
        """Recreate server topics that disappeared (:class:`TopicKeeper`); read the
        partitions held here of each recreated topic from its start, and refresh the
        producer's metadata, which otherwise refuses the topic as unknown for minutes."""
        renewed = parts.topic_keeper.keep()
        if not renewed:
            return
        for topic in renewed:
            for producer in parts.outbox.producers:
                with suppress(KafkaException):
                    producer.list_topics(topic=topic, timeout=5)
        parts.ownership.restart_from_the_start(renewed)

    def _ride_out_redis_outage(self, cause: BaseException) -> None:
        """Pause on a retriable Redis error until Redis is back, then resume from the
        committed offsets.

        What the outbox holds belongs to changes Redis applied, so it is sent; nothing
        after the committed offsets is committed before it has been applied again (the
        Lua apply recognises each EventID it applied before the outage and returns the
        stored result, so its event and reply are produced again, flagged
        ``possible_duplicate``).
        """
        parts = self._parts
        assert parts is not None
        self._redis_outage.began(cause)
        parts.entries.discard()
        parts.handlers.forget_reads()  # the operations after the commit are read again
        parts.send()
        parts.ownership.rewind_to_committed()
        while self._redis_outage.wait():
            try:
                parts.lifecycle.outage_ended()
                parts.ownership.reconcile_with_leases()
                self._elect()
            except Exception as exc:
                if not is_redis_unavailable(exc):
                    raise
                continue
            self._redis_outage.ended()
            return

    # --- intake ------------------------------------------------------------------------

    def _process(self, messages: Sequence[Polled]) -> None:
        """Process polled messages for at most a quarter of the lease TTL: the rest are read
        again at the next tick, so the loop's other duties (the election, commits, clients'
        liveness) keep their pace however slow the work is. What is produced is sent at the
        end, or every :data:`SEND_EVERY_S` while the batch lasts longer."""
        parts = self._parts
        assert parts is not None
        parts.lifecycle.new_poll_batch()
        started = time.monotonic()
        deadline = started + self.settings.lease_ttl_ms / 4000
        send_at = started + SEND_EVERY_S
        for index, message in enumerate(messages):
            parts.ownership.drop_lost()
            now = time.monotonic()
            if now >= deadline:
                self._read_again(parts, messages[index:])
                break
            if now >= send_at:
                parts.end_batch()
                send_at = time.monotonic() + SEND_EVERY_S
            if isinstance(message, UnreadableRecords):
                # Dead-lettered once and committed past, as any record it cannot decode.
                if parts.ownership.consumed(message.topic, message.partition, message.last_offset):
                    parts.outbox.dead_letter_unreadable(message)
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", error)
                if error.code() in TOPIC_GONE and message.topic():
                    parts.topic_keeper.suspect(message.topic())
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None
            if not parts.ownership.consumed(topic, partition, offset):
                continue
            source = Source(topic, partition, offset)
            try:
                parts.intake.message(message, source)
            except Exception as exc:
                if is_infrastructure_error(exc):
                    raise
                set_aside(parts.outbox, message.value(), source, exc)
        parts.end_batch()

    def _read_again(self, parts: ServerParts, messages: Sequence[Polled]) -> None:
        try:
            parts.ownership.read_again(messages)
        except KafkaException as exc:
            log.warning("cannot seek back, processing again from the committed offsets: %s", exc)
            parts.end_batch()
            parts.ownership.rewind_to_committed()


__all__ = ["CacheServer"]
