"""confluent-kafka access for the Spark source and sink: the one place its errors become ours.

Offsets come from the brokers as Spark's Kafka source takes them: ``earliest`` is a
partition's low watermark, ``latest`` its high watermark (the offset the next record will
get), and the timestamp options (``startingTimestamp``, ``endingOffsetsByTimestamp``, ...)
the earliest offset whose timestamp is at or after the given one (Kafka's ListOffsets, via
``offsets_for_times``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Literal

import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka import Message as KafkaMessage

from regionbus.schemas.errors import ConfigurationError, TransportError
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.transport import assign_from, kafka_error, watermarks
from regionbus.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    Subscription,
    TimestampSpec,
    TopicPartitionKey,
)

METADATA_TIMEOUT_S: Final = 10.0
"""Longest wait for a metadata or ListOffsets answer, in seconds."""
FETCH_WAIT_MAX_MS: Final = 100
"""``fetch.wait.max.ms`` of the source's consumers. Each lives for one range or one offset
look-up, so the idle polls it bounds cost nothing; it caps the wait of a fetch at the end
of a log (a streaming micro-batch at the head of a partition)."""
ARROW_BATCH_ROWS: Final = 10_000
"""Rows per Arrow record batch handed to Spark."""

HEADERS_TYPE: Final = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# confluent-kafka timestamp kinds -> Kafka's TimestampType ids, as Spark shows them.
_TIMESTAMP_TYPES: Final = {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema of the Kafka source's rows (Spark's column names and types).

    Args:
        include_headers: Whether to add the ``headers`` column.
    """
    fields = [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", HEADERS_TYPE))
    return pa.schema(fields)


def consumer_config(kafka_config: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka settings of a source consumer: never joins a group, never commits."""
    config: dict[str, Any] = {
        "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
        "enable.partition.eof": True,
    }
    config.update(kafka_config)
    config.update(
        {
            # librdkafka wants a group id even for assign(); one nobody else uses.
            "group.id": f"regionbus-spark-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
        }
    )
    return config


def _consume(consumer: Consumer, count: int, timeout_s: float, what: str) -> list[KafkaMessage]:
    """``consume``, less the refusals of the consumer's group: these consumers never use it
    (``assign`` and no commits), but librdkafka still looks up its coordinator and reports
    a principal without an ACL for the throw-away group (a Kafka with ACLs) as an error."""
    try:
        messages = consumer.consume(count, timeout_s)
    except KafkaException as exc:
        raise kafka_error(exc, what) from exc
    return [m for m in messages if not _group_refused(m)]


def _group_refused(message: KafkaMessage) -> bool:
    error = message.error()
    return error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def _consumer(kafka_config: Mapping[str, str]) -> Consumer:
    try:
        return kafka_consumer(consumer_config(kafka_config))
    except KafkaException as exc:
        raise TransportError(f"cannot create a Kafka consumer: {exc}") from exc


def list_partitions(
    kafka_config: Mapping[str, str], subscription: Subscription
) -> list[TopicPartitionKey]:
    """The partitions a subscription reads now.

    One metadata request lists every topic (patterns need them all anyway); a subscribed
    topic that does not exist yet simply has no partitions.

    Args:
        kafka_config: librdkafka settings (``bootstrap.servers`` at least).
        subscription: What to read.

    Returns:
        ``(topic, partition)`` pairs, sorted.

    Raises:
        TransportError: Kafka did not answer within :data:`METADATA_TIMEOUT_S`.
    """
    try:
        topics = kafka_admin(dict(kafka_config)).list_topics(timeout=METADATA_TIMEOUT_S).topics
    except KafkaException as exc:
        raise TransportError(f"Kafka metadata: {exc}") from exc
    if subscription.assignment:
        return sorted(
            (t, p) for t, p in subscription.assignment if t in topics and p in topics[t].partitions
        )
    return sorted(
        (name, p)
        for name, meta in topics.items()
        if meta.error is None and subscription.matches(name)
        for p in meta.partitions
    )


def earliest_offsets(
    kafka_config: Mapping[str, str], partitions: Iterable[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """The first offset of each partition (its low watermark).

    Raises:
        TransportError: Kafka did not answer within :data:`METADATA_TIMEOUT_S`.
    """
    return {tp: low for tp, (low, _) in _all_watermarks(kafka_config, partitions).items()}


def latest_offsets(
    kafka_config: Mapping[str, str], partitions: Iterable[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """The end of each partition: its high watermark (last offset + 1).

    Args:
        kafka_config: librdkafka settings.
        partitions: The partitions.

    Returns:
        ``{(topic, partition): end offset}``; an empty partition's end is its start.

    Raises:
        TransportError: Kafka did not answer within :data:`METADATA_TIMEOUT_S`.
    """
    return {
        tp: max(low, high) for tp, (low, high) in _all_watermarks(kafka_config, partitions).items()
    }


def _all_watermarks(
    kafka_config: Mapping[str, str], partitions: Iterable[TopicPartitionKey]
) -> dict[TopicPartitionKey, tuple[int, int]]:
    wanted = list(partitions)
    if not wanted:
        return {}
    consumer = _consumer(kafka_config)
    try:
        found = {}
        for tp in wanted:
            try:
                found[tp] = watermarks(consumer, TopicPartition(*tp), METADATA_TIMEOUT_S)
            except KafkaException as exc:
                raise TransportError(f"watermarks of {tp[0]}[{tp[1]}]: {exc}") from exc
        return found
    finally:
        consumer.close()


def offsets_for_timestamps(
    kafka_config: Mapping[str, str],
    partitions: Iterable[TopicPartitionKey],
    spec: TimestampSpec,
    *,
    when_none: Literal["error", "latest"],
) -> dict[TopicPartitionKey, int]:
    """The earliest offset of each partition whose record timestamp is at or after the
    given one (Kafka ListOffsets by timestamp), as Spark's timestamp offset options take it.

    Args:
        kafka_config: librdkafka settings.
        partitions: The partitions read.
        spec: One timestamp for every partition, or one per partition, in milliseconds
            since the Unix epoch; a per-partition spec must name every partition read
            (as Spark requires).
        when_none: What a partition gets when no record is that recent: ``"latest"`` its
            high watermark (Spark's ``endingOffsetsByTimestamp`` and
            ``startingOffsetsByTimestampStrategy=latest``), ``"error"`` raises (Spark's
            default ``startingOffsetsByTimestampStrategy``).

    Returns:
        ``{(topic, partition): offset}`` for every partition.

    Raises:
        ConfigurationError: a per-partition spec misses a partition, or (``"error"``) a
            partition has no record at or after its timestamp.
        TransportError: Kafka did not answer within :data:`METADATA_TIMEOUT_S`.
    """
    wanted = list(partitions)
    if not wanted:
        return {}
    if isinstance(spec, dict):
        missing = sorted(tp for tp in wanted if tp not in spec)
        if missing:
            raise ConfigurationError(
                f"offsets by timestamp must name every partition read; missing {missing}"
            )
    requests = [
        TopicPartition(tp[0], tp[1], spec[tp] if isinstance(spec, dict) else spec) for tp in wanted
    ]
    consumer = _consumer(kafka_config)
    try:
        try:
            answers = consumer.offsets_for_times(requests, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise TransportError(f"offsets by timestamp: {exc}") from exc
    finally:
        consumer.close()
    found: dict[TopicPartitionKey, int] = {}
    too_late: list[TopicPartitionKey] = []
    for answer in answers:
        tp = (answer.topic, answer.partition)
        if answer.error is not None:
            raise TransportError(f"offset by timestamp of {tp[0]}[{tp[1]}]: {answer.error}")
        if answer.offset >= 0:
            found[tp] = answer.offset
        else:
            too_late.append(tp)
    if too_late and when_none == "error":
        raise ConfigurationError(
            f"no record at or after the starting timestamp in {sorted(too_late)} "
            "(startingOffsetsByTimestampStrategy=latest starts those at their end)"
        )
    found.update(latest_offsets(kafka_config, too_late))
    return found


def resolve_offsets(
    kafka_config: Mapping[str, str],
    partitions: list[TopicPartitionKey],
    spec: OffsetSpec,
    default: OffsetSpec,
) -> dict[TopicPartitionKey, int]:
    """Concrete offsets for ``earliest`` / ``latest`` / per-partition JSON.

    Args:
        kafka_config: librdkafka settings.
        partitions: The partitions read.
        spec: The option's value.
        default: What a partition missing from a JSON spec gets (``"earliest"`` or
            ``"latest"``).

    Returns:
        ``{(topic, partition): offset}`` for every partition.

    Raises:
        TransportError: Kafka did not answer.
    """
    wanted: dict[TopicPartitionKey, int] = {}
    for tp in partitions:
        if isinstance(spec, str):
            wanted[tp] = EARLIEST if spec == "earliest" else LATEST
        else:
            wanted[tp] = spec.get(tp, EARLIEST if default == "earliest" else LATEST)
    resolved = {tp: o for tp, o in wanted.items() if o >= 0}
    resolved.update(
        earliest_offsets(kafka_config, [tp for tp, o in wanted.items() if o == EARLIEST])
    )
    resolved.update(latest_offsets(kafka_config, [tp for tp, o in wanted.items() if o == LATEST]))
    return resolved


def read_range(
    kafka_config: Mapping[str, str],
    tp: TopicPartitionKey,
    start: int,
    end: int,
    *,
    include_headers: bool,
    poll_timeout_ms: int,
) -> Iterator[pa.RecordBatch]:
    """Read offsets ``[start, end)`` of one partition as Arrow record batches.

    Offsets the log does not hold (compacted away, transaction markers) are skipped; the
    read ends at the first record at or past ``end - 1``, or at an EOF at or past ``end``.

    Args:
        kafka_config: librdkafka settings.
        tp: ``(topic, partition)``.
        start: First offset.
        end: Offset after the last one.
        include_headers: Whether to fill the ``headers`` column.
        poll_timeout_ms: Longest wait without a record before failing, in milliseconds.

    Yields:
        Batches of at most :data:`ARROW_BATCH_ROWS` rows in offset order, with the schema of
        :func:`arrow_schema`.

    Raises:
        TransportError: the consumer failed, or no record came for ``poll_timeout_ms``
            although the range is not finished (the records are gone or the broker is down).
    """
    if start >= end:
        return
    schema = arrow_schema(include_headers)
    consumer = _consumer(kafka_config)
    try:
        try:
            assign_from(consumer, [TopicPartition(tp[0], tp[1], start)], METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise TransportError(f"reading {tp[0]}[{tp[1]}]: {exc}") from exc
        rows = _Columns(include_headers)
        position = start
        deadline = time.monotonic() + poll_timeout_ms / 1000
        while position < end:
            # At most what is left, so the last call returns as soon as it is there.
            messages = _consume(
                consumer, min(ARROW_BATCH_ROWS, end - position), 0.5, f"reading {tp[0]}[{tp[1]}]"
            )
            if not messages and time.monotonic() > deadline:
                raise TransportError(
                    f"no record of {tp[0]}[{tp[1]}] at offset {position} (reading up to "
                    f"{end}) for kafkaConsumer.pollTimeoutMs={poll_timeout_ms}"
                )
            for message in messages:
                position = rows.add(message, position, end, tp)
                if position >= end:
                    break
            if messages:
                deadline = time.monotonic() + poll_timeout_ms / 1000
            if len(rows) >= ARROW_BATCH_ROWS:
                yield rows.take(schema)
        if len(rows):
            yield rows.take(schema)
    finally:
        consumer.close()


class _Columns:
    """Column lists of the rows read so far (cheaper than per-row dicts)."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.topics: list[str] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, message: KafkaMessage, position: int, end: int, tp: TopicPartitionKey) -> int:
        """Add one consumed message; return the next position to read."""
        error = message.error()
        offset = message.offset()
        assert offset is not None
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                raise kafka_error(error, f"reading {tp[0]}[{tp[1]}]", f"topic {tp[0]}")
            # At the end of the log: an EOF at or past ``end`` means nothing is missing.
            return end if offset >= end else position
        if offset >= end:
            return end
        kind, timestamp_ms = message.timestamp()
        self.keys.append(message.key())
        self.values.append(message.value())
        self.topics.append(tp[0])
        self.partitions.append(tp[1])
        self.offsets.append(offset)
        known = kind in _TIMESTAMP_TYPES
        self.timestamps.append(timestamp_ms * 1000 if known else None)
        self.timestamp_types.append(_TIMESTAMP_TYPES.get(kind, -1))
        if self.include_headers:
            headers = message.headers()
            self.headers.append(
                [{"key": k, "value": v} for k, v in headers]  # type: ignore[str-unpack]
                if headers
                else None
            )
        return offset + 1

    def take(self, schema: pa.Schema) -> pa.RecordBatch:
        """The rows so far as one record batch; starts over empty."""
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array(self.topics, pa.string()),
            pa.array(self.partitions, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
            pa.array(self.timestamp_types, pa.int32()),
        ]
        if self.include_headers:
            arrays.append(pa.array(self.headers, HEADERS_TYPE))
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        self._reset()
        return batch


def producer(kafka_config: Mapping[str, str]) -> Producer:
    """A producer for the sink: ``acks=all`` and idempotence, so per-partition order holds
    across retries and a broker-side resend is not stored twice. ``linger.ms=5``: a sink
    writes in bulk, where 5 ms batches halve the broker's CPU per record against 0-1 ms
    (measured on the embedded Apache Kafka), and each task waits for all of its records anyway.

    Raises:
        TransportError: the configuration is refused.
    """
    config: dict[str, Any] = {"linger.ms": 5, "acks": "all", "enable.idempotence": True}
    config.update(kafka_config)
    try:
        return kafka_producer(config)
    except KafkaException as exc:
        raise TransportError(f"cannot create a Kafka producer: {exc}") from exc


def produce(
    producer_: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    partition: int | None,
    headers: list[tuple[str, bytes | None]] | None,
    failures: list[tuple[str, KafkaError]],
) -> None:
    """Produce one record, waiting for room when the local queue is full.

    Args:
        producer_: The producer.
        topic: Destination topic.
        value: Record value.
        key: Record key.
        partition: Destination partition, None to let the partitioner choose.
        headers: Record headers.
        failures: ``(topic, error)`` of each failed delivery, appended by the delivery
            callback.

    Raises:
        TransportError: the producer refused the record.
    """

    def on_delivery(error: KafkaError | None, _message: KafkaMessage) -> None:
        if error is not None:
            # Kept, not formatted: after a fatal producer error confluent-kafka runs this
            # with that error pending, and formatting would fail and lose it.
            failures.append((topic, error))

    kwargs: dict[str, Any] = {"on_delivery": on_delivery}
    if partition is not None:
        kwargs["partition"] = partition
    if headers:
        kwargs["headers"] = headers
    while True:
        try:
            producer_.produce(topic, value, key, **kwargs)
            return
        except BufferError:
            producer_.poll(0.05)
        except KafkaException as exc:
            raise TransportError(f"Kafka produce to {topic}: {exc}") from exc


def flush(producer_: Producer, failures: list[tuple[str, KafkaError]], timeout_s: float) -> None:
    """Wait until every produced record is acknowledged.

    Raises:
        KafkaAuthorizationError: Kafka refused a record (no Write ACL on its topic), or
            the producer failed for good for want of an ACL (an idempotent producer needs
            Write on some topic, or IdempotentWrite on the cluster).
        TransportError: records are still unacknowledged after ``timeout_s`` seconds, or a
            delivery failed.
    """
    try:
        remaining = producer_.flush(timeout_s)
    except (KafkaException, SystemError) as exc:
        # A fatal producer error (e.g. CLUSTER_AUTHORIZATION_FAILED for the idempotent
        # producer's id) is pending while confluent-kafka runs the purged messages' delivery
        # callbacks, which then fail with SystemError: the cause is that KafkaException.
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, KafkaException):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise kafka_error(cause, "producing to Kafka") from exc
    if remaining:
        raise TransportError(f"{remaining} records not delivered to Kafka in {timeout_s} s")
    if failures:
        topic, error = failures[0]
        action = f"{len(failures)} records failed delivery, the first to {topic}"
        raise kafka_error(error, action, f"topic {topic}")


__all__ = [
    "ARROW_BATCH_ROWS",
    "FETCH_WAIT_MAX_MS",
    "HEADERS_TYPE",
    "METADATA_TIMEOUT_S",
    "arrow_schema",
    "consumer_config",
    "earliest_offsets",
    "flush",
    "latest_offsets",
    "list_partitions",
    "offsets_for_timestamps",
    "produce",
    "producer",
    "read_range",
    "resolve_offsets",
]
