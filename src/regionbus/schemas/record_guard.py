"""Consuming past records that cannot be fetched, decompressed or decoded by librdkafka.

librdkafka hands the application an error, not a message, for a record batch it cannot
read: ``_BAD_COMPRESSION`` (corrupt compressed data, or data that would decompress to more
than ``receive.message.max.bytes``: a compression bomb), ``_BAD_MSG`` (a CRC or framing
error) or ``_NOT_IMPLEMENTED`` (an unknown codec). It does not move its fetch position
past such a batch: every fetch returns it again, so a consumer that only logs the error
never reads that partition again, and a restart does not help, since nothing was committed
past it. Any principal allowed to produce to a topic can write such a batch (Kafka checks
a compressed batch's size on the wire, not decompressed).

The error names only the batch's first offset (librdkafka reports ``BaseOffset``; the
batch's last offset is in its header, which the application never sees), and a batch may
hold many records. Seeking to that offset plus one reads the same batch again when it holds
more. So :class:`GuardedConsumer` finds the batch's end itself: it seeks forward in steps
that double (1, 2, 4, ... past the first offset, never past the high watermark, which the
whole batch is below) until a fetch no longer returns the bad batch, then halves the gap
until the first offset after the batch is known, and seeks there. Each step is one fetch
(milliseconds), so a batch of n records costs about 2·log2(n) fetches, and no record after
the batch is skipped: a step that lands past the batch only tells where it ends, and what
that fetch returned is read again. The partition's other records, before and after, are
delivered as usual, and the other partitions never wait.

The application then receives one :class:`UnreadableRecords` in place of the batch, in
order, and treats it as a record it could not decode: it dead-letters (or counts) it once
and moves its position past :attr:`UnreadableRecords.next_offset`, so its next commit is
past the batch and a restart does not read it again.

Every consumer of the project is a :class:`GuardedConsumer`
(`regionbus.schemas.kafka_clients.kafka_consumer`), and
`regionbus.schemas.transport.poll_batch` is how every worker polls, so this is the one
place the rule lives.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage

from regionbus.schemas.dead_letter import Source

log = logging.getLogger("regionbus.kafka")

UNREADABLE_ERRORS: Final = frozenset(
    {KafkaError._BAD_COMPRESSION, KafkaError._BAD_MSG, KafkaError._NOT_IMPLEMENTED}
)
"""librdkafka's consumer errors for a record batch it cannot read, reported at the batch's
first offset (librdkafka ``rdkafka_msgset_reader.c``): decompression failed or would exceed
``receive.message.max.bytes``, a CRC or framing error, an unknown codec."""

_KNOWN_RANGES_PER_PARTITION: Final = 16
"""Unreadable batches remembered per partition, so a consumer that goes back before one
(a rewind to its committed offset) skips it again without searching for its end."""

_WATERMARK_TIMEOUT_S: Final = 0.5
"""Longest wait for a partition's high watermark when the last fetch did not leave one."""

_WATERMARK_RETRY_S: Final = 1.0
"""How soon a search that found no high watermark asks again (each ask may hold the
caller's poll up to :data:`_WATERMARK_TIMEOUT_S`)."""


class UnreadableRecords(NamedTuple):
    """Records a consumer skipped because librdkafka could not read them: one record
    batch, from its first to its last offset.

    Attributes:
        topic: The topic.
        partition: The partition.
        first_offset: The batch's first offset (where librdkafka reported the error).
        last_offset: The batch's last offset.
        reason: librdkafka's error name and text, e.g. ``"_BAD_COMPRESSION: Decompression
            (codec 0x4) of message at 3 of 6129 bytes failed: ..."``.
    """

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    reason: str

    @property
    def next_offset(self) -> int:
        """The offset after the batch: where the consumer goes on (what it commits)."""
        return self.last_offset + 1

    @property
    def source(self) -> Source:
        """Where the batch starts, for a dead letter's headers."""
        return Source(self.topic, self.partition, self.first_offset)

    def describe(self) -> str:
        """The reason with the offsets, for a dead letter or a log line."""
        records = self.last_offset - self.first_offset + 1
        return (
            f"unreadable record batch at offsets {self.first_offset}-{self.last_offset} "
            f"({records} records) skipped: {self.reason}"
        )


Polled = KafkaMessage | UnreadableRecords
"""What a poll of a :class:`GuardedConsumer` returns: messages (errors included, as
confluent-kafka returns them) and, in their place, the batches it could not read."""


@dataclass
class _Search:
    """The search for the end of one unreadable batch of a partition.

    ``inside`` is the largest offset known to be in the batch, ``outside`` the smallest
    known to be after it (None until a step lands past it), ``target`` the offset the
    consumer was sought to and whose fetch is awaited, ``retry_at`` the monotonic time to
    try again a step that could not be taken (no high watermark known), else None."""

    base: int
    reason: str
    inside: int
    outside: int | None = None
    target: int = -1
    retry_at: float | None = None


_INSIDE, _OUTSIDE, _MOVED, _UNRELATED = range(4)


def _verdict(search: _Search, message: KafkaMessage) -> int:
    """What a polled message of a partition being searched says about the step's target."""
    error = message.error()
    offset = message.offset()
    if offset is None:
        return _UNRELATED
    if error is None:
        # The fetch at the target returned a record: the target is past the bad batch.
        return _OUTSIDE if offset >= search.target else _MOVED
    code = error.code()
    if code in UNREADABLE_ERRORS:
        if offset == search.base:
            return _INSIDE
        # Another unreadable batch begins at or before the target, after this one.
        return _OUTSIDE if offset > search.base else _MOVED
    if code == KafkaError._PARTITION_EOF:
        return _OUTSIDE if offset >= search.target else _MOVED
    return _UNRELATED


class GuardedConsumer(Consumer):
    """A confluent-kafka ``Consumer`` whose :meth:`poll_records` skips unreadable record
    batches (module docstring). Made by `regionbus.schemas.kafka_clients.kafka_consumer`.

    The searches it runs are forgotten when the application moves a partition itself
    (``seek``, ``assign``, ``incremental_assign``, ``incremental_unassign``,
    ``unassign``); the batches it found are remembered (:data:`_KNOWN_RANGES_PER_PARTITION`
    per partition).

    Args:
        config: librdkafka settings, as for ``Consumer``.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._searches: dict[tuple[str, int], _Search] = {}
        self._known: dict[tuple[str, int], deque[tuple[int, int]]] = {}
        self.unreadable_batches = 0
        """Unreadable batches this consumer found (each counted once)."""

    # --- polling -------------------------------------------------------------------------

    def poll_records(self, max_messages: int, timeout_s: float) -> list[Polled]:
        """Wait up to ``timeout_s`` for the first message, then take what else is ready,
        with each unreadable batch replaced by one :class:`UnreadableRecords`.

        A partition whose batch's end is being searched delivers nothing until it is
        found (a few fetches); the searching is done by these polls, so the caller's loop
        never waits for it.

        Args:
            max_messages: Most Kafka messages taken (the result may hold fewer).
            timeout_s: Longest wait for the first message, in seconds.

        Returns:
            In order: messages (errors included, as confluent-kafka returns them) and
            unreadable batches.

        Raises:
            confluent_kafka.KafkaException: the consumer failed (callers translate it).
        """
        now = time.monotonic()
        for where, waiting in list(self._searches.items()):
            if waiting.retry_at is not None and now >= waiting.retry_at:
                self._advance(where, waiting)
        first = self.poll(timeout_s)
        if first is None:
            return []
        messages = [first] if max_messages <= 1 else [first, *self.consume(max_messages - 1, 0)]
        if not self._searches and not any(_unreadable(m) for m in messages):
            plain: list[Polled] = list(messages)
            return plain
        out: list[Polled] = []
        sought: set[tuple[str, int]] = set()
        for message in messages:
            topic, partition = message.topic(), message.partition()
            if topic is None or partition is None or partition < 0:
                out.append(message)
                continue
            where = (topic, partition)
            if where in sought:
                continue  # fetched before this poll moved the partition: read again later
            search = self._searches.get(where)
            if search is not None:
                verdict = _verdict(search, message)
                if verdict == _UNRELATED:
                    out.append(message)
                    continue
                if verdict != _MOVED:
                    sought.add(where)
                    if verdict == _INSIDE:
                        search.inside = search.target
                    else:
                        search.outside = search.target
                    skipped = self._advance(where, search)
                    if skipped is not None:
                        out.append(skipped)
                    continue
                del self._searches[where]  # the position moved under it: start afresh
            if _unreadable(message):
                sought.add(where)
                skipped = self._found(where, message)
                if skipped is not None:
                    out.append(skipped)
                continue
            out.append(message)
        return out

    def _found(self, where: tuple[str, int], message: KafkaMessage) -> UnreadableRecords | None:
        """An unreadable batch reported at ``message.offset()``: skip it at once when it is
        known, else start searching for its end."""
        offset = message.offset()
        error = message.error()
        assert offset is not None and error is not None
        reason = f"{error.name()}: {error.str()}"
        for first, last in self._known.get(where, ()):
            if first <= offset <= last:
                return self._skip(where, first, last, reason)
        self.unreadable_batches += 1
        log.warning(
            "%s[%d]: record batch at offset %d unreadable (%s); finding its end to skip it",
            where[0],
            where[1],
            offset,
            reason,
        )
        search = _Search(base=offset, reason=reason, inside=offset)
        self._searches[where] = search
        return self._advance(where, search)

    def _advance(self, where: tuple[str, int], search: _Search) -> UnreadableRecords | None:
        """Take the search's next step (seek), or finish it: skip the batch and say so."""
        target = search.outside
        if search.outside is None:
            target = search.base + max(1, 2 * (search.inside - search.base))
            high = self._high_watermark(where, search.inside)
            if high is None:
                search.retry_at = time.monotonic() + _WATERMARK_RETRY_S
                return None
            if target >= high:
                # The whole batch lies below the high watermark: the search ends there.
                search.outside = high
        if search.outside is not None:
            if search.outside - search.inside <= 1:
                del self._searches[where]
                self._remember(where, search.base, search.inside)
                return self._skip(where, search.base, search.inside, search.reason)
            target = (search.inside + search.outside) // 2
        assert target is not None
        search.target = target
        search.retry_at = None
        if not self._seek_to(where, target):
            del self._searches[where]
        return None

    def _skip(
        self, where: tuple[str, int], first: int, last: int, reason: str
    ) -> UnreadableRecords:
        skipped = UnreadableRecords(where[0], where[1], first, last, reason)
        self._seek_to(where, skipped.next_offset)
        return skipped

    def _remember(self, where: tuple[str, int], first: int, last: int) -> None:
        known = self._known.setdefault(where, deque(maxlen=_KNOWN_RANGES_PER_PARTITION))
        known.append((first, last))

    def _seek_to(self, where: tuple[str, int], offset: int) -> bool:
        try:
            super().seek(TopicPartition(where[0], where[1], offset))
        except KafkaException as exc:
            # Not assigned any more (the application let the partition go).
            log.debug("%s[%d]: cannot seek to %d: %s", where[0], where[1], offset, exc)
            return False
        return True

    def _high_watermark(self, where: tuple[str, int], above: int) -> int | None:
        """The partition's high watermark, from the last fetch or asked of its leader;
        None when neither gives one above ``above``."""
        partition = TopicPartition(where[0], where[1])
        try:
            _, high = self.get_watermark_offsets(partition, cached=True)
            if high <= above:
                _, high = self.get_watermark_offsets(partition, timeout=_WATERMARK_TIMEOUT_S)
        except KafkaException as exc:
            log.debug("%s[%d]: no high watermark yet: %s", where[0], where[1], exc)
            return None
        return high if high > above else None

    # --- the application moving partitions -------------------------------------------------

    def _forget(self, partitions: list[TopicPartition] | None) -> None:
        if partitions is None:
            self._searches.clear()
            return
        for tp in partitions:
            self._searches.pop((tp.topic, tp.partition), None)

    def seek(self, partition: TopicPartition) -> None:
        """``Consumer.seek``; a search for a batch's end on the partition is dropped."""
        self._forget([partition])
        super().seek(partition)

    def assign(self, partitions: list[TopicPartition]) -> None:
        """``Consumer.assign``; every search is dropped."""
        self._forget(None)
        super().assign(partitions)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """``Consumer.incremental_assign``; searches on those partitions are dropped."""
        self._forget(partitions)
        super().incremental_assign(partitions)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """``Consumer.incremental_unassign``; searches on those partitions are dropped."""
        self._forget(partitions)
        super().incremental_unassign(partitions)

    def unassign(self) -> None:
        """``Consumer.unassign``; every search is dropped."""
        self._forget(None)
        super().unassign()


def _unreadable(message: KafkaMessage) -> bool:
    error = message.error()
    offset = message.offset()
    return (
        error is not None
        and error.code() in UNREADABLE_ERRORS
        and offset is not None
        and offset >= 0
        and message.topic() is not None
    )


__all__ = ["UNREADABLE_ERRORS", "GuardedConsumer", "Polled", "UnreadableRecords"]
