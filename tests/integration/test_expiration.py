"""docs/behaviour.md §1, §6, §7: entry expiration (Geode ``ExpirationAttributes``) on real time with
short timeouts, run by the bucket primary; its events reach interested clients as ordinary
destroys or invalidates, never a gateway sender's queue, and an async event queue only with
``forward_expiration_destroy``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from importlib import resources
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from gateway_sites import Site, start_async_event_queue
from support import send_raw_batch, wait_until

from regionbus.broker.config import GatewayQueueSpec, ServerSettings
from regionbus.broker.expiration import EXPIRY_MEMBER, EXPIRY_THREAD
from regionbus.broker.expiration_attributes import (
    ExpirationAction,
    ExpirationAttributes,
    RegionExpiration,
)
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, RegionShortcut
from regionbus.gateways.async_event_queue import AsyncEvent, AsyncEventListener
from regionbus.schemas.callbacks import CacheListener, EntryEvent
from regionbus.schemas.codec import decode, split_batch
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.messages import Event, EventKind, Operation, OperationKind
from regionbus.schemas.naming import Topics, bucket_of, bucket_role


def _expiring(
    ttl_s: int = 0,
    ttl_action: ExpirationAction = ExpirationAction.INVALIDATE,
    idle_s: int = 0,
    idle_action: ExpirationAction = ExpirationAction.INVALIDATE,
) -> dict[str, Any]:
    """``ServerSettings`` fields giving region ``r`` these expiration attributes."""
    return {
        "region_expiration": {
            "r": RegionExpiration(
                entry_time_to_live=ExpirationAttributes(timeout_s=ttl_s, action=ttl_action),
                entry_idle_timeout=ExpirationAttributes(timeout_s=idle_s, action=idle_action),
            )
        },
        "expiration_interval_ms": 50,
    }


class _Events(CacheListener):
    """Records every entry event a client's listener hears."""

    def __init__(self) -> None:
        self.events: list[EntryEvent] = []
        self.lock = threading.Lock()

    def _add(self, event: EntryEvent) -> None:
        with self.lock:
            self.events.append(event)

    after_create = after_update = after_invalidate = after_destroy = _add

    def of(self, key: str) -> list[tuple[EventKind, bool]]:
        with self.lock:
            return [(e.kind, e.is_expiration) for e in self.events if e.key == key]


def _server(server_settings: ServerSettings, **fields: Any) -> Iterator[CacheServer]:
    server = CacheServer(ServerSettings(**{**server_settings.model_dump(), **fields}))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ttl_destroy_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    yield from _server(server_settings, **_expiring(ttl_s=1, ttl_action=ExpirationAction.DESTROY))


@pytest.fixture
def ttl_invalidate_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    yield from _server(server_settings, **_expiring(ttl_s=1))


@pytest.fixture
def idle_destroy_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    yield from _server(server_settings, **_expiring(idle_s=2, idle_action=ExpirationAction.DESTROY))


def test_an_entry_past_its_time_to_live_is_destroyed_and_an_interested_client_hears_a_destroy(
    ttl_destroy_server: CacheServer, client_factory: Any
) -> None:
    writer = client_factory().create_region("r")
    heard = _Events()
    reader = client_factory().create_region("r", listeners=[heard])
    reader.register_interest(ALL_KEYS)
    writer.put("k", "v")
    wait_until(lambda: (EventKind.DESTROY, True) in heard.of("k"), 15, "the expiration destroy")

    assert heard.of("k") == [(EventKind.CREATE, False), (EventKind.DESTROY, True)]
    assert not reader.contains_key("k")
    assert "k" not in ttl_destroy_server.store.entries("r")
    assert ttl_destroy_server.stats.entries_expired == 1


def test_invalidate_expiration_keeps_the_key_without_its_value_and_is_heard_once(
    ttl_invalidate_server: CacheServer, client_factory: Any
) -> None:
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    heard = _Events()
    reader = client_factory().create_region("r", listeners=[heard])
    reader.register_interest(ALL_KEYS)
    writer.put("k", "v")
    wait_until(lambda: (EventKind.INVALIDATE, True) in heard.of("k"), 15, "the expiration")

    entry = ttl_invalidate_server.store.entries("r")["k"]
    assert entry.value is None  # the key stays, invalid
    assert reader.contains_key("k") and not reader.contains_value_for_key("k")
    assert writer.get("k") is None
    # An invalid entry has nothing left to expire: a later write schedules it again.
    writer.put("sentinel", 1)
    wait_until(lambda: (EventKind.INVALIDATE, True) in heard.of("sentinel"), 15, "sentinel")
    assert heard.of("k") == [(EventKind.CREATE, False), (EventKind.INVALIDATE, True)]


def test_gets_push_an_idle_timeout_back_and_the_entry_expires_once_they_stop(
    idle_destroy_server: CacheServer, client_factory: Any
) -> None:
    # PROXY: every get goes to the server (a CACHING_PROXY would answer from its own copy).
    region = client_factory().create_region("r", RegionShortcut.PROXY)
    region.put("read", "v")
    region.put("unread", "v")
    store = idle_destroy_server.store

    def unread_gone_while_read_is_read() -> bool:
        assert region.get("read") == "v", "a read entry expired"
        return "unread" not in store.entries("r")

    wait_until(unread_gone_while_read_is_read, 20, "the unread entry to expire")
    assert "read" in store.entries("r")
    wait_until(lambda: "read" not in store.entries("r"), 15, "the read entry to expire")


def _same_bucket_key(server: CacheServer, key: str) -> str:
    """Another key of region ``r`` in ``key``'s bucket: its change is applied after anything
    produced to the bucket before it."""
    total = server.settings.total_buckets
    bucket = bucket_of("r", key, total)
    return next(f"s{i}" for i in range(10_000) if bucket_of("r", f"s{i}", total) == bucket)


def _expire_op(server: CacheServer, key: str, at_ms: int, sequence: int) -> Operation:
    bucket = bucket_of("r", key, server.settings.total_buckets)
    return Operation(
        request_id=0,
        client_id=server.settings.member_id,
        kind=OperationKind.EXPIRE_DESTROY,
        region="r",
        timestamp_ms=at_ms,
        event_id=EventID(EXPIRY_MEMBER, EXPIRY_THREAD, sequence, bucket),
        key=key,
    )


@pytest.fixture
def long_ttl_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    yield from _server(server_settings, **_expiring(ttl_s=60, ttl_action=ExpirationAction.DESTROY))


def test_an_expiration_no_primary_claimed_changes_nothing(
    long_ttl_server: CacheServer, client_factory: Any, kafka_bootstrap_servers: str
) -> None:
    # Security is off: the op names the server as its producer and the entry's true expiry
    # time; only the claim a primary keeps in Redis is missing. The one without an EventID
    # is dead-lettered.
    server = long_ttl_server
    writer = client_factory().create_region("r")
    heard = _Events()
    reader = client_factory().create_region("r", listeners=[heard])
    reader.register_interest(ALL_KEYS)
    writer.put("k", "v")
    bucket = bucket_of("r", "k", server.settings.total_buckets)
    at_ms = server.store.redis.zscore(server.store.keys.region_expiry("r", bucket), "k")
    assert at_ms is not None
    forged = _expire_op(server, "k", int(at_ms), 1)
    send_raw_batch(
        kafka_bootstrap_servers,
        server.settings.namespace,
        [forged, forged._replace(event_id=None)],
        bucket,
    )
    sentinel = _same_bucket_key(server, "k")
    writer.put(sentinel, "s")
    wait_until(lambda: heard.of(sentinel), 15, "the sentinel")

    assert heard.of("k") == [(EventKind.CREATE, False)]
    assert server.store.entries("r")["k"].value is not None
    assert server.stats.entries_expired == 0
    assert server.stats.dead_letters == 1


@pytest.fixture
def rarely_looking_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    fields = _expiring(ttl_s=1, ttl_action=ExpirationAction.DESTROY)
    yield from _server(server_settings, **{**fields, "expiration_interval_ms": 600_000})


def test_a_claimed_expiration_of_an_entry_updated_since_changes_nothing(
    rarely_looking_server: CacheServer, client_factory: Any, kafka_bootstrap_servers: str
) -> None:
    # The test plays the primary's first half (claim_expiry.lua, with the bucket's epoch)
    # while the server, looking once in ten minutes, does not.
    server = rarely_looking_server
    store, keys = server.store, server.store.keys
    writer = client_factory().create_region("r")
    heard = _Events()
    reader = client_factory().create_region("r", listeners=[heard])
    reader.register_interest(ALL_KEYS)
    writer.put("k", "v1")
    bucket = bucket_of("r", "k", server.settings.total_buckets)
    at_ms = int(store.redis.zscore(keys.region_expiry("r", bucket), "k") or 0)
    wait_until(lambda: time.time() * 1000 > at_ms, 5, "the entry to be due")
    claim = store.redis.register_script(
        resources.files("regionbus.broker").joinpath("lua", "claim_expiry.lua").read_text()
    )
    claimed = claim(
        keys=[
            keys.epoch(bucket_role(bucket)),
            keys.expiry_sequence(bucket),
            keys.region_expiry_claims("r", bucket),
            keys.region_expiry("r", bucket),
        ],
        args=[store.epoch(bucket), server.settings.member_id, "k", at_ms],
    )
    assert claimed == [1]
    writer.put("k", "v2")  # after the claim, before the expiration is applied
    send_raw_batch(
        kafka_bootstrap_servers,
        server.settings.namespace,
        [_expire_op(server, "k", at_ms, 1)],
        bucket,
    )
    sentinel = _same_bucket_key(server, "k")
    writer.put(sentinel, "s")
    wait_until(lambda: heard.of(sentinel), 15, "the sentinel")

    assert heard.of("k") == [(EventKind.CREATE, False), (EventKind.UPDATE, False)]
    assert store.entries("r")["k"].value is not None
    assert server.stats.entries_expired == 0
    assert not store.redis.hlen(keys.region_expiry_claims("r", bucket))


@pytest.fixture
def site(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[Site]:
    with ExitStack() as stack:
        yield Site(stack, namespace, kafka_bootstrap_servers, redis_url, 1)


def _queued(site: Site, topic: str, until_key: str) -> list[Event]:
    """The events of a one-partition queue topic, read from its start up to ``until_key``."""
    consumer = kafka_consumer(
        {"bootstrap.servers": site.kafka, "group.id": f"{topic}.test", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    events: list[Event] = []
    try:

        def read_to_the_sentinel() -> bool:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                for raw in split_batch(message.value()):
                    decoded = decode(raw)
                    assert isinstance(decoded, Event)
                    events.append(decoded)
            return any(e.key == until_key for e in events)

        wait_until(read_to_the_sentinel, 30, f"{until_key} in {topic}")
    finally:
        consumer.close()
    return events


def test_a_gateway_sender_queue_gets_no_expiration_event(site: Site) -> None:
    server = site.start_server(
        {"to-site-2": 2},
        # One dispatcher: one queue partition, which _queued reads whole.
        sender_options={"dispatcher_threads": 1},
        settings_overrides=_expiring(ttl_s=1, ttl_action=ExpirationAction.DESTROY),
    )
    region = site.client().create_region("r")
    region.put("k", "v")
    wait_until(lambda: server.stats.entries_expired == 1, 15, "the expiration")
    region.put("sentinel", "s")

    events = _queued(site, Topics(site.namespace).gateway("to-site-2"), "sentinel")
    assert [(e.kind, e.key) for e in events] == [
        (EventKind.CREATE, "k"),
        (EventKind.CREATE, "sentinel"),
    ]


class _Recording(AsyncEventListener):
    def __init__(self) -> None:
        self.events: list[AsyncEvent] = []
        self.lock = threading.Lock()

    def process_events(self, events: list[AsyncEvent]) -> bool:
        with self.lock:
            self.events.extend(events)
        return True

    def seen(self) -> list[tuple[EventKind, str, bool]]:
        with self.lock:
            return [(e.kind, e.key, e.is_expiration) for e in self.events]


def test_an_async_event_queue_gets_expiration_destroys_only_with_forward_expiration_destroy(
    site: Site,
) -> None:
    queues = {
        "plain": GatewayQueueSpec(),
        "forwarding": GatewayQueueSpec(forward_expiration_destroy=True),
    }
    server = site.start_server(
        async_event_queues=tuple(queues),
        settings_overrides={
            **_expiring(ttl_s=1, ttl_action=ExpirationAction.DESTROY),
            "async_event_queues": queues,
        },
    )
    plain, forwarding = _Recording(), _Recording()
    start_async_event_queue(site, "plain", plain)
    start_async_event_queue(site, "forwarding", forwarding)
    region = site.client().create_region("r")
    region.put("k", "v")
    wait_until(lambda: server.stats.entries_expired == 1, 15, "the expiration")
    region.put("sentinel", "s")
    for listener in (plain, forwarding):
        wait_until(
            lambda r=listener: (EventKind.CREATE, "sentinel", False) in r.seen(), 30, "sentinel"
        )

    assert plain.seen() == [(EventKind.CREATE, "k", False), (EventKind.CREATE, "sentinel", False)]
    assert forwarding.seen() == [
        (EventKind.CREATE, "k", False),
        (EventKind.DESTROY, "k", True),
        (EventKind.CREATE, "sentinel", False),
    ]
