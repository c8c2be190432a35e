"""The settings of a gateway sender worker (`regionbus.gateways.sender.GatewaySender`):
where its queue and the remote site are, its batches, acks and retries, with Geode's
names and defaults where Geode has them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from regionbus.broker.config import OrderPolicy
from regionbus.runtime.settings import ObservabilitySettings, RedisConnectionSettings
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.kafka_clients import client_config
from regionbus.schemas.naming import check_name, generated_member_id
from regionbus.schemas.settings import KafkaConnectionSettings


class GatewaySenderSettings(
    KafkaConnectionSettings, RedisConnectionSettings, ObservabilitySettings
):
    """Configuration of one gateway sender worker (env prefix ``REGIONBUS_GATEWAY_SENDER_``,
    file table ``[gateway_sender]``).

    The cache servers of the site queue the events (``ServerSettings.gateway_senders``);
    this worker sends them. ``kafka_*`` (local Kafka, with SASL and TLS) are documented on
    :class:`regionbus.schemas.settings.KafkaConnectionSettings`; ``redis_*`` (local Redis: the
    primary
    sender's lease) on :class:`regionbus.runtime.settings.RedisConnectionSettings`;
    ``metrics_port`` and
    ``log_format`` on :class:`regionbus.runtime.settings.ObservabilitySettings`.

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
        send_when_idle: Send a batch at once, before it has ``batch_size`` events or its
            ``batch_time_interval_ms`` passed, when no batch is in flight, as Nagle's
            algorithm (RFC 896) sends a segment at once on an idle connection: a lone
            event is not held back while the link has nothing to carry, and events still
            gather into batches while earlier ones wait for their acks, so a busy sender
            sends full batches. Default False: Geode's batching
            (``AbstractGatewaySenderEventProcessor`` peeks until the batch is full or the
            interval passed), where a lone event waits ``batch_time_interval_ms``; True
            trades batch sizes for lag at low rates.
        batch_conflation_enabled: Drop an update superseded by a later update of the same
            key in the same batch (Geode ``enable-batch-conflation``, default False).
        ack_timeout_ms: Longest wait for a batch's ack before it is resent whole, flagged
            possible duplicate. Geode waits on its socket read timeout; 30 s here.
        max_batches_in_flight: Most batches sent and not yet acked at once (default 10).
            1 is the stop-and-wait sender of docs/behaviour.md §6. Geode sets no number: its serial
            dispatcher sends on while the ``AckReaderThread`` reads acks, bounded by the
            socket; here a window keeps a slow receiver from growing the inbound topic
            without end, and 10 batches of 100 events cover a WAN round trip at the
            rates one receiver applies.
        order_policy: The servers' ``GatewaySenderSpec.order_policy`` for this sender
            (Geode default KEY): with KEY or PARTITION and a queue of several dispatcher
            partitions only a key's (bucket's) order holds, as with Geode's concurrent
            dispatchers, so the receiver applies a batch's buckets at once; with THREAD,
            or one partition, it applies the batch one event after the other.
        retry_interval_ms: Wait before retrying when the remote site cannot be reached
            (docs/behaviour.md §6: five seconds).
        event_filters: ``"module:Class"`` ``GatewayEventFilter``s (``before_transmit``,
            ``after_acknowledgement``).
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the queue and ack consumers:
            bounds idle polls, and how long a queue taken over as primary waits for its
            first fetch (100 ms, as the servers').
        member_id: This worker's member id (the lease holder).
        lease_ttl_ms: Primary lease time to live (renewed every third of it).
        shards: Split the queue's partitions into this many shards, each sent by a
            primary of its own, so that a parallel sender (a partition per bucket) is
            sent by several processes at once, as Geode runs a parallel sender on every
            member that hosts primary buckets. Default 1: one primary sends the whole
            queue. Every sender process of the queue is started with the same
            ``shards``; order still holds per partition (per bucket for a parallel
            sender, per dispatcher partition for a serial one).
        shard: Which shard this process sends (0 to ``shards`` - 1): the partitions
            ``p`` with ``p % shards == shard``. Start two processes per shard for a
            secondary that takes over.
    """

    model_config = SettingsConfigDict(env_prefix="REGIONBUS_GATEWAY_SENDER_")
    config_section: ClassVar[str] = "gateway_sender"
    env_renamed: ClassVar[Mapping[str, str]] = {"sender_id": "REGIONBUS_GATEWAY_SENDER_ID"}

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
    send_when_idle: bool = False
    batch_conflation_enabled: bool = False
    ack_timeout_ms: int = Field(default=30_000, ge=100)
    max_batches_in_flight: int = Field(default=10, ge=1, le=1000)
    order_policy: OrderPolicy = OrderPolicy.KEY
    retry_interval_ms: int = Field(default=5000, ge=10)
    event_filters: list[str] = Field(default_factory=list)
    fetch_wait_max_ms: int = Field(default=100, ge=1)
    member_id: str = Field(default_factory=lambda: generated_member_id("gw-sender"))
    lease_ttl_ms: int = Field(default=10_000, ge=300)
    shards: int = Field(default=1, ge=1, le=1024)
    shard: int = Field(default=0, ge=0)

    @field_validator("sender_id", "remote_receiver_id", "namespace", "remote_namespace")
    @classmethod
    def _topic_legal(cls, value: str) -> str:
        return check_name("name", value, max_len=120)

    @model_validator(mode="after")
    def _shard_in_range(self) -> GatewaySenderSettings:
        if self.shard >= self.shards:
            raise ValueError(f"shard {self.shard} of {self.shards}: a shard is 0 to shards - 1")
        return self

    @field_validator("remote_kafka_config")
    @classmethod
    def _no_remote_auto_creation(cls, value: dict[str, Any]) -> dict[str, Any]:
        return checked_remote_kafka_config(value)


def checked_remote_kafka_config(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` when it is a valid librdkafka configuration of a remote site's clients
    (:func:`regionbus.schemas.kafka_clients.client_config`: no topic auto-creation).

    Raises:
        ValueError: it is not (pydantic reports it as the field's error).
    """
    try:
        client_config(value)
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None
    return value


__all__ = ["GatewaySenderSettings", "checked_remote_kafka_config"]
