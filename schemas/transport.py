"""Kafka consumption helpers shared by clients and servers."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

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
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
    }
)
"""Errors of a committed-offsets request that a later try may not get: the group
coordinator is still loading its partition of ``__consumer_offsets`` (a broker that just
started, or a coordinator that moved), or was not found yet."""


def _leader_moving(exc: BaseException) -> bool:
    return isinstance(exc, KafkaException) and exc.args[0].code() in _LEADER_MOVING


def _coordinator_moving(exc: BaseException) -> bool:
    return isinstance(exc, KafkaException) and exc.args[0].code() in _COORDINATOR_MOVING


def poll_batch(consumer: Consumer, max_messages: int, timeout_s: float) -> list[KafkaMessage]:
    """Wait up to ``timeout_s`` for the first message, then take what else is ready.

    ``Consumer.consume(n, timeout)`` waits for ``n`` messages or the whole timeout, which
    adds the timeout to every request/reply hop at low traffic; this returns as soon as
    anything arrives.

    Args:
        consumer: An assigned consumer.
        max_messages: Most messages returned.
        timeout_s: Longest wait for the first message, in seconds.

    Returns:
        The messages (possibly empty), errors included as confluent-kafka returns them.

    Raises:
        confluent_kafka.KafkaException: the consumer failed (callers translate it).
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, 0)]


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
        retry=retry_if_exception(_leader_moving),
        reraise=True,
    ):
        with attempt:
            low, high = consumer.get_watermark_offsets(
                partition, timeout=max(0.5, min(timeout_s, 10.0))
            )
    return low, high


def committed_offsets(
    consumer: Consumer, partitions: list[TopicPartition], timeout_s: float
) -> list[TopicPartition]:
    """The offsets the consumer's group committed for ``partitions``, asked of its group
    coordinator, retried with backoff for ``timeout_s`` while the coordinator is loading
    or moving (Apache Kafka answers ``NOT_COORDINATOR`` or ``COORDINATOR_LOAD_IN_PROGRESS``
    for a while after a broker starts).

    Args:
        consumer: A consumer of the group.
        partitions: The partitions.
        timeout_s: Longest time for all tries together, in seconds.

    Returns:
        One TopicPartition per partition; ``offset`` is negative where nothing is committed.

    Raises:
        confluent_kafka.KafkaException: another error, or the retriable one still after
            ``timeout_s`` (callers translate it).
    """
    for attempt in Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        retry=retry_if_exception(_coordinator_moving),
        reraise=True,
    ):
        with attempt:
            found: list[TopicPartition] = consumer.committed(
                partitions, timeout=max(1.0, min(timeout_s, 10.0))
            )
    return found


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
