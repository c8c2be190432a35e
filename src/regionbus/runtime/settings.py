"""Settings every long-running server-side process shares: its Redis connection and how it
exposes itself to operators (cache servers, gateway workers, the CLI).

Each process kind's settings class (``regionbus.broker.config.ServerSettings``,
``regionbus.gateways.sender_settings.GatewaySenderSettings``, ...) mixes these in; loading
and validation are :mod:`regionbus.schemas.settings`'.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from regionbus.schemas.masking import mask_url
from regionbus.schemas.settings import RegionBusSettings


class RedisConnectionSettings(RegionBusSettings):
    """The Redis connection of a server-side process (cache server, gateway workers, CLI).

    Attributes:
        redis_url: Redis URL, e.g. ``"redis://127.0.0.1:6379/0"``; ``rediss://`` for TLS.
        redis_username: Redis ACL user (Redis >= 6 ``AUTH user password``); None for the
            default user.
        redis_password: Optional Redis password (overrides the URL's), kept secret.
        redis_ssl_ca_certs: CA bundle (PEM path) to verify Redis' certificate; needs a
            ``rediss://`` URL.
        redis_ssl_certfile: Client certificate (PEM path) for Redis mutual TLS.
        redis_ssl_keyfile: Its private key (PEM path).
        redis_socket_timeout_s: Longest wait for Redis to answer one command or accept a
            connection, seconds. A Redis that hangs (stopped, or cut off without a reset)
            then counts as an outage, which servers wait out
            (:mod:`regionbus.runtime.redis_outage`),
            instead of blocking them forever. None waits forever (redis-py's default).
        redis_cluster: True when ``redis_url`` names a node of a Redis Cluster (redis-py's
            ``RedisCluster`` then learns the other nodes from it), False for one Redis;
            None (the default) asks the node when connecting (``INFO cluster``). redis-py
            names a cluster by the plain URL of any one node; see
            :mod:`regionbus.runtime.redis_connect`.
        redis_wait_replicas: Replicas every change must reach before it is acknowledged
            (Redis ``WAIT`` after each batch's writes, on each master written), so a change
            whose reply was sent survives the loss of its master; 0 (the default) does not
            wait (Redis replication is asynchronous). On a Redis Cluster a master is waited
            for by at most the replicas the cluster does not mark failed, so a failover does
            not stop writes (:mod:`regionbus.runtime.redis_replication`).
        redis_wait_timeout_ms: Longest wait for those replicas per batch, ms; fewer by then
            and the batch is not acknowledged: it is applied again, as after a Redis outage.
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_username: str | None = None
    redis_password: SecretStr | None = None
    redis_ssl_ca_certs: str | None = None
    redis_ssl_certfile: str | None = None
    redis_ssl_keyfile: str | None = None
    redis_socket_timeout_s: float | None = Field(default=10.0, gt=0)
    redis_cluster: bool | None = None
    redis_wait_replicas: int = Field(default=0, ge=0, le=16)
    redis_wait_timeout_ms: int = Field(default=1000, gt=0, le=60_000)

    @model_validator(mode="after")
    def _redis_tls_needs_rediss(self) -> RedisConnectionSettings:
        tls = [self.redis_ssl_ca_certs, self.redis_ssl_certfile, self.redis_ssl_keyfile]
        if any(tls) and not self.redis_url.startswith("rediss://"):
            raise ValueError(
                f"Redis TLS files are set but redis_url {mask_url(self.redis_url)!r} is not rediss://"
            )
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            shown = mask_url(self.redis_url)
            raise ValueError(f"redis_url {shown!r} is not a redis://, rediss:// or unix:// URL")
        socket_timeout_ms = (self.redis_socket_timeout_s or 0) * 1000
        if self.redis_wait_replicas and 0 < socket_timeout_ms <= self.redis_wait_timeout_ms:
            raise ValueError(
                f"redis_wait_timeout_ms ({self.redis_wait_timeout_ms}) must be shorter than "
                f"redis_socket_timeout_s ({self.redis_socket_timeout_s} s): WAIT holds the "
                "connection that long"
            )
        if self.redis_cluster and self.redis_url.startswith("unix://"):
            raise ValueError(
                "a Redis Cluster is reached over TCP: redis_url must be redis:// or rediss://"
            )
        return self


class ObservabilitySettings(RegionBusSettings):
    """How a long-running process (cache server, gateway worker) exposes itself to
    operators.

    Attributes:
        metrics_port: TCP port of the process's Prometheus endpoint (``/metrics``, and the
            probes ``/healthz`` and ``/readyz``; other paths get 404); None (the default)
            = no endpoint, 0 = any free port (the bound one is the worker's
            ``metrics_port``). See :mod:`regionbus.runtime.observability`.
        metrics_host: Address the endpoint listens on: ``127.0.0.1`` (the default, this
            host only); ``0.0.0.0`` (every interface) where Prometheus scrapes from
            elsewhere, as in a container.
        log_format: ``"text"`` (default: ``time level logger: message`` lines) or
            ``"json"`` (one JSON object a line, with ``member`` and ``namespace``), as set
            by ``regionbus serve`` and the ``regionbus gateway`` commands.
        liveness_timeout_s: Longest time the worker's loop may go without turning before
            ``/healthz`` answers 503 (a loop stuck in a listener, a deadlock), seconds;
            a wait the worker does on purpose (a Redis outage) does not count. Default
            60 s: above the longest turn a loaded server takes on purpose (a quarter of
            the lease for a poll batch, the election's Kafka round trips), and three of
            Kubernetes' default 10 s probe periods.
    """

    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    log_format: Literal["text", "json"] = "text"
    liveness_timeout_s: float = Field(default=60.0, gt=0)


__all__ = ["ObservabilitySettings", "RedisConnectionSettings"]
