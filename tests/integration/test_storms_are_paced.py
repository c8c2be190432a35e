"""Storms are paced: many clients asking at once slow no other client's operations.

A storm of clients (in a process of their own, as real clients are) registering interest
in every key of a big region with ``KEYS_VALUES`` all get their whole initial results,
while a victim putting on another region keeps its latency. A storm of plain connects is
answered, each within 2 s, while the victim keeps its latency, and a put sent right
after the storm does not wait for all of it.

The sizes fit CI on a small shared machine (40 clients on 20,000 entries, 1,000
connects); the issue's full sizes run with ``REGIONBUS_STORM_CLIENTS=200
REGIONBUS_STORM_ENTRIES=100000 REGIONBUS_STORM_TIMEOUT_S=3000``. The issue's victim
bounds (p99 100 ms, max 1 s) are for the full size on a quiet machine; on the shared
2-core machine (load average above 10 while other tests run) :data:`VICTIM_P99_MS`
leaves room for its noise, and ``REGIONBUS_STORM_VICTIM_P99_MS=100`` asks the issue's.
The victim puts one at a time, so a stall is one slow put: the max is the figure that
tells a held loop. Each test prints its figures.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from support import bystander_puts, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, RegionShortcut
from regionbus.schemas.codec import decode_items, encode
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
from regionbus.schemas.messages import Control, ControlKind, Reply
from regionbus.schemas.naming import Topics
from regionbus.schemas.transport import watermarks

STORM_CLIENTS = int(os.environ.get("REGIONBUS_STORM_CLIENTS", "40"))
STORM_ENTRIES = int(os.environ.get("REGIONBUS_STORM_ENTRIES", "20000"))
STORM_CONNECTS = int(os.environ.get("REGIONBUS_STORM_CONNECTS", "1000"))
VICTIM_P99_MS = float(os.environ.get("REGIONBUS_STORM_VICTIM_P99_MS", "400"))
VICTIM_MAX_MS = float(os.environ.get("REGIONBUS_STORM_VICTIM_MAX_MS", "1000"))
STORM_TIMEOUT_S = int(os.environ.get("REGIONBUS_STORM_TIMEOUT_S", "600"))
"""The registration storm's test timeout: the full size takes longer than the suite's."""
CONNECT_MAX_S = 2.0
"""The issue's bound on each connect of a storm."""
_VALUE = "v" * 64
_HERE = Path(__file__).parent


def _figures(what: str, latencies_s: list[float]) -> tuple[float, float, float]:
    """``(p50, p99, max)`` in ms of ``latencies_s``, printed."""
    ms = [s * 1000 for s in latencies_s]
    p50, p99 = statistics.median(ms), statistics.quantiles(ms, n=100, method="inclusive")[98]
    print(f"{what}: {len(ms)} puts, p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(ms):.1f} ms")
    return p50, p99, max(ms)


def _fill(region: Any, entries: int) -> None:
    for start in range(0, entries, 1000):
        region.put_all({f"k{i}": _VALUE for i in range(start, min(entries, start + 1000))})


@pytest.mark.timeout(STORM_TIMEOUT_S)
def test_a_storm_of_registrations_gets_everything_and_holds_no_one_else(
    server_settings: ServerSettings,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    tmp_path: Path,
) -> None:
    settings = server_settings.model_copy(update={"regions": ["big", "free"]})
    with CacheServer(settings):
        writer = client_factory(subscription_enabled=False)
        _fill(writer.create_region("big", RegionShortcut.PROXY), STORM_ENTRIES)
        victim = client_factory(subscription_enabled=False).create_region(
            "free", RegionShortcut.PROXY
        )
        victim.put("warm", 0)
        out, go = tmp_path / "storm.out", tmp_path / "go"
        config = {
            "namespace": settings.namespace,
            "bootstrap": kafka_bootstrap_servers,
            "count": STORM_CLIENTS,
            "region": "big",
            "read_timeout_ms": STORM_TIMEOUT_S * 1000,
            "out": str(out),
            "go": str(go),
        }
        storm = subprocess.Popen(
            [sys.executable, str(_HERE / "storm_process.py"), json.dumps(config)]
        )
        try:
            wait_until(
                lambda: storm.poll() is None and out.exists(),
                timeout_s=300,
                what="the storm's clients to connect",
            )
            with bystander_puts(victim, [f"v{i}" for i in range(100)], at_least=50) as latencies:
                go.touch()
                wait_until(
                    lambda: storm.poll() is not None, timeout_s=STORM_TIMEOUT_S, what="the storm"
                )
        finally:
            if storm.poll() is None:
                storm.kill()
            storm.wait(30)
        result = json.loads(out.read_text())
        assert not result["errors"], f"storm registrations failed: {result['errors'][:3]}"
        print(
            f"{STORM_CLIENTS} registrations of {STORM_ENTRIES} entries: the last answered "
            f"after {max(result['seconds']):.1f} s"
        )
        assert result["entries"] == [STORM_ENTRIES] * STORM_CLIENTS, (
            "a storm client's initial results are incomplete"
        )
        _, p99, worst = _figures("victim during the registration storm", latencies)
        assert p99 <= VICTIM_P99_MS and worst <= VICTIM_MAX_MS, (
            f"the victim's puts waited behind the storm: p99 {p99:.0f} ms, max {worst:.0f} ms"
        )


def test_a_storm_of_connects_is_answered_in_time_and_holds_no_one_else(
    server_settings: ServerSettings, client_factory: Any, kafka_bootstrap_servers: str
) -> None:
    settings = server_settings.model_copy(update={"regions": ["free"]})
    topics = Topics(settings.namespace)
    with CacheServer(settings):
        victim = client_factory(subscription_enabled=False).create_region(
            "free", RegionShortcut.PROXY
        )
        victim.put("warm", 0)
        replies_topic = topics.client_replies(None)
        consumer = kafka_consumer(
            {
                "bootstrap.servers": kafka_bootstrap_servers,
                "group.id": f"{settings.namespace}.storm-replies",
            }
        )
        partitions = consumer.list_topics(replies_topic, timeout=10).topics[replies_topic]
        assigned = []
        for p in partitions.partitions:
            tp = TopicPartition(replies_topic, p)
            tp.offset = watermarks(consumer, tp, 10)[1]
            assigned.append(tp)
        consumer.assign(assigned)
        controls = [
            Control(
                ControlKind.CONNECT,
                f"storm-{n}",
                int(time.time() * 1000),
                request_id=1_000_000 + n,
                connection_id=f"storm-{n}-c",
            )
            for n in range(STORM_CONNECTS)
        ]
        producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers, "linger.ms": 5})
        answered_s: dict[int, float] = {}
        produced_ms: dict[int, int] = {}
        with bystander_puts(victim, [f"v{i}" for i in range(100)], at_least=50) as latencies:
            time.sleep(0.3)  # the victim's puts before the storm count too
            for control in controls:
                producer.produce(topics.control, encode(control), key=control.client_id)
            assert producer.flush(30) == 0
            sent_s = time.monotonic()
            victim.put("after the storm", 0)
            victim_answered_ms = time.time() * 1000
            deadline_s = sent_s + 60
            while len(answered_s) < STORM_CONNECTS and time.monotonic() < deadline_s:
                message = consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                replies, _ = decode_items(message.value(), Reply)
                for reply in replies:
                    if reply.request_id >= 1_000_000:
                        answered_s.setdefault(reply.request_id, time.monotonic() - sent_s)
                        produced_ms[reply.request_id] = message.timestamp()[1]
        consumer.close()
        assert len(answered_s) == STORM_CONNECTS, "a connect of the storm was never answered"
        slowest_s = max(answered_s.values())
        print(
            f"{STORM_CONNECTS} connects answered: median "
            f"{statistics.median(answered_s.values()):.2f} s, slowest {slowest_s:.2f} s"
        )
        before_victim = sum(1 for ms in produced_ms.values() if ms <= victim_answered_ms)
        print(f"{before_victim} connects were answered before a put sent right after them")
        _, p99, worst = _figures("victim during the connect storm", latencies)
        assert slowest_s <= CONNECT_MAX_S, f"a connect of the storm took {slowest_s:.2f} s"
        # Without pacing the put waits behind every connect sent before it; the victim's
        # latency alone cannot tell on a noisy machine, where 1,000 connects take 0.3 s.
        assert before_victim <= STORM_CONNECTS // 2, (
            f"a put sent after {STORM_CONNECTS} connects waited for {before_victim} of them"
        )
        assert p99 <= VICTIM_P99_MS and worst <= VICTIM_MAX_MS, (
            f"the victim's puts waited behind the connects: p99 {p99:.0f} ms, max {worst:.0f} ms"
        )


def test_initial_results_read_over_many_turns_leave_no_gap_with_concurrent_changes(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    # Pages of 10 entries, 1 ms a turn: the load spans many turns, while a writer updates,
    # creates and destroys keys of the region; the subscriber ends with exactly its state.
    settings = server_settings.model_copy(
        update={
            "regions": ["hot"],
            "initial_results_page_entries": 10,
            "initial_results_budget_ms": 1,
            "initial_results_running_max": 2,
        }
    )
    entries = 6000
    with CacheServer(settings) as server:
        writer = client_factory(subscription_enabled=False).create_region(
            "hot", RegionShortcut.PROXY
        )
        expected: dict[str, Any] = {f"k{i}": i for i in range(entries)}
        for start in range(0, entries, 1000):
            writer.put_all({k: expected[k] for k in list(expected)[start : start + 1000]})
        # A turn gives the load 1 ms whatever the writer's share: under these writes the
        # registration can outlast the fixture's 30 s read timeout on a loaded machine.
        subscriber = client_factory(read_timeout_ms=180_000)
        region = subscriber.create_region("hot")
        registered = threading.Event()
        changes = [0]

        def write() -> None:
            # Asynchronous changes, a few in flight: many land while the pages are read.
            # One writer's changes of a key apply in the order sent (one bucket each).
            n = 0
            in_flight: list[Any] = []
            while not registered.is_set() or n < 50:
                key = f"k{(n * 7) % entries}"
                if n % 3 == 2 and key in expected:
                    in_flight.append(writer.destroy_async(key))
                    del expected[key]
                else:
                    in_flight.append(writer.put_async(key, n))
                    expected[key] = n
                in_flight.append(writer.put_async(f"new{n}", n))
                expected[f"new{n}"] = n
                n += 1
                changes[0] = n
                if len(in_flight) >= 8:
                    in_flight.pop(0).result(60)
            for future in in_flight:
                future.result(60)

        thread = threading.Thread(target=write)
        thread.start()
        try:
            wait_until(lambda: changes[0] >= 5, what="the writer to start")
            before = changes[0]
            region.register_interest(ALL_KEYS)
            during = changes[0] - before
        finally:
            registered.set()
            thread.join(120)
        wait_until(
            lambda: region.local_entries() == expected,
            timeout_s=30,
            what="the subscriber's copy to be the region's",
        )
        print(f"{during} rounds of changes while a registration was read over many turns")
        assert during >= 10, "the registration was answered before the writer changed anything"
        assert server.stats.errors == 0
