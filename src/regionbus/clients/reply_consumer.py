"""The consumer of a client's replies: its partition of its Kafka principal's shared reply
topic, read from where it ends when the client starts (replies to this process come after
its start)."""

from __future__ import annotations

from typing import Final

from confluent_kafka import KafkaException, TopicPartition

from regionbus.clients.client_topics import ClientAddress
from regionbus.clients.settings import ClientSettings
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.kafka_outage import KafkaOutage
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_guard import GuardedConsumer
from regionbus.schemas.transport import kafka_error, watermarks

REPLY_FETCH_WAIT_MAX_MS: Final = 5_000
"""librdkafka ``fetch.wait.max.ms`` of the reply consumer (the queue's is
``fetch_wait_max_ms``): how long the broker holds an idle client's fetch of its replies."""


def open_reply_consumer(
    settings: ClientSettings,
    client_id: str,
    member_id: str,
    address: ClientAddress,
    kafka_outage: KafkaOutage,
) -> GuardedConsumer:
    """A consumer assigned to the client's reply partition at its high watermark.

    Args:
        settings: The client's settings (address, security, timeouts).
        client_id: The client id (names its reply group).
        member_id: The connection's member id (the consumer's ``client.id``).
        address: Where the client's replies are.
        kafka_outage: The client's outage tracker; the consumer reports errors to it, and
            the client's producer, watching the same brokers, reports their states.

    Raises:
        KafkaAuthorizationError: the principal may not read the reply topic.
        TransportError: the reply partition's end was not known within
            ``metadata_timeout_s``.
    """
    consumer = kafka_consumer(
        settings.librdkafka(
            **{
                "group.id": Topics(settings.namespace).client_reply_group(client_id),
                # An explicit offset, not OFFSET_BEGINNING: librdkafka resolves a logical
                # offset on a just-created topic only on a 500 ms retry timer. Past the log
                # start (retention), fall back to the earliest offset.
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                # A fetch returns as soon as a reply arrives (fetch.min.bytes 1), and this
                # consumer never commits nor asks an offset once reading, which would wait
                # behind the fetch: its wait only sets how often an idle client fetches.
                "fetch.wait.max.ms": max(settings.fetch_wait_max_ms, REPLY_FETCH_WAIT_MAX_MS),
                "client.id": member_id,
                **kafka_outage.client_config("replies", watched=False),
            }
        )
    )
    partition = TopicPartition(address.reply_topic, address.reply_partition)
    try:
        _, high = watermarks(consumer, partition, settings.metadata_timeout_s)
    except KafkaException as exc:
        consumer.close()
        topic = address.reply_topic
        raise kafka_error(exc, f"reply topic of {client_id}", f"topic {topic}") from exc
    partition.offset = max(high, 0)
    consumer.assign([partition])
    return consumer


__all__ = ["REPLY_FETCH_WAIT_MAX_MS", "open_reply_consumer"]
