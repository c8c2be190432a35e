"""Acknowledged puts survive the loss of a Redis Cluster master (kill -9) while its replica is
promoted: none is lost, no listener hears one twice, and the longest pause is measured.

Redis replicates asynchronously, so the test makes the victim's replica fall behind first:
it is stopped (SIGSTOP) and the master drops its link (``CLIENT KILL TYPE replica``), the
master is killed once puts were acknowledged since or the server refused to acknowledge
them, and the replica resumes (SIGCONT) in time to be promoted. Without
``redis_wait_replicas`` the puts acknowledged in that window are on the master only and are
lost with it (the test then fails: checked by setting it to 0); with it their replies wait
for the replica, so a reply means the change survives.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from support import Recorder, settle, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.broker.store import RegionStore
from regionbus.clients import ALL_KEYS
from regionbus.devstack import EmbeddedRedisCluster
from regionbus.runtime.redis_connect import connect_redis_url
from regionbus.schemas.naming import RedisKeys, bucket_of

_BUCKETS = 16
_WRITERS = 3
_NODE_TIMEOUT_MS = 3_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedRedisCluster]:
    """A Redis Cluster of this module alone (the test kills one of its masters)."""
    with EmbeddedRedisCluster(node_timeout_ms=_NODE_TIMEOUT_MS) as started:
        yield started


class _Writers:
    """Threads putting distinct keys (``w<thread>-<n>`` -> n) one at a time; each put's
    acknowledgement time is recorded."""

    def __init__(self, region: Any, count: int) -> None:
        self._region = region
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.acked: dict[str, int] = {}
        self.ack_times_s: list[float] = []
        self.longest_put_s = 0.0
        self.errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)
        ]

    def _run(self, writer: int) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            key = f"w{writer}-{n}"
            began = time.monotonic()
            try:
                self._region.put(key, n)
            except Exception as exc:  # a put that fails is not acknowledged: it may be lost
                self.errors.append(exc)
                continue
            done = time.monotonic()
            with self._lock:
                self.acked[key] = n
                self.ack_times_s.append(done)
                self.longest_put_s = max(self.longest_put_s, done - began)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def longest_gap_s(self) -> float:
        """Longest time without any acknowledged put, seconds."""
        with self._lock:
            times = sorted(self.ack_times_s)
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def test_acknowledged_puts_survive_a_master_killed_while_its_replica_lags(
    cluster: EmbeddedRedisCluster,
    namespace: str,
    kafka_bootstrap_servers: str,
    client_factory: Any,
) -> None:
    settings = ServerSettings(
        namespace=namespace,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        redis_url=cluster.url,
        regions=["r"],
        total_buckets=_BUCKETS,
        poll_timeout_ms=20,
        message_sync_interval_s=0.2,
        redis_wait_replicas=1,
        redis_wait_timeout_ms=2_000,
        redis_socket_timeout_s=5.0,
    )
    heard = Recorder()
    with CacheServer(settings) as server:
        subscriber = client_factory()
        subscriber.create_region("r", listeners=[heard]).register_interest(ALL_KEYS)
        writers = _Writers(client_factory().create_region("r"), _WRITERS)
        writers.start()
        wait_until(lambda: writers.count() >= 300, 60, "puts before the kill")

        victim = cluster.master_of(RedisKeys(namespace).bucket_prefix(0))
        (replica,) = cluster.replicas_of(victim)
        assert victim.port is not None and replica.pid is not None
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            direct = redis.Redis(host="127.0.0.1", port=victim.port)
            direct.execute_command("CLIENT KILL TYPE replica")
            direct.close()
            before, refused = writers.count(), server.redis_outages
            wait_until(
                lambda: writers.count() >= before + 30 or server.redis_outages > refused,
                30,
                "puts acknowledged, or refused, while the replica lags",
            )
            killed_at = time.monotonic()
            victim.kill()
        finally:
            os.kill(replica.pid, signal.SIGCONT)

        wait_until(lambda: writers.count() >= before + 600, 120, "puts after the failover")
        writers.stop()
        pause_s = writers.longest_gap_s()
        print(
            f"\nRedis master killed -9: {writers.count()} puts acknowledged, longest pause "
            f"without an acknowledged put {pause_s:.2f} s, longest single put "
            f"{writers.longest_put_s:.2f} s, first put after the kill "
            f"{min((t for t in writers.ack_times_s if t > killed_at), default=0) - killed_at:.2f} s"
        )
        settle(subscriber, idle_s=1.0)

    client = connect_redis_url(cluster.url)
    try:
        store = RegionStore(client, namespace, _BUCKETS)
        lost = [
            key
            for key, n in writers.acked.items()
            if (entry := store.get("r", key, bucket_of("r", key, _BUCKETS))[1]) is None
            or entry.value != str(n).encode()
        ]
    finally:
        client.close()
    assert not lost, f"{len(lost)} acknowledged puts lost, e.g. {lost[:5]}"
    calls = heard.snapshot()
    per_key: dict[str, int] = {}
    for _method, key, _ in calls:
        per_key[key] = per_key.get(key, 0) + 1
    twice = {k: n for k, n in per_key.items() if n > 1}
    assert not twice, f"listener heard {len(twice)} keys more than once, e.g. {list(twice)[:5]}"
    missing = set(writers.acked) - set(per_key)
    assert not missing, f"listener never heard {len(missing)} acknowledged puts"
    # Detection (node timeout), the replica's election and the servers' retry, on a shared
    # machine: bounded, not a stall.
    assert pause_s < 60, pause_s
