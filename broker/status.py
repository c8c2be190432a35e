"""The state of a namespace's cluster, read from Redis and Kafka (``regionbus status``).

Members with their start times, each bucket's primary, fencing epoch and secondaries,
each client's subscription queue with its depth, and durable clients with their state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import redis
from confluent_kafka import Consumer, KafkaException, TopicPartition

from broker.client_registry import ClientRegistry
from broker.election import Membership
from broker.store import redis_errors
from schemas.naming import RedisKeys, Topics, bucket_role


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
            more events); None when Kafka could not be asked. On the embedded broker the
            end offset may lag (ARCHITECTURE.md), so this is a lower bound.
    """

    client_id: str
    durable: bool
    state: str
    away_since_ms: int | None
    durable_client_timeout_s: int
    depth_messages: int | None


@dataclass(frozen=True)
class ClusterStatus:
    """Everything ``regionbus status`` shows."""

    namespace: str
    members: tuple[MemberStatus, ...]
    buckets: tuple[BucketStatus, ...]
    queues: tuple[QueueStatus, ...]

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
        kafka_config: librdkafka settings to read queue depths with; None skips them.

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
    return ClusterStatus(namespace, member_rows, tuple(buckets), queues)


def _queue_depths(
    namespace: str, client_ids: list[str], kafka_config: dict[str, Any]
) -> dict[str, int]:
    topics = Topics(namespace)
    depths: dict[str, int] = {}
    for client_id in client_ids:
        consumer = Consumer(
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
