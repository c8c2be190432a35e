"""Settings of one cache server process, typed and validated at start (pydantic-settings).

Read from code, the environment (prefix ``REGIONBUS_``, e.g. ``REGIONBUS_NAMESPACE``) and the
file named by ``REGIONBUS_CONFIG_FILE`` (table ``[server]``): see :mod:`regionbus.schemas.settings`.
"""

from __future__ import annotations

import enum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from regionbus.broker.expiration_attributes import RegionExpiration
from regionbus.runtime.settings import ObservabilitySettings, RedisConnectionSettings
from regionbus.schemas.codec import Framing
from regionbus.schemas.entry_checks import check_region_name
from regionbus.schemas.errors import ConfigurationError, RegionBusError
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS, check_name, generated_member_id
from regionbus.schemas.settings import KafkaConnectionSettings
from regionbus.schemas.topics import (
    DEFAULT_CLIENT_PARTITIONS,
    DEFAULT_MAX_DURABLE_CLIENT_TIMEOUT_S,
)
from regionbus.schemas.tracing import TracingSettings


def _generated_member_id() -> str:
    return generated_member_id("server")


class GatewayQueueSpec(BaseModel):
    """How a cache server queues events for one gateway sender or async event queue.

    The server only enqueues (docs/behaviour.md §6, §7); the sender or dispatcher that reads the
    queue is a separate worker (:mod:`gateways`) with its own settings.

    Attributes:
        parallel: One queue partition per bucket, order kept per bucket (Geode parallel
            sender); False: one partition, one total order (serial, the Geode default).
        remote_distributed_system_id: For a gateway sender, the site it sends to: an event
            that already reached that site is not queued (loop prevention). None for an
            async event queue.
        event_filters: ``"module:Class"`` names of ``regionbus.schemas.hooks.GatewayEventFilter``s
        whose
            ``before_enqueue`` runs here (False = never queued).
        forward_expiration_destroy: Async event queues: also queue the destroys made by entry
            expiration (Geode ``forward-expiration-destroy``, default False; Geode's
            ``AbstractGatewaySender.checkForDistribution``). Gateway senders never queue an
            expiration event, whatever this says (docs/behaviour.md §6).
        queue_retention_ms: How long the queue topic keeps an event its sender or
            dispatcher has not acknowledged, in ms, set when the topic is created. None
            (the default) keeps it until acknowledged, as Geode keeps a queue's events
            until dispatched (overflowing to disk). A time bounds the topic while the
            remote site or the listener stays away, at the price of events older than it:
            they are deleted unsent, and the sender resumes from the oldest one left. At
            least one hour.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    parallel: bool = False
    remote_distributed_system_id: int | None = Field(default=None, ge=1, le=255)
    event_filters: list[str] = Field(default_factory=list)
    forward_expiration_destroy: bool = False
    queue_retention_ms: int | None = Field(default=None, ge=3_600_000)


class OrderPolicy(enum.Enum):
    """How a serial gateway sender's queue is split across its dispatchers (Geode
    ``GatewaySender.OrderPolicy``): events that must stay in order go to the same one."""

    KEY = "KEY"
    """By the event's region and key: order kept per key (Geode's default,
    ``GatewaySender.DEFAULT_ORDER_POLICY``)."""
    THREAD = "THREAD"
    """By the event's originating member and thread: order kept per application thread."""
    PARTITION = "PARTITION"
    """By the event's bucket: order kept per bucket (Geode: per partition, through the
    ``PartitionResolver``)."""


class GatewaySenderSpec(GatewayQueueSpec):
    """How a cache server queues events for one gateway sender: a
    :class:`GatewayQueueSpec` with Geode's ordering attributes.

    Attributes:
        order_policy: Which dispatcher an event of a serial sender goes to (Geode
            ``order-policy``, default ``KEY``: ``GatewaySender.DEFAULT_ORDER_POLICY``).
            A parallel sender already keeps order per bucket; one with ``THREAD`` is
            refused, as Geode's ``GatewaySenderFactoryImpl.create`` refuses it.
        dispatcher_threads: A serial sender's queue is split into this many partitions,
            chosen by ``order_policy`` (Geode ``dispatcher-threads``, default 5:
            ``GatewaySender.DEFAULT_DISPATCHER_THREADS``; at least 1, as Geode refuses
            fewer). Order then holds per key, thread or bucket, not across the whole queue;
            1 keeps one total order. A parallel sender has one partition per bucket.
    """

    order_policy: OrderPolicy = OrderPolicy.KEY
    dispatcher_threads: int = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _parallel_refuses_thread_order(self) -> GatewaySenderSpec:
        if self.parallel and self.order_policy is OrderPolicy.THREAD:
            raise ValueError(
                "a parallel gateway sender can not be created with order_policy THREAD "
                "(Geode GatewaySenderFactoryImpl)"
            )
        return self


class ServerSettings(
    KafkaConnectionSettings, RedisConnectionSettings, ObservabilitySettings, TracingSettings
):
    """Configuration of a cache server (file table ``[server]``).

    The Kafka connection (``kafka_*``, with SASL and TLS) is documented on
    :class:`regionbus.schemas.settings.KafkaConnectionSettings`, the Redis one (``redis_*``, with
    ACL
    user and TLS) on :class:`RedisConnectionSettings`.

    Attributes:
        namespace: Site namespace; every topic and Redis key of the site starts with it.
        member_id: This server's member id (EventIDs of server-side ops, logs).
        total_buckets: Buckets = partitions of ``{ns}.ops`` and ``{ns}.events``.
            Default 16 (Geode's ``total-num-buckets`` is 113; ours are Kafka partitions).
        regions: Regions this server defines at start (created in Redis if missing).
        region_expiration: ``{region: RegionExpiration}`` entry time-to-live and idle timeout
            with their actions (Geode ``ExpirationAttributes``; default none: entries never
            expire). Every server of a site must carry the same; see
            :mod:`regionbus.broker.expiration_attributes` for the rules.
        expiration_interval_ms: How often a bucket primary looks for entries due to expire
            (an entry expires at most about this long after its time).
        expiration_batch_size: Most entries a server expires per look, over all its buckets;
            the rest wait for the next look, so the loop's other duties keep their pace.
        max_value_size_bytes: Largest accepted value; larger puts are refused with
            ``ValueTooLargeError``. Default 512 KiB, below Kafka's default 1 MiB message.
        message_sync_interval_s: How often the server flushes its producer and commits its
            ``{ns}.ops`` offsets (Geode ``message-sync-interval``, default 1 s).
        maximum_time_between_pings_ms: A client silent for longer is considered gone: a
            non-durable one is dropped, a durable one disconnected (its timeout starts);
            also the window in which a durable id's connection counts as live
            (Geode ``maximum-time-between-pings``, 60000 ms).
        enable_subscription_conflation: Default of clients' subscription conflation: of
            several queued updates of a key a client reads together, it gets only the last
            (Geode ``enable-subscription-conflation``, default False); a client may override
            it (``ClientSettings.subscription_conflation``).
        maximum_message_count: Capacity of a client's subscription queue in unacked events
            (Geode ``maximum-message-count``, default 230000). A full queue holds new
            operations back for up to ``maximum_queue_full_wait_ms`` rather than dropping
            events. Each server counts the events it queued.
        maximum_queue_full_wait_ms: Longest hold for one full queue; then its queue may
            grow (or the client is disconnected, see below).
        disconnect_unresponsive_clients: Disconnect a client whose queue stayed full for
            the whole wait (its interest is dropped everywhere) instead of letting the
            queue grow.
        subscription_redundancy: Secondaries per bucket, ready to take over when its
            primary fails (Geode ``subscription-redundancy``, default 0).
        loader_threads: Worker threads running the regions' ``CacheLoader``s on a get's
            miss, never on the server's loop (`regionbus.broker.loading`).
        loader_timeout_ms: Longest a load may take, from the miss to its create applied;
            then the gets waiting on it fail with ``CacheLoaderError`` (Geode's
            ``search-timeout``, default 300 s, bounds a load the same way; 10 s here, as
            a get's ``read_timeout_ms`` is).
        max_pending_loads: Most loads running or waiting at once on a server; a miss
            beyond it is answered ``CacheLoaderError`` at once.
        lease_ttl_ms: Time to live of a bucket primary's lease and of a server's
            membership; a failed primary's buckets move after at most this long plus one
            election tick (a quarter of it). Geode's ``member-timeout`` is 5000 ms.
        durable_client_reaper_interval_s: How often the reaper (one server at a time)
            looks for durable clients away longer than their ``durable_client_timeout_s``.
        max_durable_client_timeout_s: Longest ``durable_client_timeout_s`` a durable client
            may ask for, in seconds (default 7 days); a connect asking more is refused with
            ``ConfigurationError``. The shared queue topics keep records this long plus an
            hour, so a client that asks for a longer timeout cannot make every topic of its
            principal grow for it (Geode's ``durable-client-timeout`` is an int of seconds:
            bounded too).
        poll_batch_size: Most messages taken from Kafka per poll.
        poll_timeout_ms: Longest wait of one poll when idle.
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the server's consumer. Apache
            Kafka answers a fetch as soon as data arrives, so this bounds idle polls, not
            latency; but a partition assigned while a fetch waits (a bucket taken over,
            a recreated topic) joins the next fetch only, so servers keep 100 ms: few
            processes, and takeovers wait at most that long.
        linger_ms: librdkafka ``linger.ms`` of the producer of subscription-queue records,
            replies, dead letters and gateway queues: 0 ms, since a client waits for what
            it sends; the server hands it a turn's records at once, one message per client
            and queue, so lingering would add no message to a request.
        events_linger_ms: librdkafka ``linger.ms`` of the producer of ``{ns}.events``, a
            producer of its own (`regionbus.broker.deliveries`): its readers (Spark, tools)
            wait for no record, and librdkafka sends one request per partition, so the
            events of each bucket's partition go in one request per 5 ms at most instead
            of one per turn.
        reply_chunk_bytes: Largest bulk-load / keys reply message before it is split.
        query_max_execution_time_ms: Most wall-clock time a bucket's primary spends on its
            part of one one-shot query (reading the bucket's entries, evaluating, ordering)
            before it stops and answers ``QueryExecutionTimeoutError`` (on a worker
            thread: it holds a query thread, not the server's loop). Geode's
            ``gemfire.Cache.MAX_QUERY_EXECUTION_TIME`` is unlimited by default (-1); here
            500 ms, some 25,000 JSON entries of a few fields on one core.
        query_max_rows_per_bucket: Most rows a bucket's primary answers for one one-shot
            query (after its LIMIT); a query that would answer more fails with
            ``QueryRowLimitError``, so one query's answer is at most ``total_buckets``
            times this many entries. Default 10,000 (Geode bounds none).
        query_threads: Worker threads running one-shot queries, never on the server's
            loop (`regionbus.broker.queries`).
        max_pending_queries: Most one-shot queries (bucket parts) running or waiting at
            once on a server; one more is refused with ``RequestLimitError``.
        functions: ``["module:Class", ...]`` server-side ``Function``s to instantiate at
            start and register by their ``id`` (Geode ``FunctionService.registerFunction``);
            every server of a namespace should register the same ones.
        function_threads: Worker threads running function executions, never on the
            server's loop (`regionbus.broker.functions`). 2, as ``query_threads``: threads
            of a function busy computing share the interpreter with the loop, which four
            of them slowed past a second; raise it for functions that mostly wait (on a
            database, a service).
        function_timeout_ms: Longest one execution (one bucket's, or one server's) may run
            before the caller is answered ``FunctionTimeoutError`` and its results dropped
            (its thread runs on until the function returns; its region calls fail from
            then on). Geode bounds none on the server, only the client's wait
            (``gemfire.CLIENT_FUNCTION_TIMEOUT``, the pool's read timeout); here 5 s, under
            a client's 10 s ``read_timeout_ms``, so the caller hears the timeout.
        max_pending_functions: Most executions running or waiting at once on a server;
            one more is refused with ``RequestLimitError``.
        function_max_result_bytes: Most bytes of results one execution sends; a
            ``send_result`` beyond fails the function with ``FunctionError``. The results
            are answered in messages of ``reply_chunk_bytes``. Default 16 MiB (Geode
            bounds none).
        initial_results_budget_ms: Most time of one turn of the loop spent sending initial
            results (interest registrations' bulk loads, CQs' initial results); the rest
            wait for the next turn (:mod:`regionbus.broker.initial_results`). 20 ms, as
            long as the loop holds back what it produced: others' operations wait about
            that long behind a storm of registrations.
        initial_results_share: Most of the loop's wall-clock time, over time, spent
            sending initial results (0 < share <= 1; 1: only the budget per turn bounds
            them). 0.5: a storm of registrations then makes the producer, Kafka and the
            registering clients work at most half as hard as the loop could drive them,
            which on shared cores is what others' operations wait behind (measured with
            ``bench.fleet``'s storms; bench/RESULTS.md).
        initial_results_running_max: Most initial-result loads (one bucket of one
            registration each) read at once, in turn; others wait, first in first out, a
            client running at most half of them. 8: a registration of every key is 16
            loads, so two clients' registrations progress while the first is answered.
        initial_results_page_entries: About how many entries one page of a load reads
            (Redis ``HSCAN`` ``COUNT``). 1,000 entries read in a few ms, a small fraction
            of a turn's budget.
        connects_admitted_per_s: Connects admitted per second; the rest wait for a later
            turn (:class:`regionbus.broker.pacing.ConnectAdmission`). 1,000: a storm of
            1,000 connects at once is answered within about 1 s, half the bound the
            project set (2 s); a connect costs the loop about 0.3 ms, so admitting them
            takes at most about a third of it.
        connect_burst: Connects admitted at once after a quiet time. 20: about what one
            turn of the loop handles within its 20 ms.
        connects_queued_max: Most connects waiting for admission; past it the oldest are
            dropped unanswered and their clients resend them later.
        client_topic_partitions: Partitions of the shared client topics ``{ns}.queues`` and
            ``{ns}.replies`` when a server creates them (an existing topic keeps its
            count). A client reads the partition its id hashes to: about 1/16 of the
            records of its principal's clients by default, from a pair of topics that
            serves any number of clients.
        plugins: ``{region: ["module:Class", ...]}`` server-side ``CacheListener`` /
            ``CacheWriter`` classes to instantiate at start.
        distributed_system_id: This site's id in a multi-site system, 1-255 (Geode
            ``distributed-system-id``); 0 = not multi-site (no gateway versions stored).
        gateway_senders: ``{sender id: GatewaySenderSpec}`` queues ``{ns}.gw.<sender id>``.
        async_event_queues: ``{queue id: GatewayQueueSpec}`` queues ``{ns}.aeq.<queue id>``.
        region_gateway_senders: ``{region: [sender id, ...]}`` senders attached to a region.
        region_async_event_queues: ``{region: [queue id, ...]}`` queues attached to a region.
        security_enabled: Authenticate every request (signed by the client, see
            ``regionbus.schemas.signing``) and authorize it by the principal's permissions. Off by
            default for local development; on in the secured compose stack.
        allowed_skew_ms: Largest difference between a request's signing time and this
            server's clock, milliseconds (default 300000, Kerberos' 5 minutes). It must
            also cover how long a request may wait in ``{ns}.ops`` before a server reads
            it: older requests are refused as possible replays.
        principal_cache_ttl_ms: How long a server trusts principals and permissions it
            read from Redis; ``regionbus user remove`` takes effect within this long.
        metrics_client_labels: Export the per-client series
            ``regionbus_events_routed_total{client}`` and
            ``regionbus_subscription_queue_depth_events{client}`` (one series per client
            and metric: 10,000 clients make 10,000 series per server). Off by default:
            the servers export totals and the deepest queues
            (``metrics_top_clients``), and ``regionbus status`` shows every client's lag.
        metrics_top_clients: How many of the deepest subscription queues this server
            exports as ``regionbus_subscription_queue_depth_top_events{client}`` (those
            with events not acked; 0: none). Default 10: enough to name the clients an
            alert on the total points at, few enough to be free for any fleet.
        events_framing: How this server frames what it appends to ``{ns}.events``:
            ``regionbus`` (``0xB1`` and a type byte, the default) or ``avro-single-object``
            (Apache Avro's single-object encoding, which standard Avro decoders read;
            docs/wire-format.md). Every regionbus reader takes both.
        tracing_sample_ratio: Share of the changes arriving without a trace context
            (from writers that do not trace) for which this server starts a trace, 0 to
            1. Default 0: a server continues the traces its writers started (those always,
            whatever this ratio) and starts none; each one it starts costs a span at the
            server and at every subscriber of the change.

    ``metrics_port`` and ``log_format`` are documented on :class:`ObservabilitySettings`,
    ``tracing_enabled`` on :class:`regionbus.schemas.tracing.TracingSettings`.
    """

    model_config = SettingsConfigDict(env_prefix="REGIONBUS_")
    config_section: ClassVar[str] = "server"

    namespace: str = "regionbus"
    member_id: str = Field(default_factory=lambda: generated_member_id("server"))
    total_buckets: int = Field(default=DEFAULT_TOTAL_BUCKETS, ge=1, le=1024)
    regions: list[str] = Field(default_factory=list)
    region_expiration: dict[str, RegionExpiration] = Field(default_factory=dict)
    expiration_interval_ms: int = Field(default=250, ge=10)
    expiration_batch_size: int = Field(default=500, ge=1)
    max_value_size_bytes: int = Field(default=512 * 1024, ge=1)
    message_sync_interval_s: float = Field(default=1.0, gt=0)
    maximum_time_between_pings_ms: int = Field(default=60_000, ge=100)
    enable_subscription_conflation: bool = False
    maximum_message_count: int = Field(default=230_000, ge=1)
    maximum_queue_full_wait_ms: int = Field(default=5_000, ge=0)
    disconnect_unresponsive_clients: bool = False
    subscription_redundancy: int = Field(default=0, ge=0)
    loader_threads: int = Field(default=4, ge=1, le=256)
    loader_timeout_ms: int = Field(default=10_000, ge=1)
    max_pending_loads: int = Field(default=1_000, ge=1)
    lease_ttl_ms: int = Field(default=5_000, ge=200)
    durable_client_reaper_interval_s: float = Field(default=5.0, gt=0)
    max_durable_client_timeout_s: int = Field(default=DEFAULT_MAX_DURABLE_CLIENT_TIMEOUT_S, ge=1)
    poll_batch_size: int = Field(default=1000, ge=1)
    poll_timeout_ms: int = Field(default=100, ge=1)
    fetch_wait_max_ms: int = Field(default=100, ge=1)
    linger_ms: int = Field(default=0, ge=0)
    events_linger_ms: int = Field(default=5, ge=0)
    reply_chunk_bytes: int = Field(default=256 * 1024, ge=1024)
    query_max_execution_time_ms: int = Field(default=500, ge=1)
    query_max_rows_per_bucket: int = Field(default=10_000, ge=1)
    query_threads: int = Field(default=2, ge=1, le=64)
    max_pending_queries: int = Field(default=256, ge=1)
    functions: list[str] = Field(default_factory=list)
    function_threads: int = Field(default=2, ge=1, le=256)
    function_timeout_ms: int = Field(default=5_000, ge=1)
    max_pending_functions: int = Field(default=256, ge=1)
    function_max_result_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    initial_results_budget_ms: int = Field(default=20, ge=1)
    initial_results_share: float = Field(default=0.5, gt=0, le=1)
    initial_results_running_max: int = Field(default=8, ge=1)
    initial_results_page_entries: int = Field(default=1000, ge=1)
    connects_admitted_per_s: float = Field(default=1000.0, gt=0)
    connect_burst: int = Field(default=20, ge=1)
    connects_queued_max: int = Field(default=10_000, ge=1)
    client_topic_partitions: int = Field(default=DEFAULT_CLIENT_PARTITIONS, ge=1, le=1024)
    plugins: dict[str, list[str]] = Field(default_factory=dict)
    distributed_system_id: int = Field(default=0, ge=0, le=255)
    gateway_senders: dict[str, GatewaySenderSpec] = Field(default_factory=dict)
    async_event_queues: dict[str, GatewayQueueSpec] = Field(default_factory=dict)
    region_gateway_senders: dict[str, list[str]] = Field(default_factory=dict)
    region_async_event_queues: dict[str, list[str]] = Field(default_factory=dict)
    # --- security: authentication, authorization, signed requests ---
    security_enabled: bool = False
    allowed_skew_ms: int = Field(default=300_000, ge=1_000)
    principal_cache_ttl_ms: int = Field(default=2_000, ge=0)
    # --- metrics: per-client detail ---
    metrics_client_labels: bool = False
    metrics_top_clients: int = Field(default=10, ge=0, le=1000)
    events_framing: Framing = "regionbus"
    tracing_sample_ratio: float = Field(default=0.0, ge=0.0, le=1.0)

    @field_validator("gateway_senders", mode="before")
    @classmethod
    def _plain_queue_specs_are_sender_specs(cls, value: object) -> object:
        # A plain GatewayQueueSpec names a sender with Geode's default ordering.
        if isinstance(value, dict):
            return {
                k: v.model_dump() if type(v) is GatewayQueueSpec else v for k, v in value.items()
            }
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace_is_topic_legal(cls, value: str) -> str:
        return check_name("namespace", value, max_len=120)

    @field_validator("regions")
    @classmethod
    def _region_names_ok(cls, value: list[str]) -> list[str]:
        for name in value:
            try:
                check_region_name(name)
            except RegionBusError as exc:
                raise ConfigurationError(f"regions: {exc}") from None
        return value

    @field_validator("region_expiration")
    @classmethod
    def _expiring_region_names_ok(
        cls, value: dict[str, RegionExpiration]
    ) -> dict[str, RegionExpiration]:
        cls._region_names_ok(list(value))
        return value

    @field_validator("member_id")
    @classmethod
    def _member_id_is_topic_legal(cls, value: str) -> str:
        return check_name("member id", value)

    @model_validator(mode="after")
    def _attached_queues_exist(self) -> ServerSettings:
        for kind, defined, attached in (
            ("gateway sender", self.gateway_senders, self.region_gateway_senders),
            ("async event queue", self.async_event_queues, self.region_async_event_queues),
        ):
            for queue_id in defined:
                check_name(f"{kind} id", queue_id)
            for region, ids in attached.items():
                missing = sorted(set(ids) - set(defined))
                if missing:
                    raise ValueError(f"region {region!r} names undefined {kind}s {missing}")
        if self.gateway_senders and not self.distributed_system_id:
            raise ValueError("gateway senders need distributed_system_id (1-255)")
        return self
