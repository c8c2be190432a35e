"""The settings of a gateway receiver (``REGIONBUS_GATEWAY_RECEIVER_*``), apart from the
worker that applies batches (:mod:`regionbus.gateways.receiver`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from regionbus.runtime.settings import ObservabilitySettings, RedisConnectionSettings
from regionbus.schemas.naming import check_name, generated_member_id
from regionbus.schemas.settings import KafkaConnectionSettings


class GatewayReceiverSettings(
    KafkaConnectionSettings, RedisConnectionSettings, ObservabilitySettings
):
    """Configuration of a gateway receiver worker (env prefix
    ``REGIONBUS_GATEWAY_RECEIVER_``, file table ``[gateway_receiver]``).

    ``kafka_*`` (this site's Kafka) are documented on
    :class:`regionbus.schemas.settings.KafkaConnectionSettings`; ``redis_*`` (this site's Redis,
    read
    only, by a conflict resolver) on :class:`regionbus.runtime.settings.RedisConnectionSettings`;
    ``metrics_port`` and ``log_format`` on
    :class:`regionbus.runtime.settings.ObservabilitySettings`.

    Attributes:
        receiver_id: The receiver's id; its inbound topic is ``{namespace}.gwr.<id>``.
        namespace: This site's namespace.
        distributed_system_id: This site's id (1-255).
        conflict_resolver: ``"module:Class"`` of a ``GatewayConflictResolver``, or None.
        apply_timeout_ms: Longest wait for this site's servers to answer a batch's
            operations; past it the batch is not acked (the sender resends it).
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the inbound and reply
            consumers (100 ms, as the servers').
        member_id: This worker's member id.
        security_principal: Principal the receiver signs the operations it applies as
            (`regionbus.schemas.signing`); needed where the servers have ``security_enabled``, which
            refuse unsigned operations. None sends them unsigned.
        security_secret: That principal's secret (``regionbus user add``).
        keep_batch_until_region_exists: Keep a batch naming a region this site does not
            define, unacked, until the region exists (default False: its events are
            reported failed and dropped, docs/behaviour.md §6).
        missing_region_retry_interval_ms: Wait between two tries of a batch kept for a
            missing region.
        max_batches_applying: Most batches whose operations are sent to this site's
            servers before the oldest of them is answered (default 8): batches that need
            order per bucket only (:mod:`regionbus.gateways.receiver_pipeline`). 1 applies one batch
            at a time. Geode applies a batch in its connection's thread; a sender's
            batches then wait for each other, which here would be a Kafka round trip each.
    """

    model_config = SettingsConfigDict(env_prefix="REGIONBUS_GATEWAY_RECEIVER_")
    config_section: ClassVar[str] = "gateway_receiver"
    env_renamed: ClassVar[Mapping[str, str]] = {"receiver_id": "REGIONBUS_GATEWAY_RECEIVER_ID"}

    receiver_id: str = "receiver"
    namespace: str = "regionbus"
    distributed_system_id: int = Field(ge=1, le=255)
    conflict_resolver: str | None = None
    apply_timeout_ms: int = Field(default=30_000, ge=100)
    fetch_wait_max_ms: int = Field(default=100, ge=1)
    member_id: str = Field(default_factory=lambda: generated_member_id("gw-receiver"))
    security_principal: str | None = None
    security_secret: SecretStr | None = None
    keep_batch_until_region_exists: bool = False
    missing_region_retry_interval_ms: int = Field(default=1000, ge=10)
    max_batches_applying: int = Field(default=8, ge=1, le=1000)

    @field_validator("receiver_id", "namespace")
    @classmethod
    def _topic_legal(cls, value: str) -> str:
        return check_name("name", value, max_len=120)


__all__ = ["GatewayReceiverSettings"]
