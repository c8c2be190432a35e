"""What each kind of topic is (partitions, retention) and how it is made to exist.

Nothing here relies on a broker creating topics by itself: every producer and consumer
of regionbus sets ``allow.auto.create.topics=false``, and the topics are created,
checked and waited for with `ensure_topics`.

Retention, per topic kind (``retention.ms``):

- ``{ns}.ops``, ``{ns}.control``, ``{ns}.events``, ``{ns}.dead-letter``: Kafka's default
  of 7 days, set explicitly. Servers commit ``{ns}.ops`` within ``message_sync_interval``,
  so 7 days is the longest a whole site may be down without losing an operation.
- ``{ns}.queue.<client>``: the longer of 7 days and the client's
  ``durable_client_timeout_s`` plus one hour, so a durable client that comes back within
  its timeout finds every event it missed (SPEC §5).
- ``{ns}.reply.<client>``: one hour. A reply is read within ``read_timeout_ms`` of its
  request, and a client starts reading its reply topic at the end.
- ``{ns}.gw.<sender>`` and ``{ns}.aeq.<queue>``: never by time (``-1``). A batch leaves
  these queues only once acknowledged (SPEC §6 and §7): the sender or dispatcher commits its
  offset and deletes the records before it (Kafka's DeleteRecords, at most once a second
  per partition: `regionbus.gateways.queue_trim`), as Geode removes a batch.
- gateway link topics (inbound, ack): one day; each message is consumed within seconds.

Size and compression, per topic kind (``max.message.bytes``, ``compression.type``; why:
`regionbus.schemas.record_limits`): ``{ns}.control`` takes record batches of at most
64 KiB (a ``Control`` record is under 1 KiB); ``{ns}.dead-letter`` the largest batch of any
other topic plus the dead letter's headers; every other topic Kafka's default of 1,048,588
bytes, set explicitly. Every topic keeps batches as producers compressed them
(``compression.type=producer``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from regionbus.schemas.errors import ConfigurationError, TransportError
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_limits import (
    CONTROL_BATCH_MAX_BYTES,
    DEAD_LETTER_BATCH_MAX_BYTES,
    RECORD_BATCH_MAX_BYTES,
    TOPIC_COMPRESSION,
)
from regionbus.schemas.transport import is_authorization_error, kafka_error

HOUR_MS: Final = 3_600_000
DAY_MS: Final = 24 * HOUR_MS
DEFAULT_RETENTION_MS: Final = 7 * DAY_MS
"""Apache Kafka's ``log.retention.hours`` default (168 h), set on every topic explicitly."""
REPLY_RETENTION_MS: Final = HOUR_MS
LINK_RETENTION_MS: Final = DAY_MS
QUEUE_RETENTION_MARGIN_MS: Final = HOUR_MS
KEEP_UNTIL_ACKED: Final = -1
"""``retention.ms`` of queues whose records are deleted only once acknowledged."""

MAX_REPLICATION_FACTOR: Final = 3
_LEADER_POLL_INTERVAL_S: Final = 0.05


@dataclass(frozen=True)
class TopicSpec:
    """One topic as regionbus needs it.

    Attributes:
        name: The topic name (see `regionbus.schemas.naming.Topics`).
        partitions: Partition count; an existing topic with another count is an error.
        config: Topic configs set at creation, e.g. ``{"retention.ms": "3600000"}``.
    """

    name: str
    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)


def retention(
    retention_ms: int, max_message_bytes: int = RECORD_BATCH_MAX_BYTES, **more: str
) -> dict[str, str]:
    """Topic configs for a time retention (``-1`` keeps records until deleted) and the
    largest record batch the topic takes, with ``compression.type`` kept as producers sent.

    Args:
        retention_ms: ``retention.ms``.
        max_message_bytes: ``max.message.bytes``, in bytes (default: Kafka's, 1,048,588).
        more: Further topic configs.
    """
    return {
        "retention.ms": str(retention_ms),
        "max.message.bytes": str(max_message_bytes),
        "compression.type": TOPIC_COMPRESSION,
        **more,
    }


def queue_retention_ms(durable_client_timeout_s: float) -> int:
    """``retention.ms`` of a client's subscription queue topic.

    Args:
        durable_client_timeout_s: How long the servers keep the client's queue while it is
            away, in seconds (SPEC §5, Geode default 300 s).

    Returns:
        The longer of 7 days and the timeout plus one hour, in milliseconds.
    """
    return max(
        DEFAULT_RETENTION_MS, int(durable_client_timeout_s * 1000) + QUEUE_RETENTION_MARGIN_MS
    )


def server_topic_specs(topics: Topics, total_buckets: int) -> list[TopicSpec]:
    """The topics every cache server of a namespace needs: ``{ns}.ops`` and ``{ns}.events``
    with one partition per bucket, ``{ns}.control`` and ``{ns}.dead-letter`` with one."""
    kept = retention(DEFAULT_RETENTION_MS)
    return [
        TopicSpec(topics.ops, total_buckets, kept),
        TopicSpec(topics.events, total_buckets, kept),
        TopicSpec(topics.control, 1, retention(DEFAULT_RETENTION_MS, CONTROL_BATCH_MAX_BYTES)),
        TopicSpec(
            topics.dead_letter, 1, retention(DEFAULT_RETENTION_MS, DEAD_LETTER_BATCH_MAX_BYTES)
        ),
    ]


def client_topic_specs(
    topics: Topics, client_id: str, durable_client_timeout_s: float
) -> list[TopicSpec]:
    """A client's subscription queue and reply topics (one partition each).

    Args:
        topics: The namespace's topic names.
        client_id: The client (or durable client) id.
        durable_client_timeout_s: Sizes the queue's retention (`queue_retention_ms`).
    """
    return [
        TopicSpec(
            topics.queue(client_id), 1, retention(queue_retention_ms(durable_client_timeout_s))
        ),
        TopicSpec(topics.reply(client_id), 1, retention(REPLY_RETENTION_MS)),
    ]


def acked_queue_spec(name: str, partitions: int = 1) -> TopicSpec:
    """A gateway sender's or async event queue's topic: kept until acknowledged."""
    return TopicSpec(name, partitions, retention(KEEP_UNTIL_ACKED))


def link_topic_spec(name: str) -> TopicSpec:
    """A gateway link topic (a receiver's inbound batches, a sender's acks)."""
    return TopicSpec(name, 1, retention(LINK_RETENTION_MS))


def replication_factor(brokers: int) -> int:
    """Replicas per partition: every broker up to 3 (one broker: 1; three or more: 3)."""
    return max(1, min(MAX_REPLICATION_FACTOR, brokers))


def _topic_config(spec: TopicSpec, replicas: int) -> dict[str, str]:
    config = dict(spec.config)
    if replicas >= MAX_REPLICATION_FACTOR:
        # acks=all then means two copies on disk: one broker can die without losing an
        # acknowledged write, and writes go on while it is away.
        config.setdefault("min.insync.replicas", "2")
    return config


def ensure_topics(
    admin: AdminClient, specs: Iterable[TopicSpec], *, timeout_s: float = 30.0
) -> list[str]:
    """Create the topics that do not exist, check the others, and wait for their leaders.

    A topic is ready when every partition has a leader: before that, producing to it or
    asking its offsets fails with "not leader". Replication follows the brokers the
    cluster has (`replication_factor`).

    Args:
        admin: An AdminClient of the cluster (with the caller's security settings).
        specs: The topics wanted.
        timeout_s: Longest wait, in seconds, for metadata, creation and leaders.

    Returns:
        The names of the topics this call created (empty when all existed).

    Raises:
        ConfigurationError: an existing topic has another partition count than wanted.
        KafkaAuthorizationError: the principal may not create (or describe) a topic: with
            ACLs, Kafka says so also for a topic that exists but is not the principal's.
        TransportError: the cluster cannot be reached, refused to create a topic, or a
            partition had no leader within ``timeout_s``.
    """
    wanted = {spec.name: spec for spec in specs}
    if not wanted:
        return []
    deadline = time.monotonic() + timeout_s
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise kafka_error(exc, "Kafka metadata") from exc
    replicas = replication_factor(len(metadata.brokers))
    for name, spec in wanted.items():
        existing = metadata.topics.get(name)
        found = 0 if existing is None or existing.error is not None else len(existing.partitions)
        if found and found != spec.partitions:
            raise ConfigurationError(
                f"topic {name} has {found} partitions, {spec.partitions} are needed"
            )
    missing = [
        NewTopic(name, spec.partitions, replicas, config=_topic_config(spec, replicas))
        for name, spec in wanted.items()
        if name not in metadata.topics or metadata.topics[name].error is not None
    ]
    created: list[str] = []
    if missing:
        futures = admin.create_topics(missing, operation_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result(timeout=max(0.1, deadline - time.monotonic()))
                created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise kafka_error(exc, f"cannot create topic {name}", f"topic {name}") from exc
    _wait_for_leaders(admin, wanted, deadline)
    return created


def _wait_for_leaders(admin: AdminClient, wanted: Mapping[str, TopicSpec], deadline: float) -> None:
    pending = set(wanted)
    reason = ""
    while pending:
        for name in sorted(pending):
            try:
                topic = admin.list_topics(topic=name, timeout=5).topics.get(name)
            except KafkaException as exc:
                reason = str(exc)
                continue
            refused = topic.error if topic is not None else None
            if refused is not None and is_authorization_error(refused):
                raise kafka_error(refused, f"metadata of {name}", f"topic {name}")
            if topic is None or topic.error is not None:
                reason = f"{name}: {topic.error if topic is not None else 'absent'}"
                continue
            leaderless = [p for p in topic.partitions.values() if p.leader < 0 or p.error]
            if len(topic.partitions) == wanted[name].partitions and not leaderless:
                pending.discard(name)
            else:
                reason = f"{name}: {len(leaderless)} partitions without a leader"
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TransportError(f"topics not ready in time: {reason}")
        time.sleep(_LEADER_POLL_INTERVAL_S)


__all__ = [
    "DEFAULT_RETENTION_MS",
    "KEEP_UNTIL_ACKED",
    "LINK_RETENTION_MS",
    "REPLY_RETENTION_MS",
    "TopicSpec",
    "acked_queue_spec",
    "client_topic_specs",
    "ensure_topics",
    "link_topic_spec",
    "queue_retention_ms",
    "replication_factor",
    "retention",
    "server_topic_specs",
]
