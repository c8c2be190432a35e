"""Kafka consumption helper shared by clients and servers."""

from __future__ import annotations

from confluent_kafka import Consumer
from confluent_kafka import Message as KafkaMessage


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
