"""The server's producers and the bookkeeping of their delivery reports.

A cache server produces through two idempotent ``acks=all`` producers: one for
``{ns}.events`` (every applied change, a partition per bucket), which may linger to send
the events of several turns in one request per partition, and one, without linger, for
everything a client waits for (subscription-queue records, replies) and the rest (dead
letters, gateway queues, operations sent again). librdkafka sends one ProduceRequest per
topic partition, so on one producer a turn's queue and reply records went out beside one
request per bucket its events touched, and could wait behind them; and ``linger.ms``
applies to a producer as a whole. The pages of initial results (registrations' bulk loads,
megabytes per client in a storm of them) go by the lingering producer too: on the other,
a bystander's reply could wait behind them in the producer's queue and on its connection
(half of a bystander's p99 during 200 registrations at once was between the server's
produce and its own read; how much of that this saves was not measured apart from the
other pacing, `regionbus.broker.initial_results`). A topic partition is always produced
by the same one of the two, so its order is a producer's order, except a reply topic's:
there the replies to one request all go by one of them, which keeps the only order a
client relies on.

Every message is numbered as it is handed to either producer, and
:meth:`Deliveries.settled` says when every message up to a :meth:`Deliveries.mark` has its
delivery report: the offsets part commits then, without stopping the loop for a flush.
Delivery failures are counted, so the server commits no offset past an operation whose
effects were lost (the offsets part rewinds instead).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Final

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Message as KafkaMessage

from regionbus.broker.client_topics import ClientTopicPartitions
from regionbus.broker.stats import ServerStats
from regionbus.schemas.dead_letter import Source, dead_letter_headers
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.signing import HeaderList

log = logging.getLogger("regionbus.server")

DeliveryReport = Callable[[KafkaError | None, KafkaMessage], None]
"""A librdkafka delivery callback: ``(error or None, message)``."""

TOPIC_GONE: Final = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
"""Client errors that mean the topic (or its partition) does not exist (any more)."""

REFUSED_BY_TOPIC: Final = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.POLICY_VIOLATION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)
"""Errors by which a topic refuses a record for what the topic is (its configs, its
ACLs), so sending the record again would be refused again."""

RECIPIENT_HEADER: Final = "rb.recipient"
"""Of a dead letter a client topic refused: the record key addressing its client(s)."""

_BUFFER_FULL_POLL_S = 0.05

VALUE_DROPPED_HEADER: Final = "rb.value-dropped"
"""Of a dead letter sent without the record's value (too large for the dead-letter topic):
the value's size in bytes."""


class Deliveries:
    """The server's producers, and which of the messages handed to them have their
    delivery report.

    Args:
        producer: The server's idempotent ``acks=all`` producer of queue records, replies,
            dead letters and gateway queues (no linger: a client waits for them).
        events_producer: The producer of ``{ns}.events`` (idempotent, ``acks=all``, may
            linger); None sends events with ``producer``.
        topics: The namespace's topic names.
        member_id: The server's member id (dead-letter headers).
        stats: The server's counters (dead letters).
        client_topics: The partition counts of the shared client topics.
        topic_gone: Told the name of a server topic a delivery found missing (the topic
            keeper checks it at once instead of at its next period).
    """

    def __init__(
        self,
        producer: Producer,
        events_producer: Producer | None,
        topics: Topics,
        member_id: str,
        stats: ServerStats,
        client_topics: ClientTopicPartitions,
        topic_gone: Callable[[str], object] = lambda _topic: None,
    ) -> None:
        self.producer = producer
        self.events_producer = producer if events_producer is None else events_producer
        self.producers = (
            (producer,) if self.events_producer is producer else (producer, self.events_producer)
        )
        """Every producer, each once: what :meth:`poll` and :meth:`flush` serve."""
        self.topics = topics
        self.member_id = member_id
        self.stats = stats
        self.client_topics = client_topics
        self._topic_gone = topic_gone
        self.delivery_failures = 0
        """Messages Kafka did not take (other than for a vanished client topic)."""
        self._numbered = 0
        self._settled_below = 0
        self._settled_above: set[int] = set()

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int = -1,
        on_delivery: DeliveryReport | None = None,
        headers: HeaderList | None = None,
        also_settles: int = -1,
        bulk: bool = False,
    ) -> None:
        """Hand one message to the producer, waiting (serving delivery reports) while its
        buffer is full; ``partition=-1`` lets the producer choose. ``also_settles`` is a
        number reserved for a parked run, settled with this message. A ``bulk`` message
        (a page of initial results) goes with the events, by the lingering producer."""
        number = self._numbered
        self._numbered += 1
        settles = (number,) if also_settles < 0 else (number, also_settles)
        callback = partial(self._settle, settles, on_delivery or self.on_delivery)
        producer = self.events_producer if bulk or topic == self.topics.events else self.producer
        while True:
            try:
                if partition >= 0:
                    producer.produce(
                        topic,
                        value,
                        key,
                        partition=partition,
                        on_delivery=callback,
                        headers=headers,
                    )
                else:
                    producer.produce(topic, value, key, on_delivery=callback, headers=headers)
                return
            except BufferError:
                producer.poll(_BUFFER_FULL_POLL_S)
            except KafkaException as exc:
                # The producer already knows the topic is gone (deleted): a failed delivery.
                self._delivery_failed(topic, exc.args[0])
                for settled in settles:
                    self._settled(settled)
                return

    def mark(self) -> int:
        """A mark after every message handed to the producer so far, for :meth:`settled`."""
        return self._numbered

    def settled(self, mark: int) -> bool:
        """Whether every message handed to the producer before ``mark`` (:meth:`mark`) has
        its delivery report: delivered, or counted in :attr:`delivery_failures`. Reports
        are served by the producer's ``poll``."""
        return self._settled_below >= mark

    def _settle(
        self,
        numbers: tuple[int, ...],
        report: DeliveryReport,
        error: KafkaError | None,
        message: KafkaMessage,
    ) -> None:
        try:
            report(error, message)
        finally:
            for number in numbers:
                self._settled(number)

    def _settled(self, number: int) -> None:
        # Reports of different partitions come in any order: keep those above the lowest
        # number still unsettled until it is settled too.
        if number != self._settled_below:
            self._settled_above.add(number)
            return
        self._settled_below += 1
        while self._settled_below in self._settled_above:
            self._settled_above.remove(self._settled_below)
            self._settled_below += 1

    def on_delivery(self, error: KafkaError | None, message: KafkaMessage) -> None:
        """Count a message Kafka did not take (see :meth:`_delivery_failed`)."""
        if error is not None:
            self._delivery_failed(message.topic() or "", error, message)

    def _delivery_failed(
        self, topic: str, error: KafkaError, message: KafkaMessage | None = None
    ) -> None:
        """One for a client's queue or reply topic that is gone is moot (the client closed
        and deleted it) and must not hold back the commit of everything else; one such a
        topic refuses for what it is (`REFUSED_BY_TOPIC`: its ``max.message.bytes``, its
        ACLs) is dead-lettered for its recipients, who alone miss it, while the others go
        on; any other is counted, so the offsets are rewound and it is sent again."""
        parsed = self.topics.client_topic(topic)
        if parsed is not None and message is not None and error.code() in REFUSED_BY_TOPIC:
            self._dead_letter_refused(message, error)
            return
        if error.code() in TOPIC_GONE and parsed is not None and parsed.kafka_principal:
            self.client_topics.forget(topic)
            log.info("dropped a message for %s: the topic is gone (%s)", topic, error)
            return
        self.delivery_failures += 1
        log.error("delivery to %s failed: %s", topic, error)
        if error.code() in TOPIC_GONE:
            self._topic_gone(topic)

    def dead_letter(
        self,
        raw: bytes | None,
        source: Source,
        reason: str,
        extra_headers: HeaderList | None = None,
        *,
        category: str,
        last_offset: int | None = None,
    ) -> None:
        """Set a message the server cannot process aside in ``{ns}.dead-letter``, unchanged,
        with the reason and where it came from in headers; ``category`` (see
        :class:`ServerStats`) labels the dead-letter metric; ``last_offset`` is the last
        offset of a dead letter that stands for several records."""
        self.stats.dead_lettered(category)
        log.warning(
            "dead-lettered %s[%d]@%d: %s", source.topic, source.partition, source.offset, reason
        )
        headers = [
            *dead_letter_headers(reason, source, self.member_id, last_offset),
            *(extra_headers or []),
        ]
        sent = partial(self._dead_letter_sent, headers)
        self.produce(self.topics.dead_letter, raw, None, on_delivery=sent, headers=headers)

    def _dead_letter_refused(self, message: KafkaMessage, error: KafkaError) -> None:
        """Set a record a client topic refused aside, with its key and headers (the
        recipients, the signature) and the topic and partition it was for."""
        topic, partition = message.topic() or "", message.partition()
        key = message.key()
        self.dead_letter(
            message.value(),
            Source(topic, -1 if partition is None else partition, -1),
            f"{topic} refused the record for its recipients: {error.str()}",
            [(RECIPIENT_HEADER, key), *(message.headers() or [])],
            category="refused_by_recipient_topic",
        )

    def _dead_letter_sent(
        self, headers: HeaderList, error: KafkaError | None, message: KafkaMessage
    ) -> None:
        """A dead letter Kafka refused as too large (a dead-letter topic made before its size
        limit left room for the headers) goes again without its value, whose size it names
        in ``rb.value-dropped``: the record stays at its source offset, and a refused dead
        letter counted as a failed delivery would have the record read again for ever."""
        value = message.value()
        if error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE and value:
            dropped = (VALUE_DROPPED_HEADER, str(len(value)).encode())
            log.error("dead letter too large for %s, sent without its value", message.topic())
            self.produce(self.topics.dead_letter, None, None, headers=[*headers, dropped])
            return
        self.on_delivery(error, message)

    def dead_letter_unreadable(self, skipped: UnreadableRecords) -> None:
        """Dead-letter a record batch the consumer could not read (it has no value to
        keep): the reason and its offsets, category ``unreadable``."""
        self.dead_letter(
            None,
            skipped.source,
            skipped.describe(),
            category="unreadable",
            last_offset=skipped.last_offset,
        )

    def poll(self) -> int:
        """Serve the delivery reports (and statistics) of every producer, without waiting.

        Returns:
            How many events were served.
        """
        return sum(producer.poll(0) for producer in self.producers)

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every message of every producer to be delivered
        (or fail).

        Returns:
            How many are still in flight.
        """
        deadline = time.monotonic() + timeout_s
        return sum(
            producer.flush(max(0.0, deadline - time.monotonic())) for producer in self.producers
        )


__all__ = [
    "RECIPIENT_HEADER",
    "REFUSED_BY_TOPIC",
    "TOPIC_GONE",
    "VALUE_DROPPED_HEADER",
    "Deliveries",
    "DeliveryReport",
]
