"""The gateway sender's processor: batches from ``{ns}.gw.<sender>`` to a remote site.

Seed 002 / Geode ``AbstractGatewaySenderEventProcessor`` with
``GatewaySenderEventRemoteDispatcher``: the primary sender reads its queue, builds a batch
of ``batch_size`` events or what came within ``batch_time_interval_ms``, runs
``before_transmit``, optionally conflates, sends the batch to the remote site's gateway
receiver and waits for its ack; only then does the batch leave the queue, and
``after_acknowledgement`` runs. Failures:

- the ack lists exceptions: the processed and the failed events leave the queue, the
  failures are logged, processing continues;
- no ack within ``ack_timeout_ms``: the whole batch is sent again, every event flagged
  ``possible_duplicate`` (the receiving site drops duplicates by EventID);
- the remote site's Kafka cannot be reached: the batch stays, and is retried every
  ``retry_interval_ms`` (seed 002: five seconds) while the queue grows (Kafka keeps it).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from typing import Any, ClassVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict
from tenacity import RetryError, Retrying, retry_if_exception_type, wait_fixed

from gateways.errors import RemoteSiteUnreachableError
from gateways.processor import QueueProcessor, conflate
from gateways.protocol import (
    GatewayAck,
    GatewayBatch,
    decode_ack,
    encode_batch,
)
from runtime.observability import Metric, MetricFamilies
from runtime.redis_connect import connect_redis
from runtime.settings import ObservabilitySettings, RedisConnectionSettings
from schemas.codec import encode
from schemas.errors import ConfigurationError, MessageDecodeError, RegionBusError
from schemas.hooks import GatewayEventFilter, load_hook
from schemas.kafka_clients import client_config, kafka_admin, kafka_consumer, kafka_producer
from schemas.messages import Event
from schemas.naming import Topics, check_name, generated_member_id, sender_role
from schemas.settings import KafkaConnectionSettings
from schemas.topics import ensure_topics, link_topic_spec
from schemas.transport import assign_from, committed_offsets, kafka_error, poll_batch

log = logging.getLogger("regionbus.gateways.sender")


class GatewaySenderSettings(
    KafkaConnectionSettings, RedisConnectionSettings, ObservabilitySettings
):
    """Configuration of one gateway sender worker (env prefix ``REGIONBUS_GATEWAY_SENDER_``,
    file table ``[gateway_sender]``).

    The cache servers of the site queue the events (``ServerSettings.gateway_senders``);
    this worker sends them. ``kafka_*`` (local Kafka, with SASL and TLS) are documented on
    :class:`schemas.settings.KafkaConnectionSettings`; ``redis_*`` (local Redis: the primary
    sender's lease) on :class:`runtime.settings.RedisConnectionSettings`; ``metrics_port`` and
    ``log_format`` on :class:`runtime.settings.ObservabilitySettings`.

    Attributes:
        sender_id: The sender's id; its queue is ``{namespace}.gw.<sender_id>``.
        namespace: Local site namespace.
        distributed_system_id: Local site id (1-255).
        remote_distributed_system_id: The remote site's id (1-255).
        remote_namespace: The remote site's namespace.
        remote_kafka_bootstrap_servers: The remote site's Kafka.
        remote_kafka_config: Extra librdkafka settings for the remote Kafka (security).
        remote_receiver_id: The remote gateway receiver's id (its inbound topic).
        parallel: The queue is parallel (the servers' ``GatewayQueueSpec.parallel`` for this
            sender; Geode's ``parallel`` sender attribute, default False): told to the
            receiver, which then keeps order per bucket instead of applying each batch
            one event after the other.
        batch_size: Events per batch (Geode ``batch-size``, default 100).
        batch_time_interval_ms: Longest wait for a batch to fill, after its first event
            (Geode ``batch-time-interval``, default 1000 ms).
        batch_conflation_enabled: Drop an update superseded by a later update of the same
            key in the same batch (Geode ``enable-batch-conflation``, default False).
        ack_timeout_ms: Longest wait for a batch's ack before it is resent whole, flagged
            possible duplicate. Geode waits on its socket read timeout; 30 s here.
        retry_interval_ms: Wait before retrying when the remote site cannot be reached
            (seed 002: five seconds).
        event_filters: ``"module:Class"`` ``GatewayEventFilter``s (``before_transmit``,
            ``after_acknowledgement``).
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the queue and ack consumers:
            bounds idle polls, and how long a queue taken over as primary waits for its
            first fetch (100 ms, as the servers').
        member_id: This worker's member id (the lease holder).
        lease_ttl_ms: Primary lease time to live (renewed every third of it).
    """

    model_config = SettingsConfigDict(env_prefix="REGIONBUS_GATEWAY_SENDER_")
    config_section: ClassVar[str] = "gateway_sender"

    sender_id: str
    namespace: str = "regionbus"
    distributed_system_id: int = Field(ge=1, le=255)
    remote_distributed_system_id: int = Field(ge=1, le=255)
    remote_namespace: str
    remote_kafka_bootstrap_servers: str
    remote_kafka_config: dict[str, Any] = Field(default_factory=dict)
    remote_receiver_id: str = "receiver"
    parallel: bool = False
    batch_size: int = Field(default=100, ge=1)
    batch_time_interval_ms: int = Field(default=1000, ge=1)
    batch_conflation_enabled: bool = False
    ack_timeout_ms: int = Field(default=30_000, ge=100)
    retry_interval_ms: int = Field(default=5000, ge=10)
    event_filters: list[str] = Field(default_factory=list)
    fetch_wait_max_ms: int = Field(default=100, ge=1)
    member_id: str = Field(default_factory=lambda: generated_member_id("gw-sender"))
    lease_ttl_ms: int = Field(default=10_000, ge=300)

    @field_validator("sender_id", "remote_receiver_id", "namespace", "remote_namespace")
    @classmethod
    def _topic_legal(cls, value: str) -> str:
        return check_name("name", value, max_len=120)

    @field_validator("remote_kafka_config")
    @classmethod
    def _no_remote_auto_creation(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            client_config(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None
        return value


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
            role=sender_role(settings.sender_id),
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
        )
        self.settings = settings
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
        self._run_id = uuid.uuid4().hex[:12]
        self._batch_ids = itertools.count(1)
        self._producer: Producer | None = None
        self._acks: Consumer | None = None

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

    def _send(self, batch: GatewayBatch) -> None:
        self._ensure_remote()
        assert self._producer is not None
        failures: list[KafkaError] = []

        def on_delivery(error: KafkaError | None, _message: Any) -> None:
            if error is not None:
                failures.append(error)

        try:
            self._producer.produce(
                self.inbound_topic,
                encode_batch(batch),
                batch.batch_id.encode(),
                partition=0,
                on_delivery=on_delivery,
            )
        except (KafkaException, BufferError) as exc:
            raise RemoteSiteUnreachableError(f"cannot send batch: {exc}") from exc
        remaining = self._producer.flush(self.settings.ack_timeout_ms / 1000 + 5)
        if remaining or failures:
            topic = self.inbound_topic
            reason = (
                str(kafka_error(failures[0], f"producing to {topic}", f"topic {topic}"))
                if failures
                else "timed out"
            )
            raise RemoteSiteUnreachableError(
                f"batch {batch.batch_id} not delivered to the remote site: {reason}"
            )

    def _await_ack(self, batch_id: str) -> GatewayAck | None:
        assert self._acks is not None
        deadline = time.monotonic() + self.settings.ack_timeout_ms / 1000
        while not self.stopping.is_set() and time.monotonic() < deadline:
            try:
                messages = poll_batch(self._acks, 100, 0.1)
            except KafkaException as exc:
                log.warning("ack consumer: %s", exc)
                continue
            found: GatewayAck | None = None
            last_offset = -1
            # Every message of the poll is looked at, also after the awaited ack: the
            # consumer's position is already past them, so one skipped here is never seen.
            for message in messages:
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
                    self._dead_letter(message.value(), self.ack_topic, 0, offset, str(exc))
                    continue
                if ack.batch_id == batch_id and found is None:
                    found = ack
            if found is not None:
                self._acks.commit(
                    offsets=[TopicPartition(self.ack_topic, 0, last_offset + 1)],
                    asynchronous=True,
                )
                return found
        return None

    # --- dispatch ----------------------------------------------------------------------

    def _dispatch(self, events: list[Event]) -> bool:
        transmit = [e for e in events if all(f.before_transmit(e) for f in self.filters)]
        self.stats.events_filtered += len(events) - len(transmit)
        if self.settings.batch_conflation_enabled:
            transmit = conflate(transmit)
        if not transmit:
            return True
        batch_id = f"{self._run_id}-{next(self._batch_ids)}"
        ack = self._deliver(batch_id, transmit)
        if ack is None:
            return False
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
        return True

    def _deliver(self, batch_id: str, events: list[Event]) -> GatewayAck | None:
        """Send until acked; None when stopping or no longer primary."""
        sent = False
        retrying = Retrying(
            retry=retry_if_exception_type(RemoteSiteUnreachableError),
            wait=wait_fixed(self.settings.retry_interval_ms / 1000),
            stop=lambda _state: self.stopping.is_set() or not self._primary.is_set(),
            sleep=self._sleep,
            before_sleep=self._log_unreachable,
        )
        while not self.stopping.is_set() and self._primary.is_set():
            payload = tuple(
                encode(e._replace(possible_duplicate=True)) if sent else encode(e) for e in events
            )
            batch = GatewayBatch(
                batch_id,
                self.settings.sender_id,
                self.settings.distributed_system_id,
                self.ack_topic,
                sent,
                payload,
                self.settings.parallel,
            )
            try:
                for attempt in retrying:
                    with attempt:
                        self._send(batch)
            except RetryError:
                return None
            sent = True
            self.stats.batches_sent += 1
            ack = self._await_ack(batch_id)
            if ack is not None:
                return ack
            if not self.stopping.is_set():
                self.stats.batches_redispatched += 1
                log.warning(
                    "gateway sender %s: no ack for batch %s within %d ms: resending it",
                    self.settings.sender_id,
                    batch_id,
                    self.settings.ack_timeout_ms,
                )
        return None

    def _metric_families(self) -> list[Metric]:
        return sender_metric_families(self)

    def _sleep(self, seconds: float) -> None:
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


def sender_metric_families(sender: GatewaySender) -> list[Metric]:
    """The metric families of one scrape of a gateway sender, read from its stats.

    Every sample carries ``namespace`` and ``member`` (the worker's), and the worker's id:
    ``sender``, ``receiver`` or ``queue``. Counters end in ``_total``.

    Gateway sender (``{ns}.gw.<sender>``):

    - ``regionbus_gateway_sender_batches_sent_total``: batches the remote Kafka took (first
      sends and resends).
    - ``regionbus_gateway_sender_batches_acked_total``: batches the remote receiver acked
      (then removed from the queue).
    - ``regionbus_gateway_sender_batches_resent_total``: batches sent again, flagged possible
      duplicate, after no ack within ``ack_timeout_ms``.
    - ``regionbus_gateway_sender_events_acked_total``, ``..._events_failed_total`` (listed in
      an ack as failed), ``..._events_filtered_total`` (``before_transmit`` said no).
    - ``regionbus_gateway_sender_unreachable_retries_total``: waits of ``retry_interval_ms``
      because the remote Kafka could not be reached.
    - ``regionbus_gateway_sender_backlog_events`` (gauge): queued events not yet acked
      (only while primary).
    - ``regionbus_gateway_sender_primary`` (gauge): 1 while this worker is the primary.

    Args:
        sender: The sender; only read.
    """
    s = sender.settings
    stats = sender.stats
    families = MetricFamilies(
        {"namespace": s.namespace, "member": s.member_id, "sender": s.sender_id}
    )
    prefix = "gateway_sender_"
    metrics: list[Metric] = [
        families.counter(
            prefix + "batches_sent",
            "Batches the remote site's Kafka took (first sends and resends).",
            stats.batches_sent,
        ),
        families.counter(
            prefix + "batches_acked",
            "Batches the remote receiver acked (then removed from the queue).",
            stats.batches_dispatched,
        ),
        families.counter(
            prefix + "batches_resent",
            "Batches sent again, flagged possible duplicate, after no ack in time.",
            stats.batches_redispatched,
        ),
        families.counter(
            prefix + "events_acked", "Events in acked batches.", stats.events_dispatched
        ),
        families.counter(
            prefix + "events_failed",
            "Events the remote site listed as failed in an ack (logged, dropped).",
            stats.events_failed,
        ),
        families.counter(
            prefix + "events_filtered",
            "Events a before_transmit filter left out.",
            stats.events_filtered,
        ),
        families.counter(
            prefix + "unreachable_retries",
            "Waits because the remote site's Kafka could not be reached.",
            stats.unreachable_retries,
        ),
        families.gauge(
            prefix + "primary", "1 while this worker is the primary sender.", sender.is_primary
        ),
    ]
    backlog = stats.backlog_events
    if backlog is not None:
        metrics.append(
            families.gauge(
                prefix + "backlog_events",
                "Queued events not yet acked by the remote site (primary only).",
                backlog,
            )
        )
    return metrics


__all__ = [
    "GatewaySender",
    "GatewaySenderSettings",
    "sender_metric_families",
]
