"""Kafka helpers shared by clients and servers, and the translation of confluent-kafka's
errors into regionbus's (:func:`kafka_error`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from regionbus.schemas.errors import (
    AuthenticationError,
    KafkaAuthorizationError,
    RegionBusError,
    TransportError,
)
from regionbus.schemas.record_guard import GuardedConsumer, Polled

_REFUSED_RESOURCE_KINDS = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
}
"""Kafka's authorization errors and the kind of resource each is about."""

_AUTHENTICATION_FAILED = frozenset(
    {KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION}
)


def _kafka_error_of(error: KafkaError | KafkaException) -> KafkaError | None:
    if isinstance(error, KafkaError):
        return error
    first = error.args[0] if error.args else None
    return first if isinstance(first, KafkaError) else None


def is_authorization_error(error: KafkaError | KafkaException | None) -> bool:
    """True when Kafka refused for want of an ACL (topic, group, cluster, transactional id)."""
    found = None if error is None else _kafka_error_of(error)
    return found is not None and found.code() in _REFUSED_RESOURCE_KINDS


def kafka_error(
    error: KafkaError | KafkaException, action: str, resource: str | None = None
) -> RegionBusError:
    """The regionbus error for a confluent-kafka error: the one translation of Kafka's.

    Args:
        error: What confluent-kafka raised or reported (a delivery report, a message).
        action: What was being done, starting the message: ``"producing to regionbus.ops"``.
        resource: The topic or group the request was about, e.g. ``"topic regionbus.ops"``;
            None names only the kind of resource, from the error code.

    Returns:
        `KafkaAuthorizationError` when Kafka refused for want of an ACL,
        `AuthenticationError` when the SASL login failed, else `TransportError`.
    """
    found = _kafka_error_of(error)
    if found is None:
        return TransportError(f"{action}: {error}")
    code = found.code()
    if code in _REFUSED_RESOURCE_KINDS:
        refused = resource or _REFUSED_RESOURCE_KINDS[code]
        return KafkaAuthorizationError(
            f"{action}: Kafka refused it ({found.name()}): this Kafka principal has no ACL "
            f"for {refused} (grant it with `regionbus kafka-acls`, docs/security.md)",
            resource=refused,
            kafka_error=found.name(),
        )
    if code in _AUTHENTICATION_FAILED:
        return AuthenticationError(f"{action}: Kafka login failed: {found.str()}")
    return TransportError(f"{action}: {found.str()}")


def topic_partitions(client: AdminClient | Consumer, topic: str, timeout_s: float) -> int:
    """How many partitions a topic has, asking the cluster for that topic alone.

    Naming the topic (rather than listing every topic) is what makes Kafka say whether the
    principal may see it: a listing silently leaves out topics without a Describe ACL.

    Args:
        client: Any admin client or consumer of the cluster.
        topic: The topic.
        timeout_s: Longest wait for the metadata answer, in seconds.

    Returns:
        The partition count; 0 when the topic does not exist (yet).

    Raises:
        KafkaAuthorizationError: the principal may not describe the topic.
        TransportError: the cluster did not answer.
    """
    try:
        meta: Any = client.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    except KafkaException as exc:
        raise kafka_error(exc, f"metadata of {topic}", f"topic {topic}") from exc
    if meta is None:
        return 0
    if meta.error is not None:
        if is_authorization_error(meta.error):
            raise kafka_error(meta.error, f"metadata of {topic}", f"topic {topic}")
        return 0
    return len(meta.partitions)


_LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
    }
)
"""Errors of an offsets request that a later try may not get: a just-created partition
whose leader is not serving it yet, a leader moving after a broker failure."""


_COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._WAIT_COORD,
        KafkaError._TRANSPORT,
    }
)
"""Errors of a committed-offsets request while the group coordinator moves: a new cluster
still electing the leaders of ``__consumer_offsets``, a broker that died or restarted."""


def leader_moving(exc: BaseException) -> bool:
    """Whether a request failed because a partition's leader is not known or moving (a
    topic created a moment ago, a broker that failed): worth retrying."""
    return isinstance(exc, KafkaException) and exc.args[0].code() in _LEADER_MOVING


def _coordinator_moving(exc: BaseException) -> bool:
    return isinstance(exc, KafkaException) and exc.args[0].code() in _COORDINATOR_MOVING


def require_topic_operations(
    admin: AdminClient, topic: str, operations: Iterable[AclOperation], timeout_s: float
) -> None:
    """Check that Kafka lets this principal do ``operations`` on ``topic``, before work that
    would otherwise find out deep inside (a Spark task's producer, say).

    Kafka answers which operations the principal holds on the topic (the Describe request's
    authorized operations); a Kafka without an authorizer answers all of them.

    Args:
        admin: An admin client logged in as the principal.
        topic: An existing topic.
        operations: What the principal must be allowed, e.g. ``[AclOperation.WRITE]``.
        timeout_s: Longest wait for the answer, in seconds.

    Raises:
        KafkaAuthorizationError: an operation is not allowed (or the topic not visible).
        TransportError: Kafka did not answer.
    """
    future = admin.describe_topics(
        TopicCollection([topic]), include_authorized_operations=True, request_timeout=timeout_s
    )[topic]
    try:
        description = future.result(timeout=timeout_s)
    except KafkaException as exc:
        raise kafka_error(exc, f"describing {topic}", f"topic {topic}") from exc
    held = set(description.authorized_operations or ())
    if AclOperation.ALL in held:
        return
    missing = sorted(op.name for op in operations if op not in held)
    if missing:
        raise KafkaAuthorizationError(
            f"Kafka does not let this principal {' or '.join(missing)} topic {topic} "
            "(TOPIC_AUTHORIZATION_FAILED): grant it with `regionbus kafka-acls`, "
            "docs/security.md",
            resource=f"topic {topic}",
            kafka_error="TOPIC_AUTHORIZATION_FAILED",
        )


def poll_batch(consumer: Consumer, max_messages: int, timeout_s: float) -> list[Polled]:
    """Wait up to ``timeout_s`` for the first message, then take what else is ready.

    ``Consumer.consume(n, timeout)`` waits for ``n`` messages or the whole timeout, which
    adds the timeout to every request/reply hop at low traffic; this returns as soon as
    anything arrives. A record batch librdkafka cannot read comes as one
    `UnreadableRecords` in its place, and the consumer goes on past it
    (`regionbus.schemas.record_guard`): every consumer of the project is made by
    `regionbus.schemas.kafka_clients.kafka_consumer`, which makes a `GuardedConsumer`.

    Args:
        consumer: An assigned consumer.
        max_messages: Most messages returned.
        timeout_s: Longest wait for the first message, in seconds.

    Returns:
        The messages (possibly empty), errors included as confluent-kafka returns them,
        and the unreadable batches skipped, in order.

    Raises:
        confluent_kafka.KafkaException: the consumer failed (callers translate it).
    """
    if isinstance(consumer, GuardedConsumer):
        return consumer.poll_records(max_messages, timeout_s)
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, 0)]


def committed_offsets(
    consumer: Consumer, partitions: list[TopicPartition], timeout_s: float
) -> list[TopicPartition]:
    """The offsets the consumer's group committed, asked again while its coordinator moves.

    Args:
        consumer: A consumer with a ``group.id``.
        partitions: The topic partitions to ask about.
        timeout_s: Longest time for all tries together, in seconds.

    Returns:
        The partitions with their committed offsets (negative when none was committed).

    Raises:
        confluent_kafka.KafkaException: another error, or the coordinator still unknown
            after ``timeout_s`` (callers translate it).
    """
    for attempt in Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        retry=retry_if_exception(_coordinator_moving),
        reraise=True,
    ):
        with attempt:
            committed = consumer.committed(partitions, timeout=max(1.0, min(timeout_s, 10.0)))
    return committed


def watermarks(consumer: Consumer, partition: TopicPartition, timeout_s: float) -> tuple[int, int]:
    """The low and high watermark offsets of one partition, asked of its leader.

    A partition created a moment ago can answer "not leader" although metadata already
    names its leader (the broker applies leadership asynchronously), and a leader moves
    when a broker fails: such answers are retried, with backoff, for ``timeout_s``.

    Args:
        consumer: Any consumer of the cluster.
        partition: The topic and partition.
        timeout_s: Longest time for all tries together, in seconds.

    Returns:
        ``(low, high)``: the first offset kept and the offset the next message will get.

    Raises:
        confluent_kafka.KafkaException: another error, or the retriable one still after
            ``timeout_s`` (callers translate it).
    """
    for attempt in Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(multiplier=0.02, max=0.5),
        retry=retry_if_exception(leader_moving),
        reraise=True,
    ):
        with attempt:
            low, high = consumer.get_watermark_offsets(
                partition, timeout=max(0.5, min(timeout_s, 10.0))
            )
    return low, high


def assign_from(
    consumer: Consumer,
    partitions: list[TopicPartition],
    timeout_s: float,
    *,
    incremental: bool = False,
) -> None:
    """Assign partitions (offsets set) after asking the metadata of their topics.

    A consumer that never saw a topic learns its partitions' leaders only on librdkafka's
    one-second refresh of unknown topics, and fetches nothing until then: a new client got
    its first event 0.87 s after the put, against 0.02 s with the metadata asked first.

    Args:
        consumer: The consumer.
        partitions: Topic, partition and start offset of each.
        timeout_s: Longest wait for the metadata of one topic, in seconds.
        incremental: Add to the assignment (``incremental_assign``) instead of replacing it.

    Raises:
        confluent_kafka.KafkaException: the metadata request or the assignment failed
            (callers translate it).
    """
    for topic in sorted({tp.topic for tp in partitions}):
        consumer.list_topics(topic=topic, timeout=timeout_s)
    if incremental:
        consumer.incremental_assign(partitions)
    else:
        consumer.assign(partitions)
