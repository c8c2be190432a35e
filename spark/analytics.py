"""Queue analytics: what waits in each subscription queue and gateway queue of a namespace.

A queue's head is the committed offset of the consumer group its reader acks in, as the
naming policy names it (:meth:`regionbus.schemas.naming.Topics.parse_queue`): a client's
subscription queue ``{ns}.queue.<client>`` under ``{ns}.client.<client>``, a gateway
sender's queue ``{ns}.gw.<sender>`` under ``{ns}.gw-sender.<sender>`` and an async event
queue ``{ns}.aeq.<id>`` under ``{ns}.aeq-dispatcher.<id>`` (their workers commit once the
remote site or the listener acked). Everything after the head is unacked: the figure
``regionbus status`` shows, read from the same groups.

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

from confluent_kafka import KafkaException, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from regionbus.schemas.errors import TransportError
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.naming import QueueTopic, Topics
from regionbus.spark.decode import decode_messages
from regionbus.spark.format import kafka_reader
from regionbus.spark.kafka import METADATA_TIMEOUT_S, list_partitions
from regionbus.spark.options import EARLIEST, Subscription, TopicPartitionKey, offsets_to_json


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
    now_ms: int | None = None,
) -> QueueAnalytics:
    """Depth, age and content of every subscription queue; backlog of every gateway queue.

    Args:
        spark: The session.
        kafka_bootstrap_servers: Kafka.
        namespace: Site namespace.
        kafka_config: More librdkafka settings (without the ``kafka.`` prefix).
        now_ms: "Now" for ages, in milliseconds since the Unix epoch (default: the clock).

    Returns:
        The tables (lazy DataFrames over one cached read).

    Raises:
        TransportError: Kafka did not answer.
    """
    config: dict[str, str] = {"bootstrap.servers": kafka_bootstrap_servers, **(kafka_config or {})}
    topics = Topics(namespace)
    found: dict[str, QueueTopic] = {}
    partitions: dict[str, list[TopicPartitionKey]] = {}
    for topic, partition in list_partitions(config, Subscription(pattern=re.compile(".*"))):
        parsed = topics.parse_queue(topic)
        if parsed is not None:
            found[topic] = parsed
            partitions.setdefault(topic, []).append((topic, partition))
    starts: dict[TopicPartitionKey, int] = {}
    for topic in sorted(partitions):
        starts.update(committed_offsets(config, found[topic].ack_group, partitions[topic]))
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    known = spark.createDataFrame(
        [(t, q.kind, q.owner_id) for t, q in sorted(found.items())],
        "topic string, kind string, owner_id string",
    )
    events = _unacked_events(spark, config, starts)
    queues = _queues(known, events, now)
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


def _queues(known: DataFrame, events: DataFrame, now_ms: int) -> DataFrame:
    return (
        known.where(F.col("kind") == "queue")
        .join(events, "topic", "left")
        .groupBy("topic", F.col("owner_id").alias("client_id"))
        .agg(
            F.count("operation").alias("depth"),
            ((F.lit(now_ms) - F.min("timestamp_ms")) / 1000).alias("oldest_unacked_age_s"),
        )
        .select("topic", "client_id", "depth", "oldest_unacked_age_s")
    )


__all__ = ["QueueAnalytics", "committed_offsets", "queue_analytics"]
