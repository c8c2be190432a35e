"""A Python data source with the schema, options and sink of Spark's built-in Kafka source.

Registered as :data:`SOURCE_NAME` by :func:`regionbus.spark.format.kafka_format` when the JVM
connector (``org.apache.spark:spark-sql-kafka-0-10``) is not on the classpath, so a query
written for ``format("kafka")`` runs unchanged. Reads are batch (``spark.read``) or
Structured Streaming (``spark.readStream``, with ``maxOffsetsPerTrigger`` and
``Trigger.AvailableNow``); writes (``df.write`` / ``writeStream``) take the Kafka sink's
columns ``value`` (required), ``key``, ``topic``, ``partition``, ``headers``.

Offsets are Spark's Kafka offset JSON (``{"topic": {"0": 12}}``), kept by Spark in the
query's checkpoint; nothing is ever committed to Kafka. ``earliest`` and ``latest`` are the
partitions' watermarks, the timestamp options Kafka's offsets by timestamp (see
:mod:`regionbus.spark.kafka`). Every object here stays picklable: consumers and
producers are opened inside ``read()`` / ``write()`` (and for offset look-ups on the driver,
per call).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from regionbus.schemas.errors import ConfigurationError
from regionbus.spark import kafka

if TYPE_CHECKING:
    from confluent_kafka import KafkaError
from regionbus.spark.options import (
    SourceOptions,
    TopicPartitionKey,
    offsets_from_json,
    offsets_to_json,
    parse_source_options,
    split_limit,
)

SOURCE_NAME: Final = "regionbus_kafka"
"""The format name of the Python source (``spark.read.format(SOURCE_NAME)``)."""

SINK_FLUSH_TIMEOUT_S: Final = 120.0
"""Longest wait for a write task's records to be acknowledged, in seconds."""

_BASE_COLUMNS: Final = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
_HEADERS_COLUMN: Final = "headers array<struct<key: string, value: binary>>"


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark partition: offsets ``[start, end)`` of one Kafka partition.

    Attributes:
        topic: Kafka topic.
        partition: Kafka partition.
        start: First offset.
        end: Offset after the last one.
    """

    topic: str
    partition: int
    start: int
    end: int


class KafkaTopicsSource(DataSource):
    """The data source. Options: see :mod:`regionbus.spark.options` (Spark's Kafka source
    options)."""

    @classmethod
    def name(cls) -> str:
        """:data:`SOURCE_NAME`."""
        return SOURCE_NAME

    def schema(self) -> str:
        """Spark's Kafka source schema; ``headers`` only with ``includeHeaders=true``."""
        lowered = {k.lower(): v for k, v in self.options.items()}
        with_headers = lowered.get("includeheaders", "false").strip().lower() == "true"
        return f"{_BASE_COLUMNS}, {_HEADERS_COLUMN}" if with_headers else _BASE_COLUMNS

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader.

        Raises:
            ConfigurationError: the options are incomplete or malformed.
        """
        return BatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """A micro-batch stream reader.

        Raises:
            ConfigurationError: the options are incomplete or malformed.
        """
        return StreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        """A batch writer with Kafka sink semantics (at least once; ``overwrite`` ignored).

        Raises:
            ConfigurationError: no ``value`` column, or neither a ``topic`` column nor option.
        """
        return BatchWriter(_sink_options(self.options, schema))

    def streamWriter(  # noqa: N802
        self, schema: StructType, overwrite: bool
    ) -> DataSourceStreamArrowWriter:
        """A stream writer with Kafka sink semantics (at least once).

        Raises:
            ConfigurationError: as :meth:`writer`.
        """
        return StreamWriter(_sink_options(self.options, schema))


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, OffsetRange)
    yield from kafka.read_range(
        options.kafka_config,
        (partition.topic, partition.partition),
        partition.start,
        partition.end,
        include_headers=options.include_headers,
        poll_timeout_ms=options.poll_timeout_ms,
    )


def _start_offsets(
    options: SourceOptions, partitions: list[TopicPartitionKey], default: str
) -> dict[TopicPartitionKey, int]:
    """Where a read starts: by timestamp when one is given (Spark: ``startingTimestamp``
    over ``startingOffsetsByTimestamp`` over ``startingOffsets``), ``default`` for a
    partition a JSON ``startingOffsets`` does not name."""
    config = options.kafka_config
    if options.starting_timestamps is not None:
        return kafka.offsets_for_timestamps(
            config,
            partitions,
            options.starting_timestamps,
            when_none=options.starting_timestamp_strategy,
        )
    return kafka.resolve_offsets(config, partitions, options.starting_offsets, default)


def _end_offsets(
    options: SourceOptions, partitions: list[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """Where a batch read ends: by timestamp when one is given (no record that recent: the
    partition's end, as in Spark), else ``endingOffsets`` (default ``latest``)."""
    config = options.kafka_config
    if options.ending_timestamps is not None:
        return kafka.offsets_for_timestamps(
            config, partitions, options.ending_timestamps, when_none="latest"
        )
    return kafka.resolve_offsets(config, partitions, options.ending_offsets, "latest")


def _ranges(
    start: dict[TopicPartitionKey, int], end: dict[TopicPartitionKey, int]
) -> list[OffsetRange]:
    return [
        OffsetRange(topic, partition, start[(topic, partition)], stop)
        for (topic, partition), stop in sorted(end.items())
        if start[(topic, partition)] < stop
    ]


class BatchReader(DataSourceReader):
    """Reads from the start options up to the ending ones (``latest``: the high watermark).

    Args:
        options: Parsed source options.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per Kafka partition with records in range (at least one).

        Raises:
            TransportError: Kafka did not answer.
            ConfigurationError: a timestamp option names too few partitions, or a
                partition has no record at or after the starting timestamp (with
                ``startingOffsetsByTimestampStrategy=error``).
        """
        partitions = kafka.list_partitions(self.options.kafka_config, self.options.subscription)
        start = _start_offsets(self.options, partitions, "earliest")
        end = _end_offsets(self.options, partitions)
        # An end before the start (timestamps) reads nothing, as in Spark.
        ranges = _ranges(start, end)
        # Spark wants at least one partition; an empty range reads nothing.
        return ranges or [OffsetRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one range, as Arrow batches.

        Raises:
            TransportError: the consumer failed or timed out.
        """
        return _read(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the subscribed partitions; offsets live in Spark's checkpoint.

    Partitions that appear during the query (``subscribePattern``, new topics) start at
    their earliest offset, as in Spark's Kafka source.

    Args:
        options: Parsed source options.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._available_now_end: dict[TopicPartitionKey, int] | None = None

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        """Offsets of the start options (``startingOffsets`` default ``latest``, or a
        starting timestamp) for the current partitions.

        Raises:
            TransportError: Kafka did not answer.
            ConfigurationError: as :meth:`BatchReader.partitions` for the timestamps.
        """
        partitions = kafka.list_partitions(self.options.kafka_config, self.options.subscription)
        return offsets_to_json(_start_offsets(self.options, partitions, "latest"))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        """``ReadMaxRows(maxOffsetsPerTrigger)`` when set, else everything available."""
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Fix the end of an ``availableNow`` run at what is available now.

        Raises:
            TransportError: Kafka did not answer.
        """
        self._available_now_end = self._available()

    def _available(self) -> dict[TopicPartitionKey, int]:
        config = self.options.kafka_config
        return kafka.latest_offsets(
            config, kafka.list_partitions(config, self.options.subscription)
        )

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        """The end of the next micro-batch: what is available, cut to ``limit``.

        Args:
            start: The previous batch's end (Spark's offset JSON).
            limit: ``ReadMaxRows`` or ``ReadAllAvailable``.

        Raises:
            TransportError: Kafka did not answer.
        """
        begin = offsets_from_json(start)
        available = (
            dict(self._available_now_end)
            if self._available_now_end is not None
            else self._available()
        )
        new = [tp for tp in available if tp not in begin]
        begin.update(kafka.earliest_offsets(self.options.kafka_config, new))
        end = {tp: max(available[tp], begin[tp]) for tp in available}
        # A partition that vanished keeps its position (nothing more to read from it).
        end.update({tp: o for tp, o in begin.items() if tp not in end})
        if isinstance(limit, ReadMaxRows):
            end = split_limit(begin, end, limit.max_rows)
        return offsets_to_json(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One partition per Kafka partition that advanced between ``start`` and ``end``.

        Raises:
            TransportError: Kafka did not answer (for partitions new in this batch).
        """
        begin = offsets_from_json(start)
        stop = offsets_from_json(end)
        new = [tp for tp in stop if tp not in begin]
        begin.update(kafka.earliest_offsets(self.options.kafka_config, new))
        return _ranges(begin, stop)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one range, as Arrow batches.

        Raises:
            TransportError: the consumer failed or timed out.
        """
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: Kafka keeps the records; Spark's checkpoint keeps the position."""


# --- sink ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkOptions:
    """What a write needs.

    Attributes:
        kafka_config: librdkafka settings.
        topic: The ``topic`` option (overrides a ``topic`` column, as in Spark), or None.
    """

    kafka_config: dict[str, str]
    topic: str | None


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one write task produced.

    Attributes:
        records: Records acknowledged by Kafka.
    """

    records: int


def _sink_options(options: Any, schema: StructType) -> SinkOptions:
    kafka_config = {
        k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")
    }
    if "bootstrap.servers" not in kafka_config:
        raise ConfigurationError("option kafka.bootstrap.servers is required")
    names = {f.name.lower() for f in schema.fields}
    if "value" not in names:
        raise ConfigurationError("a Kafka sink needs a value column")
    lowered = {k.lower(): v for k, v in options.items()}
    topic = lowered.get("topic")
    if topic is None and "topic" not in names:
        raise ConfigurationError("a Kafka sink needs a topic column or the topic option")
    return SinkOptions(kafka_config, topic)


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise ConfigurationError(f"Kafka sink columns key/value must be string or binary: {value!r}")


def _write(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    producer = kafka.producer(options.kafka_config)
    failures: list[tuple[str, KafkaError]] = []
    count = 0
    for batch in batches:
        columns = {
            name.lower(): batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)
        }
        values = columns["value"]
        n = len(values)
        keys = columns.get("key", [None] * n)
        topics = [options.topic] * n if options.topic is not None else columns["topic"]
        partitions = columns.get("partition", [None] * n)
        headers = columns.get("headers", [None] * n)
        for i in range(n):
            topic = topics[i]
            if topic is None:
                raise ConfigurationError("a row has no topic")
            row_headers = headers[i]
            kafka.produce(
                producer,
                topic,
                _as_bytes(values[i]),
                _as_bytes(keys[i]),
                partitions[i],
                [(h["key"], h["value"]) for h in row_headers] if row_headers else None,
                failures,
            )
        count += n
        producer.poll(0)
    kafka.flush(producer, failures, SINK_FLUSH_TIMEOUT_S)
    return SinkCommit(count)


class BatchWriter(DataSourceArrowWriter):
    """Produces each row as one Kafka record; a task returns once Kafka acknowledged all.

    Args:
        options: Sink options.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        """Produce the task's rows.

        Raises:
            TransportError: Kafka refused or did not acknowledge a record.
            ConfigurationError: a row has no topic, or key/value are not string or binary.
        """
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: every record was acknowledged when its task ended."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: Kafka records cannot be withdrawn (at-least-once, as in Spark)."""


class StreamWriter(DataSourceStreamArrowWriter):
    """The stream form of :class:`BatchWriter` (at least once per micro-batch).

    Args:
        options: Sink options.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        """Produce the task's rows of one micro-batch.

        Raises:
            TransportError, ConfigurationError: as :meth:`BatchWriter.write`.
        """
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to do: every record was acknowledged when its task ended."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to undo (at-least-once)."""


__all__ = [
    "SINK_FLUSH_TIMEOUT_S",
    "SOURCE_NAME",
    "BatchReader",
    "BatchWriter",
    "KafkaTopicsSource",
    "OffsetRange",
    "SinkCommit",
    "SinkOptions",
    "StreamReader",
    "StreamWriter",
]
