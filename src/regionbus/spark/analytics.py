"""Queue analytics: what waits in each subscription queue and gateway queue of a namespace.

A queue's head is the committed offset of the consumer group its reader acks in. A client's
subscription queue is the records addressed to it in its partition of its Kafka principal's
shared queue topic (``{ns}.queues`` or ``{ns}.queues.<principal>``): keyed by its client
id, or listing it in the ``rb.to`` header of a record for the clients that share an
interest (`regionbus.schemas.addressing`; the changes it made itself are not counted: a
client drops them), acked under ``{ns}.client.<client>``; the clients are found by those
groups. A gateway sender's
queue ``{ns}.gw.<sender>`` is acked under ``{ns}.gw-sender.<sender>`` and an async event
queue ``{ns}.aeq.<id>`` under ``{ns}.aeq-dispatcher.<id>``, as the naming policy names them
(:meth:`regionbus.schemas.naming.Topics.parse_queue`; their workers commit once the remote
site or the listener acked). Everything after the head is unacked: what ``regionbus
status`` shows is read from the same groups.

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

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from regionbus.schemas.errors import TransportError
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer
from regionbus.schemas.naming import QueueTopic, Topics
from regionbus.spark.decode import decode_messages
from regionbus.spark.format import kafka_reader
from regionbus.spark.kafka import METADATA_TIMEOUT_S, list_partitions
from regionbus.spark.options import EARLIEST, Subscription, TopicPartitionKey, offsets_to_json


@dataclass(frozen=True)
class QueueAnalytics:
    """The three tables of one run.

    Attributes:
        queues: Per subscription queue: ``topic`` (its principal's shared queue topic),
            ``partition``, ``client_id``, ``depth`` (unacked events),
            ``oldest_unacked_age_s`` (seconds since the oldest unacked event was applied;
            null when empty).
        queue_events: Per client, region and operation (``CREATE``, ...): ``events``
            unacked.
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


def client_acks(kafka_config: Mapping[str, str], topics: Topics) -> dict[str, tuple[str, int, int]]:
    """Every client of the namespace that acks a subscription queue: ``{client id: (queue
    topic, partition, committed offset)}``, from the consumer groups ``{ns}.client.<id>``.

    Raises:
        TransportError: Kafka did not answer within the metadata timeout.
    """
    admin = kafka_admin(dict(kafka_config))
    try:
        listed = admin.list_consumer_groups(request_timeout=METADATA_TIMEOUT_S).result(
            timeout=METADATA_TIMEOUT_S
        )
        groups = [
            g.group_id for g in listed.valid if topics.client_of_group(g.group_id) is not None
        ]
        futures = {
            group: admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=METADATA_TIMEOUT_S
            )[group]
            for group in groups
        }
        acks: dict[str, tuple[str, int, int]] = {}
        for group, future in futures.items():
            client_id = topics.client_of_group(group)
            assert client_id is not None
            for tp in future.result(timeout=METADATA_TIMEOUT_S).topic_partitions or []:
                parsed = topics.client_topic(tp.topic)
                if parsed is not None and parsed.kind == "queues" and tp.offset >= 0:
                    acks[client_id] = (tp.topic, tp.partition, tp.offset)
    except (KafkaException, TimeoutError) as exc:
        raise TransportError(f"the clients' acks: {exc}") from exc
    return acks


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
    acks = client_acks(config, topics)
    for topic, partition, committed in acks.values():
        starts[(topic, partition)] = min(committed, starts.get((topic, partition), committed))
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    known = spark.createDataFrame(
        [(t, q.kind, q.owner_id) for t, q in sorted(found.items())],
        "topic string, kind string, owner_id string",
    )
    clients = spark.createDataFrame(
        [(c, t, p, o) for c, (t, p, o) in sorted(acks.items())] or [("", "", -1, 0)],
        "client_id string, topic string, partition int, committed bigint",
    ).where(F.col("partition") >= 0)
    events = _unacked_events(spark, config, starts)
    own = F.col("c.client_id") == F.col("e.addressee")
    listed = F.array_contains(F.col("e.recipients"), F.col("c.client_id")) & (
        F.col("e.originator") != F.col("c.client_id")
    )
    unacked = (
        clients.alias("c")
        .join(
            events.alias("e"),
            (F.col("c.topic") == F.col("e.topic"))
            & (F.col("c.partition") == F.col("e.partition"))
            & (own | (F.col("e.recipients").isNotNull() & listed))
            & (F.col("e.offset") >= F.col("c.committed")),
            "left",
        )
        .select(
            F.col("c.client_id").alias("client_id"),
            F.col("c.topic").alias("topic"),
            F.col("c.partition").alias("partition"),
            F.col("e.region").alias("region"),
            F.col("e.operation").alias("operation"),
            F.col("e.timestamp_ms").alias("timestamp_ms"),
        )
    )
    queues = unacked.groupBy("topic", "partition", "client_id").agg(
        F.count("operation").alias("depth"),
        ((F.lit(now) - F.min("timestamp_ms")) / 1000).alias("oldest_unacked_age_s"),
    )
    queue_events = (
        unacked.where(F.col("operation").isNotNull())
        .groupBy("client_id", "region", "operation")
        .agg(F.count(F.lit(1)).alias("events"))
    )
    gateways = (
        known.join(events, "topic", "left")
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
    columns = (
        "topic string, partition int, offset bigint, addressee string, recipients array<string>, "
        "originator string, region string, operation string, timestamp_ms bigint"
    )
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
        .option("includeHeaders", "true")
        .load()
    )
    return (
        decode_messages(raw)
        .where(F.col("message_type") == "Event")
        .select(
            "topic",
            "partition",
            "offset",
            F.col("record_key").cast("string").alias("addressee"),
            "recipients",
            "originator",
            "region",
            "operation",
            "timestamp_ms",
        )
        .cache()
    )


__all__ = ["QueueAnalytics", "client_acks", "committed_offsets", "queue_analytics"]
