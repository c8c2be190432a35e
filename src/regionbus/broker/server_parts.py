"""The parts a cache server wires at start, once Kafka is reachable, and what is done with
several of them at once: the end of a batch, and the release of held queues.

Each part gets only the collaborators it uses; the one object per client
(`regionbus.broker.client_proxy.ClientProxy`) acts through the outbox, the holds of full
queues, the routing tables and the security guard (:class:`ClientServices`), so routing
and the client lifecycle reach a client through its proxy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import redis
from confluent_kafka import Consumer, Producer

from regionbus.broker.admission import Admission
from regionbus.broker.buckets import BucketElection
from regionbus.broker.client_lifecycle import ClientLifecycle
from regionbus.broker.client_proxy import ClientProxies, ClientServices
from regionbus.broker.client_registry import ClientRegistry
from regionbus.broker.client_topics import ClientTopicPartitions
from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqRegistry
from regionbus.broker.distribution import Distribution
from regionbus.broker.entry_ops import EntryOperations
from regionbus.broker.expiration import EntryExpiration
from regionbus.broker.functions import FunctionExecutions
from regionbus.broker.gateway_queues import GatewayEnqueuer
from regionbus.broker.handlers import OperationHandlers
from regionbus.broker.intake import OperationIntake
from regionbus.broker.interest import InterestRegistry
from regionbus.broker.loading import EntryLoads
from regionbus.broker.notifier import CacheClientNotifier
from regionbus.broker.outbox import Outbox
from regionbus.broker.ownership import BucketOwnership
from regionbus.broker.plugins import ServerPlugins
from regionbus.broker.queue_acks import QueueAcks
from regionbus.broker.queue_holds import PARKED_BYTES_MAX, QueueHolds
from regionbus.broker.security import SecurityGuard
from regionbus.broker.server_latency import ServerLatency
from regionbus.broker.stats import ServerStats
from regionbus.broker.store import RegionStore
from regionbus.broker.topic_keeper import TopicKeeper
from regionbus.broker.tracing import ServerSpans
from regionbus.runtime.leases import Lease
from regionbus.schemas.functions import Function
from regionbus.schemas.kafka_clients import KafkaAdmin
from regionbus.schemas.naming import REAPER_ROLE, Topics
from regionbus.schemas.topics import client_topic_specs
from regionbus.schemas.tracing import Tracing


class ServerCore(Protocol):
    """What a cache server holds before Kafka is reachable
    (`regionbus.broker.server.CacheServer`)."""

    settings: ServerSettings
    topics: Topics
    stats: ServerStats
    plugins: ServerPlugins
    functions: dict[str, Function]
    security: SecurityGuard | None
    store: RegionStore
    registry: InterestRegistry
    cqs: CqRegistry
    clients: ClientRegistry
    election: BucketElection
    latency: ServerLatency | None
    tracing: Tracing | None


@dataclass
class ServerParts:
    """What the server wires at start, once Kafka is reachable."""

    admin: KafkaAdmin
    topic_keeper: TopicKeeper
    producer: Producer
    consumer: Consumer
    outbox: Outbox
    ownership: BucketOwnership
    notifier: CacheClientNotifier
    lifecycle: ClientLifecycle
    entries: EntryOperations
    loads: EntryLoads
    expiration: EntryExpiration
    handlers: OperationHandlers
    functions: FunctionExecutions
    admission: Admission | None
    intake: OperationIntake

    holds: QueueHolds
    registry: InterestRegistry
    latency: ServerLatency | None = None

    def end_batch(self) -> None:
        """The end of a batch of work: apply the entry operations batched so far, then send
        what the batch produced (their events and replies with the rest), in that order;
        the batch's interest registrations are persisted before any reply goes."""
        self.entries.apply()
        self.registry.save()
        self.handlers.forget_reads()
        self.send()

    def send(self) -> None:
        """Send what was gathered (:meth:`Outbox.send`) and time what waited for it."""
        self.outbox.send()
        if self.latency is not None:
            self.latency.sent()

    def release_holds(self) -> None:
        """At each turn of the loop: end the holds of full queues that have room again or
        waited long enough, disconnect the clients the operator chose to drop for it, and
        send what waited for them."""
        ended = self.holds.tick(over_budget=self.outbox.parked_bytes > PARKED_BYTES_MAX)
        for client_id in sorted(ended.disconnected):
            self.lifecycle.disconnect_unresponsive(client_id)
        if ended.any or not self.holds:
            self.outbox.release(ended.disconnected)


def wire_parts(
    server: ServerCore,
    redis_client: redis.Redis,
    gateways: GatewayEnqueuer,
    admin: KafkaAdmin,
    topic_keeper: TopicKeeper,
    producer: Producer,
    consumer: Consumer,
) -> ServerParts:
    """Wire a server's parts, once Kafka is reachable.

    Args:
        server: What the server holds already (settings, stores, registries, guard).
        redis_client: The server's Redis connection (the reaper's lease).
        gateways: The gateway queues changes are queued for.
        admin: Kafka admin client.
        topic_keeper: Keeps the server topics.
        producer: The server's producer (the outbox's).
        consumer: The server's consumer of ``{ns}.ops`` and ``{ns}.control``.

    Raises:
        KafkaException: Kafka failed (reading the client topics' partition counts).
    """
    s = server.settings
    client_topics = ClientTopicPartitions(admin)
    for spec in client_topic_specs(server.topics, None):
        client_topics.partitions(spec.name)
    acks = QueueAcks(admin, server.topics)
    holds = QueueHolds(
        acks,
        server.stats,
        s.maximum_message_count,
        s.maximum_queue_full_wait_ms,
        s.disconnect_unresponsive_clients,
    )
    outbox = Outbox(
        producer,
        server.topics,
        s.member_id,
        server.stats,
        client_topics,
        topic_keeper.suspect,
        holds,
    )
    if server.security is not None:
        outbox.seal = server.security.client_headers
    proxies = ClientProxies(
        server.topics,
        client_topics.partitions,
        ClientServices(
            outbox,
            holds,
            server.registry.table,
            server.cqs.table,
            server.security,
            s.maximum_message_count,
        ),
    )
    ownership = BucketOwnership(
        consumer,
        server.election,
        outbox,
        server.store,
        server.topics,
        server.stats,
        s.member_id,
        s.lease_ttl_ms,
    )
    notifier = CacheClientNotifier(
        s,
        server.topics,
        server.registry,
        server.cqs,
        outbox,
        proxies,
        acks,
        server.stats,
        holds,
    )
    reaper = Lease(
        redis_client,
        s.namespace,
        REAPER_ROLE,
        s.member_id,
        ttl_ms=int(s.durable_client_reaper_interval_s * 3000),
        replica_wait=server.store.replica_wait,
    )
    lifecycle = ClientLifecycle(
        s,
        server.topics,
        server.clients,
        server.registry,
        proxies,
        outbox,
        server.stats,
        server.security,
        reaper,
        admin,
        server.cqs,
    )
    distribution = Distribution(server.plugins, notifier, gateways, outbox, server.cqs.table)
    loads = EntryLoads(s, server.plugins, outbox, server.security)
    entries = EntryOperations(
        s,
        server.store,
        ownership,
        server.plugins,
        distribution,
        outbox,
        server.stats,
        loads,
        server.latency,
        None
        if server.tracing is None
        else ServerSpans(server.tracing, server.topics, outbox, s.member_id),
    )
    expiration = EntryExpiration(
        s, server.store, ownership, distribution, outbox, server.stats, server.security
    )
    functions = FunctionExecutions(
        s, server.functions, server.store, server.cqs.table, ownership, outbox, server.security
    )
    handlers = OperationHandlers(
        s,
        server.store,
        server.registry,
        ownership,
        entries,
        server.plugins,
        notifier,
        distribution,
        lifecycle,
        outbox,
        server.stats,
        expiration,
        server.cqs,
        functions,
    )
    security = server.security
    admission = None if security is None else Admission(security, outbox, server.stats)
    return ServerParts(
        admin,
        topic_keeper,
        producer,
        consumer,
        outbox,
        ownership,
        notifier,
        lifecycle,
        entries,
        loads,
        expiration,
        handlers,
        functions,
        admission,
        OperationIntake(s, server.topics, outbox, lifecycle, entries, handlers, admission),
        holds,
        server.registry,
        server.latency,
    )


__all__ = ["ServerCore", "ServerParts", "wire_parts"]
