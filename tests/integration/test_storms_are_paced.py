"""Storms are paced: many clients asking at once slow no other client's operations.

A storm of clients (in a process of their own, as real clients are:
:func:`bench.storms.run_storm_clients`, which ``bench.fleet``'s storms phase runs at full
size) registering interest
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

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from support import bystander_puts

from bench.storms import ConnectStorm, fill_region, run_storm_clients
from bench.workers import Child
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import Region, RegionShortcut
from regionbus.schemas.errors import BulkOperationError, RegionBusError

STORM_CLIENTS = int(os.environ.get("REGIONBUS_STORM_CLIENTS", "40"))
STORM_ENTRIES = int(os.environ.get("REGIONBUS_STORM_ENTRIES", "20000"))
STORM_CONNECTS = int(os.environ.get("REGIONBUS_STORM_CONNECTS", "1000"))
VICTIM_P99_MS = float(os.environ.get("REGIONBUS_STORM_VICTIM_P99_MS", "400"))
VICTIM_MAX_MS = float(os.environ.get("REGIONBUS_STORM_VICTIM_MAX_MS", "1000"))
STORM_TIMEOUT_S = int(os.environ.get("REGIONBUS_STORM_TIMEOUT_S", "600"))
"""The registration storm's test timeout: the full size takes longer than the suite's."""
CONNECT_MAX_S = 2.0
"""The issue's bound on each connect of a storm."""


def _figures(what: str, latencies_s: list[float]) -> tuple[float, float, float]:
    """``(p50, p99, max)`` in ms of ``latencies_s``, printed."""
    ms = [s * 1000 for s in latencies_s]
    p50, p99 = statistics.median(ms), statistics.quantiles(ms, n=100, method="inclusive")[98]
    print(f"{what}: {len(ms)} puts, p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(ms):.1f} ms")
    return p50, p99, max(ms)


def _tell_where_they_went(server: CacheServer, region: Region, exc: BulkOperationError) -> None:
    """Print what the server did with the entries of unknown outcome: once, on the shared
    machine, 9 entries of the first ``put_all`` (one bucket's record of its first window)
    had no reply in 30 s while every other entry was answered, and nothing was logged.
    Applied and present means their reply was lost; absent, their record."""
    unknown = sorted(exc.unknown)
    stats = server.stats
    present: dict[str, bool] | str
    try:
        present = {k: v is not None for k, v in region.get_all(unknown).items()}
    except RegionBusError as read_failed:  # the failure being told must stay the test's
        present = f"unknown ({read_failed!r})"
    print(
        f"{len(unknown)} entries of unknown outcome {unknown[:20]}; the server applied "
        f"{stats.operations_applied} changes and produced {stats.replies} replies "
        f"({stats.replies_dropped} dropped); present now: {present}"
    )


@contextmanager
def _storm(
    settings: ServerSettings,
    kafka_bootstrap_servers: str,
    region: str,
    clients: int,
    more: dict[str, Any] | None = None,
) -> Iterator[Child]:
    """A child process of ``clients`` storm clients of ``region``, connected and waiting
    for the word (``expect``)."""
    client_settings = {
        "namespace": settings.namespace,
        "kafka_bootstrap_servers": kafka_bootstrap_servers,
        "fetch_wait_max_ms": 100,
        **(more or {}),
    }
    with Child(
        run_storm_clients,
        "storm",
        settings=client_settings,
        region=region,
        count=clients,
        prefix="storm",
    ) as storm:
        storm.wait_ready(300)
        yield storm


@pytest.mark.timeout(STORM_TIMEOUT_S)
def test_a_storm_of_registrations_gets_everything_and_holds_no_one_else(
    server_settings: ServerSettings,
    client_factory: Any,
    kafka_bootstrap_servers: str,
) -> None:
    settings = server_settings.model_copy(update={"regions": ["big", "free"]})
    with CacheServer(settings) as server:
        writer = client_factory(subscription_enabled=False)
        big = writer.create_region("big", RegionShortcut.PROXY)
        try:
            fill_region(big, STORM_ENTRIES)
        except BulkOperationError as exc:
            _tell_where_they_went(server, big, exc)
            raise
        victim = client_factory(subscription_enabled=False).create_region(
            "free", RegionShortcut.PROXY
        )
        victim.put("warm", 0)
        # Queued behind the storm's loads, a client waits longer than the default.
        more = {"read_timeout_ms": STORM_TIMEOUT_S * 1000}
        keys = [f"v{i}" for i in range(100)]
        with (
            _storm(settings, kafka_bootstrap_servers, "big", STORM_CLIENTS, more) as storm,
            bystander_puts(victim, keys, at_least=50) as latencies,
        ):
            storm.expect(0)
            result = storm.wait_result(STORM_TIMEOUT_S)
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
    with CacheServer(settings):
        victim = client_factory(subscription_enabled=False).create_region(
            "free", RegionShortcut.PROXY
        )
        victim.put("warm", 0)
        storm = ConnectStorm(kafka_bootstrap_servers, settings.namespace, STORM_CONNECTS, "storm")
        with bystander_puts(victim, [f"v{i}" for i in range(100)], at_least=50) as latencies:
            time.sleep(0.3)  # the victim's puts before the storm count too
            storm.send()
            victim.put("after the storm", 0)
            victim_answered_ms = time.time() * 1000
            answers = storm.answers(60)
        assert len(answers.seconds) == STORM_CONNECTS, "a connect of the storm was never answered"
        slowest_s = max(answers.seconds.values())
        print(
            f"{STORM_CONNECTS} connects answered: median "
            f"{statistics.median(answers.seconds.values()):.2f} s, slowest {slowest_s:.2f} s"
        )
        before_victim = answers.answered_before(victim_answered_ms)
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


class _RoundTrips:
    """Counts the Redis round trips of this process (a pipeline is one) while counting."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.counting = False
        send = redis.connection.AbstractConnection.send_packed_command

        def counted(connection: Any, *args: Any, **kwargs: Any) -> Any:
            if self.counting:
                self.count += 1
            return send(connection, *args, **kwargs)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)


def test_registrations_in_a_row_share_their_redis_round_trips(
    server_settings: ServerSettings, kafka_bootstrap_servers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storm's registrations arrive hundreds in a row in each bucket: they read the
    bucket's epoch and the region's state once, and persist their records once per batch,
    not three round trips apiece (which held every other client's operations behind them:
    about 1 ms a registration, 3,200 registrations of 200 clients in one-second turns).
    The region is empty, so each registration's initial results are one ``HSCAN``."""
    clients = 30
    registrations = clients * server_settings.total_buckets
    settings = server_settings.model_copy(update={"regions": ["empty"]})
    round_trips = _RoundTrips(monkeypatch)
    with (
        CacheServer(settings),
        _storm(settings, kafka_bootstrap_servers, "empty", clients) as storm,
    ):
        round_trips.counting = True
        storm.expect(0)
        result = storm.wait_result(300)
        round_trips.counting = False
    assert not result["errors"] and result["entries"] == [0] * clients
    print(f"{registrations} registrations: {round_trips.count} Redis round trips")
    # One HSCAN each, and a few for the batches, the server's leases and pings; before,
    # three more each (the epoch's GET, the region's state, the record's HSET).
    assert round_trips.count <= 2 * registrations, round_trips.count
