"""What each kind of topic is (partitions, retention) and how it is made to exist.

Nothing here relies on a broker creating topics by itself: every producer and consumer
of regionbus sets ``allow.auto.create.topics=false``, and the topics are created,
checked and waited for with `ensure_topics`.

Retention, per topic kind (``retention.ms``):

- ``{ns}.ops``, ``{ns}.control``, ``{ns}.events``, ``{ns}.dead-letter``: Kafka's default
  of 7 days, set explicitly. Servers commit ``{ns}.ops`` within ``message_sync_interval``,
  so 7 days is the longest a whole site may be down without losing an operation.
- ``{ns}.queues`` and ``{ns}.queues.<principal>`` (the shared, partitioned subscription
  queues of the clients of one Kafka principal): at least the longest
  ``durable_client_timeout_s`` the servers accept (their ``max_durable_client_timeout_s``)
  plus one hour, and at least 7 days, so a durable client that comes back within its
  timeout finds every event it missed. The servers set it at start and at each connect.
- ``{ns}.replies`` and ``{ns}.replies.<principal>``: one hour. A reply is read within
  ``read_timeout_ms`` of its request, and a client starts reading its reply partition at
  the end.
- ``{ns}.gw.<sender>`` and ``{ns}.aeq.<queue>``: never by time (``-1``). A batch leaves
  these queues only once acknowledged (docs/behaviour.md §6 and §7): the sender or dispatcher
  commits its offset and deletes the records before it (Kafka's DeleteRecords, at most once a second
  per partition: `regionbus.gateways.queue_trim`), as Geode removes a batch.
- gateway link topics (inbound, ack): one day; each message is consumed within seconds.

Whatever made a topic, what it keeps is checked (`config_repairs`, `ensure_topic_configs`):
the servers check their topics at start and a principal's shared topics at each of its
clients' connects, on the configuration the brokers hold, and set back what would lose
records: ``cleanup.policy`` other than ``delete``, a ``retention.ms`` shorter than the
kind's, any ``retention.bytes`` limit, a ``max.message.bytes`` below the kind's.

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
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
    TopicMetadata,
)

from regionbus.schemas.errors import ConfigurationError, TransportError
from regionbus.schemas.kafka_clients import KafkaAdmin
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

DEFAULT_MAX_DURABLE_CLIENT_TIMEOUT_S: Final = 7 * 24 * 3600
"""The longest ``durable_client_timeout_s`` servers accept by default (7 days)."""

DEFAULT_CLIENT_PARTITIONS: Final = 16
"""Partitions of a shared client topic created by regionbus: a client reads about
1/16 of what its principal's clients are sent (its partition), and one topic pair serves
every client of the principal (two topics per client capped a three-broker cluster near
2,000 clients)."""

MAX_REPLICATION_FACTOR: Final = 3
_LEADER_POLL_INTERVAL_S: Final = 0.05
_METADATA_REQUEST_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class TopicSpec:
    """One topic as regionbus needs it.

    Attributes:
        name: The topic name (see `regionbus.schemas.naming.Topics`).
        partitions: Partition count; an existing topic with another count is an error,
            unless ``any_partitions``.
        config: Topic configs set at creation, e.g. ``{"retention.ms": "3600000"}``.
        any_partitions: An existing topic may have any partition count (the shared client
            topics: a client reads the partition its id hashes to among those there are).
    """

    name: str
    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)
    any_partitions: bool = False


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


_RETENTION_MS: Final = "retention.ms"
_RETENTION_BYTES: Final = "retention.bytes"
_MAX_MESSAGE_BYTES: Final = "max.message.bytes"
_CLEANUP_POLICY: Final = "cleanup.policy"
_UNLIMITED: Final = "-1"


def config_repairs(spec: TopicSpec, current: Mapping[str, str | None]) -> dict[str, str]:
    """The configs to set on an existing topic so it keeps every record ``spec`` needs kept
    and takes every record ``spec`` lets be written.

    - ``cleanup.policy`` must be ``delete``: compaction keeps one record per key, and the
      records of a shared client topic are keyed by client, a gateway queue's by nothing.
    - ``retention.ms`` must be ``-1`` where ``spec`` says ``-1`` (kept until acknowledged),
      else ``-1`` or at least ``spec``'s.
    - ``retention.bytes`` must be ``-1``: a size limit deletes records unread, whatever
      their age.
    - ``max.message.bytes`` must be at least ``spec``'s: a smaller one refuses batches
      every reader expects to be there.

    Args:
        spec: The topic as regionbus needs it (its ``config`` names the wanted values).
        current: The topic's configs as the brokers hold them (a missing or None value:
            the broker's default, taken as Kafka's own, which meets each rule but
            ``retention.ms`` below 7 days).

    Returns:
        ``{config: value}`` to set; empty when the topic is as needed.
    """
    wanted = spec.config
    repairs: dict[str, str] = {}
    if (current.get(_CLEANUP_POLICY) or "delete") != "delete":
        repairs[_CLEANUP_POLICY] = "delete"
    if _RETENTION_MS in wanted:
        need = int(wanted[_RETENTION_MS])
        have = int(current.get(_RETENTION_MS) or DEFAULT_RETENTION_MS)
        if (need < 0 and have >= 0) or (need >= 0 and 0 <= have < need):
            repairs[_RETENTION_MS] = str(need)
    if (current.get(_RETENTION_BYTES) or _UNLIMITED) != _UNLIMITED:
        repairs[_RETENTION_BYTES] = _UNLIMITED
    if _MAX_MESSAGE_BYTES in wanted:
        have_bytes = int(current.get(_MAX_MESSAGE_BYTES) or RECORD_BATCH_MAX_BYTES)
        if have_bytes < int(wanted[_MAX_MESSAGE_BYTES]):
            repairs[_MAX_MESSAGE_BYTES] = wanted[_MAX_MESSAGE_BYTES]
    return repairs


def ensure_topic_configs(
    admin: AdminClient, specs: Iterable[TopicSpec], *, timeout_s: float = 10.0
) -> dict[str, dict[str, str]]:
    """Check existing topics' configs as the brokers hold them (never as remembered), and
    set back what `config_repairs` names, in one describe and at most one alter request.

    Args:
        admin: An AdminClient allowed to describe and alter the topics' configs.
        specs: The topics, which must exist.
        timeout_s: Longest wait for each request, in seconds.

    Returns:
        ``{topic: {config: value set}}`` of the topics repaired; empty when none needed it.

    Raises:
        ConfigurationError: a topic needed a repair the cluster refused (the message names
            the topic and the configs).
        TransportError: the cluster did not describe the topics within ``timeout_s``, or
            failed.
    """
    wanted = {spec.name: spec for spec in specs}
    if not wanted:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in wanted]
    try:
        described = admin.describe_configs(resources, request_timeout=timeout_s)
        current = {
            resource.name: {k: v.value for k, v in future.result(timeout=timeout_s).items()}
            for resource, future in described.items()
        }
    except KafkaException as exc:
        raise kafka_error(exc, "topic configs") from exc
    except TimeoutError as exc:
        raise TransportError(f"topic configs: no answer in {timeout_s} s") from exc
    repairs = {
        name: found
        for name, spec in wanted.items()
        if (found := config_repairs(spec, current.get(name, {})))
    }
    if not repairs:
        return {}
    altered = []
    for name, configs in repairs.items():
        resource = ConfigResource(ResourceType.TOPIC, name)
        for config, value in configs.items():
            resource.add_incremental_config(
                ConfigEntry(config, value, incremental_operation=AlterConfigOpType.SET)
            )
        altered.append(resource)
    try:
        answers = admin.incremental_alter_configs(altered, request_timeout=timeout_s)
        for resource, future in answers.items():
            try:
                future.result(timeout=timeout_s)
            except KafkaException as exc:
                raise ConfigurationError(
                    f"topic {resource.name} would lose or refuse records "
                    f"({_described(current.get(resource.name, {}), repairs[resource.name])}) "
                    f"and setting {repairs[resource.name]} was refused: {exc.args[0].str()}"
                ) from exc
    except KafkaException as exc:
        raise kafka_error(exc, "altering topic configs") from exc
    except TimeoutError as exc:
        raise TransportError(f"altering topic configs: no answer in {timeout_s} s") from exc
    return repairs


def _described(current: Mapping[str, str | None], repairs: Mapping[str, str]) -> str:
    return ", ".join(f"{config}={current.get(config)}" for config in repairs)


def queue_retention_ms(durable_client_timeout_s: float) -> int:
    """``retention.ms`` of a client's subscription queue topic.

    Args:
        durable_client_timeout_s: How long the servers keep the client's queue while it is
            away, in seconds (docs/behaviour.md §5, Geode default 300 s).

    Returns:
        The longer of 7 days and the timeout plus one hour, in milliseconds.
    """
    return max(
        DEFAULT_RETENTION_MS, int(durable_client_timeout_s * 1000) + QUEUE_RETENTION_MARGIN_MS
    )


DEFAULT_QUEUE_RETENTION_MS: Final = queue_retention_ms(DEFAULT_MAX_DURABLE_CLIENT_TIMEOUT_S)
"""``retention.ms`` of a shared queue topic by default: 7 days and an hour."""


def server_topic_specs(
    topics: Topics,
    total_buckets: int,
    client_topic_partitions: int = DEFAULT_CLIENT_PARTITIONS,
    queue_retention: int = DEFAULT_QUEUE_RETENTION_MS,
) -> list[TopicSpec]:
    """The topics every cache server of a namespace needs: ``{ns}.ops`` and ``{ns}.events``
    with one partition per bucket, ``{ns}.control`` and ``{ns}.dead-letter`` with one, and
    the unscoped shared client topics ``{ns}.queues`` and ``{ns}.replies``
    (`client_topic_specs`).

    Args:
        topics: The namespace's topic names.
        total_buckets: Partitions of ``{ns}.ops`` and ``{ns}.events``.
        client_topic_partitions: Partitions of the shared client topics if created now.
        queue_retention: ``retention.ms`` of the shared queue topic (`queue_retention_ms`
            of the longest durable-client timeout the servers accept).
    """
    kept = retention(DEFAULT_RETENTION_MS)
    return [
        TopicSpec(topics.ops, total_buckets, kept),
        TopicSpec(topics.events, total_buckets, kept),
        TopicSpec(topics.control, 1, retention(DEFAULT_RETENTION_MS, CONTROL_BATCH_MAX_BYTES)),
        TopicSpec(
            topics.dead_letter, 1, retention(DEFAULT_RETENTION_MS, DEAD_LETTER_BATCH_MAX_BYTES)
        ),
        *client_topic_specs(topics, None, client_topic_partitions, queue_retention),
    ]


def client_topic_specs(
    topics: Topics,
    kafka_principal: str | None,
    partitions: int = DEFAULT_CLIENT_PARTITIONS,
    queue_retention: int = DEFAULT_QUEUE_RETENTION_MS,
) -> list[TopicSpec]:
    """The shared subscription-queue and reply topics of the clients of one Kafka principal
    (None: the namespace's unscoped ones). Whoever creates them first sets the partition
    count; every client then reads the partition its id hashes to among those there are.

    Args:
        topics: The namespace's topic names.
        kafka_principal: The principal, or None.
        partitions: Partitions if created now.
        queue_retention: ``retention.ms`` of the queue topic (the servers check it is at
            least `queue_retention_ms` of the longest durable-client timeout they accept).
    """
    return [
        TopicSpec(
            topics.client_queues(kafka_principal),
            partitions,
            retention(queue_retention),
            any_partitions=True,
        ),
        TopicSpec(
            topics.client_replies(kafka_principal),
            partitions,
            retention(REPLY_RETENTION_MS),
            any_partitions=True,
        ),
    ]


def acked_queue_spec(
    name: str, partitions: int = 1, retention_ms: int = KEEP_UNTIL_ACKED
) -> TopicSpec:
    """A gateway sender's or async event queue's topic: kept until acknowledged, or for
    ``retention_ms`` when the queue's spec bounds it (``GatewayQueueSpec.queue_retention_ms``)."""
    return TopicSpec(name, partitions, retention(retention_ms))


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
    admin: KafkaAdmin, specs: Iterable[TopicSpec], *, timeout_s: float = 30.0
) -> list[str]:
    """Create the topics that do not exist, check the others, and wait until every broker
    knows them.

    A topic is ready when every live broker's own metadata has it with a leader for every
    partition. Before that, producing to it or asking its offsets fails with "not leader",
    and a broker whose metadata cache has not yet learned it (a moment after the
    controller created it) answers ``UNKNOWN_TOPIC_OR_PART`` to any request about it. So
    this call asks each broker in turn, through an admin client bootstrapped from that
    broker alone (`KafkaAdmin.on_broker`), and counts an answer for the broker that gave
    it; callers then need no retry of that error. Replication follows the brokers the
    cluster has (`replication_factor`).

    Args:
        admin: An admin client of the cluster (with the caller's security settings), made
            by `regionbus.schemas.kafka_clients.kafka_admin`.
        specs: The topics wanted.
        timeout_s: Longest wait, in seconds, for metadata, creation and leaders.

    Returns:
        The names of the topics this call created (empty when all existed).

    Raises:
        ConfigurationError: an existing topic has another partition count than wanted.
        KafkaAuthorizationError: the principal may not create (or describe) a topic: with
            ACLs, Kafka says so also for a topic that exists but is not the principal's.
        TransportError: the cluster cannot be reached, refused to create a topic, or a
            broker did not show every partition with a leader within ``timeout_s``.
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
        if found and found != spec.partitions and not spec.any_partitions:
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
            except TimeoutError as exc:
                # A cluster that went away between the metadata answer and the creation
                # leaves the future unanswered: that is unreachable, as for the metadata.
                raise TransportError(f"creating topic {name}: no answer in {timeout_s} s") from exc
    _wait_for_leaders(admin, wanted, deadline)
    return created


def _wait_for_leaders(admin: KafkaAdmin, wanted: Mapping[str, TopicSpec], deadline: float) -> None:
    """Return when every live broker's own metadata has each wanted topic with a leader
    for every partition; the live brokers are those the latest metadata answer lists."""
    askers: dict[int, KafkaAdmin] = {}
    """Per broker id, an admin client bootstrapped from that broker alone."""
    confirmed: dict[int, set[str]] = {}
    """Per broker id, the wanted topics its own metadata showed ready."""
    brokers: dict[int, tuple[str, int]] = {}
    reason = ""
    while True:
        rounds = [(broker_id, askers[broker_id]) for broker_id in sorted(askers)] or [(-1, admin)]
        for broker_id, asker in rounds:
            for name in sorted(set(wanted) - confirmed.get(broker_id, set())):
                try:
                    answer = asker.list_topics(topic=name, timeout=_METADATA_REQUEST_TIMEOUT_S)
                except KafkaException as exc:
                    reason = str(exc)
                    continue
                brokers = {b.id: (str(b.host), b.port) for b in answer.brokers.values()}
                topic = answer.topics.get(name)
                refused = topic.error if topic is not None else None
                if refused is not None and is_authorization_error(refused):
                    raise kafka_error(refused, f"metadata of {name}", f"topic {name}")
                ready, why = _ready(topic, wanted[name])
                if ready:
                    # Counted for the broker that answered, whichever was asked.
                    confirmed.setdefault(answer.orig_broker_id, set()).add(name)
                else:
                    reason = f"{name} on broker {answer.orig_broker_id}: {why}"
                if broker_id >= 0 and answer.orig_broker_id != broker_id:
                    del askers[broker_id]  # it reached another broker: a new one next round
                    break
        if len(brokers) == 1:
            # One broker: ``admin`` asks it, and its answer is the broker's own.
            askers = {broker_id: admin for broker_id in brokers}
        else:
            askers = {
                broker_id: askers.get(broker_id) or admin.on_broker(host, port)
                for broker_id, (host, port) in brokers.items()
            }
        if brokers and all(set(wanted) <= confirmed.get(b, set()) for b in brokers):
            return
        if time.monotonic() > deadline:
            raise TransportError(f"topics not ready on every broker in time: {reason}")
        time.sleep(_LEADER_POLL_INTERVAL_S)


def _ready(topic: TopicMetadata | None, spec: TopicSpec) -> tuple[bool, str]:
    if topic is None or topic.error is not None:
        return False, str(topic.error) if topic is not None else "absent"
    leaderless = [p for p in topic.partitions.values() if p.leader < 0 or p.error]
    if leaderless:
        return False, f"{len(leaderless)} partitions without a leader"
    counted = len(topic.partitions) == spec.partitions or (
        spec.any_partitions and bool(topic.partitions)
    )
    return counted, "" if counted else f"{len(topic.partitions)} partitions"


__all__ = [
    "DEFAULT_CLIENT_PARTITIONS",
    "DEFAULT_MAX_DURABLE_CLIENT_TIMEOUT_S",
    "DEFAULT_QUEUE_RETENTION_MS",
    "DEFAULT_RETENTION_MS",
    "KEEP_UNTIL_ACKED",
    "LINK_RETENTION_MS",
    "REPLY_RETENTION_MS",
    "TopicSpec",
    "acked_queue_spec",
    "client_topic_specs",
    "config_repairs",
    "ensure_topic_configs",
    "ensure_topics",
    "link_topic_spec",
    "queue_retention_ms",
    "replication_factor",
    "retention",
    "server_topic_specs",
]
