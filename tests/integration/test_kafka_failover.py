"""A Kafka broker killed under load (three-broker KRaft cluster, replication factor 3,
``min.insync.replicas=2``): the broker that leads partitions of ``{ns}.ops`` and a
subscriber's queue is killed with SIGKILL while writer processes put a few hundred
entries a second. No acknowledged put may be lost, none may reach a listener twice, each
key's puts arrive in order, and a durable client that was away during the kill gets its
whole backlog when it comes back.

The cache server and the writers are processes of their own (`test_high_availability`);
the listener and the durable client live in this process. The server must keep its
buckets meanwhile (its loop is not held up by the failover), and nobody may log the
failover as a Kafka outage or librdkafka's reconnect attempts to the dead broker.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support import settle, wait_until
from test_high_availability import ServerProcess, Tap, WriterProcess, _check_delivery

from regionbus.broker.store import RegionStore
from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings
from regionbus.clients.cache import CLIENT_RECONNECTED
from regionbus.devstack import KafkaCluster
from regionbus.schemas.callbacks import RegionEvent
from regionbus.schemas.kafka_clients import kafka_admin
from regionbus.schemas.naming import RedisKeys, Topics

log = logging.getLogger(__name__)

_TOTAL_BUCKETS = 16
_BROKER_SESSION_TIMEOUT_MS = 4_000
_WRITE_RATE_PER_S = 300


@pytest.fixture
def kafka_cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    """Three KRaft nodes (each broker and controller) on loopback, killed at the end.

    A broker that stops heartbeating is fenced after ``_BROKER_SESSION_TIMEOUT_MS``
    (Kafka's default is 9 s): only then do the other replicas drop it from the in-sync
    set and ``acks=all`` writes to its partitions go on.
    """
    cluster = KafkaCluster(
        nodes=3,
        work_dir=tmp_path / "kafka",
        heap_max_mb=512,
        broker_properties={
            "broker.session.timeout.ms": str(_BROKER_SESSION_TIMEOUT_MS),
            "broker.heartbeat.interval.ms": "500",
        },
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


class ReplayTap(Tap):
    """A `Tap` that also notes how many events reached it before ``after_region_live``."""

    def __init__(self) -> None:
        super().__init__()
        self.live_after: int | None = None

    def after_region_live(self, event: RegionEvent) -> None:
        with self._lock:
            self.live_after = len(self.events)


def _leaders(cluster: KafkaCluster, topic: str) -> dict[int, int]:
    """``{partition: leader broker id}`` of ``topic``."""
    admin = kafka_admin({**cluster.client_config(), "log_level": 3})
    metadata = admin.list_topics(topic=topic, timeout=10).topics[topic]
    return {p: meta.leader for p, meta in metadata.partitions.items()}


def _region_values(client: redis.Redis, namespace: str) -> dict[str, Any]:
    keys = RedisKeys(namespace)
    values: dict[str, Any] = {}
    for bucket in range(_TOTAL_BUCKETS):
        for key, raw in client.hgetall(keys.region_values("r", bucket)).items():
            values[key.decode()] = json.loads(raw)
    return values


def test_sigkill_of_the_leader_of_ops_and_queue_partitions_under_load_loses_and_duplicates_nothing(
    kafka_cluster: KafkaCluster,
    namespace: str,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    server = ServerProcess(
        "s1",
        {
            "REGIONBUS_NAMESPACE": namespace,
            "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "REGIONBUS_REDIS_URL": redis_url,
            "REGIONBUS_FETCH_WAIT_MAX_MS": "20",
            "REGIONBUS_POLL_TIMEOUT_MS": "20",
            "REGIONBUS_MESSAGE_SYNC_INTERVAL_S": "0.5",
        },
        tmp_path / "s1.log",
    )
    opened: list[ClientCache] = []

    def client(**overrides: Any) -> ClientCache:
        cache = ClientCache(
            ClientSettings(
                namespace=namespace,
                kafka_bootstrap_servers=bootstrap,
                fetch_wait_max_ms=20,
                read_timeout_ms=60_000,
                **overrides,
            )
        )
        opened.append(cache)
        return cache

    try:
        tap = Tap()
        listener = client()
        listener.create_region("r", listeners=[tap]).register_interest(ALL_KEYS)
        durable = client(durable_client_id="desk")
        durable.create_region("r").register_interest(ALL_KEYS, durable=True)
        durable.ready_for_events()
        writers = [
            WriterProcess(
                tmp_path,
                name,
                {
                    "namespace": namespace,
                    "bootstrap": bootstrap,
                    "rate": _WRITE_RATE_PER_S,
                },
            )
            for name in ("w1", "w2")
        ]
        wait_until(lambda: len(tap.snapshot()) > 300, timeout_s=90, what="a steady stream")
        durable.close(keep_alive=True)
        away_since_ms = time.time() * 1000

        topics = Topics(namespace)
        address = listener.pool.address
        victim = _leaders(kafka_cluster, address.queue_topic)[address.queue_partition]
        orphaned = {
            p for p, leader in _leaders(kafka_cluster, topics.ops).items() if leader == victim
        }
        assert orphaned, f"broker {victim} leads the listener's queue but no ops partition"
        kill_ms = time.time() * 1000
        kafka_cluster.node_of_broker(victim).kill()
        wait_until(
            lambda: any(sent_ms > kill_ms for _k, _i, sent_ms, *_ in tap.snapshot()),
            timeout_s=60,
            what="puts sent after the kill to reach the listener",
        )
        wait_until(
            lambda: (
                {
                    eid[3]
                    for _k, _i, sent_ms, eid, _a in tap.snapshot()
                    if sent_ms > kill_ms and eid[3] in orphaned
                }
                == orphaned
            ),
            timeout_s=60,
            what="puts sent after the kill to every bucket the dead broker led",
        )
        time.sleep(2.0)
        acks = [a for w in writers for a in w.finish()]
        settle(listener, idle_s=1.0)

        server_log = server.log.read_text()
        assert server.proc.poll() is None, f"server died:\n{server_log[-3000:]}"
        assert "lost the lease" not in server_log, "the broker's death cost the server buckets"
        # One WARNING names the dead broker; librdkafka's reconnect attempts stay at DEBUG.
        refused = [line for line in server_log.splitlines() if "Connection refused" in line]
        assert len(refused) <= 1 and all("unreachable" in line for line in refused), (
            "librdkafka logged its reconnects:\n" + "\n".join(refused[:10])
        )
        outages = [r.getMessage() for r in caplog.records if "Kafka unavailable" in r.getMessage()]
        assert "Kafka unavailable" not in server_log and not outages, "a failover is no outage"
        failed = [a for a in acks if not a["ok"]]
        assert not failed, f"{len(failed)} puts were not acknowledged"
        assert len(acks) > 600
        events = _check_delivery(acks, tap)
        last_i: dict[str, int] = {}
        for key, i, *_ in events:
            assert i > last_i.get(key, -1), f"the puts of {key} arrived out of order"
            last_i[key] = i

        latest: dict[str, int] = {}
        for a in acks:
            latest[a["key"]] = max(latest.get(a["key"], -1), a["i"])
        stored = _region_values(redis_client, namespace)
        wrong = {k: i for k, i in latest.items() if stored.get(k, {}).get("i") != i}
        assert not wrong, f"Redis does not hold the last acknowledged put of {len(wrong)} keys"
        # No region operation ran, so each bucket's version is its count of changes.
        store = RegionStore(redis_client, namespace, _TOTAL_BUCKETS)
        version = sum(store.region_version("r", b) for b in range(_TOTAL_BUCKETS))
        assert version == len(acks), (
            f"region version {version} != {len(acks)} puts: a put was applied twice or lost"
        )

        arrivals = sorted(arrival for *_, arrival in events)
        gap_ms = max(b - a for a, b in itertools.pairwise(arrivals) if b > kill_ms)
        resumed_ms = {
            bucket: min(
                arrival - kill_ms
                for _k, _i, sent_ms, eid, arrival in events
                if sent_ms > kill_ms and eid[3] == bucket
            )
            for bucket in orphaned
        }
        sent = sorted(sent for _k, _i, sent, *_ in events)
        log.info(
            "broker %d killed: %d puts acked, sent over %.1f s; longest pause of the "
            "listener's stream %.0f ms; first put sent after the kill delivered per orphaned "
            "bucket after %s ms",
            victim,
            len(acks),
            (sent[-1] - sent[0]) / 1000,
            gap_ms,
            {b: round(ms) for b, ms in sorted(resumed_ms.items())},
        )

        back = client(durable_client_id="desk")
        assert back.client_state == CLIENT_RECONNECTED
        replay = ReplayTap()
        region = back.create_region("r", listeners=[replay])
        back.ready_for_events()
        wait_until(lambda: replay.live_after is not None, timeout_s=60, what="the durable marker")
        assert replay.live_after is not None
        sent_at_ms = {(key, i): sent for key, i, sent, *_ in events}
        backlog = {
            (a["key"], a["i"]) for a in acks if sent_at_ms[(a["key"], a["i"])] > away_since_ms
        }
        replayed = [(key, i) for key, i, *_ in replay.snapshot()[: replay.live_after]]
        assert len(replayed) == len(set(replayed)), "a replayed event reached the listener twice"
        missing = backlog - set(replayed)
        assert not missing, f"{len(missing)} events of the durable client's backlog not replayed"
        assert region.local_entries() == {}, "replayed events changed the durable client's cache"
    finally:
        for cache in opened:
            if not cache.closed:
                cache.close()
        server.stop()
