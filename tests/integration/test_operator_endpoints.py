"""What an operator reaches first, against real Kafka and Redis: ``regionbus status``
answers within its bound (about a second), naming what it could not read, and the metrics
endpoint listens on loopback unless told otherwise and answers ``/metrics`` only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from regionbus.broker.config import GatewayQueueSpec, ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.broker.status import STATUS_TIMEOUT_S, cluster_status
from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings
from regionbus.runtime.redis_connect import connect_redis

_REGIONBUS = Path(sys.executable).with_name("regionbus")
_CLIENTS = 12
_SLACK_S = 1.5
"""What a loaded machine may add to the status bound (process start-up excluded)."""


@pytest.fixture
def populated(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> Iterator[ServerSettings]:
    """A server with a gateway sender's and an async event queue's topics, and clients
    whose queues status reads: subscribers still connected and durable ones gone away."""
    settings = ServerSettings(
        namespace=namespace,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        redis_url=redis_url,
        regions=["r"],
        fetch_wait_max_ms=100,
        poll_timeout_ms=20,
        message_sync_interval_s=0.2,
        distributed_system_id=1,
        gateway_senders={"to-b": GatewayQueueSpec(remote_distributed_system_id=2)},
        async_event_queues={"audit": GatewayQueueSpec()},
        region_gateway_senders={"r": ["to-b"]},
        region_async_event_queues={"r": ["audit"]},
    )
    with ExitStack() as stack:
        server = CacheServer(settings)
        server.start()
        stack.callback(server.stop)
        for number in range(_CLIENTS):
            durable = number % 3 == 0
            client = ClientCache(
                ClientSettings(
                    namespace=namespace,
                    kafka_bootstrap_servers=kafka_bootstrap_servers,
                    fetch_wait_max_ms=100,
                    **({"durable_client_id": f"desk-{number}"} if durable else {}),
                )
            )
            region = client.create_region("r")
            region.register_interest(ALL_KEYS, durable=durable)
            region.put(f"k{number}", number)
            if durable:
                client.ready_for_events()
                client.close(keep_alive=True)
            else:
                stack.callback(client.close)
        yield settings


def _run_status(settings: ServerSettings, kafka: str) -> tuple[float, dict[str, Any]]:
    env = {
        **os.environ,
        "REGIONBUS_NAMESPACE": settings.namespace,
        "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS": kafka,
        "REGIONBUS_REDIS_URL": settings.redis_url,
    }
    started = time.monotonic()
    done = subprocess.run(
        [str(_REGIONBUS), "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    return elapsed, json.loads(done.stdout)


def test_status_of_a_populated_namespace_answers_within_its_bound(
    populated: ServerSettings, kafka_bootstrap_servers: str
) -> None:
    client = connect_redis(populated)
    started = time.monotonic()
    status = cluster_status(
        client, populated.namespace, populated.total_buckets, populated.librdkafka()
    )
    elapsed_s = time.monotonic() - started
    print(f"cluster_status: {elapsed_s:.2f} s")
    assert elapsed_s < STATUS_TIMEOUT_S + _SLACK_S
    assert len(status.queues) == _CLIENTS
    # Every figure is either read or named as unread: nothing is silently missing.
    for queue in status.queues:
        assert queue.depth_messages is not None or any(
            queue.client_id in note for note in status.unreadable
        )
    assert [q.queue_id for q in status.gateway_senders] == ["to-b"]
    assert [q.queue_id for q in status.async_event_queues] == ["audit"]

    # Given time, every figure is read: the batched requests answer what the slow ones did.
    patient = cluster_status(
        client, populated.namespace, populated.total_buckets, populated.librdkafka(), 60.0
    )
    assert patient.unreadable == ()
    assert all(q.depth_messages is not None for q in patient.queues)
    away = [q for q in patient.queues if q.durable]
    assert away and all(q.depth_messages for q in away), "puts queued for the away desks"
    assert all(q.backlog_events is not None for q in patient.gateway_senders)
    assert all(q.backlog_events is not None for q in patient.async_event_queues)

    cli_elapsed_s, document = _run_status(populated, kafka_bootstrap_servers)
    print(f"regionbus status --json: {cli_elapsed_s:.2f} s")
    assert len(document["queues"]) == _CLIENTS
    # Process start-up (imports) comes on top of the bound.
    assert cli_elapsed_s < STATUS_TIMEOUT_S + 2 * _SLACK_S + 2.0


def test_status_with_kafka_unreachable_answers_at_once_and_says_what_it_could_not_read(
    populated: ServerSettings,
) -> None:
    client = connect_redis(populated)
    dead_kafka = {**populated.librdkafka(), "bootstrap.servers": "127.0.0.1:1"}
    started = time.monotonic()
    status = cluster_status(client, populated.namespace, populated.total_buckets, dead_kafka)
    elapsed_s = time.monotonic() - started
    print(f"cluster_status, Kafka unreachable: {elapsed_s:.2f} s")
    assert elapsed_s < STATUS_TIMEOUT_S + _SLACK_S
    assert len(status.queues) == _CLIENTS
    assert all(q.depth_messages is None for q in status.queues)
    assert status.unreadable, "the figures Kafka did not give must be named"
    assert any("kafka" in note.lower() for note in status.unreadable)


# --- the metrics endpoint ----------------------------------------------------------------


def test_the_metrics_endpoint_listens_on_loopback_and_answers_only_metrics(
    server_settings: ServerSettings,
) -> None:
    server = CacheServer(server_settings.model_copy(update={"metrics_port": 0}))
    server.start()
    try:
        assert server.metrics_address == "127.0.0.1"
        url = server.metrics_url
        assert url is not None
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert b"regionbus_bucket_primaries" in response.read()
        base = url.removesuffix("/metrics")
        for path in ("/", "/other", "/metrics/x", "/metricsfoo", "/favicon.ico"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=10)
            assert refused.value.code == 404, path
    finally:
        server.stop()


def test_metrics_host_chooses_the_listening_address(server_settings: ServerSettings) -> None:
    assert ServerSettings().metrics_host == "127.0.0.1"
    server = CacheServer(
        server_settings.model_copy(update={"metrics_port": 0, "metrics_host": "0.0.0.0"})
    )
    server.start()
    try:
        assert server.metrics_address == "0.0.0.0"
    finally:
        server.stop()
