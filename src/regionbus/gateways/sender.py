"""The gateway sender's processor: batches from ``{ns}.gw.<sender>`` to a remote site.

Seed 002 / Geode ``AbstractGatewaySenderEventProcessor`` with
``GatewaySenderEventRemoteDispatcher``: the primary sender reads its queue, builds a batch
of ``batch_size`` events or what came within ``batch_time_interval_ms`` (with
``send_when_idle``, what was read once no batch awaits an ack), runs ``before_transmit``,
optionally conflates and sends the batch to the remote site's gateway receiver. It does
not wait for the ack before the next batch: up to ``max_batches_in_flight`` batches are
unacked at once (:mod:`regionbus.gateways.sender_window`; Geode's dispatcher also sends on
while its ``AckReaderThread`` reads the acks). Acks are read on
their own thread; a batch leaves the queue, and ``after_acknowledgement`` runs, once it and
every batch before it were acked. The receiver applies a run's batches strictly in their
order (:mod:`regionbus.gateways.batch_sequence`). Failures:

- the ack lists exceptions: the processed and the failed events leave the queue, the
  failures are logged, processing continues;
- no ack within ``ack_timeout_ms``: every unacked batch is sent again, from the first, in
  order, every event flagged ``possible_duplicate`` (the receiving site drops duplicates
  by EventID);
- the remote site's Kafka does not take a batch: it and the unacked batches after it are
  sent again, retried every ``retry_interval_ms`` (docs/behaviour.md §6: five seconds) while the
  queue grows (Kafka keeps it).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from tenacity import RetryError, Retrying, retry_if_exception_type, wait_fixed

from regionbus.broker.config import OrderPolicy
from regionbus.gateways.errors import RemoteSiteUnreachableError
from regionbus.gateways.processor import QueueProcessor, conflate
from regionbus.gateways.protocol import (
    GatewayAck,
    GatewayBatch,
    decode_ack,
    encode_batch,
)
from regionbus.gateways.queue_reader import QueuedEvent
from regionbus.gateways.sender_metrics import sender_metric_families
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.gateways.sender_window import BatchWindow, InFlightBatch
from regionbus.runtime.observability import Metric
from regionbus.runtime.redis_connect import connect_redis
from regionbus.schemas.codec import encode
from regionbus.schemas.errors import (
    MessageDecodeError,
    RegionBusError,
    TransportError,
)
from regionbus.schemas.hooks import GatewayEventFilter, load_hook
from regionbus.schemas.kafka_clients import (
    kafka_admin,
    kafka_consumer,
    kafka_producer,
)
from regionbus.schemas.messages import Event
from regionbus.schemas.naming import Topics, sender_role, sender_shard_id
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.topics import ensure_topics, link_topic_spec
from regionbus.schemas.transport import assign_from, committed_offsets, kafka_error, poll_batch

log = logging.getLogger("regionbus.gateways.sender")


class GatewaySender(QueueProcessor):
    """A gateway sender worker: runs on threads until :meth:`stop`.

    Args:
        settings: The sender's settings.
        event_filters: Filters in addition to ``settings.event_filters``.

    Raises:
        ConfigurationError: a filter cannot be loaded.
    """

    def __init__(
        self,
        settings: GatewaySenderSettings,
        *,
        event_filters: list[GatewayEventFilter] | None = None,
    ) -> None:
        super().__init__(
            role=sender_role(settings.sender_id, settings.shard, settings.shards),
            namespace=settings.namespace,
            kafka_config=settings.librdkafka(),
            fetch_wait_max_ms=settings.fetch_wait_max_ms,
            redis_client=connect_redis(settings),
            member_id=settings.member_id,
            topic=Topics(settings.namespace).gateway(settings.sender_id),
            group_id=Topics(settings.namespace).sender_group(settings.sender_id),
            batch_size=settings.batch_size,
            batch_time_interval_ms=settings.batch_time_interval_ms,
            lease_ttl_ms=settings.lease_ttl_ms,
            metrics_port=settings.metrics_port,
            metrics_host=settings.metrics_host,
            liveness_timeout_s=settings.liveness_timeout_s,
            shard=settings.shard,
            shards=settings.shards,
        )
        self.settings = settings
        # The shards of one queue share its ack topic (each ignores the acks of batches
        # it did not send) but not their batch sequences.
        self.batch_sender_id = sender_shard_id(settings.sender_id, settings.shard, settings.shards)
        self.filters = [load_hook(n, GatewayEventFilter) for n in settings.event_filters]
        self.filters += event_filters or []
        self._remote = {
            "bootstrap.servers": settings.remote_kafka_bootstrap_servers,
            **settings.remote_kafka_config,
        }
        self.inbound_topic = Topics(settings.remote_namespace).gateway_inbound(
            settings.remote_receiver_id
        )
        self.ack_topic = Topics(settings.remote_namespace).gateway_ack(
            settings.distributed_system_id, settings.sender_id
        )
        self._producer: Producer | None = None
        self._acks: Consumer | None = None
        # Held to open or close the queue reader and to hand acked positions over.
        self._run_lock = threading.Lock()
        # Queue positions whose batches were acked, committed by the dispatching thread:
        # the queue consumer is polled there, and a synchronous commit from the ack thread
        # while that poll runs could wait for seconds.
        self._acked_positions: dict[int, int] = {}
        self._window: BatchWindow | None = None
        self._order_per_bucket = settings.parallel
        self._last_send_error: KafkaError | None = None
        self._round_trip = (
            self._metrics.histogram(
                "gateway_sender_batch_round_trip_seconds",
                "Time from a batch's last send to the remote receiver's ack of it.",
                {
                    "namespace": settings.namespace,
                    "member": settings.member_id,
                    "sender": settings.sender_id,
                },
            )
            if self._metrics.enabled
            else None
        )

    def _setup(self) -> None:
        super()._setup()
        self.spawn(self._read_acks, "acks")

    # --- remote site -------------------------------------------------------------------

    def _ensure_remote(self) -> None:
        if self._producer is not None and self._acks is not None:
            return
        try:
            admin = kafka_admin({**self._remote, "socket.timeout.ms": 5000})
            ensure_topics(
                admin,
                [link_topic_spec(self.inbound_topic), link_topic_spec(self.ack_topic)],
                timeout_s=5,
            )
        except RegionBusError as exc:
            # A missing ACL too: the batch waits, retried, until an operator grants it.
            raise RemoteSiteUnreachableError(f"remote site Kafka: {exc}") from exc
        except KafkaException as exc:
            raise RemoteSiteUnreachableError(
                f"remote site Kafka: {kafka_error(exc, 'admin client')}"
            ) from exc
        timeout_ms = max(1000, min(self.settings.ack_timeout_ms, 30_000))
        self._producer = kafka_producer(
            {
                **self._remote,
                "acks": "all",
                # Not idempotent: an idempotent producer must first get a producer id, which
                # Kafka grants only to a principal with Write on some topic; a sender whose
                # one remote topic is refused would get a fatal error, and its producer stay
                # dead after the grant. A batch appended twice by a retry is applied once:
                # the receiver recognises its EventIDs.
                "message.timeout.ms": timeout_ms,
                # A batch is whole when produced (Geode writes it to the connection at
                # once): lingering (librdkafka's default 5 ms) only delays it.
                "linger.ms": 0,
                # One produce request at a time: a retried request never lands after a
                # later batch (not idempotent, so librdkafka would not keep the order).
                "max.in.flight.requests.per.connection": 1,
                "client.id": self.member_id,
            }
        )
        group = Topics(self.settings.namespace).sender_ack_group(self.settings.sender_id)
        acks = kafka_consumer(
            {
                **self._remote,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": self.settings.fetch_wait_max_ms,
                "client.id": self.member_id,
            }
        )
        try:
            committed = committed_offsets(acks, [TopicPartition(self.ack_topic, 0)], 10.0)
            start = max(committed[0].offset, 0)
            assign_from(acks, [TopicPartition(self.ack_topic, 0, start)], 10.0)
        except KafkaException as exc:
            acks.close()
            self._producer = None
            failure = kafka_error(exc, f"committed offset of {group}", f"group {group}")
            raise RemoteSiteUnreachableError(f"remote site Kafka: {failure}") from exc
        self._acks = acks

    def _close(self) -> None:
        if self._acks is not None:
            self._acks.close()
            self._acks = None
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None

    # --- the run: peek, send, resend ---------------------------------------------------

    def _serve(self) -> None:
        opened = False
        while not self.stopping.is_set():
            self.turned()
            if not self._primary.is_set():
                if opened:
                    self._end_run()
                    opened = False
                self.stats.backlog_events = None
                self._primary.wait(0.2)
                continue
            if not opened:
                self._start_run()
                opened = True
            window = self._window
            assert window is not None
            self._commit_acked()
            self._reader.trimmer.trim()
            self.stats.backlog_events = self._reader.backlog_events()
            if not self._resend_due(window):
                self._end_run()  # stopping, or no longer primary
                opened = False
                continue
            self.stats.batches_in_flight = window.in_flight
            if not window.wait_for_room(0.05):
                continue
            batch = self._reader.peek(
                self.batch_size,
                self.batch_time_interval_ms,
                0.2,
                self.stopping,
                window.idle if self.settings.send_when_idle else None,
            )
            positions = self._reader.mark()
            if batch or positions is not None:
                self._submit(window, batch, positions)
        if opened:
            self._end_run()  # what was acked leaves the queue before the reader closes

    def _start_run(self) -> None:
        """Read the queue from its committed offsets under a new run id (a new batch
        sequence: the receiver takes its first batch as the start)."""
        with self._run_lock:
            self._reader.open()
            partitions = self._reader.partitions
            self._order_per_bucket = self.settings.parallel or (
                partitions > 1 and self.settings.order_policy is not OrderPolicy.THREAD
            )
            self._window = BatchWindow(uuid.uuid4().hex[:12], self.settings.max_batches_in_flight)
        self._reading.set()

    def _end_run(self) -> None:
        """Stop reading; the batches in flight are read again from the committed offsets
        by the next run (resent, and recognised by EventID where applied)."""
        self._commit_acked(asynchronous=False)
        with self._run_lock:
            if self._window is not None:
                self._window.close()
            self._acked_positions.clear()
            self._reader.close()
        self._reading.clear()
        self.stats.batches_in_flight = 0

    def _submit(
        self, window: BatchWindow, queued: list[QueuedEvent], positions: dict[int, int] | None
    ) -> None:
        transmit = [q for q in queued if all(f.before_transmit(q.event) for f in self.filters)]
        self.stats.events_filtered += len(queued) - len(transmit)
        if self.settings.batch_conflation_enabled:
            kept = {id(e) for e in conflate([q.event for q in transmit])}
            transmit = [q for q in transmit if id(q.event) in kept]
        entry = window.new_batch([q.event for q in transmit], [q.raw for q in transmit], positions)
        if entry.events:
            self._transmit(window, entry)

    def _batch_of(self, window: BatchWindow, entry: InFlightBatch) -> GatewayBatch:
        resend = entry.delivered
        payload = (
            tuple(encode(e._replace(possible_duplicate=True)) for e in entry.events)
            if resend
            else tuple(entry.raw)
        )
        return GatewayBatch(
            entry.batch_id,
            self.batch_sender_id,
            self.settings.distributed_system_id,
            self.ack_topic,
            resend,
            payload,
            self._order_per_bucket,
            entry.sequence,
            window.acked_through,
        )

    def _transmit(self, window: BatchWindow, entry: InFlightBatch) -> None:
        """Hand a batch to the remote producer without waiting; a failure marks it for
        :meth:`_resend_due`."""
        entry.sends += 1
        entry.sent_at = time.monotonic()
        entry.failed = False
        try:
            self._ensure_remote()
            assert self._producer is not None
            self._producer.produce(
                self.inbound_topic,
                encode_batch(self._batch_of(window, entry)),
                entry.batch_id.encode(),
                partition=0,
                on_delivery=lambda error, _message: self._delivered(entry, error),
            )
            self._producer.poll(0)
        except (RemoteSiteUnreachableError, KafkaException, BufferError) as exc:
            log.debug("batch %s not handed to the remote producer: %s", entry.batch_id, exc)
            entry.failed = True

    def _delivered(self, entry: InFlightBatch, error: KafkaError | None) -> None:
        # On the thread that polls or flushes the producer (the dispatching one).
        if error is None:
            entry.delivered = True
            self.stats.batches_sent += 1
        else:
            entry.failed = True
            self._last_send_error = error

    def _resend_due(self, window: BatchWindow) -> bool:
        """Send again what failed or whose ack is overdue, from the first such batch, in
        order, until the remote Kafka takes it all; False when stopping or no longer
        primary."""
        if self._producer is not None:
            self._producer.poll(0)
        again, overdue = window.to_resend(time.monotonic(), self.settings.ack_timeout_ms / 1000)
        if not again:
            return True
        if overdue:
            self.stats.batches_redispatched += len(again)
            log.warning(
                "gateway sender %s: no ack for batch %s within %d ms: resending %d batches",
                self.settings.sender_id,
                again[0].batch_id,
                self.settings.ack_timeout_ms,
                len(again),
            )
        retrying = Retrying(
            retry=retry_if_exception_type(RemoteSiteUnreachableError),
            wait=wait_fixed(self.settings.retry_interval_ms / 1000),
            stop=lambda _state: self.stopping.is_set() or not self._primary.is_set(),
            sleep=self._sleep,
            before_sleep=self._log_unreachable,
        )
        try:
            for attempt in retrying:
                with attempt:
                    self._send_all(window, again)
        except RetryError:
            return False
        return True

    def _send_all(self, window: BatchWindow, entries: list[InFlightBatch]) -> None:
        self._ensure_remote()
        assert self._producer is not None
        for entry in entries:
            self._transmit(window, entry)
        remaining = self._producer.flush(self.settings.ack_timeout_ms / 1000 + 5)
        failed = next((e for e in entries if e.failed), None)
        if remaining or failed is not None:
            topic = self.inbound_topic
            error = self._last_send_error
            reason = (
                str(kafka_error(error, f"producing to {topic}", f"topic {topic}"))
                if error is not None
                else "timed out"
            )
            name = failed.batch_id if failed is not None else entries[0].batch_id
            raise RemoteSiteUnreachableError(
                f"batch {name} not delivered to the remote site: {reason}"
            )

    # --- acks --------------------------------------------------------------------------

    def _read_acks(self) -> None:
        """The ack reader thread (Geode's ``AckReaderThread``): records acks in the run's
        window and removes the acked prefix from the queue."""
        while not self.stopping.is_set():
            acks, window = self._acks, self._window
            if acks is None or window is None or window.closed:
                self.stopping.wait(0.05)
                continue
            try:
                messages = poll_batch(acks, 500, 0.05)
            except KafkaException as exc:
                log.warning("ack consumer: %s", exc)
                continue
            last_offset = -1
            for message in messages:
                if isinstance(message, UnreadableRecords):
                    self._dead_letter(
                        None,
                        self.ack_topic,
                        0,
                        message.first_offset,
                        message.describe(),
                        message.last_offset,
                    )
                    last_offset = max(last_offset, message.last_offset)
                    continue
                if message.error() is not None:
                    continue
                offset = message.offset()
                assert offset is not None
                last_offset = max(last_offset, offset)
                try:
                    ack = decode_ack(message.value())
                except MessageDecodeError as exc:
                    # The ack topic is on the remote Kafka; the dead letter goes to this
                    # site's, where the sender's operators look (as for its queue).
                    self._dead_letter(message.value(), self.ack_topic, 0, offset, str(exc), None)
                    continue
                acked = window.acked(ack)
                if acked is not None and self._round_trip is not None:
                    self._round_trip.observe(time.monotonic() - acked.sent_at)
            self._complete(window)
            if last_offset >= 0:
                acks.commit(
                    offsets=[TopicPartition(self.ack_topic, 0, last_offset + 1)],
                    asynchronous=True,
                )

    def _commit_acked(self, *, asynchronous: bool = True) -> None:
        """Remove from the queue what the remote site acked (on the dispatching thread,
        which polls the queue consumer); a failed commit is tried again next time.

        Asynchronous while the run goes on: a synchronous commit made this thread wait a
        group coordinator round trip per batch before it peeked the next one. The end of
        a run commits synchronously, so a new primary starts after what was acked."""
        with self._run_lock:
            positions, self._acked_positions = self._acked_positions, {}
        if not positions:
            return
        try:
            self._reader.commit_at(positions, asynchronous=asynchronous)
        except TransportError as exc:
            log.warning("gateway sender %s: %s", self.settings.sender_id, exc)
            with self._run_lock:
                self._acked_positions = {**positions, **self._acked_positions}

    def _complete(self, window: BatchWindow) -> None:
        """Remove the leading acked batches from the queue, then run their filters."""
        with self._run_lock:
            if window.closed:
                return
            done = window.pop_completed()
            positions: dict[int, int] = {}
            for entry in done:
                positions.update(entry.positions or {})
            self._acked_positions.update(positions)
        self.stats.batches_in_flight_peak = max(
            self.stats.batches_in_flight_peak, window.peak_in_flight
        )
        for entry in done:
            if entry.events and entry.ack is not None:
                self._acknowledged(entry.events, entry.ack)

    def _acknowledged(self, transmit: list[Event], ack: GatewayAck) -> None:
        self.stats.dispatched(len(transmit))
        for failure in ack.exceptions:
            event = transmit[failure.event_index] if failure.event_index < len(transmit) else None
            log.error(
                "gateway sender %s: remote site %d failed event %s (key %r): %s: %s; dropped",
                self.settings.sender_id,
                self.settings.remote_distributed_system_id,
                failure.event_id,
                event.key if event is not None else None,
                failure.error_type,
                failure.message,
            )
        self.stats.events_failed += len(ack.exceptions)
        for event in transmit:
            for f in self.filters:
                f.after_acknowledgement(event)

    def _metric_families(self) -> list[Metric]:
        s = self.settings
        labels = {"namespace": s.namespace, "member": s.member_id, "sender": s.sender_id}
        return sender_metric_families(labels, self.stats, self.is_primary)

    def _sleep(self, seconds: float) -> None:
        # A wait between tries to reach the remote site: the loop turns, slowly, on purpose.
        self.turned()
        self.stopping.wait(seconds)

    def _log_unreachable(self, state: Any) -> None:
        self.stats.unreachable_retries += 1
        outcome = state.outcome
        log.warning(
            "gateway sender %s: remote site %d unreachable (%s); retrying in %d ms",
            self.settings.sender_id,
            self.settings.remote_distributed_system_id,
            outcome.exception() if outcome is not None else "?",
            self.settings.retry_interval_ms,
        )


__all__ = ["GatewaySender"]
