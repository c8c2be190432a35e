"""Client acks, client close and expiry, server restart, and the command-line entry points."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from confluent_kafka import TopicPartition
from readme_commands import REPOSITORY, fresh_default_stack_dir, readme_stack_command
from support import Recorder, Sentinel, consumer_groups, routed, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings
from regionbus.schemas.codec import split_batch
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer
from regionbus.schemas.naming import Topics


def _committed(kafka: str, group: str, queue: tuple[str, int]) -> int:
    consumer = kafka_consumer({"bootstrap.servers": kafka, "group.id": group})
    try:
        return consumer.committed([TopicPartition(*queue)], timeout=10)[0].offset
    finally:
        consumer.close()


def test_the_client_acks_processed_events_by_committing_its_queue_offset(
    cache_server, client_factory, kafka_bootstrap_servers, namespace
) -> None:  # type: ignore[no-untyped-def]
    reader_cache: ClientCache = client_factory(subscription_ack_interval_ms=100)
    recorder = Recorder()
    reader_cache.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    writer = client_factory().create_region("r")
    writer.put_all({f"k{i}": i for i in range(10)})
    wait_until(lambda: len(recorder.snapshot()) == 10, what="10 events")
    group = Topics(namespace).client_group(reader_cache.client_id)
    address = reader_cache.pool.address
    queue = address.queue_topic, address.queue_partition
    end = _offset_after_events(kafka_bootstrap_servers, queue, address.key, 10)
    wait_until(lambda: _committed(kafka_bootstrap_servers, group, queue) == end, what="ack")


def _offset_after_events(kafka: str, queue: tuple[str, int], key: bytes, events: int) -> int:
    """The offset just after the record that completes ``events`` events for the client
    whose records are keyed ``key`` (the server batches a poll's events for one client into
    one Kafka record)."""
    consumer = kafka_consumer({"bootstrap.servers": kafka, "group.id": "probe"})
    consumer.assign([TopicPartition(*queue, 0)])
    seen, deadline = 0, time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(10, 0.5):
                if message.error() is None and message.key() == key:
                    seen += len(split_batch(message.value()))
                    if seen >= events:
                        return (message.offset() or 0) + 1
    finally:
        consumer.close()
    raise AssertionError(f"only {seen} events in {queue}")


def test_closing_a_client_drops_its_interest_and_its_acks(
    cache_server, client_factory, kafka_bootstrap_servers, namespace
) -> None:  # type: ignore[no-untyped-def]
    leaving: ClientCache = client_factory()
    leaving.create_region("r").register_interest(ALL_KEYS)
    group = Topics(namespace).client_group(leaving.client_id)
    wait_until(lambda: group in consumer_groups(kafka_bootstrap_servers), what="its first ack")
    assert routed(cache_server.registry, "r", "k", 0) == {leaving.client_id: True}
    leaving.close()
    wait_until(lambda: routed(cache_server.registry, "r", "k", 0) == {}, what="interest dropped")
    wait_until(
        lambda: (
            not cache_server.store.redis.exists(cache_server.store.keys.interest(leaving.client_id))
        ),
        what="interest removed from Redis",
    )
    assert group not in consumer_groups(kafka_bootstrap_servers)
    names = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers}).list_topics(timeout=10)
    assert not [t for t in names.topics if t.startswith(namespace) and leaving.client_id in t]


def test_a_silent_client_is_dropped_after_maximum_time_between_pings(
    server_settings: ServerSettings, client_factory
) -> None:  # type: ignore[no-untyped-def]
    settings = server_settings.model_copy(update={"maximum_time_between_pings_ms": 1000})
    with CacheServer(settings) as server:
        silent: ClientCache = client_factory(ping_interval_ms=60_000)
        silent.create_region("r").register_interest(ALL_KEYS)
        pinging: ClientCache = client_factory(ping_interval_ms=200)
        pinging.create_region("r").register_interest(ALL_KEYS)
        assert set(routed(server.registry, "r", "k", 0)) == {silent.client_id, pinging.client_id}
        wait_until(
            lambda: set(routed(server.registry, "r", "k", 0)) == {pinging.client_id},
            timeout_s=10,
            what="the silent client to be dropped",
        )
        time.sleep(1.5)
        assert set(routed(server.registry, "r", "k", 0)) == {pinging.client_id}


def test_a_restarted_server_keeps_routing_by_the_registrations_in_redis(
    server_settings: ServerSettings, client_factory
) -> None:  # type: ignore[no-untyped-def]
    first = CacheServer(server_settings)
    first.start()
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest(["a", "sentinel"])
    writer = client_factory().create_region("r")
    writer.put("a", 1)
    first.stop()
    second = CacheServer(server_settings.model_copy(update={"member_id": "server-second"}))
    second.start()
    try:
        writer.put("a", 2)
        assert Sentinel(writer, recorder).fence() == [("create", "a", 1), ("update", "a", 2)]
    finally:
        second.stop()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL"):
        env.pop(name, None)
        env.pop(f"REGIONBUS_{name}", None)
    return env


def test_python_m_broker_serve_runs_a_server_until_sigterm(
    kafka_bootstrap_servers, redis_url, namespace
) -> None:  # type: ignore[no-untyped-def]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "regionbus",
            "serve",
            "--namespace",
            namespace,
            "--kafka",
            kafka_bootstrap_servers,
            "--redis",
            redis_url,
            "--region",
            "r",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    try:
        cache = ClientCache(
            ClientSettings(namespace=namespace, kafka_bootstrap_servers=kafka_bootstrap_servers)
        )
        region = cache.create_region("r")
        region.put("via-cli", "ok")
        assert region.get("via-cli") == "ok"
        cache.close()
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    assert server.returncode == 0, output
    assert f"serving namespace {namespace}" in output


def _run_stack() -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Start the README's ``regionbus stack`` command line as written, from the repository's
    root, and read the three ``export`` lines it prints."""
    stack = subprocess.Popen(
        readme_stack_command(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
        cwd=REPOSITORY,
    )
    exports: dict[str, str] = {}
    assert stack.stdout is not None
    while len(exports) < 3:
        line = stack.stdout.readline()
        assert line, "regionbus stack exited early"
        name, _, value = line.strip().removeprefix("export ").partition("=")
        exports[name] = value
    return stack, exports


def _stop_stack(stack: subprocess.Popen[str]) -> list[str]:
    children = subprocess.run(
        ["pgrep", "-P", str(stack.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    stack.send_signal(signal.SIGINT)
    stack.communicate(timeout=60)
    return children


def test_regionbus_stack_runs_kafka_redis_and_a_server_and_a_restart_keeps_the_data() -> None:
    """``regionbus stack`` as the README gives it runs Apache Kafka and redis-server as its
    two children and stops them on SIGINT; started again the same way (so on the same
    default data dir) it comes back on the same ports, and a durable client's queue, its
    committed offset and the region's entries are still there."""
    with fresh_default_stack_dir():
        _stack_restart_keeps_the_data()


def _stack_restart_keeps_the_data() -> None:
    stack, exports = _run_stack()
    try:
        settings = ClientSettings(
            namespace=exports["REGIONBUS_NAMESPACE"],
            kafka_bootstrap_servers=exports["REGIONBUS_KAFKA_BOOTSTRAP_SERVERS"],
            durable_client_id="desk",
        )
        durable = ClientCache(settings)
        durable.create_region(_README_REGION).register_interest(ALL_KEYS, durable=True)
        durable.ready_for_events()
        durable.close(keep_alive=True)
        writer_cache = ClientCache(settings.model_copy(update={"durable_client_id": None}))
        writer = writer_cache.create_region(_README_REGION)
        writer.put("k", [1, 2])
        writer.put("missed", "while away")
        assert writer.get("k") == [1, 2]
        writer_cache.close()
    finally:
        children = _stop_stack(stack)
    assert stack.returncode == 0
    assert len(children) == 2  # Apache Kafka (java) and redis-server
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)

    again, exports_again = _run_stack()
    try:
        assert exports_again == exports
        recorder = Recorder()
        durable = ClientCache(settings)
        region = durable.create_region(_README_REGION, listeners=[recorder])
        region.register_interest(ALL_KEYS, durable=True)
        durable.ready_for_events()
        live = ("region_live", _README_REGION, None)
        wait_until(lambda: live in recorder.snapshot(), 60, "the marker")
        before_marker = recorder.snapshot()[: recorder.snapshot().index(live)]
        assert ("missed", "while away") in [(key, value) for _, key, value in before_marker]
        assert region.get("k") == [1, 2]
        durable.close(keep_alive=False)
    finally:
        _stop_stack(again)
    assert again.returncode == 0


_README_REGION = "flights"
"""The region the README's ``regionbus stack --region flights`` defines."""


def _is_zombie(pid: str) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] == "Z"
