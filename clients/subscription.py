"""The client's subscription queue reader: events in, duplicates out, acks back.

One thread reads ``{ns}.queue.<client>`` from the committed offset, drops events whose
EventID was already seen (message tracking), hands the rest to their region, and every
``subscription_ack_interval_ms`` commits the offset after the last processed event: that
commit is the client's ack (ARCHITECTURE.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from clients.settings import ClientSettings
from clients.tracking import MessageTracker
from schemas.codec import decode, split_batch
from schemas.errors import MessageDecodeError
from schemas.messages import Event, Marker
from schemas.naming import Topics
from schemas.transport import poll_batch

log = logging.getLogger("regionbus.client")


@dataclass
class SubscriptionStats:
    """Counters of one client's subscription queue.

    Attributes:
        events_received: Events read from the queue (duplicates included).
        events_delivered: Events handed to regions (duplicates excluded).
        duplicates_dropped: Events dropped by message tracking.
        undecodable: Messages that could not be decoded (logged and skipped).
        markers: Markers read.
    """

    events_received: int = 0
    events_delivered: int = 0
    duplicates_dropped: int = 0
    undecodable: int = 0
    markers: int = 0


class SubscriptionQueue:
    """Reads one client's subscription queue on its own thread.

    Args:
        settings: The client's settings.
        client_id: Whose queue.
        on_event: Called with each new (non-duplicate) event, on the queue thread.
        on_marker: Called with each marker, on the queue thread.
    """

    def __init__(
        self,
        settings: ClientSettings,
        client_id: str,
        on_event: Callable[[Event], None],
        on_marker: Callable[[Marker], None],
    ) -> None:
        self._settings = settings
        self._topics = Topics(settings.namespace)
        self._topic = self._topics.queue(client_id)
        self._on_event = on_event
        self._on_marker = on_marker
        self.tracker = MessageTracker(settings.subscription_message_tracking_timeout_s)
        self.stats = SubscriptionStats()
        self._consumer = Consumer(
            settings.librdkafka(
                **{
                    "group.id": self._topics.client_group(client_id),
                    # An explicit offset, not OFFSET_BEGINNING: librdkafka resolves a logical
                    # offset on a just-created topic only on a 500 ms retry timer. Past the
                    # log start (retention), fall back to the earliest offset.
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": settings.fetch_wait_max_ms,
                    "client.id": client_id,
                }
            )
        )
        committed = self._consumer.committed([TopicPartition(self._topic, 0)], timeout=10)[0]
        start = max(committed.offset, 0)
        self._consumer.assign([TopicPartition(self._topic, 0, start)])
        self._acked = committed.offset
        self._position = committed.offset
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"queue-{client_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ack_every_s = self._settings.subscription_ack_interval_ms / 1000
        next_ack = time.monotonic() + ack_every_s
        while not self._stop.is_set():
            try:
                messages = poll_batch(self._consumer, 500, 0.1)
            except KafkaException as exc:
                log.warning("subscription queue %s: %s", self._topic, exc)
                continue
            self._idle.clear() if messages else self._idle.set()
            for message in messages:
                if message.error() is not None:
                    continue
                try:
                    items = split_batch(message.value())
                except MessageDecodeError as exc:
                    self.stats.undecodable += 1
                    log.warning("undecodable batch in %s skipped: %s", self._topic, exc)
                    items = []
                for raw in items:
                    self._handle(raw)
                self._position = (message.offset() or 0) + 1
            if time.monotonic() >= next_ack:
                self.ack()
                next_ack = time.monotonic() + ack_every_s
        self.ack(asynchronous=False)

    def _handle(self, value: bytes | None) -> None:
        try:
            message = decode(value)
        except MessageDecodeError as exc:
            self.stats.undecodable += 1
            log.warning("undecodable message in %s skipped: %s", self._topic, exc)
            return
        if isinstance(message, Event):
            self.stats.events_received += 1
            if not self.tracker.is_new(message.event_id):
                self.stats.duplicates_dropped += 1
                return
            self.stats.events_delivered += 1
            try:
                self._on_event(message)
            except Exception:
                log.exception("handling event %s failed", message.event_id)
        elif isinstance(message, Marker):
            self.stats.markers += 1
            self._on_marker(message)
        else:
            self.stats.undecodable += 1
            log.warning("unexpected %s in %s skipped", type(message).__name__, self._topic)

    def ack(self, asynchronous: bool = True) -> None:
        """Commit the offset after the last processed event (the client's ack)."""
        if self._position <= self._acked:
            return
        offsets = [TopicPartition(self._topic, 0, self._position)]
        with suppress(KafkaException):
            if asynchronous:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            else:
                self._consumer.commit(offsets=offsets, asynchronous=False)
            self._acked = self._position

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until a poll of the queue found nothing new (for tests and demos).

        Returns:
            True when the queue was seen idle within ``timeout_s`` seconds.
        """
        self._idle.clear()
        return self._idle.wait(timeout_s)

    def close(self) -> None:
        """Stop reading after a final synchronous ack."""
        self._stop.set()
        self._thread.join(10)
        with suppress(Exception):
            self._consumer.close()
