"""Removing acknowledged batches from a queue topic, as Geode removes them from its queue.

A gateway sender's or async event queue's topic keeps its records until they are
acknowledged (``retention.ms=-1``, `regionbus.schemas.topics`). The processor acknowledges a batch
by
committing its offsets past it (invariant 5); the :class:`QueueTrimmer` then deletes the
records before the committed offsets (Kafka DeleteRecords), so the topic holds only what
still waits for an ack, and the disk a long-lived queue takes stays bounded. Never past a
committed offset: a batch not acked yet is never deleted.

At most once per :data:`TRIM_INTERVAL_S` per partition: a busy queue acks many batches a
second, and one DeleteRecords each would double its broker requests for nothing. A
partition whose last ack fell inside the interval is trimmed by the next :meth:`trim`
after it (the processor calls it on every turn of its loop).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Final

from confluent_kafka import KafkaException, TopicPartition

from regionbus.schemas.kafka_clients import kafka_admin

log = logging.getLogger("regionbus.gateways")

TRIM_INTERVAL_S: Final = 1.0
"""Least time between two DeleteRecords requests for one partition, in seconds."""
REQUEST_TIMEOUT_S: Final = 10.0
"""Longest wait for a DeleteRecords answer, in seconds."""


class QueueTrimmer:
    """Deletes a queue topic's records below its acknowledged (committed) offsets.

    Args:
        kafka_config: librdkafka settings of the queue's Kafka (connection and security).
        topic: The queue topic.
        interval_s: Least time between two deletions on one partition, in seconds.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topic: str,
        *,
        interval_s: float = TRIM_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topic = topic
        self._admin = kafka_admin(kafka_config)
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._acked: dict[int, int] = {}
        self._trimmed: dict[int, int] = {}
        self._requested_at: dict[int, float] = {}
        self.failures = 0
        """DeleteRecords requests that failed (logged; the next ack tries again)."""

    def acked(self, offsets: Mapping[int, int]) -> None:
        """Note committed offsets (``{partition: offset past the acked batch}``) and delete
        what is due now."""
        with self._lock:
            for partition, offset in offsets.items():
                self._acked[partition] = max(offset, self._acked.get(partition, 0))
        self.trim()

    def trim(self) -> None:
        """Send a DeleteRecords for each partition with acknowledged records left whose
        last request is :attr:`interval_s` old; never waits for the answer."""
        now = self._clock()
        with self._lock:
            due = [
                TopicPartition(self.topic, partition, offset)
                for partition, offset in self._acked.items()
                if offset > self._trimmed.get(partition, 0)
                and now - self._requested_at.get(partition, -self._interval_s) >= self._interval_s
            ]
            for tp in due:
                self._requested_at[tp.partition] = now
        if not due:
            return
        try:
            futures = self._admin.delete_records(due, request_timeout=REQUEST_TIMEOUT_S)
        except KafkaException as exc:
            self._failed(due, exc)
            return
        for tp, future in futures.items():
            future.add_done_callback(functools.partial(self._answered, tp.partition, tp.offset))

    def _answered(self, partition: int, offset: int, done: Future[Any]) -> None:
        error = done.exception()
        if error is not None:
            self._failed([TopicPartition(self.topic, partition, offset)], error)
            return
        with self._lock:
            self._trimmed[partition] = max(offset, self._trimmed.get(partition, 0))

    def _failed(self, partitions: list[TopicPartition], error: BaseException) -> None:
        self.failures += len(partitions)
        where = ", ".join(f"{tp.partition}@{tp.offset}" for tp in partitions)
        log.warning(
            "could not delete the acknowledged records of %s (%s): %s", self.topic, where, error
        )


__all__ = ["REQUEST_TIMEOUT_S", "TRIM_INTERVAL_S", "QueueTrimmer"]
