"""Reading a client's subscription queue records (`regionbus.clients.subscription`): which
records of the shared partition are this client's, which come from a cache server, and the
events, CQ events and markers they hold; and the queue's counters.

A queue partition is shared by the clients of one Kafka principal: a record is this
client's when keyed by its client id, or when it lists the client among those sharing an
interest (`regionbus.schemas.addressing`). Nothing read here is trusted: a record that does
not decode, or (security on) a cache server did not sign, is counted and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from regionbus.clients.server_trust import ServerMessages
from regionbus.clients.tracing import ListenerSpans
from regionbus.schemas.addressing import addressed_to, own_marker
from regionbus.schemas.codec import decode, split_batch
from regionbus.schemas.errors import MessageDecodeError
from regionbus.schemas.messages import CqEvent, Event, Marker
from regionbus.schemas.record_guard import Polled, UnreadableRecords

log = logging.getLogger("regionbus.client")

QUEUED = (Event, Marker, CqEvent)
"""What a subscription queue holds."""


@dataclass
class SubscriptionStats:
    """Counters of one client's subscription queue.

    Attributes:
        events_received: Events read from the queue (duplicates included).
        events_delivered: Events handed to regions (duplicates excluded).
        duplicates_dropped: Events dropped by message tracking.
        undecodable: Messages that could not be decoded (logged and skipped).
        markers: Markers read.
        replayed: Events delivered as replay (before their bucket's marker).
        conflated: Updates not delivered because a newer update of the same key was read
            with them (subscription conflation).
        forged: Messages dropped because a cache server did not sign them (security on:
            unsigned or forged events and markers, never applied).
        cq_events_received: CQ events read from the queue (duplicates included).
        cq_events_delivered: CQ events handed to the continuous queries.
        cq_duplicates_dropped: CQ events dropped by message tracking.
    """

    events_received: int = 0
    events_delivered: int = 0
    duplicates_dropped: int = 0
    undecodable: int = 0
    markers: int = 0
    replayed: int = 0
    conflated: int = 0
    forged: int = 0
    cq_events_received: int = 0
    cq_events_delivered: int = 0
    cq_duplicates_dropped: int = 0


class QueueRecords:
    """Turns polled records of a client's queue partition into what is addressed to it.

    Args:
        topic: The queue topic (for log lines).
        key: The record key of the client's own records.
        client_id: The client's id.
        server_messages: The check that a record comes from a cache server.
        stats: The queue's counters (``undecodable`` and ``forged`` are counted here).
        spans: The listener spans, which note the traced items (None: tracing off).
    """

    def __init__(
        self,
        topic: str,
        key: bytes,
        client_id: str,
        server_messages: ServerMessages,
        stats: SubscriptionStats,
        spans: ListenerSpans | None,
    ) -> None:
        self._topic = topic
        self._key = key
        self._marker = own_marker(client_id)
        self._client_id = client_id
        self._server_messages = server_messages
        self.stats = stats
        self._spans = spans

    def decode(
        self, messages: Iterable[Polled], position: int
    ) -> tuple[list[Event | Marker | CqEvent], int]:
        """The events, CQ events and markers of ``messages`` addressed to this client, from
        a cache server, decodable; and the offset after the last message.

        Args:
            messages: Polled records of the queue partition, in offset order.
            position: The offset after the last message taken before them.

        Returns:
            ``(items, position)``. Never raises: what cannot be read is counted in
            ``stats`` (``undecodable``, ``forged``), logged, and gone past.
        """
        decoded: list[Event | Marker | CqEvent] = []
        keep = decoded.append
        key, marker, client_id = self._key, self._marker, self._client_id
        for message in messages:
            if isinstance(message, UnreadableRecords):
                # No dead-letter rights here (secured clients): counted, logged, acked past.
                self.stats.undecodable += 1
                log.warning("subscription queue: %s", message.describe())
                position = message.next_offset
                continue
            if message.error() is not None:
                continue
            position = (message.offset() or 0) + 1
            record_key = message.key()
            shared = record_key != key
            if shared and not addressed_to(record_key, message.headers(), key, marker):
                continue  # others', in the partition it shares
            if not self._server_messages.accepts(message):
                self.stats.forged += 1
                continue
            try:
                items = split_batch(message.value())
            except MessageDecodeError as exc:
                self.stats.undecodable += 1
                log.warning("undecodable batch in %s skipped: %s", self._topic, exc)
                continue
            skipped: list[str] = []
            traced = self._spans.traced(message.headers()) if self._spans else None
            for index, raw in enumerate(items):
                try:
                    item = decode(raw)
                except MessageDecodeError as exc:
                    skipped.append(str(exc))
                    continue
                if isinstance(item, QUEUED):
                    # A record for several clients holds its own changes too: the server
                    # never returns a change to the client that made it (docs/behaviour.md §3).
                    if not (shared and type(item) is Event and item.originator == client_id):
                        keep(item)
                        if traced and index in traced:
                            assert self._spans is not None
                            self._spans.took(item, traced[index])
                else:
                    skipped.append(f"unexpected {type(item).__name__}")
            if skipped:
                # One line per Kafka message, however many of its items are bad.
                self.stats.undecodable += len(skipped)
                log.warning(
                    "%d of %d messages in %s@%s skipped, the first: %s",
                    len(skipped),
                    len(items),
                    self._topic,
                    message.offset(),
                    skipped[0],
                )
        return decoded, position


__all__ = ["QUEUED", "QueueRecords", "SubscriptionStats"]
