"""Settings of one client cache: typed, validated, from code, env (prefix ``REGIONBUS_``) or
the ``[client]`` table of the ``REGIONBUS_CONFIG_FILE`` file (:mod:`regionbus.schemas.settings`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.naming import check_name
from regionbus.schemas.settings import KafkaConnectionSettings
from regionbus.schemas.tracing import TracingSettings


class ClientSettings(KafkaConnectionSettings, TracingSettings):
    """Configuration of a :class:`clients.ClientCache` (file table ``[client]``).

    The Kafka connection (``kafka_*``, with SASL and TLS) is documented on
    :class:`regionbus.schemas.settings.KafkaConnectionSettings`, traces
    (``tracing_enabled``, ``tracing_sample_ratio``) on
    :class:`regionbus.schemas.tracing.TracingSettings`.

    Attributes:
        namespace: Site namespace of the servers to talk to.
        client_id: Id of this client (its queue records and replies are keyed by it, its
            acks are the consumer group ``{ns}.client.<client_id>``); generated when None.
            Must be legal in a Kafka topic name.
        durable_client_id: Makes the client durable under this id (docs/behaviour.md §5); it then is
            the client id.
        durable_client_timeout_s: How long the servers keep a durable client's queue while
            it is away (Geode ``durable-client-timeout``, default 300 s).
        read_timeout_ms: Longest wait for a server reply (Geode pool ``read-timeout``,
            default 10000 ms).
        retry_interval_ms: A change unanswered for this long is sent again with the same
            EventID and ``possible_duplicate`` (its server may have died; the bucket's new
            primary applies an EventID once), until ``read_timeout_ms`` gives up.
        retry_attempts: Times the buckets (or servers) of a function execution that failed
            are executed again, for an ``is_ha`` function whose server stopped, lost the
            bucket or did not answer within ``read_timeout_ms`` (Geode pool
            ``retry-attempts``; Geode's -1 means once per server, a number this client
            does not know: 3 here).
        subscription_enabled: Whether the client has a subscription queue (Geode pool
            ``subscription-enabled``); needed for interest.
        subscription_ack_interval_ms: How often processed events are acked, i.e. the queue
            offset committed (Geode ``subscription-ack-interval``, default 100 ms).
        subscription_message_tracking_timeout_s: Idle time after which a thread's
            duplicate-tracking entry expires (Geode default 900 s).
        subscription_conflation: ``"server"`` (default: as the servers'
            ``enable_subscription_conflation``), ``"true"`` or ``"false"`` (Geode client
            ``conflate-events``). With conflation, of several queued updates of a key read
            together only the last reaches the listeners; creates and destroys always do.
        ping_interval_ms: How often the client tells the servers it is alive (Geode pool
            ``ping-interval``, default 10000 ms).
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` for the queue and reply
            consumers: how long the broker holds a fetch that finds nothing. Apache Kafka
            answers as soon as data arrives, so this bounds idle polls, not latency; 500 ms
            (librdkafka's default) costs the broker a third of the CPU of 100 ms per idle
            client (measured on the embedded Apache Kafka).
        queue_fetch_backoff_ms: 0 (the default) or how long the subscription queue's
            consumer waits, after a fetch brought events the client has not taken yet,
            before it fetches again (librdkafka ``fetch.queue.backoff.ms``, with
            ``queued.min.messages`` 1). A subscriber at a steady rate otherwise fetches
            once per event. Set it for subscribers whose CPU matters more than a few
            milliseconds: ``bench.fleet``, 10 subscribers at 200 puts/s, 20 ms cut their
            CPU per event from 146-163 to 114-128 µs (raw Kafka consumers: 108-122) and
            added 4-12 ms to put → listener p50. On a saturated machine it gains nothing
            (consumers that fall behind fetch many events at once anyway: ``bench.fleet``,
            100 subscribers, 53-55 µs per event either way) and costs latency. An idle
            queue's fetch is not delayed. 0: librdkafka's defaults (fetch as soon as the
            previous fetch returns, prefetching up to 100,000 messages or 64 MiB).
        linger_ms: librdkafka producer ``linger.ms``: 1 ms cuts each producer hop's wait
            from 5 ms (put → listener p50 12.7 → 5.0 ms at 500 puts/s) and keeps most of the
            batching of bulk writes (ops/s within 5 % of 5 ms; 0 ms lost 20 %).
        metadata_timeout_s: Longest wait at start for this client's topics to be created
            and have a leader. The first contact (Kafka answering, the servers'
            ``{ns}.ops`` existing) waits at most ``read_timeout_ms``, or this if shorter,
            so a wrong address or namespace fails as soon as an unanswered request would.
        kafka_principal: The Kafka principal this client logs in as, naming the shared
            queue and reply topics it reads, ``{ns}.queues.<principal>`` and
            ``{ns}.replies.<principal>`` (which Kafka ACLs can keep to that principal's
            clients). Default: ``kafka_sasl_username`` (or ``sasl.username`` in
            ``kafka_config``) when set, else none: the namespace's ``{ns}.queues`` and
            ``{ns}.replies``, shared by every client. Set it for a TLS client
            certificate's principal, as a name legal in a topic.
        security_principal: Principal this client signs its requests as (servers with
            ``security_enabled`` refuse unsigned requests); None sends them unsigned.
        security_secret: The principal's secret (given by ``regionbus user add``); the
            MAC key is derived from it at start (PBKDF2, ``regionbus.schemas.signing``).
        metrics_port: TCP port of this client's Prometheus endpoint (``/metrics``, and the
            probes ``/healthz`` and ``/readyz``): its subscription counters and its
            put → listener and replay latency histograms
            (:mod:`regionbus.clients.client_metrics`). None (the default): no endpoint and
            no latency kept; 0: any free port (``ClientCache.metrics_url``).
        metrics_host: Address that endpoint listens on: ``127.0.0.1`` (the default, this
            host only), ``0.0.0.0`` where Prometheus scrapes from elsewhere.
        liveness_timeout_s: Longest time the subscription queue's reader may go without
            turning (a listener that never returns) before ``/healthz`` answers 503,
            seconds (default 60, as the servers').
    """

    model_config = SettingsConfigDict(env_prefix="REGIONBUS_")
    config_section: ClassVar[str] = "client"

    namespace: str = "regionbus"
    client_id: str | None = None
    durable_client_id: str | None = None
    durable_client_timeout_s: int = Field(default=300, ge=1)
    read_timeout_ms: int = Field(default=10_000, ge=1)
    retry_interval_ms: int = Field(default=5_000, ge=10)
    retry_attempts: int = Field(default=3, ge=0)
    subscription_enabled: bool = True
    subscription_ack_interval_ms: int = Field(default=100, ge=1)
    subscription_message_tracking_timeout_s: float = Field(default=900.0, gt=0)
    subscription_conflation: Literal["server", "true", "false"] = "server"
    ping_interval_ms: int = Field(default=10_000, ge=10)
    fetch_wait_max_ms: int = Field(default=500, ge=1)
    queue_fetch_backoff_ms: int = Field(default=0, ge=0, le=1_000)
    linger_ms: int = Field(default=1, ge=0)
    metadata_timeout_s: float = Field(default=30.0, gt=0)
    kafka_principal: str | None = None
    security_principal: str | None = None
    security_secret: SecretStr | None = None
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    liveness_timeout_s: float = Field(default=60.0, gt=0)

    @property
    def first_contact_timeout_s(self) -> float:
        """Longest wait for Kafka to answer and the servers' topics to exist, in seconds:
        ``read_timeout_ms``, or ``metadata_timeout_s`` if shorter."""
        return min(self.read_timeout_ms / 1000, self.metadata_timeout_s)

    @property
    def topic_principal(self) -> str | None:
        """The Kafka principal whose shared client topics this client reads
        (:attr:`kafka_principal`, else the SASL user name), None for the unscoped ones."""
        if self.kafka_principal:
            return self.kafka_principal
        user = self.kafka_sasl_username or self.kafka_config.get("sasl.username")
        return str(user) if user else None

    @model_validator(mode="after")
    def _topic_principal_ok(self) -> ClientSettings:
        principal = self.topic_principal
        if principal is not None:
            try:
                check_name("Kafka principal", principal)
            except ConfigurationError as exc:
                raise ValueError(
                    f"{exc}: it names this client's shared queue and reply topics; set "
                    "kafka_principal (env REGIONBUS_KAFKA_PRINCIPAL) to a legal name"
                ) from None
        return self

    @field_validator("namespace")
    @classmethod
    def _namespace_ok(cls, value: str) -> str:
        return check_name("namespace", value, max_len=120)

    @field_validator("client_id", "durable_client_id")
    @classmethod
    def _id_ok(cls, value: str | None) -> str | None:
        return None if value is None else check_name("client id", value, max_len=100)
