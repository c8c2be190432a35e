"""The state of a namespace's cluster, read from Redis and Kafka (``regionbus status``).

Members with their start times, each bucket's primary, fencing epoch and secondaries,
each client's subscription queue with its depth, durable clients with their state and
timeout, and the gateways: each gateway sender's and async event queue's primary worker
(the holder of its Redis lease) and backlog, and each gateway receiver's pending batches.

Gateways are found by their queue topics (``{ns}.gw.<sender>``, ``{ns}.aeq.<queue>``,
``{ns}.gwr.<receiver>``) and by their workers' leases, so a queue shows up as soon as a
cache server created it, and a worker as soon as it holds the lease. Backlogs are the
high watermarks after the committed offsets of the queue's consumer group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import redis
from confluent_kafka import KafkaException, TopicPartition

from broker.client_registry import ClientRegistry
from broker.store import redis_errors
from runtime.leases import Membership
from schemas.kafka_clients import kafka_consumer
from schemas.naming import RedisKeys, Topics, bucket_role, dispatcher_role
from schemas.naming import sender_role as sender_role_of


@dataclass(frozen=True)
class MemberStatus:
    """A live server: its member id and start time (ms since the Unix epoch)."""

    member_id: str
    started_at_ms: int
    primaries: int
    secondaries: int


@dataclass(frozen=True)
class BucketStatus:
    """One bucket: its primary (None while free), fencing epoch and live secondaries."""

    bucket: int
    primary: str | None
    epoch: int
    secondaries: tuple[str, ...]


@dataclass(frozen=True)
class QueueStatus:
    """One client's subscription queue.

    Attributes:
        client_id: The client.
        durable: A durable client.
        state: ``connected``, ``away`` (durable, kept alive) or ``unregistering``.
        away_since_ms: For ``away``, when it disconnected (ms since the Unix epoch).
        durable_client_timeout_s: How long an away durable client is kept.
        depth_messages: Kafka messages after the client's acked offset (each holds one or
            more events); None when Kafka could not be asked.
    """

    client_id: str
    durable: bool
    state: str
    away_since_ms: int | None
    durable_client_timeout_s: int
    depth_messages: int | None


@dataclass(frozen=True)
class DurableClientStatus:
    """A durable client the servers keep (SPEC §5).

    Attributes:
        client_id: The durable client id.
        state: ``connected``, ``away`` (closed with keep-alive, or silent) or
            ``unregistering`` (away past its timeout; the reaper is dropping it).
        away_since_ms: When it went away (ms since the Unix epoch); None while connected.
        durable_client_timeout_s: How long it is kept while away (seconds).
        expires_at_ms: When an away client is unregistered (ms since the Unix epoch);
            None while connected.
    """

    client_id: str
    state: str
    away_since_ms: int | None
    durable_client_timeout_s: int
    expires_at_ms: int | None


@dataclass(frozen=True)
class GatewayQueueStatus:
    """A gateway sender's queue or an async event queue.

    Attributes:
        queue_id: The sender id or async event queue id.
        topic: Its queue topic (``{ns}.gw.<id>`` or ``{ns}.aeq.<id>``).
        partitions: 1 (serial) or one per bucket (parallel); None when the topic does not
            exist (a worker holds a lease but no server created the queue yet).
        primary: Member id of the worker holding the lease (the one dispatching), None
            when no worker is primary.
        epoch: The lease's fencing epoch (0 without a primary).
        backlog_events: Events queued and not yet removed (acked by the remote site, or
            accepted by the listener); None when Kafka could not be asked.
    """

    queue_id: str
    topic: str
    partitions: int | None
    primary: str | None
    epoch: int
    backlog_events: int | None


@dataclass(frozen=True)
class GatewayReceiverStatus:
    """A gateway receiver of this site.

    Attributes:
        receiver_id: The receiver id.
        topic: Its inbound topic (``{ns}.gwr.<id>``).
        pending_batches: Batches sent by remote senders that it has not applied and acked
            yet; None when Kafka could not be asked.
    """

    receiver_id: str
    topic: str
    pending_batches: int | None


@dataclass(frozen=True)
class ClusterStatus:
    """Everything ``regionbus status`` shows."""

    namespace: str
    members: tuple[MemberStatus, ...]
    buckets: tuple[BucketStatus, ...]
    queues: tuple[QueueStatus, ...]
    durable_clients: tuple[DurableClientStatus, ...] = ()
    gateway_senders: tuple[GatewayQueueStatus, ...] = ()
    gateway_receivers: tuple[GatewayReceiverStatus, ...] = ()
    async_event_queues: tuple[GatewayQueueStatus, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The status as plain JSON-able data."""
        return asdict(self)


def cluster_status(
    client: redis.Redis,
    namespace: str,
    total_buckets: int,
    kafka_config: dict[str, Any] | None = None,
) -> ClusterStatus:
    """Read the cluster's state.

    Args:
        client: Redis connection.
        namespace: Site namespace.
        total_buckets: Number of buckets.
        kafka_config: librdkafka settings to read queue depths, backlogs and the gateway
            topics with; None skips them (gateways are then found by their leases only).

    Raises:
        TransportError: Redis failed.
    """
    keys = RedisKeys(namespace)
    members = Membership(client, namespace, "status", 1).live_members()
    with redis_errors():
        pipe = client.pipeline(transaction=False)
        for bucket in range(total_buckets):
            pipe.get(keys.lease(bucket_role(bucket)))
            pipe.smembers(keys.secondaries(bucket))
        raw = pipe.execute()
    live = {m.member_id for m in members}
    order = {m.member_id: i for i, m in enumerate(members)}
    buckets = []
    for bucket in range(total_buckets):
        lease, secondaries = raw[2 * bucket], raw[2 * bucket + 1]
        primary, epoch = None, 0
        if lease is not None:
            holder, _, number = lease.decode().rpartition("|")
            primary, epoch = holder, int(number)
        alive = sorted(
            (s.decode() for s in secondaries if s.decode() in live), key=order.__getitem__
        )
        buckets.append(BucketStatus(bucket, primary, epoch, tuple(alive)))
    member_rows = tuple(
        MemberStatus(
            m.member_id,
            m.started_at_ms,
            sum(b.primary == m.member_id for b in buckets),
            sum(m.member_id in b.secondaries for b in buckets),
        )
        for m in members
    )
    records = ClientRegistry(client, namespace, 0).all()
    depths = _queue_depths(namespace, list(records), kafka_config) if kafka_config else {}
    queues = tuple(
        QueueStatus(
            client_id,
            record.durable,
            "unregistering" if record.reaping else ("connected" if record.connected else "away"),
            record.disconnected_at_ms if not record.connected else None,
            record.durable_client_timeout_s,
            depths.get(client_id),
        )
        for client_id, record in sorted(records.items())
    )
    durable = tuple(
        DurableClientStatus(
            q.client_id,
            q.state,
            q.away_since_ms,
            q.durable_client_timeout_s,
            None
            if q.away_since_ms is None
            else q.away_since_ms + q.durable_client_timeout_s * 1000,
        )
        for q in queues
        if q.durable
    )
    senders, receivers, aeqs = _gateways(client, namespace, kafka_config)
    return ClusterStatus(
        namespace, member_rows, tuple(buckets), queues, durable, senders, receivers, aeqs
    )


def _gateways(
    client: redis.Redis, namespace: str, kafka_config: dict[str, Any] | None
) -> tuple[
    tuple[GatewayQueueStatus, ...],
    tuple[GatewayReceiverStatus, ...],
    tuple[GatewayQueueStatus, ...],
]:
    """Find the namespace's gateway queues and receivers by topic and by lease."""
    lease_prefix = RedisKeys(namespace).lease("")
    topics = Topics(namespace)
    sender_role, aeq_role = sender_role_of(""), dispatcher_role("")
    with redis_errors():
        names = [k.decode() for k in client.scan_iter(match=f"{lease_prefix}*", count=500)]
        wanted = [n for n in names if n[len(lease_prefix) :].startswith((sender_role, aeq_role))]
        values = client.mget(wanted) if wanted else []
    leases: dict[str, tuple[str, int]] = {}
    for name, value in zip(wanted, values, strict=True):
        if value is not None:
            holder, _, epoch = value.decode().rpartition("|")
            leases[name[len(lease_prefix) :]] = (holder, int(epoch))
    partitions = _topic_partitions(namespace, kafka_config) if kafka_config else {}
    senders = _queues(
        topics.gateway_prefix, sender_role, leases, partitions, kafka_config, topics.sender_group
    )
    aeqs = _queues(
        topics.async_event_queue_prefix,
        aeq_role,
        leases,
        partitions,
        kafka_config,
        topics.dispatcher_group,
    )
    inbound = topics.gateway_inbound_prefix
    receivers = []
    for topic, count in sorted(partitions.items()):
        if not topic.startswith(inbound):
            continue
        receiver_id = topic[len(inbound) :]
        group = topics.receiver_group(receiver_id)
        pending = _backlog(kafka_config, topic, count, group) if kafka_config else None
        receivers.append(GatewayReceiverStatus(receiver_id, topic, pending))
    return senders, tuple(receivers), aeqs


def _topic_partitions(namespace: str, kafka_config: dict[str, Any]) -> dict[str, int]:
    """``{topic: partitions}`` of the namespace's topics; empty when Kafka does not answer."""
    consumer = kafka_consumer({**kafka_config, "group.id": Topics(namespace).status_group})
    try:
        topics = consumer.list_topics(timeout=10).topics
    except KafkaException:
        return {}
    finally:
        consumer.close()
    return {
        name: len(meta.partitions)
        for name, meta in topics.items()
        if name.startswith(f"{namespace}.") and meta.error is None
    }


def _queues(
    topic_prefix: str,
    role_prefix: str,
    leases: dict[str, tuple[str, int]],
    partitions: dict[str, int],
    kafka_config: dict[str, Any] | None,
    group_of: Callable[[str], str],
) -> tuple[GatewayQueueStatus, ...]:
    ids = {t[len(topic_prefix) :] for t in partitions if t.startswith(topic_prefix)}
    ids |= {role[len(role_prefix) :] for role in leases if role.startswith(role_prefix)}
    rows = []
    for queue_id in sorted(ids):
        topic = topic_prefix + queue_id
        holder, epoch = leases.get(role_prefix + queue_id, (None, 0))
        count = partitions.get(topic)
        backlog = None
        if kafka_config and count is not None:
            backlog = _backlog(kafka_config, topic, count, group_of(queue_id))
        rows.append(GatewayQueueStatus(queue_id, topic, count, holder, epoch, backlog))
    return tuple(rows)


def _backlog(kafka_config: dict[str, Any], topic: str, partitions: int, group: str) -> int | None:
    """Messages of a topic after a group's committed offsets (high watermark minus
    committed, summed over the partitions); None when Kafka does not answer."""
    consumer = kafka_consumer({**kafka_config, "group.id": group, "enable.auto.commit": False})
    try:
        wanted = [TopicPartition(topic, p) for p in range(partitions)]
        total = 0
        for tp in consumer.committed(wanted, timeout=5):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=5)
            total += max(0, high - max(tp.offset, 0))
        return total
    except KafkaException:
        return None
    finally:
        consumer.close()


def _queue_depths(
    namespace: str, client_ids: list[str], kafka_config: dict[str, Any]
) -> dict[str, int]:
    topics = Topics(namespace)
    depths: dict[str, int] = {}
    for client_id in client_ids:
        consumer = kafka_consumer(
            {
                **kafka_config,
                "group.id": topics.client_group(client_id),
                "enable.auto.commit": False,
            }
        )
        try:
            partition = TopicPartition(topics.queue(client_id), 0)
            committed = consumer.committed([partition], timeout=5)[0].offset
            _, high = consumer.get_watermark_offsets(partition, timeout=5)
            depths[client_id] = max(0, high - max(committed, 0))
        except KafkaException:
            continue
        finally:
            consumer.close()
    return depths
