"""Reading a queue topic in batches, for the queue processors (gateway senders and async
event queue dispatchers): from the committed offsets, "peek" a batch, "remove" it by
committing past it (then :mod:`regionbus.gateways.queue_trim` deletes what precedes), and
which partitions a shard of a queue reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from regionbus.gateways.queue_trim import QueueTrimmer
from regionbus.schemas.codec import decode_as
from regionbus.schemas.errors import MessageDecodeError, TransportError
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.messages import Event
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.transport import committed_offsets, poll_batch

log = logging.getLogger("regionbus.gateways")

SEND_NOW_CHECK_S: Final = 0.01
"""Longest wait for more events, in seconds, between two checks of
:meth:`QueueReader.peek`'s ``send_now`` (a sender's window that emptied is noticed within
it)."""


class QueuedEvent(NamedTuple):
    """An event peeked from a queue topic, with where it was read and its bytes as queued
    (a gateway sender forwards them as they are)."""

    partition: int
    offset: int
    event: Event
    raw: bytes


def shard_partitions(partitions: int, shard: int, shards: int) -> list[int]:
    """The partitions of a queue of ``partitions`` that shard ``shard`` of ``shards`` reads:
    ``p % shards == shard``, so that each bucket's partition has one reader and the
    shards of a parallel queue (a partition per bucket) hold about as many buckets each.

    Raises:
        ValueError: ``shards`` is below 1, or ``shard`` is not in ``range(shards)``.
    """
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards}: a shard is 0 to shards - 1")
    return [p for p in range(partitions) if p % shards == shard]


class QueueReader:
    """Reads a queue topic from its committed offsets, in batches, and commits after them.

    Args:
        kafka_config: librdkafka settings of the local Kafka (bootstrap servers, security).
        topic: The queue topic.
        group_id: Consumer group holding the committed offsets (the queue's "head").
        dead_letter: Called with ``(raw, topic, partition, offset, reason, last_offset)``
            for a message that is not an Event (``last_offset`` None) or a record batch
            Kafka's client could not read (``raw`` None, ``offset`` its first and
            ``last_offset`` its last offset); it is then skipped (and removed with the
            batch).
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the queue consumer (the
            worker's settings).
        shard: Which shard of the queue's partitions this reader reads (0-based).
        shards: Shards the queue's partitions are split into: the reader reads the
            partitions ``p`` with ``p % shards == shard`` (1: all of them).
    """

    def __init__(
        self,
        kafka_config: dict[str, Any],
        topic: str,
        group_id: str,
        dead_letter: Callable[[bytes | None, str, int, int, str, int | None], None],
        fetch_wait_max_ms: int,
        *,
        shard: int = 0,
        shards: int = 1,
    ) -> None:
        self.topic = topic
        self.shard, self.shards = shard, shards
        self._config = {
            **kafka_config,
            "group.id": group_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": fetch_wait_max_ms,
        }
        self._dead_letter = dead_letter
        self.trimmer = QueueTrimmer(kafka_config, topic)
        self._consumer: Consumer | None = None
        self._positions: dict[int, int] = {}
        self._marked: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self.partitions = 0

    @property
    def owned_partitions(self) -> list[int]:
        """The queue partitions this reader reads (all of them unless sharded; empty
        until :meth:`open`)."""
        return shard_partitions(self.partitions, self.shard, self.shards)

    def open(self, metadata_timeout_s: float = 30.0) -> None:
        """Assign every partition of the topic (of the reader's shard) from its committed
        offset.

        Raises:
            TransportError: the topic does not appear within ``metadata_timeout_s`` seconds
                (a cache server creates it at start).
        """
        self.close()
        consumer = kafka_consumer(self._config)
        deadline = time.monotonic() + metadata_timeout_s
        while True:
            try:
                # Naming the topic creates nothing: auto-creation is off (schemas.kafka_clients).
                meta = consumer.list_topics(topic=self.topic, timeout=5).topics.get(self.topic)
            except KafkaException as exc:
                meta = None
                log.debug("metadata: %s", exc)
            if meta is not None and meta.error is None and meta.partitions:
                break
            if time.monotonic() > deadline:
                consumer.close()
                raise TransportError(f"queue topic {self.topic} does not exist")
            time.sleep(0.2)
        self.partitions = len(meta.partitions)
        wanted = [TopicPartition(self.topic, p) for p in self.owned_partitions]
        if not wanted:
            log.warning(
                "queue %s: shard %d of %d holds none of its %d partitions",
                self.topic,
                self.shard,
                self.shards,
                self.partitions,
            )
        committed = committed_offsets(consumer, wanted, 10.0) if wanted else []
        consumer.assign(
            [TopicPartition(self.topic, tp.partition, max(tp.offset, 0)) for tp in committed]
        )
        self._positions = {}
        self._marked = {}
        self._committed = {tp.partition: max(tp.offset, 0) for tp in committed}
        self._consumer = consumer

    def close(self) -> None:
        """Close the consumer (uncommitted batches will be read again)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def peek(
        self,
        batch_size: int,
        batch_time_interval_ms: int,
        idle_s: float,
        stop: threading.Event,
        send_now: Callable[[], bool] | None = None,
    ) -> list[QueuedEvent]:
        """Read the next batch: ``batch_size`` events, or what came within
        ``batch_time_interval_ms`` of the first one.

        The interval is measured from the first event peeked (Geode measures it from the
        start of the peek), so an idle queue never cuts a burst at an arbitrary point.

        Args:
            batch_size: Most events in the batch.
            batch_time_interval_ms: Longest wait, after the first event, for more.
            idle_s: Return an empty batch after this long without any event.
            stop: Return early when set.
            send_now: Checked after every read once the batch has an event (at least every
                ``SEND_NOW_CHECK_S``): when it returns True the batch is returned as it is,
                before it is full or its interval passed. None: never.

        Returns:
            The events, in queue order (per partition).

        Raises:
            TransportError: the consumer failed.
        """
        assert self._consumer is not None
        batch: list[QueuedEvent] = []
        deadline: float | None = None
        idle_until = time.monotonic() + idle_s
        while len(batch) < batch_size and not stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if deadline is None and now >= idle_until:
                break
            slice_s = SEND_NOW_CHECK_S if batch and send_now is not None else 0.1
            wait_s = min(slice_s, (deadline if deadline is not None else idle_until) - now)
            try:
                messages = poll_batch(self._consumer, batch_size - len(batch), max(wait_s, 0))
            except KafkaException as exc:
                raise TransportError(f"queue {self.topic}: {exc}") from exc
            for message in messages:
                if isinstance(message, UnreadableRecords):
                    # Removed with the batch, as any record that does not decode.
                    self._positions[message.partition] = message.next_offset
                    self._dead_letter(
                        None,
                        self.topic,
                        message.partition,
                        message.first_offset,
                        message.describe(),
                        message.last_offset,
                    )
                    continue
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("queue %s: %s", self.topic, error)
                    continue
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None
                self._positions[partition] = offset + 1
                raw = message.value()
                try:
                    event = decode_as(raw, Event)
                except MessageDecodeError as exc:
                    self._dead_letter(raw, self.topic, partition, offset, str(exc), None)
                    continue
                assert raw is not None  # decode_as refuses None
                batch.append(QueuedEvent(partition, offset, event, raw))
            if batch and deadline is None:
                deadline = time.monotonic() + batch_time_interval_ms / 1000
            if batch and send_now is not None and send_now():
                break
        return batch

    @property
    def has_uncommitted(self) -> bool:
        """True when messages were read (perhaps only dead-lettered) since the last commit."""
        return bool(self._positions)

    def commit(self) -> None:
        """Remove what was peeked from the queue: commit the offsets past it, then have
        the records before them deleted (:class:`QueueTrimmer`, at most once a second per
        partition).

        Raises:
            TransportError: the commit failed (the batch may be delivered again).
        """
        assert self._consumer is not None
        if not self._positions:
            return
        offsets = [TopicPartition(self.topic, p, o) for p, o in self._positions.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            raise TransportError(f"queue {self.topic}: commit failed: {exc}") from exc
        self._committed.update(self._positions)
        self.trimmer.acked(self._positions)
        self._positions = {}

    def mark(self) -> dict[int, int] | None:
        """The read positions (``{partition: offset past the last message read}``) when
        they moved since the last mark, else None. A pipelining processor marks after each
        peek and commits a batch's mark (:meth:`commit_at`) once it was acked."""
        if self._positions == self._marked:
            return None
        self._marked = dict(self._positions)
        return dict(self._marked)

    def commit_at(self, positions: dict[int, int], *, asynchronous: bool = False) -> None:
        """Remove from the queue what precedes ``positions`` (a :meth:`mark`): commit them,
        then have the records before them deleted, as :meth:`commit`.

        Args:
            positions: ``{partition: offset past the acked batch}``.
            asynchronous: Send the commit without waiting for the group coordinator's
                answer. A commit lost that way is covered by the next one (positions only
                grow) or read again as possible duplicates by the next run; only
                positions of acked batches are ever committed (invariant 5).

        Raises:
            TransportError: the commit failed (a later one covers it).
        """
        assert self._consumer is not None
        offsets = [TopicPartition(self.topic, p, o) for p, o in positions.items()]
        try:
            if asynchronous:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            else:
                self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            raise TransportError(f"queue {self.topic}: commit failed: {exc}") from exc
        self._committed.update(positions)
        self.trimmer.acked(positions)

    def backlog_events(self) -> int | None:
        """Events of the queue not removed yet: those peeked and not committed past, plus
        those not read yet as far as the consumer's cached high watermarks tell (no
        request is made: they are as recent as the last fetch). None while not open.
        """
        consumer = self._consumer
        if consumer is None:
            return None
        total = 0
        for partition in self.owned_partitions:
            committed = self._committed.get(partition, 0)
            read = self._positions.get(partition, committed)
            try:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), cached=True
                )
            except KafkaException:
                high = -1
            total += max(high, read, committed) - committed
        return total


__all__ = ["SEND_NOW_CHECK_S", "QueueReader", "QueuedEvent", "shard_partitions"]
