"""Queue analytics: what waits in each subscription queue and gateway queue of a namespace.

A subscription queue ``{ns}.queue.<client>`` is acked by the client committing its offset
under the group ``{ns}.client.<client>`` (ARCHITECTURE.md); everything after that offset is
unacked. A gateway queue ``{ns}.gw.<sender>`` (and an async event queue ``{ns}.aeq.<id>``)
leaves the queue when its dispatcher commits after the remote ack; its group is
``gateway_group_format`` with ``{topic}`` replaced by the queue topic (default: the topic
name), because the gateway issue has not fixed that name yet.

The unacked records are read with one Spark batch read (offsets from the committed ones to
the high watermarks), batches exploded into events, and counted. Depth and backlog are in
**events** (a queue record may be a batch of events); markers are not counted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaException, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from regionbus.schemas.errors import TransportError
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.naming import Topics
from regionbus.spark.decode import decode_messages
from regionbus.spark.format import kafka_reader
from regionbus.spark.kafka import METADATA_TIMEOUT_S, list_partitions
from regionbus.spark.options import EARLIEST, Subscription, TopicPartitionKey, offsets_to_json

DEFAULT_GATEWAY_GROUP_FORMAT: Final = "{topic}"
"""Consumer group of a gateway or async event queue, ``{topic}`` being the queue topic."""


@dataclass(frozen=True)
class QueueAnalytics:
    """The three tables of one run.

    Attributes:
        queues: Per subscription queue: ``topic``, ``client_id``, ``depth`` (unacked
            events), ``oldest_unacked_age_s`` (seconds since the oldest unacked event was
            applied; null when empty).
        queue_events: Per subscription queue, region and operation (``CREATE``, ...):
            ``events`` unacked.
        gateways: Per gateway or async event queue: ``topic``, ``kind`` (``gateway`` or
            ``async-event-queue``), ``backlog`` (events not yet acked by the remote site or
            listener), ``oldest_age_s``.
    """

    queues: DataFrame
    queue_events: DataFrame
    gateways: DataFrame


def committed_offsets(
    kafka_config: Mapping[str, str], group: str, partitions: list[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """The offsets a consumer group committed (:data:`EARLIEST` where it committed none).

    Raises:
        TransportError: Kafka did not answer within the metadata timeout.
    """
    consumer = kafka_consumer({**kafka_config, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed(
            [TopicPartition(t, p) for t, p in partitions], timeout=METADATA_TIMEOUT_S
        )
    except KafkaException as exc:
        raise TransportError(f"committed offsets of {group}: {exc}") from exc
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else EARLIEST for tp in found}


def queue_analytics(
    spark: SparkSession,
    *,
    kafka_bootstrap_servers: str,
    namespace: str,
    kafka_config: Mapping[str, str] | None = None,
    gateway_group_format: str = DEFAULT_GATEWAY_GROUP_FORMAT,
    now_ms: int | None = None,
) -> QueueAnalytics:
    """Depth, age and content of every subscription queue; backlog of every gateway queue.

    Args:
        spark: The session.
        kafka_bootstrap_servers: Kafka.
        namespace: Site namespace.
        kafka_config: More librdkafka settings (without the ``kafka.`` prefix).
        gateway_group_format: Group of a gateway / async event queue (``{topic}`` is
            replaced by its topic).
        now_ms: "Now" for ages, in milliseconds since the Unix epoch (default: the clock).

    Returns:
        The tables (lazy DataFrames over one cached read).

    Raises:
        TransportError: Kafka did not answer.
    """
    config: dict[str, str] = {"bootstrap.servers": kafka_bootstrap_servers, **(kafka_config or {})}
    topics = Topics(namespace)
    prefixes = {
        topics.queue_prefix: "queue",
        topics.gateway_prefix: "gateway",
        topics.async_event_queue_prefix: "async-event-queue",
    }

    def kind_of(topic: str) -> str | None:
        return next((k for p, k in prefixes.items() if topic.startswith(p)), None)

    partitions = [
        tp
        for tp in list_partitions(config, Subscription(pattern=re.compile(".*")))
        if kind_of(tp[0]) is not None
    ]
    starts: dict[TopicPartitionKey, int] = {}
    for topic in sorted({t for t, _ in partitions}):
        group = (
            topics.client_group(topic[len(topics.queue_prefix) :])
            if kind_of(topic) == "queue"
            else gateway_group_format.format(topic=topic)
        )
        starts.update(committed_offsets(config, group, [tp for tp in partitions if tp[0] == topic]))
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    known = spark.createDataFrame(
        [(t, kind_of(t)) for t in sorted({t for t, _ in partitions})] or [("", "none")],
        "topic string, kind string",
    ).where(F.col("kind") != "none")
    events = _unacked_events(spark, config, starts)
    queues = _queues(known, events, now, len(topics.queue_prefix) + 1)
    queue_events = (
        events.join(known.where(F.col("kind") == "queue"), "topic")
        .groupBy("topic", "region", "operation")
        .agg(F.count(F.lit(1)).alias("events"))
    )
    gateways = (
        known.where(F.col("kind") != "queue")
        .join(events, "topic", "left")
        .groupBy("topic", "kind")
        .agg(
            F.count("operation").alias("backlog"),
            ((F.lit(now) - F.min("timestamp_ms")) / 1000).alias("oldest_age_s"),
        )
    )
    return QueueAnalytics(queues, queue_events, gateways)


def _unacked_events(
    spark: SparkSession, config: Mapping[str, str], starts: dict[TopicPartitionKey, int]
) -> DataFrame:
    columns = "topic string, region string, operation string, timestamp_ms bigint"
    if not starts:
        return spark.createDataFrame([], columns)
    settings = dict(config)
    reader = kafka_reader(spark, settings.pop("bootstrap.servers"), settings)
    assignment: dict[str, list[int]] = {}
    for topic, partition in sorted(starts):
        assignment.setdefault(topic, []).append(partition)
    raw = (
        reader.option("assign", json.dumps(assignment))
        .option("startingOffsets", json.dumps(offsets_to_json(starts)))
        .option("endingOffsets", "latest")
        .load()
    )
    return (
        decode_messages(raw)
        .where(F.col("message_type") == "Event")
        .select("topic", "region", "operation", "timestamp_ms")
        .cache()
    )


def _queues(known: DataFrame, events: DataFrame, now_ms: int, client_at: int) -> DataFrame:
    return (
        known.where(F.col("kind") == "queue")
        .join(events, "topic", "left")
        .groupBy("topic")
        .agg(
            F.count("operation").alias("depth"),
            ((F.lit(now_ms) - F.min("timestamp_ms")) / 1000).alias("oldest_unacked_age_s"),
        )
        .withColumn("client_id", F.expr(f"substring(topic, {client_at})"))
        .select("topic", "client_id", "depth", "oldest_unacked_age_s")
    )


__all__ = ["DEFAULT_GATEWAY_GROUP_FORMAT", "QueueAnalytics", "committed_offsets", "queue_analytics"]
