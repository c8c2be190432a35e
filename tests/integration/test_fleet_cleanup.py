"""Nothing outlives its client: 200 clients killed with SIGKILL leave no topic, partition,
consumer group, Redis record or metric series behind once the servers have given up on
them (their silence window for the non-durable ones, ``durable_client_timeout_s`` for the
durable ones), and they never cost a Kafka partition of their own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support import consumer_groups, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.broker.server_metrics import server_metric_families
from regionbus.schemas.kafka_clients import kafka_admin

pytestmark = pytest.mark.abuse

_HERE = Path(__file__).parent
_PER_FLEET = 100
_SILENCE_MS = 3_000
_DURABLE_TIMEOUT_S = 8
_REAPER_INTERVAL_S = 1.0
_MARGIN_S = 2 * _REAPER_INTERVAL_S + _SILENCE_MS / 4000 + 1
"""The stated margin: a liveness check (a quarter of the silence window) and two reaper
intervals (one to forget, one to list and delete the consumer groups), plus a second."""
_LOADED_MACHINE_S = 30
"""What a shared, loaded machine may add to the margin without the test failing."""


class _Fleet:
    """``fleet_process.py``: ``count`` clients of one process."""

    def __init__(self, tmp_path: Path, name: str, config: dict[str, Any]) -> None:
        self.out = tmp_path / f"{name}.out"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(_HERE / "fleet_process.py"),
                json.dumps(config | {"out": str(self.out)}),
            ]
        )
        self.ids = {f"{config['prefix']}-{n}" for n in range(config["count"])}

    def ready(self) -> bool:
        assert self.proc.poll() is None, "a fleet process failed"
        return self.out.exists()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def _partitions(kafka: str, namespace: str) -> dict[str, int]:
    admin = kafka_admin({"bootstrap.servers": kafka})
    topics = admin.list_topics(timeout=10).topics
    return {t: len(m.partitions) for t, m in topics.items() if t.startswith(namespace)}


def _left_behind(
    ids: set[str], server: CacheServer, redis_client: redis.Redis, kafka: str, namespace: str
) -> list[str]:
    """What of these clients still exists anywhere."""
    left = []
    records = {k.decode() for k in redis_client.hkeys(server.store.keys.clients)}
    left += [f"client record {c}" for c in ids & records]
    for key in redis_client.scan_iter(match=f"{server.store.keys.prefix}*", count=1000):
        name = key.decode()
        left += [f"redis key {name}" for c in ids if name.endswith(f":{c}")]
    left += [f"group {g}" for g in consumer_groups(kafka) if g.rsplit(".", 1)[-1] in ids]
    left += [f"topic {t}" for t in _partitions(kafka, namespace) if any(c in t for c in ids)]
    for family in server_metric_families(server):
        for sample in family.samples:
            if sample.labels.get("client") in ids:
                left.append(f"metric {sample.name}{{client={sample.labels['client']}}}")
    return left


@pytest.fixture
def fleet_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    settings = server_settings.model_copy(
        update={
            "maximum_time_between_pings_ms": _SILENCE_MS,
            "durable_client_reaper_interval_s": _REAPER_INTERVAL_S,
        }
    )
    with CacheServer(settings) as server:
        yield server


def test_two_hundred_killed_clients_leave_nothing_behind_within_their_timeouts(
    fleet_server: CacheServer,
    client_factory: Any,
    redis_client: redis.Redis,
    kafka_bootstrap_servers: str,
    namespace: str,
    tmp_path: Path,
) -> None:
    before = _partitions(kafka_bootstrap_servers, namespace)
    common = {
        "namespace": namespace,
        "bootstrap": kafka_bootstrap_servers,
        "count": _PER_FLEET,
        "ping_interval_ms": 500,
    }
    fleets = {
        "plain": _Fleet(tmp_path, "plain", common | {"prefix": "plain"}),
        "durable": _Fleet(
            tmp_path,
            "durable",
            common | {"prefix": "durable", "durable_client_timeout_s": _DURABLE_TIMEOUT_S},
        ),
    }
    try:
        wait_until(lambda: all(f.ready() for f in fleets.values()), 600, "200 clients to connect")
        writer = client_factory(subscription_enabled=False).create_region("r")
        writer.put_all({f"k{i}": i for i in range(16)})
        every = fleets["plain"].ids | fleets["durable"].ids
        wait_until(
            lambda: every <= set(fleet_server.events_routed_by_client()),
            what="events routed to every client",
        )
        wait_until(
            lambda: (
                len(
                    every & {g.rsplit(".", 1)[-1] for g in consumer_groups(kafka_bootstrap_servers)}
                )
                == len(every)
            ),
            what="every client's first ack",
        )
        assert _partitions(kafka_bootstrap_servers, namespace) == before, (
            "200 clients added Kafka topics or partitions"
        )
    finally:
        for fleet in fleets.values():
            fleet.kill()
    killed_at = time.monotonic()

    def gone(ids: set[str]) -> bool:
        return not _left_behind(ids, fleet_server, redis_client, kafka_bootstrap_servers, namespace)

    limit_s = _SILENCE_MS / 1000 + _MARGIN_S + _LOADED_MACHINE_S
    wait_until(lambda: gone(fleets["plain"].ids), limit_s, "the non-durable clients to be gone")
    plain_s = time.monotonic() - killed_at
    limit_s = _SILENCE_MS / 1000 + _DURABLE_TIMEOUT_S + _MARGIN_S + _LOADED_MACHINE_S
    wait_until(lambda: gone(fleets["durable"].ids), limit_s, "the durable clients to be gone")
    durable_s = time.monotonic() - killed_at
    assert durable_s >= _DURABLE_TIMEOUT_S, "durable clients were dropped before their timeout"
    assert _partitions(kafka_bootstrap_servers, namespace) == before
    print(f"non-durable gone after {plain_s:.1f} s, durable after {durable_s:.1f} s")
