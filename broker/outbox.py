"""Everything a cache server produces: events, replies, markers and dead letters.

The outbox is the floor of the server: every other part hands it what to send. Replies
and subscription-queue messages of one poll batch are gathered per topic and sent as few
Kafka messages as possible, in order (:func:`regionbus.schemas.codec.encode_batches`); events to
``{ns}.events`` and gateway queues, and dead letters, go at once. Delivery failures are
counted, so the server commits no offset past an operation whose effects were lost (the
offsets part rewinds instead). Every message is numbered as it is handed to the producer,
and :meth:`Outbox.settled` says when every message up to a :meth:`Outbox.mark` has its
delivery report: the offsets part commits then, without stopping the loop for a flush.

With security on, every message to a client's queue or reply topic is signed for that
client (:attr:`Outbox.seal`, `regionbus.broker.security.SecurityGuard.client_headers`), so the
client
can tell a server's message from a forged one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Final

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Message as KafkaMessage

from regionbus.broker.client_topics import ClientTopicPresence
from regionbus.broker.queue_depth import QueueDepths
from regionbus.broker.stats import ServerStats
from regionbus.schemas.codec import encode, encode_batches, split_batch
from regionbus.schemas.dead_letter import Source, dead_letter_headers
from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.messages import Operation, Reply
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.signing import HeaderList

log = logging.getLogger("regionbus.server")

DeliveryReport = Callable[[KafkaError | None, KafkaMessage], None]
"""A librdkafka delivery callback: ``(error or None, message)``."""

Seal = Callable[[str, str, int, bytes], HeaderList | None]
"""Signing headers of a message to a client: ``(client id, topic, partition, value)``."""

TOPIC_GONE: Final = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
"""Client errors that mean the topic (or its partition) does not exist (any more)."""

_BUFFER_FULL_POLL_S = 0.05

VALUE_DROPPED_HEADER: Final = "rb.value-dropped"
"""Of a dead letter sent without the record's value (too large for the dead-letter topic):
the value's size in bytes."""


class Outbox:
    """The server's producer, with its batching per client topic and delivery bookkeeping.

    Args:
        producer: The server's idempotent ``acks=all`` producer.
        topics: The namespace's topic names.
        member_id: The server's member id (dead-letter headers).
        stats: The server's counters (replies, routed events, dead letters).
        reply_topics: Which clients' reply topics exist.
        depths: Per-client queue depth bookkeeping, told of each delivered queue message.
        topic_gone: Told the name of a server topic a delivery found missing (the topic
            keeper checks it at once instead of at its next period).
    """

    def __init__(
        self,
        producer: Producer,
        topics: Topics,
        member_id: str,
        stats: ServerStats,
        reply_topics: ClientTopicPresence,
        depths: QueueDepths,
        topic_gone: Callable[[str], object] = lambda _topic: None,
    ) -> None:
        self.producer = producer
        self.topics = topics
        self.member_id = member_id
        self.stats = stats
        self.reply_topics = reply_topics
        self.depths = depths
        self._topic_gone = topic_gone
        self.delivery_failures = 0
        """Messages Kafka did not take (other than for a vanished client topic)."""
        self._pending: dict[str, list[bytes]] = {}
        self._queue_topics: dict[str, str] = {}
        self._queue_clients: dict[str, str] = {}
        self._reply_clients: dict[str, str] = {}
        self._reply_topic_names: dict[str, str] = {}
        self.seal: Seal | None = None
        """Signs what goes to client topics (set when security is on), else None."""
        self._numbered = 0
        self._settled_below = 0
        self._settled_above: set[int] = set()

    # --- sending now -------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int = -1,
        on_delivery: DeliveryReport | None = None,
        headers: HeaderList | None = None,
    ) -> None:
        """Hand one message to the producer, waiting (serving delivery reports) while its
        buffer is full; ``partition=-1`` lets the producer choose."""
        number = self._numbered
        self._numbered += 1
        callback = partial(self._settle, number, on_delivery or self.on_delivery)
        while True:
            try:
                if partition >= 0:
                    self.producer.produce(
                        topic,
                        value,
                        key,
                        partition=partition,
                        on_delivery=callback,
                        headers=headers,
                    )
                else:
                    self.producer.produce(topic, value, key, on_delivery=callback, headers=headers)
                return
            except BufferError:
                self.producer.poll(_BUFFER_FULL_POLL_S)
            except KafkaException as exc:
                # The producer already knows the topic is gone (deleted): a failed delivery.
                self._delivery_failed(topic, exc.args[0])
                self._settled(number)
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
        self, number: int, report: DeliveryReport, error: KafkaError | None, message: KafkaMessage
    ) -> None:
        try:
            report(error, message)
        finally:
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
            self._delivery_failed(message.topic() or "", error)

    def _delivery_failed(self, topic: str, error: KafkaError) -> None:
        """One for a client's queue or reply topic that is gone is moot (the client closed
        and deleted it) and must not hold back the commit of everything else; any other
        is counted, so the offsets are rewound."""
        if error.code() in TOPIC_GONE and self.topics.is_client_topic(topic):
            self.reply_topics.forget(topic)
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

    # --- gathered per poll batch -------------------------------------------------------

    def reply(self, reply: Reply, client_id: str) -> None:
        """Queue a reply to a client; dropped (and counted) when the client has no reply
        topic: a server-side application writing to ``{ns}.ops``, a client that closed."""
        topic = self._reply_topic_names.get(client_id)
        if topic is None:
            topic = self._reply_topic_names[client_id] = self.topics.reply(client_id)
        if not self.reply_topics.exists(topic):
            self.stats.replies_dropped += 1
            return
        self._reply_clients[topic] = client_id
        self._pending.setdefault(topic, []).append(encode(reply))
        self.stats.replies += 1

    def reply_error(self, op: Operation, bucket: int, exc: RegionBusError) -> None:
        """Reply that ``op`` failed with ``exc`` (its class name and message)."""
        self.stats.errors += 1
        try:
            self.reply(
                Reply(
                    request_id=op.request_id,
                    bucket=bucket,
                    ok=False,
                    error_type=type(exc).__name__,
                    error_message=str(exc),
                ),
                op.client_id,
            )
        except RegionBusError:
            log.warning("cannot reply to %r: %s", op.client_id, exc)

    def queue(self, client_id: str, framed: bytes) -> None:
        """Queue an encoded event or marker for a client's subscription queue."""
        topic = self._queue_topics.get(client_id)
        if topic is None:
            topic = self._queue_topics[client_id] = self.topics.queue(client_id)
            self._queue_clients[topic] = client_id
        self._pending.setdefault(topic, []).append(framed)

    def send(self) -> None:
        """Produce what the poll batch gathered, per topic, as few messages as possible,
        in order; each queue message's delivery updates its client's queue depth."""
        pending, self._pending = self._pending, {}
        for topic, framed in pending.items():
            client_id = self._queue_clients.get(topic)
            reply_to = self._reply_clients.get(topic)
            values = list(encode_batches(framed))
            for value in values:
                # Client topics have one partition; a signature covers it, so it is explicit.
                headers = None
                if self.seal is not None and (client_id or reply_to):
                    headers = self.seal(client_id or reply_to or "", topic, 0, value)
                if client_id is None:
                    self.produce(topic, value, None, partition=0, headers=headers)
                    continue
                count = len(framed) if len(values) == 1 else len(split_batch(value))
                self.produce(
                    topic,
                    value,
                    None,
                    partition=0,
                    on_delivery=self._queue_delivery(client_id, count),
                    headers=headers,
                )

    def _queue_delivery(self, client_id: str, events: int) -> DeliveryReport:
        def delivered(error: KafkaError | None, message: KafkaMessage) -> None:
            if error is not None:
                self.on_delivery(error, message)
            else:
                self.depths.delivered(client_id, message.offset() or 0, events)

        return delivered

    def forget_client(self, client_id: str) -> None:
        """Forget a client's topic names (it is gone)."""
        topic = self._queue_topics.pop(client_id, None)
        if topic is not None:
            self._queue_clients.pop(topic, None)
        self._reply_topic_names.pop(client_id, None)
        self._reply_clients.pop(self.topics.reply(client_id), None)
        self.reply_topics.forget(self.topics.reply(client_id))

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every message to be delivered (or fail).

        Returns:
            How many are still in flight.
        """
        return self.producer.flush(timeout_s)


__all__ = ["TOPIC_GONE", "VALUE_DROPPED_HEADER", "DeliveryReport", "Outbox"]
