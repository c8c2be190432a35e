"""Apache Kafka going away and coming back (the single-node embedded broker, restarted on its
work dir): durable clients find their queues again, and servers and clients ride out the
outage by themselves, each logging it once.

Each test runs its own broker (not the session's, which every other test shares) and a
cache server on a thread of this process, with the session's Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, CacheListener, ClientCache, ClientSettings, EntryEvent
from regionbus.clients.cache import CLIENT_RECONNECTED
from regionbus.clients.region import Region
from regionbus.devstack import KafkaNode
from regionbus.schemas.callbacks import RegionEvent
from regionbus.schemas.errors import ServerTimeoutError

_FETCH_WAIT_MAX_MS = 20
_REFUSED = "Connection refused"
# How late past read_timeout_ms an operation may fail on a loaded machine: a hang would be
# unbounded (a put during an outage used to wait for good).
_TIMEOUT_SLACK_S = 5.0


@pytest.fixture
def kafka_node(tmp_path: Path) -> Iterator[KafkaNode]:
    """A single-node Kafka of this test only, with its log in ``tmp_path`` (so it can be
    stopped or killed and started again with every topic and offset)."""
    node = KafkaNode(work_dir=tmp_path / "kafka", heap_max_mb=512)
    node.start()
    try:
        yield node
    finally:
        node.kill()


@pytest.fixture
def server(kafka_node: KafkaNode, namespace: str, redis_url: str) -> Iterator[CacheServer]:
    """A cache server of the test's namespace on ``kafka_node``, region ``r``."""
    settings = ServerSettings(
        namespace=namespace,
        kafka_bootstrap_servers=kafka_node.bootstrap_servers,
        redis_url=redis_url,
        regions=["r"],
        fetch_wait_max_ms=_FETCH_WAIT_MAX_MS,
        poll_timeout_ms=20,
        message_sync_interval_s=0.2,
    )
    with CacheServer(settings) as running:
        yield running


@pytest.fixture
def clients(kafka_node: KafkaNode, namespace: str) -> Iterator[Callable[..., ClientCache]]:
    """Makes client caches on ``kafka_node`` (keyword args override settings); closes the
    ones still open at the end."""
    made: list[ClientCache] = []

    def make(**overrides: Any) -> ClientCache:
        settings: dict[str, Any] = {
            "namespace": namespace,
            "kafka_bootstrap_servers": kafka_node.bootstrap_servers,
            "fetch_wait_max_ms": _FETCH_WAIT_MAX_MS,
            "read_timeout_ms": 15_000,
            "ping_interval_ms": 500,
        }
        cache = ClientCache(ClientSettings(**{**settings, **overrides}))
        made.append(cache)
        return cache

    yield make
    for cache in made:
        if not cache.closed:
            cache.close()


class CacheTap(CacheListener):
    """Records each entry event with what the region's cache held for its key when the
    listener ran (the cache is applied before listeners), and ``after_region_live``."""

    def __init__(self) -> None:
        self.region: Region | None = None
        self.calls: list[tuple[str, str, Any, Any]] = []
        self._lock = threading.Lock()

    def _add(self, kind: str, event: EntryEvent) -> None:
        assert self.region is not None
        cached = self.region.local_entries().get(event.key)
        with self._lock:
            self.calls.append((kind, event.key, event.new_value, cached))

    def after_create(self, event: EntryEvent) -> None:
        self._add("create", event)

    def after_update(self, event: EntryEvent) -> None:
        self._add("update", event)

    def after_region_live(self, event: RegionEvent) -> None:
        with self._lock:
            self.calls.append(("live", event.region, None, None))

    def snapshot(self) -> list[tuple[str, str, Any, Any]]:
        with self._lock:
            return list(self.calls)


def _tapped_region(cache: ClientCache) -> tuple[Region, CacheTap]:
    tap = CacheTap()
    region = cache.create_region("r", listeners=[tap])
    tap.region = region
    return region, tap


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_durable_client_away_during_a_broker_restart_reconnects_and_gets_every_missed_event_before_the_marker(  # noqa: E501
    how: str,
    kafka_node: KafkaNode,
    server: CacheServer,
    clients: Callable[..., ClientCache],
) -> None:
    durable = clients(durable_client_id="desk")
    durable.create_region("r").register_interest(ALL_KEYS, durable=True)
    durable.ready_for_events()
    durable.close(keep_alive=True)

    writer = clients().create_region("r")
    for i in range(20):
        writer.put(f"k{i}", i)
    getattr(kafka_node, how)()  # SIGTERM (controlled shutdown) or SIGKILL
    kafka_node.start()
    for i in range(20, 40):
        writer.put(f"k{i}", i)

    again = clients(durable_client_id="desk")
    assert again.client_state == CLIENT_RECONNECTED
    assert again.pending_event_count == 40
    region, tap = _tapped_region(again)
    again.ready_for_events()
    wait_until(lambda: ("live", "r", None, None) in tap.snapshot(), what="the marker")

    replayed = tap.snapshot()[:-1]
    assert [(kind, key, value) for kind, key, value, _ in replayed] == [
        ("create", f"k{i}", i) for i in range(40)
    ], "not every missed event, once and in order, before the marker"
    assert all(cached is None for *_, cached in replayed), "a replayed event changed the cache"
    assert region.local_entries() == {}

    writer.put("k0", 100)
    wait_until(lambda: tap.snapshot()[-1][:3] == ("update", "k0", 100), what="a live event")
    assert tap.snapshot()[-1][3] == 100, "after the marker events are applied to the cache"
    assert server.alive
    assert server.stats.buckets_lost == 0, "the restart cost the server its buckets"


def _outage_lines(records: list[logging.LogRecord], level: int, text: str) -> dict[str, int]:
    """``{who: count}`` of the records of ``regionbus.kafka`` at ``level`` containing
    ``text`` (who: the part of the message after ``for`` up to the next parenthesis or
    "after")."""
    counts: dict[str, int] = {}
    for record in records:
        message = record.getMessage()
        if record.name != "regionbus.kafka" or record.levelno != level or text not in message:
            continue
        who = message.split(" for ", 1)[1].split(" (", 1)[0].split(" after ", 1)[0]
        counts[who] = counts.get(who, 0) + 1
    return counts


def test_during_a_broker_outage_operations_time_out_with_typed_errors_everything_resumes_and_each_process_logs_it_once(  # noqa: E501
    kafka_node: KafkaNode,
    server: CacheServer,
    clients: Callable[..., ClientCache],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    read_timeout_ms = 2_000
    listener_cache = clients()
    listened, tap = _tapped_region(listener_cache)
    listened.register_interest(ALL_KEYS)
    writer_cache = clients(read_timeout_ms=read_timeout_ms)
    writer = writer_cache.create_region("r")
    writer.put("before", 1)
    wait_until(lambda: ("create", "before", 1, 1) in tap.snapshot(), what="the first event")
    who = {
        f"cache server {server.settings.member_id}",
        f"client {listener_cache.client_id}",
        f"client {writer_cache.client_id}",
    }

    with caplog.at_level(logging.INFO):
        kafka_node.stop()
        wait_until(
            lambda: set(_outage_lines(caplog.records, logging.WARNING, "Kafka unavailable")) == who,
            timeout_s=30,
            what="the server and both clients to notice the outage",
        )

        began = time.monotonic()
        with pytest.raises(ServerTimeoutError):
            writer.put("during", 2)
        assert time.monotonic() - began < read_timeout_ms / 1000 + _TIMEOUT_SLACK_S, "put hung"
        began = time.monotonic()
        pipelined: Future[None] = writer.put_async("during-async", 3)
        with pytest.raises(ServerTimeoutError):
            pipelined.result(timeout=read_timeout_ms / 1000 + _TIMEOUT_SLACK_S)
        waited_s = time.monotonic() - began
        assert waited_s < read_timeout_ms / 1000 + _TIMEOUT_SLACK_S, "put_async hung"
        with pytest.raises(ServerTimeoutError):
            writer.get("never-put")

        kafka_node.start()
        wait_until(
            lambda: (
                set(_outage_lines(caplog.records, logging.INFO, "Kafka available again")) == who
            ),
            timeout_s=30,
            what="the server and both clients to notice Kafka is back",
        )

        # Operations resume by themselves, but the server may still be catching up when the
        # clients see Kafka again: the writer's short read timeout is for the outage, so a
        # put after it may time out once on a slow machine and is then made again.
        def put_after() -> bool:
            try:
                writer.put("after", 4)
            except ServerTimeoutError:
                return False
            return True

        wait_until(put_after, timeout_s=60, what="a put made after the outage to be answered")
        wait_until(
            lambda: any(e[1:3] == ("after", 4) for e in tap.snapshot()),
            timeout_s=30,
            what="a put made after the outage to reach the listener",
        )

    assert server.alive, "the server stopped during the outage"
    assert _outage_lines(caplog.records, logging.WARNING, "Kafka unavailable") == dict.fromkeys(
        who, 1
    ), "not one warning per process for the outage"
    assert _outage_lines(caplog.records, logging.INFO, "Kafka available again") == dict.fromkeys(
        who, 1
    ), "not one line per process for the end of the outage"
    # librdkafka writes one line per reconnect attempt, to stderr unless given a logger. Only
    # lines naming this test's broker count: stderr is the process's, and another test's
    # client may still be closing against a broker that test has stopped.
    ours = kafka_node.bootstrap_servers

    def refused_here(line: str) -> bool:
        return _REFUSED in line and ours in line

    refused = [r.getMessage() for r in caplog.records if refused_here(r.getMessage())]
    refused += [line for line in capfd.readouterr().err.splitlines() if refused_here(line)]
    # The first failed connection to the broker is one WARNING naming it, for the process.
    named = [line for line in refused if line.startswith(f"Kafka broker {ours} unreachable")]
    assert len(named) == 1, "not one warning naming the unreachable broker:\n" + "\n".join(named)
    refused = [line for line in refused if line not in named]
    assert not refused, "reconnect attempts were logged:\n" + "\n".join(refused[:10])
    assert server.kafka_outages == 1
    assert server.stats.buckets_lost == 0, "the outage cost the server its buckets"
