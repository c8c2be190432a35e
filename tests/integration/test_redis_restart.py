"""Redis restarts under a steady put stream: two cache server processes, writer
processes and an interested listener keep going while the test restarts a Redis with the
append-only file on the same port, once gracefully and briefly, once with SIGKILL for
longer than the bucket leases live. Nothing acknowledged may be lost or applied twice, and
the servers must be serving again afterwards without a restart of their own."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from gateway_sites import Site, start_async_event_queue
from prometheus_client.parser import text_string_to_metric_families
from support import settle, wait_until
from test_high_availability import ServerProcess, Tap, WriterProcess

from regionbus.broker.status import cluster_status
from regionbus.broker.store import RegionStore
from regionbus.clients import ALL_KEYS
from regionbus.devstack import EmbeddedRedis, free_port
from regionbus.gateways.async_event_queue import AsyncEvent, AsyncEventListener
from regionbus.runtime.leases import Membership, wall_clock_ms
from regionbus.schemas.naming import RedisKeys

_TOTAL_BUCKETS = 16
_LEASE_TTL_MS = 3_000
_MEMBERS = ("s1", "s2")


@pytest.fixture
def aof_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis of this test only, with the append-only file in ``tmp_path``; the fsync
    policy comes from the test's parameter (``always`` survives SIGKILL, ``everysec`` a
    graceful shutdown)."""
    server = EmbeddedRedis(appendonly=True, appendfsync=request.param, work_dir=tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.close()


def _start_servers(
    tmp_path: Path, namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> dict[str, ServerProcess]:
    env = {
        "REGIONBUS_NAMESPACE": namespace,
        "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
        "REGIONBUS_REDIS_URL": redis_url,
        "REGIONBUS_SUBSCRIPTION_REDUNDANCY": "1",
        "REGIONBUS_LEASE_TTL_MS": str(_LEASE_TTL_MS),
        "REGIONBUS_FETCH_WAIT_MAX_MS": "100",
        "REGIONBUS_POLL_TIMEOUT_MS": "20",
        "REGIONBUS_MESSAGE_SYNC_INTERVAL_S": "0.5",
        "REGIONBUS_REDIS_SOCKET_TIMEOUT_S": "1",
    }
    servers = {}
    for name in _MEMBERS:
        port = free_port()
        server = ServerProcess(
            name, {**env, "REGIONBUS_METRICS_PORT": str(port)}, tmp_path / f"{name}.log"
        )
        server.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
        servers[name] = server
        time.sleep(0.3)  # distinct start times, so the election has a longest-lived member
    return servers


def _serving(client: redis.Redis, namespace: str) -> bool:
    """Both members are live and every bucket has one of them as its primary."""
    try:
        status = cluster_status(client, namespace, _TOTAL_BUCKETS)
    except Exception:
        return False
    return {m.member_id for m in status.members} == set(_MEMBERS) and all(
        b.primary in _MEMBERS for b in status.buckets
    )


def _region_values(client: redis.Redis, namespace: str) -> dict[str, Any]:
    keys = RedisKeys(namespace)
    values: dict[str, Any] = {}
    for bucket in range(_TOTAL_BUCKETS):
        for key, raw in client.hgetall(keys.region_values("r", bucket)).items():
            values[key.decode()] = json.loads(raw)
    return values


@pytest.mark.parametrize(
    ("aof_redis", "kill_signal", "down_s"),
    [
        pytest.param("everysec", signal.SIGTERM, 1.5, id="graceful-shorter-than-lease"),
        pytest.param("always", signal.SIGKILL, 6.0, id="sigkill-longer-than-lease"),
        # SIGSTOP: Redis hangs with connections open; only the servers' socket timeout
        # (1 s here) turns that into an outage they can wait out.
        pytest.param("everysec", signal.SIGSTOP, 4.0, id="hung-redis"),
    ],
    indirect=["aof_redis"],
)
def test_a_redis_restart_under_a_put_stream_loses_no_acknowledged_put_and_applies_none_twice(
    aof_redis: EmbeddedRedis,
    kill_signal: signal.Signals,
    down_s: float,
    namespace: str,
    kafka_bootstrap_servers: str,
    client_factory: Any,
    tmp_path: Path,
) -> None:
    redis_url = aof_redis.url
    client = redis.Redis.from_url(redis_url)
    servers = _start_servers(tmp_path, namespace, kafka_bootstrap_servers, redis_url)
    try:
        wait_until(lambda: _serving(client, namespace), timeout_s=90, what="both servers")
        tap = Tap()
        listener = client_factory(read_timeout_ms=60_000)
        listener.create_region("r", listeners=[tap]).register_interest(ALL_KEYS)
        writers = [
            WriterProcess(
                tmp_path,
                name,
                {"namespace": namespace, "bootstrap": kafka_bootstrap_servers, "rate": 100},
            )
            for name in ("w1", "w2")
        ]
        wait_until(lambda: len(tap.snapshot()) > 200, timeout_s=60, what="a steady stream")

        if kill_signal is signal.SIGSTOP:
            assert aof_redis.pid is not None
            os.kill(aof_redis.pid, signal.SIGSTOP)
            time.sleep(down_s)
            os.kill(aof_redis.pid, signal.SIGCONT)
        else:
            _stop_redis(aof_redis, kill_signal)
            time.sleep(down_s)
            aof_redis.start()
        restarted_ms = time.time() * 1000

        wait_until(
            lambda: any(sent_ms > restarted_ms for _k, _i, sent_ms, *_ in tap.snapshot()),
            timeout_s=60,
            what="puts sent after the restart to reach the listener",
        )
        wait_until(
            lambda: _serving(client, namespace), timeout_s=30, what="every bucket served again"
        )
        time.sleep(1.0)
        acks = [a for w in writers for a in w.finish()]

        after = client_factory(read_timeout_ms=30_000).create_region("r")
        after.put("after-restart", {"i": -1, "sent_ms": time.time() * 1000})
        wait_until(
            lambda: any(k == "after-restart" for k, *_ in tap.snapshot()),
            what="a put made after the restart to reach the listener",
        )
        settle(listener, idle_s=1.0)

        for name, server in servers.items():
            assert server.proc.poll() is None, f"{name} died:\n{server.log.read_text()[-3000:]}"
        failed = [a for a in acks if not a["ok"]]
        assert not failed, f"{len(failed)} puts in flight during the outage were not acked"
        assert len(acks) > 400

        events = tap.snapshot()
        seen = [(key, i) for key, i, *_ in events]
        assert len(seen) == len(set(seen)), "an event reached the listener twice"
        missing = {(a["key"], a["i"]) for a in acks} - set(seen)
        assert not missing, f"{len(missing)} acknowledged puts never reached the listener"
        last_sequence: dict[tuple[str, int, int], int] = {}
        for *_, (member, thread, sequence, bucket), _arrival in events:
            stream = (member, thread, bucket)
            assert sequence > last_sequence.get(stream, -1), f"out of order in {stream}"
            last_sequence[stream] = sequence

        latest: dict[str, int] = {}
        for a in acks:
            latest[a["key"]] = max(latest.get(a["key"], -1), a["i"])
        stored = _region_values(client, namespace)
        wrong = {k: i for k, i in latest.items() if stored.get(k, {}).get("i") != i}
        assert not wrong, f"Redis does not hold the last acknowledged put of {len(wrong)} keys"
        # No region operation ran, so each bucket's version is its count of changes.
        store = RegionStore(client, namespace, _TOTAL_BUCKETS)
        version = sum(store.region_version("r", b) for b in range(_TOTAL_BUCKETS))
        assert version == len(acks) + 1, (
            f"region version {version} != {len(acks) + 1} puts: a put was applied twice or lost"
        )

        for server in servers.values():
            text = server.log.read_text()
            assert text.count("Redis unavailable") == 1, "not one warning for the outage"
            assert "Redis available again" in text
            assert _scraped(server.metrics_url, "regionbus_redis_outages_total") == 1.0
    finally:
        for server in servers.values():
            server.stop()
        client.close()


def _scraped(url: str, name: str) -> float:
    """The value of the single sample ``name`` on a Prometheus endpoint."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    values = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]
    assert len(values) == 1, f"{name}: {values}"
    return values[0]


def _stop_redis(server: EmbeddedRedis, signum: signal.Signals) -> None:
    """Stop the test's Redis with ``signum`` (SIGTERM: Redis shuts down cleanly and fsyncs
    its AOF; SIGKILL: it dies at once) and reap it."""
    pid = server.pid
    assert pid is not None
    if signum is signal.SIGKILL:
        os.kill(pid, signal.SIGKILL)
    server.stop()


def test_a_member_dropped_as_dead_while_redis_was_away_registers_again_on_its_heartbeat(
    redis_client: redis.Redis, namespace: str
) -> None:
    # After an outage longer than the liveness TTL, the first member back removes the
    # others from the member list; their next heartbeat must put them back, or no bucket
    # would ever be given to them again.
    late = Membership(redis_client, namespace, "late", ttl_ms=60_000)
    late.join()
    redis_client.delete(RedisKeys(namespace).member_alive("late"))
    # Members are ordered by start time in ms, ties by id ("early" < "late"): let the
    # clock move on so that "late" is the longer-lived one, as the last assert says.
    wait_until(lambda: wall_clock_ms() > late.started_at_ms, 5, "the clock to tick")
    early = Membership(redis_client, namespace, "early", ttl_ms=60_000)
    early.join()
    assert [m.member_id for m in early.live_members()] == ["early"]
    late.heartbeat()
    assert [m.member_id for m in early.live_members()] == ["late", "early"]


class _Dispatched(AsyncEventListener):
    """Records the key of every event an async event queue dispatches."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self._lock = threading.Lock()

    def process_events(self, events: list[AsyncEvent]) -> bool:
        with self._lock:
            self.keys.extend(e.key for e in events if e.key is not None)
        return True

    def snapshot(self) -> set[str]:
        with self._lock:
            return set(self.keys)


@pytest.mark.parametrize("aof_redis", ["everysec"], indirect=True)
def test_an_async_event_queue_and_its_server_go_on_after_redis_was_away_longer_than_the_lease(
    aof_redis: EmbeddedRedis,
    namespace: str,
    kafka_bootstrap_servers: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with ExitStack() as stack:
        site = Site(stack, namespace, kafka_bootstrap_servers, aof_redis.url, 1)
        server = site.start_server(async_event_queues=("audit",))
        dispatched = _Dispatched()
        queue = start_async_event_queue(site, "audit", dispatched, lease_ttl_ms=_LEASE_TTL_MS)
        region = site.client(read_timeout_ms=60_000).create_region("r")
        region.put_all({f"before-{i}": i for i in range(50)})
        wait_until(lambda: len(dispatched.snapshot()) == 50, what="the first events")

        with caplog.at_level(logging.INFO):
            _stop_redis(aof_redis, signal.SIGTERM)
            during = region.put_async("during", 1)
            time.sleep(_LEASE_TTL_MS / 1000 + 1.0)
            aof_redis.start()
            during.result(timeout=60)
            region.put_all({f"after-{i}": i for i in range(50)})
            expected = {f"before-{i}" for i in range(50)} | {f"after-{i}" for i in range(50)}
            wait_until(
                lambda: dispatched.snapshot() == expected | {"during"},
                timeout_s=60,
                what="every event, also those put during and after the outage",
            )
        assert server.alive and queue.alive
        assert queue.is_primary
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        role_warnings = [m for m in warnings if "Redis unavailable for async-event-queue" in m]
        assert len(role_warnings) == 1, warnings
        assert not [m for m in warnings if ": lease: " in m], "one warning per lease retry"
