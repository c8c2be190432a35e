"""Bounded requests: what one call may ask is refused over its documented limit before
anything is sent (`regionbus.schemas.limits`), and a bulk call's verdict matches what
happened to each entry: an entry reported failed was not applied, whatever the servers do
later; an entry without a reply in time is of unknown outcome."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients.interest import keys_interest, regex_interest
from regionbus.clients.server_proxy import ServerRegionProxy
from regionbus.schemas.callbacks import CacheListener, EntryEvent
from regionbus.schemas.errors import BulkOperationError, RequestLimitError, ValueTooLargeError
from regionbus.schemas.limits import (
    MAX_BULK_ENTRIES,
    MAX_KEYS_PER_REGISTRATION,
    MAX_REGEXES_PER_CLIENT,
)
from regionbus.schemas.messages import OperationKind
from regionbus.schemas.naming import RedisKeys, bucket_of

pytestmark = pytest.mark.abuse


def test_requests_over_the_limits_are_refused_before_anything_is_sent(
    cache_server: CacheServer, client_factory: Any
) -> None:
    cache = client_factory()
    region = cache.create_region("r")
    replies_before = cache_server.stats.replies
    with pytest.raises(RequestLimitError, match="keys per registration") as keys:
        region.register_interest([f"k{i}" for i in range(MAX_KEYS_PER_REGISTRATION + 1)])
    assert (keys.value.limit, keys.value.requested) == (
        MAX_KEYS_PER_REGISTRATION,
        MAX_KEYS_PER_REGISTRATION + 1,
    )
    with pytest.raises(RequestLimitError, match="entries per put_all"):
        region.put_all({f"k{i}": i for i in range(MAX_BULK_ENTRIES + 1)})
    with pytest.raises(RequestLimitError, match="entries per remove_all"):
        region.remove_all(f"k{i}" for i in range(MAX_BULK_ENTRIES + 1))
    with pytest.raises(ValueTooLargeError, match="max_value_size_bytes"):
        region.put("big", "x" * (cache_server.settings.max_value_size_bytes + 1))
    assert cache_server.stats.replies == replies_before, "a refused request was answered"
    assert cache_server.stats.errors == 0 and cache_server.stats.dead_letters == 0
    assert region.get("k0") is None and region.get("big") is None


def test_a_client_holds_at_most_the_regex_limit_and_a_server_refuses_one_more(
    cache_server: CacheServer, client_factory: Any
) -> None:
    cache = client_factory()
    region = cache.create_region("r")
    for i in range(MAX_REGEXES_PER_CLIENT):
        region.register_interest_regex(f"p{i}-.*")
    replies_before = cache_server.stats.replies
    with pytest.raises(RequestLimitError, match="regexes per client"):
        region.register_interest_regex("one-more-.*")
    assert cache_server.stats.replies == replies_before, "the refused one was sent"
    assert cache_server.registry.table.regexes_of(cache.client_id) == MAX_REGEXES_PER_CLIENT
    # A request that skips the region's check is refused by the servers.
    remote = ServerRegionProxy(cache, "r", "json")
    with pytest.raises(RequestLimitError, match="regexes per client"):
        remote.interest(OperationKind.REGISTER_INTEREST, regex_interest("one-more-.*"))
    assert cache_server.registry.table.regexes_of(cache.client_id) == MAX_REGEXES_PER_CLIENT


def test_a_client_holds_at_most_the_key_limit_over_its_calls_and_a_server_refuses_more(
    server_settings: ServerSettings, client_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit of keys per call alone let three calls of 100,000 keys grow a server by
    160 MB. Here the limit is 1,000 (the real one, 250,000, takes minutes to reach)."""
    limit = 1_000
    monkeypatch.setattr("regionbus.clients.interest.MAX_KEYS_PER_CLIENT", limit)
    monkeypatch.setattr("regionbus.broker.handlers.MAX_KEYS_PER_CLIENT", limit)
    cache_server = CacheServer(server_settings.model_copy(update={"regions": ["r", "r2"]}))
    cache_server.start()
    try:
        _hold_keys_up_to(cache_server, client_factory(), limit)
    finally:
        cache_server.stop()


def _hold_keys_up_to(cache_server: CacheServer, cache: Any, limit: int) -> None:
    region = cache.create_region("r")
    other = cache.create_region("r2")
    region.register_interest([f"k{i}" for i in range(600)])
    region.register_interest([f"k{i}" for i in range(300, 700)])  # 100 new keys
    with pytest.raises(RequestLimitError, match="keys per client") as refused:
        other.register_interest([f"k{i}" for i in range(301)])
    assert (refused.value.limit, refused.value.requested) == (limit, 1_001)
    other.register_interest([f"k{i}" for i in range(300)])
    assert cache_server.registry.table.keys_of(cache.client_id) == limit
    # A request that skips the region's check is refused by the servers, bucket by bucket.
    remote = ServerRegionProxy(cache, "r2", "json")
    with pytest.raises(RequestLimitError, match="keys per client"):
        remote.interest(
            OperationKind.REGISTER_INTEREST, keys_interest([f"x{i}" for i in range(50)])
        )
    assert cache_server.registry.table.keys_of(cache.client_id) == limit


def test_a_bulk_verdict_reports_failed_only_what_was_not_applied(
    server_settings: ServerSettings,
    client_factory: Any,
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    """The server goes away in the middle of a put_all: the entries it answered are applied,
    those sent and unanswered are of unknown outcome (a new server applies them from
    ``{ns}.ops``), and those reported failed are never applied, even by it."""
    first = CacheServer(server_settings)
    first.start()
    writer = client_factory(read_timeout_ms=3_000, retry_interval_ms=60_000)
    region = writer.create_region("r")
    region.put("warm", 0)
    entries = {f"k{i}": i for i in range(20_000)}

    class StopAfterApplied(CacheListener):
        """Stops the server once the first 2,000 entries are answered."""

        count = 0

        def after_create(self, event: EntryEvent) -> None:
            self.count += 1
            if self.count == 2_000:
                first.stop()

    region.listeners.append(StopAfterApplied())
    with pytest.raises(BulkOperationError) as incomplete:
        region.put_all(entries)
    verdict = incomplete.value
    assert set(verdict.applied) | set(verdict.failures) | set(verdict.unknown) == set(entries)
    assert len(verdict.applied) >= 2_000 and verdict.failures and verdict.unknown
    second = CacheServer(server_settings.model_copy(update={"member_id": "server-second"}))
    second.start()
    try:
        region.put("after", 1)  # answered once the backlog before it is applied
        stored = _stored_keys(redis_client, namespace, set(entries))
    finally:
        second.stop()
    assert set(verdict.applied) <= stored, "an entry reported applied is missing"
    assert not set(verdict.failures) & stored, "an entry reported failed was applied"


def _stored_keys(client: redis.Redis, namespace: str, keys: set[str]) -> set[str]:
    redis_keys = RedisKeys(namespace)
    stored = set()
    for key in keys:
        field = client.hget(redis_keys.region_meta("r", bucket_of("r", key, 16)), key)
        if field is not None:
            stored.add(key)
    return stored
