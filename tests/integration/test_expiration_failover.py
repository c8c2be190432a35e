"""High availability of entry expiration (docs/behaviour.md §1, §4): a bucket primary SIGKILLed
after an expiration changed Redis and before its events left the server loses nothing; the new
primary delivers it, and every interested client hears every expiration exactly once.
Servers run as processes of their own; the kill comes from a server listener
(``expiry_kill_plugin``), at the first expiration."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from expiry_kill_plugin import MARKER_ENV
from support import settle, wait_until
from test_high_availability import ServerProcess

from regionbus.clients import ALL_KEYS, CacheListener, EntryEvent
from regionbus.schemas.messages import EventKind
from regionbus.schemas.naming import RedisKeys

_HERE = Path(__file__).parent
_LEASE_TTL_MS = 2_000
_KEYS = [f"k{i}" for i in range(12)]


class _Heard(CacheListener):
    """Every entry event of the client: (key, kind, is_expiration), and the keys whose
    expiration came flagged ``possible_duplicate`` (delivered from a stored result)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, EventKind, bool]] = []
        self.redelivered: list[str] = []
        self.lock = threading.Lock()

    def _add(self, event: EntryEvent) -> None:
        with self.lock:
            self.events.append((event.key, event.kind, event.is_expiration))
            if event.is_expiration and event.possible_duplicate:
                self.redelivered.append(event.key)

    after_create = after_update = after_invalidate = after_destroy = _add

    def expired(self) -> list[str]:
        with self.lock:
            return [key for key, kind, expiration in self.events if expiration]

    def of(self, key: str) -> list[tuple[EventKind, bool]]:
        with self.lock:
            return [(kind, expiration) for k, kind, expiration in self.events if k == key]


@pytest.fixture
def expiring_cluster(
    tmp_path: Path, namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> Iterator[Callable[[str], ServerProcess]]:
    """Starts server processes whose region ``r`` destroys entries 1 s after their last
    write, with the killing listener on ``r``; stops them at the end."""
    started: list[ServerProcess] = []

    def start(member_id: str) -> ServerProcess:
        expiration = {"r": {"entry_time_to_live": {"timeout_s": 1, "action": "destroy"}}}
        env = {
            "REGIONBUS_NAMESPACE": namespace,
            "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
            "REGIONBUS_REDIS_URL": redis_url,
            "REGIONBUS_SUBSCRIPTION_REDUNDANCY": "1",
            "REGIONBUS_LEASE_TTL_MS": str(_LEASE_TTL_MS),
            "REGIONBUS_FETCH_WAIT_MAX_MS": "100",
            "REGIONBUS_POLL_TIMEOUT_MS": "20",
            "REGIONBUS_MESSAGE_SYNC_INTERVAL_S": "0.5",
            "REGIONBUS_REGION_EXPIRATION": json.dumps(expiration),
            "REGIONBUS_EXPIRATION_INTERVAL_MS": "50",
            "REGIONBUS_PLUGINS": json.dumps({"r": ["expiry_kill_plugin:KillOnFirstExpiration"]}),
            "PYTHONPATH": str(_HERE),
            MARKER_ENV: str(tmp_path / "killed"),
        }
        server = ServerProcess(member_id, env, tmp_path / f"{member_id}.log")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_a_primary_killed_between_an_expiration_and_its_events_loses_none_of_them(
    expiring_cluster: Callable[[str], ServerProcess],
    redis_client: redis.Redis,
    namespace: str,
    client_factory: Any,
    tmp_path: Path,
) -> None:
    servers = [expiring_cluster(name) for name in ("s1", "s2")]
    members = RedisKeys(namespace).members
    for server in servers:
        wait_until(
            lambda s=server: redis_client.hexists(members, s.member_id), 60, "servers to join"
        )
    heard = _Heard()
    reader = client_factory(read_timeout_ms=30_000)
    reader.create_region("r", listeners=[heard]).register_interest(ALL_KEYS)
    writer = client_factory(read_timeout_ms=30_000).create_region("r")
    for key in _KEYS:
        writer.put(key, key)

    wait_until(
        lambda: set(heard.expired()) == set(_KEYS),
        _LEASE_TTL_MS / 1000 + 45,
        "every key's expiration to reach the client",
    )
    killed = [s for s in servers if s.proc.poll() is not None]
    assert (tmp_path / "killed").exists() and len(killed) == 1, "no primary was killed"
    assert killed[0].proc.returncode == -9
    time.sleep(1.0)  # an expiration heard twice would arrive within this
    settle(reader, idle_s=0.5)
    for key in _KEYS:
        assert heard.of(key) == [(EventKind.CREATE, False), (EventKind.DESTROY, True)], key
    # The one expiration the killed server applied reached the client from its successor,
    # which read it again from the committed offset and found its EventID applied.
    assert len(heard.redelivered) == 1, heard.redelivered
    assert not redis_client.keys(f"rb:{{{namespace}:*}}:r:r:expc"), "claims left"
