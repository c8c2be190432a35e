"""Bulk load of a region from a DataFrame: entries become PUT operations on ``{ns}.ops``.

The operations go through the cache servers, as a client's ``put_all`` does, so Redis is
written by the servers and every client with interest gets the events.

:func:`entries_to_operations` turns ``(key, value)`` rows into Kafka records of the Kafka
sink schema (``topic``, ``partition`` = bucket, ``key``, ``value``), so they are written with
either Kafka format (:func:`regionbus.spark.format.kafka_format`). Each Spark task is one member
(``<load id>-p<partition>``, thread 1) whose sequence ids count 0, 1, 2, ... per bucket
(docs/behaviour.md §2: N consecutive sequence ids for a bulk operation of N entries). A retried task
(same partition, same input order) sends the same EventIDs, so the servers recognise what it had
already applied. Operations of one bucket are packed into ``Batch`` messages as ``put_all``
packs them.

:func:`bulk_load` writes, then reads the replies keyed by its load id in its partition of the
shared reply topic of its Kafka principal (from where that partition ended when the load
started) until every entry is answered, and reports how many were applied, recognised as
duplicates or refused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AclOperation
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from regionbus.runtime.heartbeat import PhaseStatus
from regionbus.schemas.codec import decode_as, encode, encode_batches, split_batch
from regionbus.schemas.errors import (
    ConfigurationError,
    MessageDecodeError,
    ServerTimeoutError,
    TransportError,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer
from regionbus.schemas.messages import Operation, OperationKind, Reply
from regionbus.schemas.naming import (
    BULK_LOAD_ID_PREFIX,
    Topics,
    bucket_of,
    check_name,
    client_partition,
)
from regionbus.schemas.serializers import AvroSerializer, Serializer, serializer_named
from regionbus.schemas.signing import derive_key, signed_headers
from regionbus.schemas.topics import client_topic_specs, ensure_topics
from regionbus.schemas.transport import (
    assign_from,
    kafka_error,
    require_topic_operations,
    topic_partitions,
)
from regionbus.spark.format import kafka_options, kafka_writer
from regionbus.spark.kafka import latest_offsets

OPERATIONS_SCHEMA: Final = (
    "topic string, partition int, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>"
)
"""Columns of :func:`entries_to_operations` (the Kafka sink's); ``headers`` carries the
signing headers of a signed load (`regionbus.schemas.signing`), null otherwise."""

BULK_LOAD_THREAD: Final = 1
"""Thread id of every bulk-load member (one member per Spark task)."""

_FAILURES_KEPT: Final = 5
_HEADERS_TYPE: Final = pa.list_(
    pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
)


def _serializer(name: str, avro_schema: dict[str, Any] | None) -> Serializer:
    if avro_schema is not None:
        return AvroSerializer(avro_schema)
    return serializer_named(name)


def entries_to_operations(
    df: DataFrame,
    region: str,
    *,
    namespace: str,
    total_buckets: int,
    load_id: str,
    key_column: str = "key",
    value_column: str = "value",
    serializer: str = "json",
    avro_schema: dict[str, Any] | None = None,
    signing_key: tuple[str, bytes] | None = None,
    kafka_principal: str | None = None,
) -> DataFrame:
    """The PUT operations of a bulk load, as Kafka records for ``{ns}.ops``.

    Args:
        df: Entries: a string ``key_column`` and a ``value_column`` of any type the
            serializer takes (JSON: structs, maps, arrays, numbers, strings; ``str``: string;
            ``bytes``: binary; Avro: a struct matching ``avro_schema``).
        region: Region name.
        namespace: Site namespace.
        total_buckets: Buckets (= partitions of ``{ns}.ops``).
        load_id: Client id of the load (its replies are keyed by it) and prefix of its
            member ids; ``[A-Za-z0-9._-]``.
        key_column: Column of entry keys.
        value_column: Column of entry values.
        serializer: ``json``, ``str`` or ``bytes`` (ignored when ``avro_schema`` is given).
        avro_schema: The Avro record schema of a typed region (serializer ``avro:<name>``).
        signing_key: ``(principal, MAC key)`` to sign each record with, as servers with
            ``security_enabled`` require (`regionbus.schemas.signing.derive_key`); None: unsigned.
        kafka_principal: The Kafka principal whose shared reply topic the load reads
            (``{ns}.replies.<principal>``); None: the namespace's ``{ns}.replies``.

    Returns:
        A DataFrame of :data:`OPERATIONS_SCHEMA`, one row per Kafka message. Request ids are
        ``(Spark partition << 32) | row number``, unique within the load.

    Raises:
        ConfigurationError: ``load_id`` is not a legal client id, or a column is missing.
        SerializationError: (when the DataFrame runs) a value the serializer cannot encode,
            or a null or non-string key.
    """
    check_name("load id", load_id)
    for column in (key_column, value_column):
        if column not in df.columns:
            raise ConfigurationError(f"bulk load: the DataFrame has no column {column!r}")
    ops_topic = Topics(namespace).ops
    chosen = _serializer(serializer, avro_schema)
    serializer_name = chosen.name

    def to_operations(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        member = f"{load_id}-p{partition_id}"
        encoder = _serializer(serializer, avro_schema)
        sequences: dict[int, int] = {}
        row_number = 0
        for batch in batches:
            keys = batch.column(key_column).to_pylist()
            values = batch.column(value_column).to_pylist()
            now_ms = int(time.time() * 1000)
            per_bucket: dict[int, list[bytes]] = {}
            for key, value in zip(keys, values, strict=True):
                if not isinstance(key, str):
                    raise ConfigurationError(f"bulk load: keys are strings, got {key!r}")
                bucket = bucket_of(region, key, total_buckets)
                sequence = sequences.get(bucket, 0)
                sequences[bucket] = sequence + 1
                operation = Operation(
                    request_id=(partition_id << 32) | row_number,
                    client_id=load_id,
                    kind=OperationKind.PUT,
                    region=region,
                    timestamp_ms=now_ms,
                    event_id=EventID(member, BULK_LOAD_THREAD, sequence, bucket),
                    key=key,
                    value=encoder.dumps(value),
                    serializer=serializer_name,
                    kafka_principal=kafka_principal,
                )
                per_bucket.setdefault(bucket, []).append(encode(operation))
                row_number += 1
            topics: list[str] = []
            partitions: list[int] = []
            record_keys: list[bytes | None] = []
            record_values: list[bytes] = []
            record_headers: list[list[dict[str, Any]] | None] = []
            for bucket, framed in per_bucket.items():
                for message in encode_batches(framed):
                    topics.append(ops_topic)
                    partitions.append(bucket)
                    record_keys.append(None)
                    record_values.append(message)
                    record_headers.append(
                        None
                        if signing_key is None
                        else [
                            {"key": name, "value": value}
                            for name, value in signed_headers(
                                signing_key[1], signing_key[0], ops_topic, bucket, message
                            )
                        ]
                    )
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(topics, pa.string()),
                    pa.array(partitions, pa.int32()),
                    pa.array(record_keys, pa.binary()),
                    pa.array(record_values, pa.binary()),
                    pa.array(record_headers, _HEADERS_TYPE),
                ],
                names=["topic", "partition", "key", "value", "headers"],
            )

    return df.select(key_column, value_column).mapInArrow(to_operations, OPERATIONS_SCHEMA)


@dataclass
class BulkLoadReport:
    """What a bulk load did.

    Attributes:
        load_id: The load's client id.
        entries: Rows of the input DataFrame.
        applied: Entries the servers applied.
        duplicates: Entries recognised as already applied (a retried task's).
        failed: Entries refused (``failures`` has the first few reasons).
        failures: ``"<error type>: <message>"`` of the first refusals.
        answered: Whether every entry was answered (False when not waited for).
        write_s: Seconds spent writing the operations to Kafka.
        apply_s: Seconds from the end of the write to the last reply.
    """

    load_id: str
    entries: int
    applied: int = 0
    duplicates: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    answered: bool = False
    write_s: float = 0.0
    apply_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every entry was answered and none refused."""
        return self.answered and self.failed == 0


def ops_partitions(kafka_config: Mapping[str, str], namespace: str) -> int:
    """The partition count of ``{ns}.ops`` (= the namespace's total buckets).

    Raises:
        KafkaAuthorizationError: the Kafka principal may not describe ``{ns}.ops``.
        TransportError: Kafka did not answer, or ``{ns}.ops`` does not exist (no cache
            server of the namespace ever ran).
    """
    topic = Topics(namespace).ops
    partitions = topic_partitions(kafka_admin(dict(kafka_config)), topic, 10)
    if not partitions:
        raise TransportError(f"topic {topic} does not exist: is a cache server running?")
    return partitions


def bulk_load(
    spark: SparkSession,
    df: DataFrame,
    region: str,
    *,
    kafka_bootstrap_servers: str,
    namespace: str,
    kafka_config: Mapping[str, str] | None = None,
    key_column: str = "key",
    value_column: str = "value",
    serializer: str = "json",
    avro_schema: dict[str, Any] | None = None,
    load_id: str | None = None,
    wait_applied_timeout_s: float | None = 600.0,
    kafka_format_name: str | None = None,
    status: PhaseStatus | None = None,
    security_principal: str | None = None,
    security_secret: str | None = None,
    kafka_principal: str | None = None,
) -> BulkLoadReport:
    """Load a DataFrame of entries into a region through the cache servers.

    Args:
        spark: The session.
        df: Entries (see :func:`entries_to_operations`).
        region: Region name (must be defined on the servers, else every entry is refused
            with ``RegionNotFoundError``).
        kafka_bootstrap_servers: Kafka.
        namespace: Site namespace.
        kafka_config: More librdkafka settings (without the ``kafka.`` prefix).
        key_column: Column of keys.
        value_column: Column of values.
        serializer: ``json`` (default), ``str`` or ``bytes``.
        avro_schema: The region's Avro schema (typed regions).
        load_id: Client id of the load; a fresh ``spark-load-<hex>`` when None
            (`regionbus.schemas.naming.BULK_LOAD_ID_PREFIX`, which the bulk-load principal's Kafka
            ACLs cover, `regionbus.broker.kafka_acls.bulk_load_acls`). Running a
            load again with the same id and the same input re-sends the same EventIDs, which
            the servers recognise as duplicates.
        wait_applied_timeout_s: Longest wait for every entry's reply after the write, in
            seconds; None returns right after the write (``answered`` stays False).
        kafka_format_name: The Kafka format to write with; :func:`kafka_format` when None.
        status: Kept current with the load's phase and reply count, for a
            :class:`regionbus.runtime.heartbeat.Heartbeat`; None for none.
        security_principal: Principal to sign the load's operations as (servers with
            ``security_enabled`` refuse unsigned ones); None writes them unsigned.
        security_secret: That principal's secret; its MAC key is derived once, on the
            driver, and shipped to the tasks (never the secret).
        kafka_principal: The Kafka principal whose shared reply topic the load reads
            (``{ns}.replies.<principal>``); default ``sasl.username`` of ``kafka_config``,
            else the namespace's ``{ns}.replies``.

    Returns:
        The report.

    Raises:
        KafkaAuthorizationError: the Kafka principal may not write ``{ns}.ops`` or create
            and read the load's reply topic (`regionbus.broker.kafka_acls.bulk_load_acls`); checked
            before the Spark job starts.
        TransportError: Kafka is unreachable or ``{ns}.ops`` does not exist.
        ServerTimeoutError: not every entry was answered within ``wait_applied_timeout_s``.
        ConfigurationError, SerializationError: bad columns or values (see
            :func:`entries_to_operations`).
    """
    status = status or PhaseStatus()
    status.phase(f"checking {namespace}.ops and the load's topics")
    config: dict[str, Any] = {
        "bootstrap.servers": kafka_bootstrap_servers,
        **(kafka_config or {}),
    }
    if (security_principal is None) != (security_secret is None):
        raise ConfigurationError("security_principal and security_secret go together")
    signing_key = (
        None
        if security_principal is None or security_secret is None
        else (security_principal, derive_key(security_secret, namespace, security_principal))
    )
    load = load_id or f"{BULK_LOAD_ID_PREFIX}{uuid.uuid4().hex[:12]}"
    total_buckets = ops_partitions(config, namespace)
    principal = kafka_principal or config.get("sasl.username") or None
    reply_spec = client_topic_specs(Topics(namespace), principal)[1]
    reply_topic = reply_spec.name
    admin = kafka_admin(config)
    ensure_topics(admin, [reply_spec])
    # Refusals surface here, typed, rather than as a failed Spark task's stack trace.
    require_topic_operations(admin, Topics(namespace).ops, [AclOperation.WRITE], 10)
    require_topic_operations(admin, reply_topic, [AclOperation.READ], 10)
    reply_partition = client_partition(load, topic_partitions(admin, reply_topic, 10))
    # Replies of an earlier load with the same id are not this load's.
    replies_from = latest_offsets(config, [(reply_topic, reply_partition)])[
        (reply_topic, reply_partition)
    ]
    status.phase("counting the entries")
    entries = df.count()
    report = BulkLoadReport(load_id=load, entries=entries)
    operations = entries_to_operations(
        df,
        region,
        namespace=namespace,
        total_buckets=total_buckets,
        load_id=load,
        key_column=key_column,
        value_column=value_column,
        serializer=serializer,
        avro_schema=avro_schema,
        signing_key=signing_key,
        kafka_principal=principal,
    )
    started = time.monotonic()
    status.phase(f"writing {entries:,} entries to {Topics(namespace).ops} (Spark)")
    if kafka_format_name is None:
        kafka_writer(operations, kafka_bootstrap_servers, kafka_config).save()
    else:
        operations.write.format(kafka_format_name).mode("append").options(
            **kafka_options(kafka_format_name, kafka_bootstrap_servers, kafka_config)
        ).save()
    report.write_s = time.monotonic() - started
    if wait_applied_timeout_s is not None:
        status.phase(
            "waiting for the servers to apply them",
            lambda: (
                f"{report.applied + report.duplicates + report.failed:,} of "
                f"{report.entries:,} answered"
            ),
        )
        _await_replies(
            config,
            (reply_topic, reply_partition),
            namespace,
            load,
            replies_from,
            report,
            wait_applied_timeout_s,
        )
        report.apply_s = time.monotonic() - started - report.write_s
    return report


def _await_replies(
    config: Mapping[str, str],
    replies: tuple[str, int],
    namespace: str,
    load: str,
    start_offset: int,
    report: BulkLoadReport,
    timeout_s: float,
) -> None:
    reply_topic, reply_partition = replies
    own_key = load.encode()
    group = Topics(namespace).client_reply_group(load)
    consumer = kafka_consumer(
        {
            **config,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
    )
    answered: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        assign_from(consumer, [TopicPartition(reply_topic, reply_partition, start_offset)], 10)
        while len(answered) < report.entries:
            if time.monotonic() > deadline:
                raise ServerTimeoutError(
                    f"bulk load {report.load_id}: {len(answered)} of {report.entries} entries "
                    f"answered within {timeout_s} s ({json.dumps(_summary(report))})"
                )
            try:
                messages = consumer.consume(1000, 0.5)
            except KafkaException as exc:
                raise kafka_error(exc, f"reading {reply_topic}", f"topic {reply_topic}") from exc
            for message in messages:
                if message.error() is not None or message.key() != own_key:
                    continue
                try:
                    answers = [decode_as(raw, Reply) for raw in split_batch(message.value())]
                except MessageDecodeError:
                    continue
                for reply in answers:
                    if reply.request_id in answered:
                        continue
                    answered.add(reply.request_id)
                    _count(report, reply)
        report.answered = True
    finally:
        consumer.close()


def _count(report: BulkLoadReport, reply: Reply) -> None:
    if not reply.ok:
        report.failed += 1
        if len(report.failures) < _FAILURES_KEPT:
            report.failures.append(f"{reply.error_type}: {reply.error_message}")
    elif reply.duplicate:
        report.duplicates += 1
    else:
        report.applied += 1


def _summary(report: BulkLoadReport) -> dict[str, int]:
    return {"applied": report.applied, "duplicates": report.duplicates, "failed": report.failed}


__all__ = [
    "BULK_LOAD_THREAD",
    "OPERATIONS_SCHEMA",
    "BulkLoadReport",
    "bulk_load",
    "entries_to_operations",
    "ops_partitions",
]
