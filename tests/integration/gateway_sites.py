"""Sites for the gateway and async event queue tests: a cache server per namespace, with
gateway senders, receivers and async event queues started on threads."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from support import wait_until

from regionbus.broker.config import GatewayQueueSpec, GatewaySenderSpec, ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ClientCache, ClientSettings
from regionbus.gateways.filters import GatewayConflictResolver
from regionbus.gateways.receiver import GatewayReceiver, GatewayReceiverSettings
from regionbus.gateways.sender import GatewaySender
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.schemas.messages import Entry

TEST_FETCH_WAIT_MAX_MS = 100


class Site:
    """One site (namespace, Kafka, Redis, distributed system id) of a test.

    Args:
        stack: Where started workers register their stop.
        namespace: The site's namespace.
        kafka: Bootstrap servers of the site's Kafka.
        redis_url: The site's Redis.
        site_id: The site's distributed system id.
    """

    def __init__(
        self, stack: ExitStack, namespace: str, kafka: str, redis_url: str, site_id: int
    ) -> None:
        self.stack = stack
        self.namespace = namespace
        self.kafka = kafka
        self.redis_url = redis_url
        self.site_id = site_id
        self.server: CacheServer | None = None
        self.senders: dict[str, GatewaySender] = {}
        self.receiver: GatewayReceiver | None = None

    def start_server(
        self,
        senders: dict[str, int] | None = None,
        *,
        regions: tuple[str, ...] = ("r",),
        parallel: bool = False,
        async_event_queues: tuple[str, ...] = (),
        sender_filters: list[str] | None = None,
        sender_options: dict[str, Any] | None = None,
        settings_overrides: dict[str, Any] | None = None,
        **server_kwargs: Any,
    ) -> CacheServer:
        """Start the site's cache server; ``senders`` maps sender id -> remote site id, each
        attached to every region, as are the async event queues. ``sender_options`` are
        more ``GatewaySenderSpec`` fields (e.g. ``dispatcher_threads``);
        ``settings_overrides`` more ``ServerSettings`` fields (e.g. a Kafka login)."""
        senders = senders or {}
        settings = ServerSettings(
            namespace=self.namespace,
            kafka_bootstrap_servers=self.kafka,
            redis_url=self.redis_url,
            regions=list(regions),
            fetch_wait_max_ms=TEST_FETCH_WAIT_MAX_MS,
            poll_timeout_ms=20,
            message_sync_interval_s=0.2,
            distributed_system_id=self.site_id,
            gateway_senders={
                s: GatewaySenderSpec(
                    parallel=parallel,
                    remote_distributed_system_id=remote,
                    event_filters=sender_filters or [],
                    **(sender_options or {}),
                )
                for s, remote in senders.items()
            },
            async_event_queues={q: GatewayQueueSpec(parallel=parallel) for q in async_event_queues},
            region_gateway_senders={r: list(senders) for r in regions} if senders else {},
            region_async_event_queues={r: list(async_event_queues) for r in regions}
            if async_event_queues
            else {},
        )
        if settings_overrides:
            settings = ServerSettings(**{**settings.model_dump(), **settings_overrides})
        server = CacheServer(settings, **server_kwargs)
        server.start()
        self.stack.callback(server.stop)
        self.server = server
        return server

    def start_sender(
        self, sender_id: str, remote: Site, *, wait_primary: bool = True, **overrides: Any
    ) -> GatewaySender:
        """Start a gateway sender of this site to ``remote`` and wait until it is primary
        (``wait_primary`` False: a standby is expected, it is not waited for)."""
        settings: dict[str, Any] = {
            "sender_id": sender_id,
            "namespace": self.namespace,
            "kafka_bootstrap_servers": self.kafka,
            "redis_url": self.redis_url,
            "distributed_system_id": self.site_id,
            "remote_distributed_system_id": remote.site_id,
            "remote_namespace": remote.namespace,
            "remote_kafka_bootstrap_servers": remote.kafka,
            "batch_time_interval_ms": 200,
            "ack_timeout_ms": 15_000,
            "lease_ttl_ms": 3000,
        }
        filters = overrides.pop("event_filters_instances", None)
        settings.update(overrides)
        sender = GatewaySender(GatewaySenderSettings(**settings), event_filters=filters)
        sender.start()
        self.stack.callback(sender.stop)
        if wait_primary:
            assert sender.wait_primary(30), f"sender {sender_id} never became primary"
        self.senders[sender_id] = sender
        return sender

    def start_receiver(
        self, resolver: GatewayConflictResolver | None = None, **overrides: Any
    ) -> GatewayReceiver:
        """Start this site's gateway receiver (id ``receiver``)."""
        settings: dict[str, Any] = {
            "namespace": self.namespace,
            "kafka_bootstrap_servers": self.kafka,
            "redis_url": self.redis_url,
            "distributed_system_id": self.site_id,
            "fetch_wait_max_ms": TEST_FETCH_WAIT_MAX_MS,
        }
        settings.update(overrides)
        receiver = GatewayReceiver(GatewayReceiverSettings(**settings), conflict_resolver=resolver)
        receiver.start()
        self.stack.callback(receiver.stop)
        self.receiver = receiver
        return receiver

    def client(self, **overrides: Any) -> ClientCache:
        """A client cache of this site, closed at the end of the test."""
        settings: dict[str, Any] = {
            "namespace": self.namespace,
            "kafka_bootstrap_servers": self.kafka,
            "fetch_wait_max_ms": TEST_FETCH_WAIT_MAX_MS,
            "read_timeout_ms": 30_000,
        }
        settings.update(overrides)
        cache = ClientCache(ClientSettings(**settings))
        self.stack.callback(cache.close)
        return cache

    def entries(self, region: str = "r") -> dict[str, Entry]:
        """The site's region, read from Redis."""
        assert self.server is not None
        return self.server.store.entries(region)

    def values(self, region: str = "r") -> dict[str, bytes | None]:
        """``{key: value bytes}`` of the site's region."""
        return {k: e.value for k, e in self.entries(region).items()}

    def wait_for(
        self, key: str, value: bytes | None, region: str = "r", timeout_s: float = 60
    ) -> None:
        """Wait until the site's entry ``key`` holds ``value`` (None: until it is absent)."""

        def holds() -> bool:
            entry = self.entries(region).get(key)
            if value is None:
                return entry is None
            return entry is not None and entry.value == value

        wait_until(holds, timeout_s, f"{key}={value!r} on site {self.site_id}")


def site_namespaces(namespace: str, count: int) -> Iterator[str]:
    """``count`` distinct namespaces derived from a test's namespace."""
    for index in range(count):
        yield f"{namespace}.s{index + 1}{secrets.token_hex(2)}"


@contextmanager
def running_sites(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str, count: int
) -> Iterator[list[Site]]:
    """``count`` sites (ids 1..count, namespaces from ``namespace``) on one Kafka and Redis;
    every server and worker they started is stopped on exit."""
    with ExitStack() as stack:
        yield [
            Site(stack, ns, kafka_bootstrap_servers, redis_url, site_id)
            for site_id, ns in enumerate(site_namespaces(namespace, count), start=1)
        ]


def replay_flights(region: Any, days: int = 1, window: int = 2000) -> int:
    """Replay the first ``days`` days of the flights timeline on a client region
    (``regionbus.demo.flights_data``), pipelined; returns the number of operations."""
    from regionbus.demo.flights_data import Stage, load_flights, timeline

    pending: list[Any] = []
    count = 0
    for op in timeline(load_flights(days=days)):
        if op.stage is Stage.DESTROY:
            pending.append(region.destroy_async(op.key))
        else:
            pending.append(region.put_async(op.key, op.value))
        count += 1
        if len(pending) >= window:
            for future in pending:
                future.result(60)
            pending.clear()
    for future in pending:
        future.result(60)
    return count


def start_async_event_queue(site: Site, queue_id: str, listener: Any, **overrides: Any) -> Any:
    """Start an async event queue dispatcher of ``site`` and wait until it is primary."""
    from regionbus.gateways.async_event_queue import AsyncEventQueue, AsyncEventQueueSettings

    settings: dict[str, Any] = {
        "queue_id": queue_id,
        "namespace": site.namespace,
        "kafka_bootstrap_servers": site.kafka,
        "redis_url": site.redis_url,
        "lease_ttl_ms": 3000,
    }
    settings.update(overrides)
    queue = AsyncEventQueue(AsyncEventQueueSettings(**settings), listener)
    queue.start()
    site.stack.callback(queue.stop)
    assert queue.wait_primary(30), f"async event queue {queue_id} never became primary"
    return queue
