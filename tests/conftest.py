"""Session-wide Kafka and Redis for the integration tests, and per-test namespaces.

The stack comes from ``REGIONBUS_KAFKA_BOOTSTRAP_SERVERS`` / ``REGIONBUS_REDIS_URL`` when
set (the older unprefixed names too, with a warning), else from
testcontainers when a Docker engine answers, else from an embedded Apache Kafka (KRaft)
and ``redis-server`` (see `devstack.LocalStack`). It starts only when a test asks for it,
so ``tests/unit`` runs without it. Each test's topics are deleted after it, so one broker
carries the whole session.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ClientCache, ClientSettings
from regionbus.devstack import EmbeddedRedisCluster, KafkaNode, LocalStack, ScramSecurity
from regionbus.runtime.redis_connect import connect_redis_url
from regionbus.schemas.kafka_clients import kafka_admin

_INTEGRATION_DIR = Path(__file__).parent / "integration"
_NAMESPACE_MAX_CHARS = 60
_NAMESPACE_SUFFIX_HEX_CHARS = 6
_NOT_TOPIC_CHARS = re.compile(r"[^A-Za-z0-9_-]+")

# Property tests (hypothesis): derandomized and database-less, so CI runs the same examples
# every time and writes nothing; no deadline, since the machines are shared and slow. Each
# test sets its own ``max_examples``; select another profile with HYPOTHESIS_PROFILE=...
settings.register_profile(
    "regionbus",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "regionbus"))


REDIS_MODES = ("single", "cluster")
"""What the region store runs on: one Redis, or a Redis Cluster of 3 masters and 3
replicas. Tests marked ``redis_modes`` run on both; every other test on one Redis."""

CLUSTER_ENV_VAR = "TEST_REDIS_CLUSTER_URL"
"""A running Redis Cluster for the ``cluster`` mode (any node's URL); unset starts one."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test marked ``redis_modes`` once per Redis mode, grouped by mode."""
    if metafunc.definition.get_closest_marker("redis_modes") is None:
        return
    if "redis_mode" in metafunc.fixturenames:
        metafunc.parametrize("redis_mode", REDIS_MODES, indirect=True, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under ``tests/integration`` with ``integration``."""
    for item in items:
        if item.path.is_relative_to(_INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def local_stack() -> Iterator[LocalStack]:
    """The one Kafka and Redis of the session, stopped (if started here) at its end."""
    with LocalStack() as stack:
        yield stack


@pytest.fixture(scope="session")
def kafka_bootstrap_servers(local_stack: LocalStack) -> str:
    """``host:port`` of the session's Kafka."""
    return local_stack.kafka_bootstrap_servers


@pytest.fixture(scope="session")
def redis_mode(request: pytest.FixtureRequest) -> str:
    """``"single"``, or ``"cluster"`` for a test marked ``redis_modes`` in its second run."""
    return str(getattr(request, "param", "single"))


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[str]:
    """URL of the session's Redis Cluster (3 masters, 3 replicas, append-only files on),
    started on first use, or the one named by ``TEST_REDIS_CLUSTER_URL``."""
    from_env = os.environ.get(CLUSTER_ENV_VAR, "").strip()
    if from_env:
        yield from_env
        return
    with EmbeddedRedisCluster() as cluster:
        yield cluster.url


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest, local_stack: LocalStack, redis_mode: str) -> str:
    """URL of the session's Redis: its one Redis, or any node of its Redis Cluster."""
    if redis_mode == "cluster":
        return str(request.getfixturevalue("redis_cluster"))
    return local_stack.redis_url


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace no other test uses: ``t.<test name>.<6 hex>``, at most 60 characters.

    Only characters legal in Kafka topic names, so ``{ns}.ops`` and the like are valid
    topics and Redis key prefixes. When the test used the session's Kafka, every topic
    whose name starts with the namespace is deleted afterwards.
    """
    room = _NAMESPACE_MAX_CHARS - len("t..") - _NAMESPACE_SUFFIX_HEX_CHARS
    name = _NOT_TOPIC_CHARS.sub("_", request.node.name)[:room].strip("_") or "test"
    suffix = secrets.token_hex(_NAMESPACE_SUFFIX_HEX_CHARS // 2)
    namespace = f"t.{name}.{suffix}"
    yield namespace
    if "kafka_bootstrap_servers" in request.fixturenames:
        _delete_topics(request.getfixturevalue("kafka_bootstrap_servers"), namespace)


def _delete_topics(bootstrap_servers: str, prefix: str) -> None:
    # Best effort: a test that left a broken broker behind must not fail the next one here.
    admin = kafka_admin({"bootstrap.servers": bootstrap_servers, "log_level": 3})
    try:
        names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
        if names:
            for future in admin.delete_topics(names, operation_timeout=30).values():
                future.exception(timeout=30)
    except Exception:
        return


@pytest.fixture(scope="module")
def scram_kafka() -> Iterator[KafkaNode]:
    """A Kafka of this test module alone: SASL/SCRAM-SHA-512 on its listener and ACLs
    enforced (no ACL, no access), super user ``admin``; the session's Kafka stays PLAINTEXT.
    """
    with KafkaNode(security=ScramSecurity("admin", "admin-scram-secret"), heap_max_mb=512) as node:
        yield node


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the session's Redis returning bytes (a ``RedisCluster`` in the cluster
    mode), closed after the test."""
    client = connect_redis_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        client.close()


# --- cache server and client fixtures ---

# Apache Kafka answers a fetch as soon as data arrives; the wait only bounds idle polls and
# the first fetch of a partition assigned while one waits. Measured on three test files:
# 100 ms runs as fast as 20 ms (wall 1.00x, CPU 1.02x) with a fifth of the idle fetches;
# 500 ms (the clients' default) ran 1.15x slower.
TEST_FETCH_WAIT_MAX_MS = 100


@pytest.fixture
def server_settings(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> ServerSettings:
    """Settings of a cache server of this test's namespace, defining region ``r``."""
    return ServerSettings(
        namespace=namespace,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        redis_url=redis_url,
        regions=["r"],
        fetch_wait_max_ms=TEST_FETCH_WAIT_MAX_MS,
        poll_timeout_ms=20,
        message_sync_interval_s=0.2,
    )


@pytest.fixture
def cache_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    """A running cache server (on a thread) of this test's namespace."""
    server = CacheServer(server_settings)
    server.start()
    try:
        yield server
    finally:
        server.stop()


ClientFactory = Callable[..., ClientCache]


@pytest.fixture
def client_factory(namespace: str, kafka_bootstrap_servers: str) -> Iterator[ClientFactory]:
    """Makes client caches of this test's namespace (keyword args override settings);
    closes every one at the end."""
    made: list[ClientCache] = []

    def make(**overrides: Any) -> ClientCache:
        settings: dict[str, Any] = {
            "namespace": namespace,
            "kafka_bootstrap_servers": kafka_bootstrap_servers,
            "fetch_wait_max_ms": TEST_FETCH_WAIT_MAX_MS,
            # 30 s, not the 15 s these tests used: once, on the shared machine, a 16-bucket
            # registration went unanswered for 15 s, and running its file again and again
            # did not repeat it. A lost reply still fails the test, later; a test of
            # timeouts sets its own.
            "read_timeout_ms": 30_000,
        }
        settings.update(overrides)
        cache = ClientCache(ClientSettings(**settings))
        made.append(cache)
        return cache

    try:
        yield make
    finally:
        for cache in made:
            cache.close()


# --- Spark ---


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """The one local SparkSession of the test session (``local[2]``, 2 shuffle partitions).

    pyspark is imported here, not at the top, so tests that do not use Spark never pay for it.
    """
    from regionbus.spark.session import local_session

    session = local_session("regionbus-tests")
    try:
        yield session
    finally:
        session.stop()
