"""The gateway receiver: applies batches from remote senders to this site (docs/behaviour.md §6).

Geode ``GatewayReceiverCommand``: each event of a batch is applied to this site's regions
as a distributed operation, so the site's clients, listeners and further gateway senders
see it. Here the receiver is a client of its own site (client id ``gw-receiver-<id>``): it
produces each event as an :class:`Operation` to ``{ns}.ops`` keeping the event's EventID
(so the servers drop a resent event as a duplicate), with the origin site id and the sites
reached (this one added, for loop prevention), waits until the servers answered every
operation, and then acks the batch, listing the events that failed.

Order: a batch that needs queue order (a serial sender's with one dispatcher, or order
policy THREAD) is applied in that order, as Geode's ``GatewayReceiverCommand`` applies a
batch's events one after the other: consecutive events of one bucket go together (one
partition of ``{ns}.ops`` keeps their order), the next bucket's once those were answered.
A batch that needs order per bucket only (``GatewayBatch.parallel``) is sent at once, behind
the batches still applying (:mod:`regionbus.gateways.receiver_pipeline`). A sender's batches are
applied in their sequence (:mod:`regionbus.gateways.batch_sequence`); acks are not waited for.

A region this site does not define: its events fail and are listed in the ack, so the
sender drops them (docs/behaviour.md §6; Geode's default
``GatewaySender.REMOVE_FROM_QUEUE_ON_EXCEPTION`` true). With ``keep_batch_until_region_exists`` the
receiver instead keeps the batch unacked and applies it again every
``missing_region_retry_interval_ms`` until the region exists (Geode's
``gemfire.GatewaySender.REMOVE_FROM_QUEUE_ON_EXCEPTION=false``, which keeps resending a batch that
failed); the events applied before are recognised by EventID then.

Conflict resolution: the servers refuse, atomically at apply, an event from another site
that is older than the entry's last change (timestamp, then site id). A pluggable
:class:`GatewayConflictResolver` runs here first, for events whose entry was last changed
by another site, and may disallow the event or change its value.

An undecodable batch goes to ``{ns}.dead-letter`` with the reason; the receiver keeps going.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from regionbus.broker.gateway_queues import DISTRIBUTABLE_KINDS
from regionbus.broker.store import RegionStore
from regionbus.clients.pool import Pool
from regionbus.clients.settings import ClientSettings
from regionbus.gateways.batch_sequence import BatchSequencer
from regionbus.gateways.errors import BatchApplyTimeoutError, RegionNotYetDefinedError
from regionbus.gateways.filters import GatewayConflictResolver, resolve_conflict
from regionbus.gateways.protocol import (
    BatchEventException,
    GatewayAck,
    GatewayBatch,
    decode_batch,
    encode_ack,
)
from regionbus.gateways.receiver_pipeline import ApplyingBatch, ApplyPipeline, PreparedBatch
from regionbus.gateways.receiver_settings import GatewayReceiverSettings
from regionbus.gateways.receiver_stats import ReceiverStats, receiver_metric_families
from regionbus.runtime.observability import Metric, MetricsEndpoint
from regionbus.runtime.redis_connect import connect_redis, replica_wait
from regionbus.runtime.redis_outage import RedisOutage, is_redis_unavailable
from regionbus.runtime.worker import BackgroundWorker
from regionbus.schemas.codec import decode_as
from regionbus.schemas.dead_letter import Source, dead_letter_headers
from regionbus.schemas.errors import MessageDecodeError, RegionBusError, TransportError
from regionbus.schemas.hooks import load_hook
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.messages import Event, EventKind, Operation, OperationKind, Reply
from regionbus.schemas.naming import Topics, bucket_of, receiver_client_id
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.topics import ensure_topics, link_topic_spec
from regionbus.schemas.transport import assign_from, committed_offsets, kafka_error, poll_batch

log = logging.getLogger("regionbus.gateways.receiver")

INBOUND_POLL_MESSAGES: Final = 16
"""Most inbound batches taken per poll (each is applied and acked in turn)."""


class GatewayReceiver(BackgroundWorker):
    """A gateway receiver worker: runs on a thread from :meth:`start` (which returns once it
    reads its inbound topic) until :meth:`stop` (after the batch in hand: an unacked batch
    is sent again by its sender).

    Args:
        settings: The receiver's settings.
        conflict_resolver: A resolver instance (overrides ``settings.conflict_resolver``).

    Raises:
        ConfigurationError: the resolver cannot be loaded.
    """

    def __init__(
        self,
        settings: GatewayReceiverSettings,
        *,
        conflict_resolver: GatewayConflictResolver | None = None,
    ) -> None:
        self.settings = settings
        self.site_id = settings.distributed_system_id
        self.client_id = receiver_client_id(settings.receiver_id)
        self.topics = Topics(settings.namespace)
        self.inbound_topic = Topics(settings.namespace).gateway_inbound(settings.receiver_id)
        self.stats = ReceiverStats()
        if conflict_resolver is None and settings.conflict_resolver:
            conflict_resolver = load_hook(settings.conflict_resolver, GatewayConflictResolver)
        self.resolver = conflict_resolver
        self._kafka: dict[str, Any] = settings.librdkafka()
        self._pool: Pool | None = None
        self._store: RegionStore | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._sequencer = BatchSequencer()
        self._pipeline = ApplyPipeline(settings.max_batches_applying)
        self._committed_offset = -1
        super().__init__(
            f"gw-receiver-{settings.receiver_id}",
            MetricsEndpoint(
                settings.metrics_port, self._metric_families, address=settings.metrics_host
            ),
            settings.liveness_timeout_s,
        )

    # --- lifecycle ---------------------------------------------------------------------

    def _metric_families(self) -> list[Metric]:
        s = self.settings
        labels = {"namespace": s.namespace, "member": s.member_id, "receiver": s.receiver_id}
        return receiver_metric_families(labels, self.stats)

    def _setup(self) -> None:
        s = self.settings
        ensure_topics(kafka_admin(self._kafka), [link_topic_spec(self.inbound_topic)])
        client_settings = ClientSettings(
            namespace=s.namespace,
            **s.kafka_connection(),
            fetch_wait_max_ms=s.fetch_wait_max_ms,
            read_timeout_ms=s.apply_timeout_ms,
            security_principal=s.security_principal,
            security_secret=s.security_secret,
        )
        self._pool = Pool(client_settings, self.client_id, s.member_id)
        if self.resolver is not None:
            client = connect_redis(s)
            self._store = RegionStore(
                client, s.namespace, self._pool.total_buckets, replica_wait(client, s)
            )
        self._producer = kafka_producer(
            {
                **self._kafka,
                "acks": "all",
                # An ack survives a leader change of the sender's ack topic, once.
                "enable.idempotence": True,
                # An unknown ack topic is one no sender made: fail at once, not in 30 s.
                "topic.metadata.propagation.max.ms": 1000,
                # An ack frees a place in the sender's window: sent at once, not after
                # librdkafka's default 5 ms linger.
                "linger.ms": 0,
            }
        )
        consumer = kafka_consumer(
            {
                **self._kafka,
                "group.id": Topics(s.namespace).receiver_group(s.receiver_id),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": s.fetch_wait_max_ms,
                "client.id": s.member_id,
            }
        )
        committed = committed_offsets(consumer, [TopicPartition(self.inbound_topic, 0)], 10.0)
        self._sequencer = BatchSequencer(committed[0].metadata)
        self._committed_offset = committed[0].offset
        assign_from(
            consumer, [TopicPartition(self.inbound_topic, 0, max(committed[0].offset, 0))], 10.0
        )
        self._consumer = consumer
        log.info(
            "gateway receiver %s of site %d reading %s",
            s.receiver_id,
            self.site_id,
            self.inbound_topic,
        )

    def _teardown(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
        if self._consumer is not None:
            if self._committed_offset >= 0:
                try:
                    # The loop's commits are asynchronous: the last one is made sure of.
                    self._commit(self._committed_offset, asynchronous=False)
                except KafkaException as exc:
                    log.warning("last inbound commit: %s", exc)
            self._consumer.close()
        if self._pool is not None:
            self._pool.close()
        if self._store is not None:
            self._store.redis.close()

    # --- batches -----------------------------------------------------------------------

    def _serve(self) -> None:
        assert self._consumer is not None and self._producer is not None
        while not self.stopping.is_set():
            self.turned()
            self._producer.poll(0)  # the acks' delivery reports
            if not self._conclude(keep=self._pipeline.capacity):
                continue
            try:
                wait_s = 0.005 if len(self._pipeline) else 0.1
                messages = poll_batch(self._consumer, INBOUND_POLL_MESSAGES, wait_s)
            except KafkaException as exc:
                log.warning("inbound consumer: %s", exc)
                continue
            for message in messages:
                if isinstance(message, UnreadableRecords):
                    self._dead_letter(
                        None, message.first_offset, message.describe(), message.last_offset
                    )
                    self._pipeline.add(ApplyingBatch(message.last_offset))  # committed in turn
                    continue
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("inbound: %s", error)
                    continue
                offset = message.offset()
                assert offset is not None
                if not self._handle(message.value(), offset):
                    break  # read again from a batch: the rest of the poll is dropped
        # Stopping: what is answered is acked; the rest is read again by the next start.
        self._conclude(keep=len(self._pipeline))

    def _handle(self, raw: bytes | None, offset: int) -> bool:
        """Apply (or start applying) one inbound message; False when the receiver seeked
        back to read again from a batch."""
        try:
            batch = decode_batch(raw)
        except MessageDecodeError as exc:
            self._dead_letter(raw, offset, str(exc))
            self._pipeline.add(ApplyingBatch(offset))  # committed in turn
            return True
        if not self._sequencer.admits(batch):
            # The batch before it was lost on the way: the sender resends both, in order.
            self.stats.batches_out_of_sequence += 1
            log.info(
                "batch %s of site %d not applied: the one before it was not received",
                batch.batch_id,
                batch.site_id,
            )
            self._pipeline.add(ApplyingBatch(offset))
            return True
        if batch.parallel and self.resolver is None:
            # Order per bucket only: sent behind the batches still applying.
            assert self._pool is not None
            if batch.possible_duplicate:
                self.stats.possible_duplicate_batches += 1
            prepared = self._prepare(batch)
            entry = ApplyingBatch(
                offset,
                batch,
                prepared,
                self._pool.request_each(prepared.ops) if prepared.ops else [],
                ApplyPipeline.deadline(self.settings.apply_timeout_ms),
            )
            self._sequencer.applied(batch)  # the next batch of the run may follow it
            self._pipeline.add(entry)
            return self._conclude(keep=self._pipeline.capacity)
        # Queue order (or a resolver reading entries): after every batch before it.
        if not self._conclude(keep=0):
            return False
        try:
            ack = self.apply_batch(batch)
        except (BatchApplyTimeoutError, RegionNotYetDefinedError, TransportError) as exc:
            self._not_applied(batch, offset, exc)
            return False
        self._sequencer.applied(batch)
        self._send_ack(batch, ack)
        self._commit(offset + 1, asynchronous=True)
        return True

    def _conclude(self, keep: int) -> bool:
        if self._pipeline.conclude(keep, self._finish):
            return True
        assert self._pool is not None
        for entry in self._pipeline.dropped():
            for op, _ in entry.prepared.ops:
                self._pool.forget(op.request_id)
        return False

    def _finish(self, entry: ApplyingBatch) -> bool:
        """Wait for a pipelined batch's replies, ack it and commit past it; False (after
        a seek back to it) when it was not applied."""
        batch = entry.batch
        if batch is not None:
            try:
                replies = [
                    self._wait(f, op, entry.deadline)
                    for (op, _), f in zip(entry.prepared.ops, entry.futures, strict=True)
                ]
                self._check_regions(replies)
            except (BatchApplyTimeoutError, RegionNotYetDefinedError) as exc:
                assert self._pool is not None
                for op, _ in entry.prepared.ops:
                    self._pool.forget(op.request_id)
                self._not_applied(batch, entry.offset, exc)
                return False
            self._send_ack(batch, self._conclude_batch(batch, entry.prepared, replies))
        self._commit(entry.offset + 1, asynchronous=True)
        return True

    def _not_applied(self, batch: GatewayBatch, offset: int, exc: Exception) -> None:
        """Read again from ``offset``: after a timeout at once, for a missing region after
        ``missing_region_retry_interval_ms``, for Redis once it is back.

        Raises:
            TransportError: ``exc`` itself when it is not a Redis outage of the resolver.
        """
        assert self._consumer is not None
        if isinstance(exc, TransportError) and (
            self._store is None or not is_redis_unavailable(exc)
        ):
            raise exc
        self._consumer.seek(TopicPartition(self.inbound_topic, 0, offset))
        if isinstance(exc, RegionNotYetDefinedError):
            self.stats.batches_kept_for_region += 1
            log.info("batch %s kept: %s", batch.batch_id, exc)
            self.stopping.wait(self.settings.missing_region_retry_interval_ms / 1000)
        elif isinstance(exc, TransportError):
            # The conflict resolver reads Redis before any event is sent, so the whole
            # batch is applied again (and acked) once Redis is back.
            self._wait_for_redis(exc)
        else:
            log.warning("batch %s not acked: %s", batch.batch_id, exc)

    def _commit(self, offset: int, *, asynchronous: bool) -> None:
        """Commit the inbound offset with what was applied per sender (its metadata)."""
        assert self._consumer is not None
        position = TopicPartition(
            self.inbound_topic, 0, offset, metadata=self._sequencer.to_metadata()
        )
        if asynchronous:
            self._consumer.commit(offsets=[position], asynchronous=True)
        else:
            self._consumer.commit(offsets=[position], asynchronous=False)
        self._committed_offset = offset

    def _wait_for_redis(self, cause: TransportError) -> None:
        assert self._store is not None
        outage = RedisOutage(self._store.redis, self.settings.receiver_id, self.stopping)
        outage.began(cause)
        with self.waiting("Redis unavailable"):
            if outage.wait():
                outage.ended()

    def apply_batch(self, batch: GatewayBatch) -> GatewayAck:
        """Apply one batch to this site and build its ack.

        Args:
            batch: The decoded batch.

        Returns:
            The ack, listing the events that failed.

        Raises:
            BatchApplyTimeoutError: the servers did not answer within ``apply_timeout_ms``.
            RegionNotYetDefinedError: an event names a region this site does not define
                and ``keep_batch_until_region_exists`` is set (the batch is not acked).
        """
        if batch.possible_duplicate:
            self.stats.possible_duplicate_batches += 1
        prepared = self._prepare(batch)
        replies = self._apply_in_order(prepared.ops, parallel=batch.parallel)
        return self._conclude_batch(batch, prepared, replies)

    def _prepare(self, batch: GatewayBatch) -> PreparedBatch:
        """The batch's events as this site's operations (conflict resolver run)."""
        assert self._pool is not None
        pool = self._pool
        prepared = PreparedBatch()
        exceptions, sent, ops = prepared.exceptions, prepared.sent, prepared.ops
        for index, raw in enumerate(batch.events):
            try:
                event = decode_as(raw, Event)
            except MessageDecodeError as exc:
                exceptions.append(BatchEventException(index, "?", type(exc).__name__, str(exc)))
                continue
            if self.site_id in event.sites_reached or event.origin_site_id == self.site_id:
                self.stats.loops_dropped += 1
                continue
            if event.kind not in DISTRIBUTABLE_KINDS or event.key is None:
                exceptions.append(
                    BatchEventException(
                        index,
                        str(event.event_id),
                        "InvalidOperationError",
                        f"{event.kind.value} is not a gateway event",
                    )
                )
                continue
            bucket = bucket_of(event.region, event.key, pool.total_buckets)
            value = event.value
            if self.resolver is not None:
                assert self._store is not None
                verdict = resolve_conflict(self._store, self.resolver, event, bucket)
                if verdict is None:
                    self.stats.conflicts_disallowed += 1
                    continue
                value = verdict
            kind = OperationKind.DESTROY if event.kind is EventKind.DESTROY else OperationKind.PUT
            op = Operation(
                request_id=pool.next_request_id(),
                client_id=self.client_id,
                kind=kind,
                region=event.region,
                timestamp_ms=event.timestamp_ms,
                event_id=event.event_id._replace(bucket=bucket),
                key=event.key,
                value=value if event.kind is not EventKind.DESTROY else None,
                serializer=event.serializer,
                callback_argument=event.callback_argument,
                possible_duplicate=event.possible_duplicate or batch.possible_duplicate,
                origin_site_id=event.origin_site_id or batch.site_id,
                sites_reached=(*event.sites_reached, self.site_id),
                kafka_principal=pool.kafka_principal,
            )
            sent.append((index, event, op))
            ops.append((op, bucket))
        return prepared

    def _conclude_batch(
        self, batch: GatewayBatch, prepared: PreparedBatch, replies: list[Reply]
    ) -> GatewayAck:
        """The ack of an applied batch, from its operations' replies."""
        exceptions = list(prepared.exceptions)
        for (index, event, op), reply in zip(prepared.sent, replies, strict=True):
            if reply.ok:
                if reply.duplicate:
                    self.stats.duplicates += 1
                elif reply.event_kind is None:
                    self.stats.conflicts_refused += 1
                else:
                    self.stats.events_applied += 1
            elif op.kind is OperationKind.DESTROY and reply.error_type == "EntryNotFoundError":
                log.debug("destroy of absent %r from site %d ignored", op.key, op.origin_site_id)
            else:
                exceptions.append(
                    BatchEventException(
                        index,
                        str(event.event_id),
                        reply.error_type or "ServerOperationError",
                        reply.error_message or "",
                    )
                )
        self.stats.events_failed += len(exceptions)
        return GatewayAck(
            batch.batch_id, self.settings.receiver_id, len(batch.events), tuple(exceptions)
        )

    def _apply_in_order(self, ops: list[tuple[Operation, int]], *, parallel: bool) -> list[Reply]:
        """Send a batch's operations and wait for their replies: all at once for a parallel
        sender (each bucket's partition keeps its order), else one run of consecutive
        same-bucket operations at a time, the next run sent after the previous one was
        answered (the sender's order across buckets)."""
        assert self._pool is not None
        deadline = time.monotonic() + self.settings.apply_timeout_ms / 1000
        runs: list[list[tuple[Operation, int]]] = []
        for op, bucket in ops:
            if parallel and runs:
                runs[0].append((op, bucket))
            elif runs and runs[-1][-1][1] == bucket:
                runs[-1].append((op, bucket))
            else:
                runs.append([(op, bucket)])
        replies: list[Reply] = []
        for run in runs:
            futures = self._pool.request_each(run)
            answered = [
                self._wait(f, op, deadline) for (op, _), f in zip(run, futures, strict=True)
            ]
            self._check_regions(answered)
            replies.extend(answered)
        return replies

    def _check_regions(self, replies: list[Reply]) -> None:
        """Raises RegionNotYetDefinedError: a reply says a region is missing and
        ``keep_batch_until_region_exists`` is set."""
        if self.settings.keep_batch_until_region_exists:
            missing = next((r for r in replies if r.error_type == "RegionNotFoundError"), None)
            if missing is not None:
                raise RegionNotYetDefinedError(missing.error_message or "region not found")

    def _wait(self, future: Future[list[Reply]], op: Operation, deadline: float) -> Reply:
        assert self._pool is not None
        try:
            replies = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeoutError as exc:
            self._pool.forget(op.request_id)
            raise BatchApplyTimeoutError(
                f"no reply for {op.event_id} within {self.settings.apply_timeout_ms} ms"
            ) from exc
        except RegionBusError as exc:
            return Reply(op.request_id, -1, False, type(exc).__name__, str(exc))
        return replies[0]

    def _send_ack(self, batch: GatewayBatch, ack: GatewayAck) -> None:
        assert self._producer is not None
        # A batch names its ack topic, so anyone who can write the inbound topic could
        # point it anywhere: only this site's ack topics, and only ones that exist (the
        # sender creates its own), are written; otherwise the ack is dropped and logged.
        if not batch.ack_topic.startswith(Topics(self.settings.namespace).gateway_ack_prefix):
            self._ack_not_sent(batch, "its ack topic is not one of this site's")
            return
        topic = batch.ack_topic

        def on_delivery(error: KafkaError | None, _message: Any) -> None:
            # Served by the loop's poll: the ack is not waited for, the next batch goes on.
            if error is not None:
                failure = kafka_error(error, f"producing to {topic}", f"topic {topic}")
                self._ack_not_sent(batch, str(failure))
                return
            self.stats.batches_acked += 1
            self.stats.batch_sizes.append(len(batch.events))
            del self.stats.batch_sizes[:-10_000]

        try:
            self._producer.produce(topic, encode_ack(ack), partition=0, on_delivery=on_delivery)
        except BufferError:
            self._producer.flush(30)
            self._producer.produce(topic, encode_ack(ack), partition=0, on_delivery=on_delivery)
        except KafkaException as exc:
            self._ack_not_sent(batch, str(exc))

    def _ack_not_sent(self, batch: GatewayBatch, reason: str) -> None:
        self.stats.acks_not_sent += 1
        log.warning(
            "batch %s applied, but its ack to %r was not sent: %s",
            batch.batch_id,
            batch.ack_topic,
            reason,
        )

    def _dead_letter(
        self, raw: bytes | None, offset: int, reason: str, last_offset: int | None = None
    ) -> None:
        assert self._producer is not None
        self.stats.dead_letters += 1
        log.warning("dead-lettered %s[0]@%d: %s", self.inbound_topic, offset, reason)
        source = Source(self.inbound_topic, 0, offset)
        headers = dead_letter_headers(reason, source, self.settings.member_id, last_offset)
        self._producer.produce(self.topics.dead_letter, raw, None, headers=headers)
        self._producer.flush(10)


__all__ = [
    "GatewayReceiver",
    "GatewayReceiverSettings",
    "ReceiverStats",
    "receiver_metric_families",
]
