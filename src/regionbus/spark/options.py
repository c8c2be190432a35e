"""The options of Spark's built-in Kafka source, parsed for the Python source.

Names and meanings follow Spark's Structured Streaming + Kafka integration guide, so one
query's ``.option(...)`` calls work with either ``format("kafka")`` (the JVM connector) or
this package's Python source:

- ``kafka.bootstrap.servers`` (required) and any other ``kafka.<librdkafka key>``;
- exactly one of ``subscribe`` (comma-separated topics), ``subscribePattern`` (a regex
  matched against the whole topic name) and ``assign`` (JSON ``{"topic": [0, 1]}``);
- ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON
  ``{"topic": {"0": 23, "1": -2}}`` with ``-2`` for earliest and ``-1`` for latest;
- by timestamp (milliseconds since the Unix epoch; the offset is the earliest whose record
  timestamp is at or after it): ``startingTimestamp`` / ``endingTimestamp`` (every
  partition) and ``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp`` (JSON
  ``{"topic": {"0": 1700000000000}}`` naming every partition read). Each takes precedence
  as in Spark: ``*Timestamp`` over ``*OffsetsByTimestamp`` over ``*Offsets``. A start with
  no record that recent fails the read, or starts at the end with
  ``startingOffsetsByTimestampStrategy=latest``; such an end is the partition's end. The
  ending options are for batch reads only;
- ``maxOffsetsPerTrigger`` (streaming), ``includeHeaders`` (default false, as in Spark),
  ``kafkaConsumer.pollTimeoutMs`` (default 120,000 ms, as in Spark).

Options Spark's source has and this one ignores: ``failOnDataLoss``, ``minPartitions``,
``groupIdPrefix``, ``kafka.group.id``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from regionbus.schemas.errors import ConfigurationError

EARLIEST: Final = -2
"""Offset placeholder for "the first offset of the partition" (Spark's ``-2``)."""
LATEST: Final = -1
"""Offset placeholder for "the end of the partition" (Spark's ``-1``)."""

DEFAULT_POLL_TIMEOUT_MS: Final = 120_000
"""Spark's ``kafkaConsumer.pollTimeoutMs`` default."""

_KAFKA_PREFIX: Final = "kafka."
SPARK_OWNED_KAFKA_KEYS: Final = frozenset(
    {
        "group.id",
        "key.deserializer",
        "value.deserializer",
        "key.serializer",
        "value.serializer",
        "auto.offset.reset",
        "enable.auto.commit",
        "interceptor.classes",
    }
)
"""Java client settings Spark's Kafka source and sink set themselves and refuse from a
user, which also have no librdkafka equivalent: dropped on either side instead of failing
the client's construction."""

TopicPartitionKey = tuple[str, int]
"""``(topic, partition)``."""

OffsetSpec = str | dict[TopicPartitionKey, int]
"""``"earliest"``, ``"latest"``, or explicit offsets per partition (``EARLIEST``/``LATEST``
allowed as values)."""

TimestampSpec = int | dict[TopicPartitionKey, int]
"""One timestamp for every partition, or one per partition (ms since the Unix epoch)."""


@dataclass(frozen=True)
class Subscription:
    """Which topics or partitions to read; exactly one field is set.

    Attributes:
        topics: Topic names (``subscribe``).
        pattern: A compiled regex matched against whole topic names (``subscribePattern``).
        assignment: Explicit partitions (``assign``).
    """

    topics: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    assignment: tuple[TopicPartitionKey, ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether a topic is read (for ``assign``: whether any of its partitions is)."""
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        if self.topics:
            return topic in self.topics
        return any(t == topic for t, _ in self.assignment)


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one read.

    Attributes:
        kafka_config: librdkafka settings (``kafka.`` prefix removed).
        subscription: What to read.
        starting_offsets: Where to start (``startingOffsets``).
        ending_offsets: Where a batch read ends (``endingOffsets``).
        starting_timestamps: ``startingTimestamp`` (wins) or ``startingOffsetsByTimestamp``
            (ms since the Unix epoch); when set it replaces :attr:`starting_offsets`.
        ending_timestamps: ``endingTimestamp`` or ``endingOffsetsByTimestamp``, likewise.
        starting_timestamp_strategy: ``startingOffsetsByTimestampStrategy``: a partition
            with no record at or after its starting timestamp fails the read
            (``"error"``, Spark's default) or starts at its end (``"latest"``).
        max_offsets_per_trigger: Most records per micro-batch, over all partitions
            (None: no limit).
        include_headers: Whether the ``headers`` column exists.
        poll_timeout_ms: Longest wait for a record known to exist before the task fails,
            in milliseconds.
    """

    kafka_config: dict[str, str]
    subscription: Subscription
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    max_offsets_per_trigger: int | None
    include_headers: bool
    poll_timeout_ms: int
    starting_timestamps: TimestampSpec | None = None
    ending_timestamps: TimestampSpec | None = None
    starting_timestamp_strategy: Literal["error", "latest"] = "error"


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse the ``.option(...)`` values of a read.

    Args:
        options: The options as Spark passes them (keys case-insensitive).
        streaming: True for ``readStream`` (default start ``latest``), False for ``read``
            (default start ``earliest``; ``latest`` refused as a start, as Spark does).

    Returns:
        The parsed options.

    Raises:
        ConfigurationError: ``kafka.bootstrap.servers`` is missing, not exactly one of
            ``subscribe``/``subscribePattern``/``assign`` is given, an ending timestamp
            option is given to a stream, or a value is malformed.
    """
    lowered = {k.lower(): v for k, v in options.items()}
    kafka_config = {
        k[len(_KAFKA_PREFIX) :]: v
        for k, v in options.items()
        if k.lower().startswith(_KAFKA_PREFIX)
        and k[len(_KAFKA_PREFIX) :] not in SPARK_OWNED_KAFKA_KEYS
    }
    if "bootstrap.servers" not in kafka_config:
        raise ConfigurationError("option kafka.bootstrap.servers is required")
    subscription = _subscription(lowered)
    starting = _offset_spec(
        lowered.get("startingoffsets", "latest" if streaming else "earliest"), "startingOffsets"
    )
    if not streaming and (starting == "latest" or _names(starting, LATEST)):
        raise ConfigurationError("startingOffsets=latest is not allowed for a batch read")
    ending = _offset_spec(lowered.get("endingoffsets", "latest"), "endingOffsets")
    if ending == "earliest" or _names(ending, EARLIEST):
        raise ConfigurationError("endingOffsets=earliest is not allowed")
    ending_timestamps = _timestamp_spec(lowered, "ending")
    if streaming and ending_timestamps is not None:
        raise ConfigurationError(
            "endingTimestamp / endingOffsetsByTimestamp are for batch reads, not streams"
        )
    strategy = lowered.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ConfigurationError(
            f"startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}"
        )
    max_offsets = lowered.get("maxoffsetspertrigger")
    return SourceOptions(
        kafka_config=kafka_config,
        subscription=subscription,
        starting_offsets=starting,
        ending_offsets=ending,
        starting_timestamps=_timestamp_spec(lowered, "starting"),
        ending_timestamps=ending_timestamps,
        starting_timestamp_strategy="latest" if strategy == "latest" else "error",
        max_offsets_per_trigger=_positive_int(max_offsets, "maxOffsetsPerTrigger")
        if max_offsets is not None
        else None,
        include_headers=_boolean(lowered.get("includeheaders", "false"), "includeHeaders"),
        poll_timeout_ms=_positive_int(
            lowered.get("kafkaconsumer.polltimeoutms", str(DEFAULT_POLL_TIMEOUT_MS)),
            "kafkaConsumer.pollTimeoutMs",
        ),
    )


def _subscription(lowered: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if lowered.get(k)]
    if len(given) != 1:
        raise ConfigurationError(
            "exactly one of the options subscribe, subscribePattern, assign is required"
        )
    (kind,) = given
    value = lowered[kind]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise ConfigurationError("option subscribe names no topic")
        return Subscription(topics=topics)
    if kind == "subscribepattern":
        try:
            return Subscription(pattern=re.compile(value))
        except re.error as exc:
            raise ConfigurationError(f"subscribePattern {value!r}: {exc}") from exc
    parsed = _json(value, "assign")
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigurationError('assign must be JSON like {"topic": [0, 1]}')
    assignment: list[TopicPartitionKey] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(isinstance(p, int) for p in partitions):
            raise ConfigurationError(f"assign: partitions of {topic!r} must be a list of ints")
        assignment.extend((str(topic), p) for p in partitions)
    return Subscription(assignment=tuple(assignment))


def _offset_spec(value: str, name: str) -> OffsetSpec:
    stripped = value.strip()
    if stripped.lower() in ("earliest", "latest"):
        return stripped.lower()
    parsed = _json(stripped, name)
    if not isinstance(parsed, dict):
        raise ConfigurationError(f'{name} must be earliest, latest or JSON {{"topic": {{...}}}}')
    offsets: dict[TopicPartitionKey, int] = {}
    for topic, per_partition in parsed.items():
        if not isinstance(per_partition, dict):
            raise ConfigurationError(f"{name}: offsets of {topic!r} must be an object")
        for partition, offset in per_partition.items():
            if not isinstance(offset, int) or offset < EARLIEST:
                raise ConfigurationError(f"{name}: bad offset {offset!r} for {topic}[{partition}]")
            try:
                offsets[(str(topic), int(partition))] = offset
            except ValueError as exc:
                raise ConfigurationError(f"{name}: bad partition {partition!r}") from exc
    return offsets


def _timestamp_spec(lowered: Mapping[str, str], side: str) -> TimestampSpec | None:
    """``<side>Timestamp`` (wins) or ``<side>OffsetsByTimestamp``, None when neither."""
    single = lowered.get(f"{side}timestamp")
    if single is not None:
        return _timestamp(single.strip(), f"{side}Timestamp")
    per_partition = lowered.get(f"{side}offsetsbytimestamp")
    if per_partition is None:
        return None
    name = f"{side}OffsetsByTimestamp"
    parsed = _json(per_partition, name)
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigurationError(f'{name} must be JSON {{"topic": {{"0": <timestamp ms>}}}}')
    timestamps: dict[TopicPartitionKey, int] = {}
    for topic, per_topic in parsed.items():
        if not isinstance(per_topic, dict):
            raise ConfigurationError(f"{name}: timestamps of {topic!r} must be an object")
        for partition, value in per_topic.items():
            try:
                key = (str(topic), int(partition))
            except ValueError as exc:
                raise ConfigurationError(f"{name}: bad partition {partition!r}") from exc
            timestamps[key] = _timestamp(value, f"{name} of {topic}[{partition}]")
    return timestamps


def _timestamp(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigurationError(f"{name} must be milliseconds since the epoch, got {value!r}")
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigurationError(
            f"{name} must be milliseconds since the epoch, got {value!r}"
        ) from exc
    if number < 0:
        raise ConfigurationError(f"{name} must not be negative, got {number}")
    return number


def _names(spec: OffsetSpec, placeholder: int) -> bool:
    return isinstance(spec, dict) and placeholder in spec.values()


def _json(value: str, name: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name} is not valid JSON: {exc}") from exc


def _positive_int(value: str, name: str) -> int:
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name} must be an integer, got {value!r}") from exc
    if number <= 0:
        raise ConfigurationError(f"{name} must be positive, got {number}")
    return number


def _boolean(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigurationError(f"{name} must be true or false, got {value!r}")
    return lowered == "true"


def offsets_to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """Offsets in Spark's Kafka offset JSON shape: ``{"topic": {"0": 12}}``.

    Args:
        offsets: ``{(topic, partition): offset}``.

    Returns:
        A JSON-ready dict (partition numbers as strings, as Spark writes them).
    """
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def offsets_from_json(data: Mapping[str, Mapping[str, int]]) -> dict[TopicPartitionKey, int]:
    """The inverse of :func:`offsets_to_json`."""
    return {
        (topic, int(partition)): int(offset)
        for topic, per_partition in data.items()
        for partition, offset in per_partition.items()
    }


def split_limit(
    start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int], limit: int
) -> dict[TopicPartitionKey, int]:
    """Cut a micro-batch to at most ``limit`` records, shared in proportion to each
    partition's backlog (as Spark's Kafka source does for ``maxOffsetsPerTrigger``).

    Args:
        start: Offsets the batch starts at; partitions missing here start at 0.
        end: Offsets available.
        limit: Most records in the batch, over all partitions (> 0).

    Returns:
        End offsets with ``sum(end - start) <= limit`` that advance by at least one record
        when anything is available.
    """
    backlog = {tp: max(0, end[tp] - start.get(tp, 0)) for tp in end}
    total = sum(backlog.values())
    if total <= limit:
        return dict(end)
    cut: dict[TopicPartitionKey, int] = {}
    given = 0
    for tp in sorted(end):
        share = backlog[tp] * limit // total
        cut[tp] = start.get(tp, 0) + share
        given += share
    # Rounding down can leave room (and, for tiny limits, no progress): hand it out in order.
    for tp in sorted(end):
        if given >= limit:
            break
        extra = min(backlog[tp] - (cut[tp] - start.get(tp, 0)), limit - given)
        cut[tp] += extra
        given += extra
    return cut


__all__ = [
    "DEFAULT_POLL_TIMEOUT_MS",
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "SourceOptions",
    "Subscription",
    "TimestampSpec",
    "TopicPartitionKey",
    "offsets_from_json",
    "offsets_to_json",
    "parse_source_options",
    "split_limit",
]
