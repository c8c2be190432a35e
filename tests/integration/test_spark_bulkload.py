"""Bulk load of a region from a Spark DataFrame, through the cache servers."""

from __future__ import annotations

import json
import threading
from typing import Any

import redis
from support import wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.permissions import ResourcePermission
from regionbus.broker.principals import PrincipalStore
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS
from regionbus.schemas.callbacks import CacheListener, EntryEvent
from regionbus.schemas.naming import RedisKeys, bucket_of
from regionbus.spark.bulkload import bulk_load

_ENTRIES = 100_000
_BUCKETS = 16


class _Counter(CacheListener):
    """Counts creates and updates per key (thread-safe, cheap enough for 100k events)."""

    def __init__(self) -> None:
        self.creates: dict[str, Any] = {}
        self.updates = 0
        self._lock = threading.Lock()

    def after_create(self, event: EntryEvent) -> None:
        with self._lock:
            self.creates[event.key] = event.new_value

    def after_update(self, event: EntryEvent) -> None:
        with self._lock:
            self.updates += 1


def _entries(spark: Any, count: int) -> Any:
    return spark.range(count).selectExpr(
        "concat('item-', id) AS key",
        "named_struct('n', id, 'label', concat('label ', id), 'even', id % 2 = 0) AS value",
    )


def _redis_entries(client: redis.Redis, namespace: str) -> int:
    keys = RedisKeys(namespace)
    return sum(int(client.hlen(keys.region_meta("r", b))) for b in range(_BUCKETS))


def test_bulk_load_of_100k_entries_lands_in_redis_and_reaches_an_interested_client(
    spark_session: Any,
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
    redis_client: redis.Redis,
) -> None:
    counter = _Counter()
    watcher = client_factory().create_region("r", listeners=[counter])
    watcher.register_interest(ALL_KEYS)

    report = bulk_load(
        spark_session,
        _entries(spark_session, _ENTRIES).repartition(4),
        "r",
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        namespace=namespace,
    )

    assert report.ok, report
    assert (report.entries, report.applied, report.duplicates) == (_ENTRIES, _ENTRIES, 0)
    assert _redis_entries(redis_client, namespace) == _ENTRIES
    for i in (0, 1, 54_321, _ENTRIES - 1):
        key = f"item-{i}"
        stored = redis_client.hget(
            RedisKeys(namespace).region_values("r", bucket_of("r", key, _BUCKETS)), key
        )
        assert stored is not None
        assert json.loads(stored) == {"n": i, "label": f"label {i}", "even": i % 2 == 0}
    wait_until(lambda: len(counter.creates) == _ENTRIES, timeout_s=120, what="100k create events")
    assert counter.updates == 0
    assert counter.creates["item-77"] == {"n": 77, "label": "label 77", "even": False}
    assert cache_server.stats.operations_applied == _ENTRIES


def test_loading_again_with_the_same_load_id_is_recognised_as_duplicates(
    spark_session: Any,
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
    redis_client: redis.Redis,
) -> None:
    counter = _Counter()
    watcher = client_factory().create_region("r", listeners=[counter])
    watcher.register_interest(ALL_KEYS)
    entries = _entries(spark_session, 2_000).repartition(2)
    options: dict[str, Any] = {
        "kafka_bootstrap_servers": kafka_bootstrap_servers,
        "namespace": namespace,
        "load_id": "spark-load-retry",
    }

    first = bulk_load(spark_session, entries, "r", **options)
    # A whole re-run of the job stands for a retried task: same members, same sequence ids.
    second = bulk_load(spark_session, entries, "r", **options)

    assert (first.applied, first.duplicates) == (2_000, 0)
    assert (second.applied, second.duplicates, second.failed) == (0, 2_000, 0)
    assert _redis_entries(redis_client, namespace) == 2_000
    wait_until(lambda: len(counter.creates) == 2_000, timeout_s=60, what="2,000 creates")
    # The servers re-emit a duplicate's event (possible duplicate); the client's message
    # tracking drops it, so no listener sees an entry twice.
    assert counter.updates == 0


def test_bulk_load_into_a_missing_region_reports_every_refusal(
    spark_session: Any, cache_server: CacheServer, kafka_bootstrap_servers: str, namespace: str
) -> None:
    report = bulk_load(
        spark_session,
        _entries(spark_session, 50),
        "no-such-region",
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        namespace=namespace,
    )

    assert not report.ok
    assert (report.applied, report.failed) == (0, 50)
    assert report.failures[0].startswith("RegionNotFoundError")


def test_a_signed_bulk_load_is_applied_by_secured_servers_and_an_unsigned_one_refused(
    spark_session: Any,
    server_settings: ServerSettings,
    redis_client: redis.Redis,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    PrincipalStore(redis_client, namespace).add(
        "loader", "loader-secret", [ResourcePermission.parse("DATA:WRITE:r")]
    )
    server = CacheServer(server_settings.model_copy(update={"security_enabled": True}))
    server.start()
    try:
        options: dict[str, Any] = {
            "kafka_bootstrap_servers": kafka_bootstrap_servers,
            "namespace": namespace,
        }
        unsigned = bulk_load(spark_session, _entries(spark_session, 40), "r", **options)
        signed = bulk_load(
            spark_session,
            _entries(spark_session, 40),
            "r",
            security_principal="loader",
            security_secret="loader-secret",
            **options,
        )
    finally:
        server.stop()

    assert (unsigned.applied, unsigned.failed) == (0, 40)
    assert unsigned.failures[0].startswith("AuthenticationError")
    assert signed.ok, signed
    assert (signed.applied, signed.failed) == (40, 0)
    assert _redis_entries(redis_client, namespace) == 40
