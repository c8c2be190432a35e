"""The settings of ``regionbus gateway repair`` (`regionbus.gateways.repair.GatewayRepair`):
the two sites it compares, the regions, and how it runs."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from regionbus.gateways.sender_settings import checked_remote_kafka_config
from regionbus.runtime.settings import RedisConnectionSettings
from regionbus.schemas.naming import check_name
from regionbus.schemas.settings import KafkaConnectionSettings


class GatewayRepairSettings(KafkaConnectionSettings, RedisConnectionSettings):
    """Configuration of a gateway repair (env prefix ``REGIONBUS_GATEWAY_REPAIR_``, file
    table ``[gateway_repair]``). ``kafka_*`` and ``redis_*`` are this site's (documented on
    :class:`regionbus.schemas.settings.KafkaConnectionSettings` and
    :class:`regionbus.runtime.settings.RedisConnectionSettings`); ``remote_*`` the other's.

    Attributes:
        namespace: This site's namespace.
        distributed_system_id: This site's id (1-255).
        remote_namespace: The other site's namespace.
        remote_distributed_system_id: The other site's id (1-255).
        remote_kafka_bootstrap_servers: The other site's Kafka (its cache servers apply
            what it lost).
        remote_kafka_config: Extra librdkafka settings for the other site's Kafka.
        remote_redis_url: The other site's Redis (where its tree is computed).
        regions: The regions to compare (both sites define them).
        total_buckets: Buckets of both sites (servers' ``total_buckets``, default 16).
        leaf_bits: Leaves per bucket as bits, 1-24 (default: sized to each bucket, about
            four leaves an entry); more leaves move fewer entries along with each
            difference, and more tree nodes.
        conflict_resolver: ``"module:Class"`` of a ``GatewayConflictResolver`` to run on
            each conflicting change as the losing site's gateway receiver would (Geode
            ``GatewayConflictResolver``), or None: the later change wins.
        dry_run: Compare and report what would change, change nothing.
        interval_s: Run again every this many seconds, as anti-entropy (0: once).
        apply_timeout_ms: Longest wait for a site's servers to answer one window of
            changes (default 30,000 ms).
    """

    model_config = SettingsConfigDict(env_prefix="REGIONBUS_GATEWAY_REPAIR_")
    config_section: ClassVar[str] = "gateway_repair"

    namespace: str = "regionbus"
    distributed_system_id: int = Field(ge=1, le=255)
    remote_namespace: str
    remote_distributed_system_id: int = Field(ge=1, le=255)
    remote_kafka_bootstrap_servers: str
    remote_kafka_config: dict[str, Any] = Field(default_factory=dict)
    remote_redis_url: str
    regions: list[str] = Field(min_length=1)
    total_buckets: int = Field(default=16, ge=1)
    leaf_bits: int | None = Field(default=None, ge=1, le=24)
    conflict_resolver: str | None = None
    dry_run: bool = False
    interval_s: float = Field(default=0.0, ge=0.0)
    apply_timeout_ms: int = Field(default=30_000, ge=100)

    @field_validator("namespace", "remote_namespace")
    @classmethod
    def _topic_legal(cls, value: str) -> str:
        return check_name("namespace", value, max_len=120)

    @field_validator("remote_kafka_config")
    @classmethod
    def _no_remote_auto_creation(cls, value: dict[str, Any]) -> dict[str, Any]:
        return checked_remote_kafka_config(value)


__all__ = ["GatewayRepairSettings"]
