"""The client's subscription queue reader: events in, duplicates out, acks back.

One thread reads the client's partition of its Kafka principal's shared queue topic
(``{ns}.queues``, or ``{ns}.queues.<principal>``) from the committed offset, takes the
records addressed to it (keyed by its client id, or listing it among the clients that share
an interest: `regionbus.schemas.addressing`), drops events whose EventID
was already seen (message tracking), hands the rest to their region, and every
``subscription_ack_interval_ms`` commits the offset after the last record it went past:
that commit is the client's ack (ARCHITECTURE.md). A client that has never acked starts
where the partition ended when it connected (nothing was queued for it before), and
commits that place at once as its first ack.

A durable client's queue starts *replaying*: when the client is ready for events, each
bucket's server writes a marker into the queue, and the events of a bucket before its marker
are replay (docs/behaviour.md §5: handed to listeners, not applied to the cache). Once the markers
of every bucket from this connection have been read, the client is live.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container
from contextlib import suppress

from confluent_kafka import KafkaException, TopicPartition

from regionbus.clients.client_topics import ClientAddress
from regionbus.clients.conflation import superseded_updates
from regionbus.clients.poll_pace import PollPace
from regionbus.clients.queue_records import QueueRecords, SubscriptionStats
from regionbus.clients.server_trust import ServerMessages
from regionbus.clients.settings import ClientSettings
from regionbus.clients.tracing import ListenerSpans
from regionbus.clients.tracking import MessageTracker
from regionbus.schemas.addressing import addressed_to, own_marker
from regionbus.schemas.codec import TYPE_BYTES, split_batch
from regionbus.schemas.errors import MessageDecodeError, RegionBusError
from regionbus.schemas.health import LoopWatch
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.kafka_outage import KafkaOutage
from regionbus.schemas.messages import CqEvent, Event, Marker
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_guard import Polled, UnreadableRecords
from regionbus.schemas.record_limits import CONSUMER_FETCH_MAX_BYTES
from regionbus.schemas.signing import Signer
from regionbus.schemas.tracing import Tracing
from regionbus.schemas.transport import (
    assign_from,
    committed_offsets,
    kafka_error,
    poll_batch,
    topic_partitions,
    watermarks,
)

log = logging.getLogger("regionbus.client")

_POLL_MAX_MESSAGES = 500
"""Most Kafka messages one poll of the queue takes (conflation looks across them)."""

_PREFETCH_MAX_BYTES = 64 * 1024 * 1024
"""Most bytes of queued messages a durable reconnection keeps from counting its pending
events to deliver them (the rest is read again)."""


class SubscriptionQueue:
    """Reads one client's subscription queue on its own thread, once :meth:`start` ran.

    Args:
        settings: The client's settings.
        client_id: Whose queue.
        address: Where its queue is (topic, partition, record key).
        start_offset: Where to start when the client never acked: the partition's end as
            read before the client connected.
        on_event: Called with each new (non-duplicate) event and whether it is replay, on
            the queue thread.
        on_live: Called once, on the queue thread, when the last marker of this connection
            has been read (never for a queue that does not replay).
        on_cq_event: Called with each new (non-duplicate) CQ event, on the queue thread.
            CQ events are tracked apart from interest events (a change that matches both a
            client's interest and its CQ comes as two messages with one EventID).
        replaying: Start in replay mode (a durable client); markers of ``connection_id``
            from all ``total_buckets`` buckets end it.
        connection_id: This connection's id; markers of earlier connections are ignored.
        total_buckets: The number of buckets (so of markers to wait for).
        tracker: Message tracking state to continue with (after a re-initialisation).
        cq_tracker: Message tracking state of CQ events to continue with.
        conflate: Subscription conflation (docs/behaviour.md §4): of several updates of one key read
            together, only the last is delivered; creates, destroys, invalidates, region
            events and markers never are dropped.
        kafka_outage: The client's Kafka outage tracker, which the queue consumer reports
            errors to (the client's producer, watching the same brokers, reports their
            states); None gives the queue one of its own, which the consumer feeds alone.
        end_of_queue: Where the queue partition ends now (asked by the caller's admin
            client: this consumer, fetching once assigned, answers such a question only
            after its fetch wait); None asks this consumer.
        start_of_queue: Where the queue partition's log starts now, by the same admin
            client: a start past the last ack means records were deleted unread
            (:attr:`lost_records`); None asks this consumer (with ``end_of_queue`` None)
            or does not look.
        signer: The client's signer: with one, only messages a cache server signed for its
            principal are taken (`regionbus.clients.server_trust`); None takes every message.
        tracing: The client's spans: traced events reach their listeners in a span.

    Raises:
        KafkaAuthorizationError: the Kafka principal may not read this queue topic (it is
            another client's, or the client's ACLs are missing).
        TransportError: Kafka did not answer the queue's committed offset.
    """

    def __init__(
        self,
        settings: ClientSettings,
        client_id: str,
        address: ClientAddress,
        start_offset: int,
        on_event: Callable[[Event, bool], None],
        on_live: Callable[[], None],
        *,
        on_cq_event: Callable[[CqEvent], None] = lambda _event: None,
        replaying: bool = False,
        connection_id: str | None = None,
        total_buckets: int = 0,
        tracker: MessageTracker | None = None,
        cq_tracker: MessageTracker | None = None,
        conflate: bool = False,
        kafka_outage: KafkaOutage | None = None,
        signer: Signer | None = None,
        end_of_queue: Callable[[], int] | None = None,
        start_of_queue: Callable[[], int] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._settings = settings
        self._topics = Topics(settings.namespace)
        self._client_id = client_id
        self._topic = address.queue_topic
        self._partition = address.queue_partition
        self._key = address.key
        self._marker = own_marker(client_id)
        self._spans = (
            ListenerSpans(tracing, self._topic, self._partition, client_id) if tracing else None
        )
        if self._spans:
            on_event = self._spans.listening(on_event)
            on_cq_event = self._spans.listening(on_cq_event)
        self._on_event = on_event
        self._on_live = on_live
        self._replaying = replaying
        self._connection_id = connection_id
        self._total_buckets = total_buckets
        self._live_buckets: set[int] = set()
        self.conflate = conflate
        self.tracker = tracker or MessageTracker(settings.subscription_message_tracking_timeout_s)
        self.cq_tracker = cq_tracker or MessageTracker(
            settings.subscription_message_tracking_timeout_s
        )
        self._on_cq_event = on_cq_event
        self.stats = SubscriptionStats()
        self.loop = LoopWatch(settings.liveness_timeout_s)
        """When the reader last turned (a listener that never returns stops it)."""
        self._records = QueueRecords(
            self._topic, self._key, client_id, ServerMessages(signer), self.stats, self._spans
        )
        self._kafka_outage = kafka_outage or KafkaOutage(f"subscription queue {client_id}")
        self._end_of_queue = end_of_queue
        self._start_of_queue = start_of_queue
        self._consumer = kafka_consumer(
            settings.librdkafka(
                **{
                    "group.id": self._topics.client_group(client_id),
                    # An explicit offset, not OFFSET_BEGINNING: librdkafka resolves a logical
                    # offset on a just-created topic only on a 500 ms retry timer. Past the
                    # log start (retention), fall back to the earliest offset.
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": settings.fetch_wait_max_ms,
                    **queue_fetch_pacing(settings.queue_fetch_backoff_ms),
                    "client.id": client_id,
                    # A tracker shared with the pool is fed by its producer, which watches
                    # the same brokers.
                    **self._kafka_outage.client_config("queue", watched=kafka_outage is None),
                }
            )
        )
        group = self._topics.client_group(client_id)
        try:
            # The topic is asked by name first: Kafka refuses that with an authorization
            # error, where librdkafka reports an offset fetch it may not make as a timeout.
            topic_partitions(self._consumer, self._topic, settings.metadata_timeout_s)
            partition = TopicPartition(self._topic, self._partition)
            committed = committed_offsets(self._consumer, [partition], settings.metadata_timeout_s)[
                0
            ]
        except KafkaException as exc:
            self._consumer.close()
            raise kafka_error(exc, f"committed offset of {group}", f"group {group}") from exc
        except RegionBusError:
            self._consumer.close()
            raise
        start = committed.offset if committed.offset >= 0 else max(start_offset, 0)
        head = TopicPartition(self._topic, self._partition, start)
        try:
            if committed.offset < 0:
                # The queue's head is set now, before any interest is registered (a
                # registration's round trip takes longer than this commit): a client that
                # dies before its first ack comes back to everything queued for it, and
                # readers of its acks (status, analytics) see its queue from the start.
                self._consumer.commit(offsets=[head], asynchronous=True)
            assign_from(self._consumer, [head], settings.metadata_timeout_s)
        except KafkaException as exc:
            self._consumer.close()
            raise kafka_error(exc, f"committing the head of {group}", f"group {group}") from exc
        self._acked = start
        self._position = start
        self._committed = committed.offset
        self.lost_records = 0
        """Records of the queue partition deleted past this client's last ack before it
        read them (found by :meth:`count_pending`)."""
        # Messages count_pending read before the thread started, delivered first.
        self._prefetched: list[Polled] = []
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"queue-{client_id}", daemon=True)

    def start(self) -> None:
        """Start reading (for a durable client: after it is ready for events)."""
        if not self._thread.is_alive() and not self._stop.is_set():
            self.loop.turned()
            self._thread.start()

    @property
    def started(self) -> bool:
        """True once :meth:`start` ran."""
        return self._thread.is_alive() or self._stop.is_set()

    @property
    def replaying(self) -> bool:
        """True until every bucket's marker of this connection has been read."""
        return self._replaying

    def count_pending(self, timeout_s: float) -> int:
        """Count the events in the queue after the last ack, before :meth:`start`.

        Reads the queue from the acked offset up to its high watermark with the queue's
        own consumer: a queue message may hold several events, so the offsets alone do not
        count them. Only the frames' type bytes are looked at, not the Avro bodies. The
        messages read are kept (up to ``_PREFETCH_MAX_BYTES``) and are the first the queue
        thread delivers, so a durable reconnection reads its queue once; past that bound
        the consumer goes back to the first message not kept.

        The end is the high watermark asked first, not the partition EOF: librdkafka
        reports EOF only after a fetch that found nothing, which the broker holds for
        ``fetch_wait_max_ms`` (0.5 s of a 20,000-event reconnection).

        Args:
            timeout_s: Longest time to spend counting, in seconds.

        Returns:
            Events queued after the acked offset (duplicates included), as far as read
            within ``timeout_s``; 0 once the queue thread runs (it reads the queue then).
        """
        if self.started:
            return 0
        event_types = (TYPE_BYTES[Event], TYPE_BYTES[CqEvent])
        deadline = time.monotonic() + timeout_s
        head = TopicPartition(self._topic, self._partition)
        try:
            if self._end_of_queue is not None:
                low, high = 0, self._end_of_queue()
                if self._committed >= 0 and self._start_of_queue is not None:
                    # Records past the last ack may have been deleted (retention).
                    low = self._start_of_queue()
            else:
                low, high = watermarks(self._consumer, head, timeout_s)
            if self._committed >= 0:
                self.lost_records = max(0, low - self._committed)
        except (KafkaException, RegionBusError) as exc:
            log.warning("subscription queue %s: no watermarks to count: %s", self._topic, exc)
            return 0
        count = kept_bytes = 0
        resume_at: int | None = None
        offset = max(self._position, low)
        key, marker = self._key, self._marker
        while offset < high and time.monotonic() < deadline:
            try:
                messages = poll_batch(
                    self._consumer, 500, min(1.0, max(0.0, deadline - time.monotonic()))
                )
            except KafkaException as exc:
                log.warning("subscription queue %s: %s", self._topic, exc)
                continue
            for message in messages:
                if isinstance(message, UnreadableRecords):
                    offset = message.next_offset
                    if resume_at is None:
                        self._prefetched.append(message)  # counted and skipped when taken
                    continue
                if message.error() is not None:
                    continue
                offset = (message.offset() or 0) + 1
                if not addressed_to(message.key(), message.headers(), key, marker):
                    continue
                value = message.value()
                size = len(value) if value else 0
                if resume_at is None and kept_bytes + size <= _PREFETCH_MAX_BYTES:
                    self._prefetched.append(message)
                    kept_bytes += size
                elif resume_at is None:
                    resume_at = offset - 1
                try:
                    items = split_batch(value)
                except MessageDecodeError:
                    continue
                count += sum(1 for raw in items if len(raw) > 1 and raw[1] in event_types)
        if resume_at is not None:
            # The consumer has read past what is kept: it reads the rest again.
            with suppress(KafkaException):
                self._consumer.seek(TopicPartition(self._topic, self._partition, resume_at))
        return count

    def _run(self) -> None:
        ack_every_s = self._settings.subscription_ack_interval_ms / 1000
        next_ack = time.monotonic() + ack_every_s
        prefetched, self._prefetched = self._prefetched, []
        if prefetched:
            self._take(prefetched)
        pace = PollPace()
        while not self._stop.is_set():
            self.loop.turned()
            try:
                messages = poll_batch(self._consumer, _POLL_MAX_MESSAGES, pace.timeout_s())
            except KafkaException as exc:
                log.warning("subscription queue %s: %s", self._topic, exc)
                continue
            except RuntimeError:
                return  # close() gave up waiting for a listener and closed the consumer
            self._idle.clear() if messages else self._idle.set()
            if messages or self._position > self._acked:
                pace.busy()
            self._take(messages)
            if time.monotonic() >= next_ack:
                self.ack()
                next_ack = time.monotonic() + ack_every_s
        # A synchronous commit waits for a group coordinator for as long as none answers:
        # during a Kafka outage it would hold close() until Kafka is back.
        if not self._kafka_outage.ongoing:
            self.ack(asynchronous=False)

    def _take(self, messages: list[Polled]) -> None:
        """Decode, track and deliver one poll's messages, then move the ack position.

        Every frame is decoded once. With conflation the whole poll is decoded before the
        first delivery (conflation looks across it); without, each Kafka message's events
        are delivered before the next message is decoded: nothing looks further, and a
        poll of a durable client's queue holds ~100,000 events, which decoded at once
        would all live long enough to reach the collector's oldest generation and make
        it scan the whole heap again and again.
        """
        position = self._position
        if self.conflate:
            decoded, position = self._records.decode(messages, position)
            self._deliver(decoded, superseded_updates(decoded))
        else:
            for message in messages:
                decoded, position = self._records.decode((message,), position)
                if decoded:
                    self._deliver(decoded, ())
        self._position = position

    def _deliver(self, decoded: list[Event | Marker | CqEvent], superseded: Container[int]) -> None:
        """Track and hand over decoded events, in order; take markers.

        One loop (once per event: no call per event but the tracker's and the region's);
        a marker may end replay, so ``_replaying`` is read per event.
        """
        now = time.monotonic()
        stats = self.stats
        is_new = self.tracker.is_new
        on_event = self._on_event
        live_buckets = self._live_buckets
        for index, message in enumerate(decoded):
            if type(message) is not Event:
                if type(message) is CqEvent:
                    if index not in superseded:
                        self._deliver_cq(message, now)
                    else:
                        stats.conflated += 1
                    continue
                stats.markers += 1
                self._on_marker(message)  # type: ignore[arg-type]
                continue
            stats.events_received += 1
            event_id = message.event_id
            if not is_new(event_id, now):
                stats.duplicates_dropped += 1
                continue
            if index in superseded:
                stats.conflated += 1
                continue
            stats.events_delivered += 1
            replay = self._replaying and event_id.bucket not in live_buckets
            if replay:
                stats.replayed += 1
            try:
                on_event(message, replay)
            except Exception:
                log.exception("handling event %s failed", event_id)

    def _deliver_cq(self, message: CqEvent, now: float) -> None:
        """Track and hand over one CQ event (durable replay changes nothing for CQs: they
        have no cache to leave alone)."""
        stats = self.stats
        stats.cq_events_received += 1
        if not self.cq_tracker.is_new(message.event.event_id, now):
            stats.cq_duplicates_dropped += 1
            return
        stats.cq_events_delivered += 1
        try:
            self._on_cq_event(message)
        except Exception:
            log.exception("handling CQ event %s failed", message.event.event_id)

    def _on_marker(self, marker: Marker) -> None:
        if not self._replaying or marker.connection_id != self._connection_id:
            return
        self._live_buckets.add(marker.bucket)
        if len(self._live_buckets) >= self._total_buckets:
            self._replaying = False
            try:
                self._on_live()
            except Exception:
                log.exception("after_region_live callbacks failed")

    def ack(self, asynchronous: bool = True) -> None:
        """Commit the offset after the last processed event (the client's ack)."""
        if self._position <= self._acked:
            return
        offsets = [TopicPartition(self._topic, self._partition, self._position)]
        # RuntimeError: the consumer was closed by close() while a slow listener held this
        # thread; what was not acked is delivered again to the next connection.
        with suppress(KafkaException, RuntimeError):
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
        """Stop reading after a final synchronous ack (none during a Kafka outage: what
        was not acked is delivered again to the client's next connection)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with suppress(Exception):
            self._consumer.close()
        self._kafka_outage.forget("queue")


def queue_fetch_pacing(backoff_ms: int) -> dict[str, int]:
    """librdkafka settings that make a subscription queue's consumer fetch at most once per
    ``backoff_ms`` while it holds events not yet taken.

    A consumer fetches again as soon as a fetch returns, and Apache Kafka answers a fetch
    at its first record, so at a steady rate each event costs a fetch round trip and a
    wake-up of the reading thread: half of a busy subscriber's CPU. With
    ``queued.min.messages`` 1, one record still held locally is enough to postpone the next
    fetch by ``fetch.queue.backoff.ms``; an empty local queue (an idle client) fetches at
    once, and the broker holds that fetch until a record arrives. As a paced fetch is one
    per backoff, it may bring a whole response's worth of the queue's one partition
    (``fetch.max.bytes``, not the 1 MiB per partition other consumers ask for): a
    reconnecting durable client counts its backlog a response per backoff.

    A paced consumer holds one fetch locally, not the backlog librdkafka would prefetch:
    with conflation, a slow client conflates what each fetch brought (as a Geode client
    gets, unconflated, what was already dispatched to it), not its whole backlog at once.

    Args:
        backoff_ms: ``ClientSettings.queue_fetch_backoff_ms``, in ms; 0 keeps librdkafka's
            defaults.

    Returns:
        The librdkafka keys to add to the consumer's configuration (empty for 0, which
        also keeps ``max.partition.fetch.bytes`` at 1 MiB).
    """
    if backoff_ms <= 0:
        return {}
    return {
        "queued.min.messages": 1,
        "fetch.queue.backoff.ms": backoff_ms,
        "max.partition.fetch.bytes": CONSUMER_FETCH_MAX_BYTES,
    }
