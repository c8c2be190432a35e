"""The state of a namespace's cluster, read from Redis and Kafka (``regionbus status``).

Members with their start times, each bucket's primary, fencing epoch and secondaries,
each client's subscription queue (its principal's shared topic, its partition) with how
far behind it is: the partition's records after its ack, and its own among them (its true
lag, :mod:`regionbus.broker.queue_lag`), durable clients with their state and
timeout, and the gateways: each gateway sender's and async event queue's primary worker
(the holder of its Redis lease) and backlog, and each gateway receiver's pending batches.

Gateways are found by their queue topics (``{ns}.gw.<sender>``, ``{ns}.aeq.<queue>``,
``{ns}.gwr.<receiver>``) and by their workers' leases, so a queue shows up as soon as a
cache server created it, and a worker as soon as it holds the lease. Backlogs are the
high watermarks after the committed offsets of the queue's consumer group.

It is an operator's first command, so it answers within about a second whatever Kafka
does (:data:`STATUS_TIMEOUT_S`): every committed-offset and watermark question goes out
at once through one admin client (:class:`KafkaFigures`), all of them share one deadline,
and a figure not answered by then is shown as unknown and named in
:attr:`ClusterStatus.unreadable`, rather than waited for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import redis

from regionbus.broker.client_registry import ClientRegistry
from regionbus.broker.kafka_figures import KafkaFigures
from regionbus.broker.queue_lag import PartitionReaders, queue_lags
from regionbus.runtime.leases import Membership
from regionbus.runtime.redis_connect import redis_errors
from regionbus.schemas.naming import (
    RedisKeys,
    Topics,
    bucket_role,
    client_partition,
    dispatcher_role,
)
from regionbus.schemas.naming import sender_role as sender_role_of
from regionbus.schemas.redis_values import parse_lease


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
        depth_messages: Kafka records of its partition after the client's acked offset
            (each holds one or more events; the partition is shared with other clients
            of its Kafka principal, so this bounds what waits for it from above); None
            when Kafka could not be asked.
        queue_topic: The shared queue topic it reads (its Kafka principal's).
        queue_partition: Its partition of that topic; None when Kafka could not be asked.
        lag_records: Of ``depth_messages``, the records addressed to this client: its
            true lag, as the partition is shared. None when not read in time (named in
            :attr:`ClusterStatus.unreadable`).
    """

    client_id: str
    durable: bool
    state: str
    away_since_ms: int | None
    durable_client_timeout_s: int
    depth_messages: int | None
    queue_topic: str = ""
    queue_partition: int | None = None
    lag_records: int | None = None


@dataclass(frozen=True)
class DurableClientStatus:
    """A durable client the servers keep (docs/behaviour.md §5).

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
            when no worker is primary; for a sender split into shards, each shard's
            holder, ``"<member> (shard <k>), ..."``.
        epoch: The lease's fencing epoch (0 without a primary; a sharded sender's
            highest).
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
    unreadable: tuple[str, ...] = ()
    """What could not be read in time, one line each (its figure shows as unknown)."""

    def as_dict(self) -> dict[str, Any]:
        """The status as plain JSON-able data."""
        return asdict(self)


STATUS_TIMEOUT_S = 1.0
"""Longest wait for Kafka's figures (topics, committed offsets, watermarks), seconds."""


def cluster_status(
    client: redis.Redis,
    namespace: str,
    total_buckets: int,
    kafka_config: dict[str, Any] | None = None,
    kafka_timeout_s: float = STATUS_TIMEOUT_S,
) -> ClusterStatus:
    """Read the cluster's state.

    Args:
        client: Redis connection.
        namespace: Site namespace.
        total_buckets: Number of buckets.
        kafka_config: librdkafka settings to read queue depths, backlogs and the gateway
            topics with; None skips them (gateways are then found by their leases only).
        kafka_timeout_s: Longest wait for all of Kafka's figures together, seconds
            (default :data:`STATUS_TIMEOUT_S`); those not read by then are None and
            named in :attr:`ClusterStatus.unreadable`.

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
            primary, epoch = parse_lease(lease)
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
    records = ClientRegistry(client, namespace).all()
    topics = Topics(namespace)
    figures = KafkaFigures(namespace, kafka_config, kafka_timeout_s) if kafka_config else None
    partitions = figures.topic_partitions() if figures is not None else {}
    leases = _gateway_leases(client, namespace)
    queue_ids = _gateway_ids(namespace, partitions, leases)
    addresses: dict[str, tuple[str, int | None]] = {}
    for client_id, record in records.items():
        topic = topics.client_queues(record.kafka_principal)
        count = partitions.get(topic)
        partition = client_partition(client_id, count) if count else None
        addresses[client_id] = (topic, partition)
        if figures is not None and partition is not None:
            figures.ask_backlog(
                ("queue", client_id), topic, (partition,), topics.client_group(client_id)
            )
    if figures is not None:
        for kind, topic, count, group in _gateway_topics(namespace, partitions, queue_ids):
            figures.ask_backlog((kind, topic), topic, count, group)
        figures.wait()
    depths = {
        client_id: figures.backlog(("queue", client_id)) if figures is not None else None
        for client_id in records
    }
    lags: dict[str, int] = {}
    if figures is not None and kafka_config is not None:
        read = [client_id for client_id, depth in depths.items() if depth is not None]
        lags = _queue_lags(figures, kafka_config, topics, read)
    queues = tuple(
        QueueStatus(
            client_id,
            record.durable,
            "unregistering" if record.reaping else ("connected" if record.connected else "away"),
            record.disconnected_at_ms if not record.connected else None,
            record.durable_client_timeout_s,
            depths.get(client_id),
            *addresses[client_id],
            lags.get(client_id),
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
    senders, receivers, aeqs = _gateways(namespace, leases, partitions, queue_ids, figures)
    unreadable = tuple(figures.unreadable) if figures is not None else ()
    return ClusterStatus(
        namespace,
        member_rows,
        tuple(buckets),
        queues,
        durable,
        senders,
        receivers,
        aeqs,
        unreadable,
    )


def _queue_lags(
    figures: KafkaFigures, kafka_config: dict[str, Any], topics: Topics, clients: list[str]
) -> dict[str, int]:
    """Each client's own records after its ack (of ``clients``, whose queue positions
    were read), read until the status deadline; what is not read in time is noted in
    ``figures.unreadable``."""
    partitions: dict[tuple[str, int], PartitionReaders] = {}
    for client_id in clients:
        positions = figures.positions(("queue", client_id))
        for tp, committed, high in positions or ():
            place = (tp.topic, tp.partition)
            readers = partitions.setdefault(place, PartitionReaders(high, {}))
            readers.committed[client_id] = committed
    lags, notes = queue_lags(kafka_config, topics.status_group, partitions, figures.deadline)
    figures.unreadable.extend(notes)
    return lags


def _gateway_leases(client: redis.Redis, namespace: str) -> dict[str, tuple[str, int]]:
    """``{role: (holder, epoch)}`` of the gateway senders' and dispatchers' leases.

    Raises:
        TransportError: Redis failed.
    """
    lease_prefix = RedisKeys(namespace).lease_prefix()
    sender_role, aeq_role = sender_role_of(""), dispatcher_role("")
    with redis_errors():
        names = [k.decode() for k in client.scan_iter(match=f"{lease_prefix}*", count=500)]
        wanted = [n for n in names if n[len(lease_prefix) :].startswith((sender_role, aeq_role))]
        values = client.mget(wanted) if wanted else []
    leases: dict[str, tuple[str, int]] = {}
    for name, value in zip(wanted, values, strict=True):
        if value is not None:
            holder, epoch = parse_lease(value)
            leases[name[len(lease_prefix) :]] = (holder, epoch)
    return leases


def _gateway_ids(
    namespace: str, partitions: dict[str, int], leases: dict[str, tuple[str, int]]
) -> dict[str, list[str]]:
    """Sender, async event queue and receiver ids, found by topic and by lease."""
    topics = Topics(namespace)
    sender_role, aeq_role = sender_role_of(""), dispatcher_role("")

    def ids(topic_prefix: str, role_prefix: str | None) -> list[str]:
        found = {t[len(topic_prefix) :] for t in partitions if t.startswith(topic_prefix)}
        if role_prefix is not None:
            # A shard's role is "<role>/<shard>" (ids never hold a "/").
            found |= {
                r[len(role_prefix) :].split("/")[0] for r in leases if r.startswith(role_prefix)
            }
        return sorted(found)

    return {
        "sender": ids(topics.gateway_prefix, sender_role),
        "aeq": ids(topics.async_event_queue_prefix, aeq_role),
        "receiver": ids(topics.gateway_inbound_prefix, None),
    }


def _gateway_topics(
    namespace: str, partitions: dict[str, int], ids: dict[str, list[str]]
) -> list[tuple[str, str, int, str]]:
    """``(kind, topic, partitions, consumer group)`` of each gateway topic that exists."""
    topics = Topics(namespace)
    shapes: list[tuple[str, str, Callable[[str], str]]] = [
        ("sender", topics.gateway_prefix, topics.sender_group),
        ("aeq", topics.async_event_queue_prefix, topics.dispatcher_group),
        ("receiver", topics.gateway_inbound_prefix, topics.receiver_group),
    ]
    found = []
    for kind, prefix, group_of in shapes:
        for queue_id in ids[kind]:
            count = partitions.get(prefix + queue_id)
            if count is not None:
                found.append((kind, prefix + queue_id, count, group_of(queue_id)))
    return found


def _shard_holders(leases: dict[str, tuple[str, int]], role: str) -> tuple[str | None, int]:
    """The holders of a sharded queue's leases (``<role>/<shard>``) as one
    ``"<member> (shard <k>), ..."``, with the highest epoch; ``(None, 0)`` when none."""
    shards = sorted(
        (int(r[len(role) + 1 :]), holder, epoch)
        for r, (holder, epoch) in leases.items()
        if r.startswith(role + "/") and r[len(role) + 1 :].isdigit()
    )
    if not shards:
        return None, 0
    holders = ", ".join(f"{holder} (shard {shard})" for shard, holder, _ in shards)
    return holders, max(epoch for _, _, epoch in shards)


def _gateways(
    namespace: str,
    leases: dict[str, tuple[str, int]],
    partitions: dict[str, int],
    ids: dict[str, list[str]],
    figures: KafkaFigures | None,
) -> tuple[
    tuple[GatewayQueueStatus, ...],
    tuple[GatewayReceiverStatus, ...],
    tuple[GatewayQueueStatus, ...],
]:
    """The gateway rows, from the leases, the topics and the backlogs read."""
    topics = Topics(namespace)

    def queues(
        kind: str, topic_prefix: str, role_of: Callable[[str], str]
    ) -> tuple[GatewayQueueStatus, ...]:
        rows = []
        for queue_id in ids[kind]:
            topic = topic_prefix + queue_id
            holder, epoch = leases.get(role_of(queue_id)) or _shard_holders(
                leases, role_of(queue_id)
            )
            backlog = figures.backlog((kind, topic)) if figures is not None else None
            rows.append(
                GatewayQueueStatus(queue_id, topic, partitions.get(topic), holder, epoch, backlog)
            )
        return tuple(rows)

    senders = queues("sender", topics.gateway_prefix, sender_role_of)
    aeqs = queues("aeq", topics.async_event_queue_prefix, dispatcher_role)
    receivers = tuple(
        GatewayReceiverStatus(
            receiver_id,
            topics.gateway_inbound_prefix + receiver_id,
            figures.backlog(("receiver", topics.gateway_inbound_prefix + receiver_id))
            if figures is not None
            else None,
        )
        for receiver_id in ids["receiver"]
    )
    return senders, receivers, aeqs
