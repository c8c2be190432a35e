"""Each client's true lag for ``regionbus status``: its own records after its ack.

The clients of one Kafka principal share its queue topic, a partition per client id's hash
(`regionbus.schemas.addressing`), so the high watermark after a client's committed offset
counts every other client's records of that partition too: one away durable client makes
each client of its partition look as far behind as itself. A client's lag is the records
after its committed offset that are addressed to it (keyed by its id, or listing it among
their recipients); each holds one or more of its events.

The records are read once per partition, from the lowest committed offset of its clients
to the high watermark asked, with one consumer for every partition (keys and headers are
what is looked at), until a deadline: a partition not read to its end by then leaves its
clients' lag unknown, named in the notes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from confluent_kafka import KafkaException, TopicPartition

from regionbus.schemas.addressing import is_shared, recipient_ids
from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.kafka_outage import quiet_config
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.transport import poll_batch

_POLL_MESSAGES = 2000


class PartitionReaders(NamedTuple):
    """One queue partition: its high watermark and each client's committed offset there
    (-1: never committed; its records are counted from the partition's start)."""

    high: int
    committed: dict[str, int]


def queue_lags(
    kafka_config: Mapping[str, Any],
    group_id: str,
    partitions: Mapping[tuple[str, int], PartitionReaders],
    deadline_s: float,
) -> tuple[dict[str, int], list[str]]:
    """Count each client's records after its committed offset.

    Args:
        kafka_config: librdkafka settings (connection and security).
        group_id: A consumer group id for the reading consumer (it assigns partitions and
            never commits; librdkafka wants one).
        partitions: ``{(topic, partition): readers}`` of the queue partitions to read.
        deadline_s: ``time.monotonic()`` by which to stop reading.

    Returns:
        ``{client id: records}`` for the clients of every partition read to its end, and
        one note for each partition that was not (its clients are left out).
    """
    lags: dict[str, int] = {}
    starts: dict[tuple[str, int], int] = {}
    for place, readers in partitions.items():
        start = min((max(o, 0) for o in readers.committed.values()), default=readers.high)
        if start >= readers.high:
            lags.update(dict.fromkeys(readers.committed, 0))
        else:
            starts[place] = start
    if not starts:
        return lags, []
    counted = {place: dict.fromkeys(partitions[place].committed, 0) for place in starts}
    reached = dict(starts)
    try:
        _read(kafka_config, group_id, partitions, starts, counted, reached, deadline_s)
    except (KafkaException, RegionBusError) as exc:
        return lags, [f"queue lags: {exc}"]
    notes = []
    for place, counts in counted.items():
        high = partitions[place].high
        if reached[place] >= high:
            lags.update(counts)
        else:
            topic, number = place
            read = reached[place] - starts[place]
            notes.append(
                f"lag of the clients of {topic}[{number}]: {read} of "
                f"{high - starts[place]} records read in time"
            )
    return lags, notes


def _read(
    kafka_config: Mapping[str, Any],
    group_id: str,
    partitions: Mapping[tuple[str, int], PartitionReaders],
    starts: dict[tuple[str, int], int],
    counted: dict[tuple[str, int], dict[str, int]],
    reached: dict[tuple[str, int], int],
    deadline_s: float,
) -> None:
    """Read the partitions from their starts, counting into ``counted`` and moving
    ``reached`` (the offset after the last record read), until each reaches its high
    watermark or the deadline passes."""
    consumer = kafka_consumer(
        {
            **kafka_config,
            **quiet_config(),
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    try:
        consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in starts.items()])
        pending = set(starts)
        while pending:
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                return
            for message in poll_batch(consumer, _POLL_MESSAGES, min(left_s, 0.2)):
                if isinstance(message, UnreadableRecords):
                    place = (message.topic, message.partition)
                    reached[place] = max(reached.get(place, 0), message.next_offset)
                elif message.error() is None:
                    place = (message.topic() or "", message.partition() or 0)
                    offset = message.offset() or 0
                    if place in counted:
                        _count(
                            message.key(),
                            message.headers(),
                            offset,
                            partitions[place],
                            counted[place],
                        )
                        reached[place] = max(reached[place], offset + 1)
                else:
                    continue
                if place in pending and reached[place] >= partitions[place].high:
                    pending.discard(place)
    finally:
        consumer.close()


def _count(
    key: bytes | None,
    headers: Any,
    offset: int,
    readers: PartitionReaders,
    counts: dict[str, int],
) -> None:
    """Count one record for each client it is addressed to that has not acked it."""
    committed = readers.committed
    if not is_shared(key):
        ids = [key.decode(errors="replace")] if key else []
    else:
        ids = recipient_ids(headers) or []
    for client_id in ids:
        acked = committed.get(client_id)
        if acked is not None and offset >= acked:
            counts[client_id] += 1


__all__ = ["PartitionReaders", "queue_lags"]
